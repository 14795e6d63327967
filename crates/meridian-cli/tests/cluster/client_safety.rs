//! Cluster tests of what a client can and cannot do to a node: a retried write (same write id)
//! is applied once; a resent transaction commit is answered as committed, and a stale one as a
//! conflict; a causality token (`meridian-hlc`) never moves a node's clock; a body that
//! is not protobuf is the client's error, not the server's.

use crate::common::*;
use bytes::{Buf, BufMut, Bytes};
use meridian_cli::demo::keys_across_shards;
use meridian_client::proto::{
    kv_client::KvClient, txn_write, CommitRequest, GetRequest, PutRequest, TxnRead, TxnWrite,
    WriteId,
};
use meridian_client::{fetch_status, Timestamp};
use std::time::Duration;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::transport::Channel;

async fn channel(address: &str) -> Channel {
    Channel::from_shared(format!("http://{address}"))
        .expect("uri")
        .timeout(Duration::from_secs(5))
        .connect()
        .await
        .expect("connect")
}

fn meridian_code(status: &tonic::Status) -> String {
    status
        .metadata()
        .get("meridian-code")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("<none>")
        .to_string()
}

/// The address of the node leading `key`'s shard.
async fn leader_of(client: &meridian_client::Client, key: &Bytes) -> String {
    client.refresh_shard_map().await.expect("refresh");
    let route = client.route(key).expect("routable");
    let leader = route.leader_id.expect("leader known");
    client.shard_map().nodes()[&leader].address.clone()
}

#[test]
fn client_facing_safety() {
    run_scenario(scenario());
}

async fn scenario() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = start_cluster(21_900, dir.path(), 4, &[]);
    cluster
        .wait_ready(READY_TIMEOUT)
        .await
        .expect("cluster ready");
    let client = connect_client(cluster.endpoints()).await;
    retried_write_is_applied_once(&client).await;
    resent_commit_is_answered_committed(&client).await;
    causality_token_never_moves_node_clocks(&cluster, &client).await;
    malformed_body_is_invalid_argument(&cluster).await;
    let stuck = cluster.stop_all(Duration::from_secs(20));
    assert!(stuck.is_empty(), "nodes {stuck:?} ignored SIGTERM");
}

/// Client 7's put(k, v1) commits but its answer is "lost"; client 8 writes v2; client 7 resends
/// put(k, v1) with the same write id. The resend must be answered with the first commit
/// timestamp and must not roll k back to v1.
async fn retried_write_is_applied_once(client: &meridian_client::Client) {
    let key = keys_across_shards(&client.shard_map(), 1).remove(0);
    let mut kv = KvClient::new(channel(&leader_of(client, &key).await).await);
    let put = |value: &str, client_id: u64, seq: u64| PutRequest {
        key: key.clone(),
        value: Bytes::from(value.to_string()),
        write_id: Some(WriteId { client_id, seq }),
        ..Default::default()
    };
    let first = kv
        .put(put("v1", 7, 1))
        .await
        .expect("first put")
        .into_inner();
    let other = kv
        .put(put("v2", 8, 1))
        .await
        .expect("other put")
        .into_inner();
    assert!(other.commit_ts > first.commit_ts);
    let retry = kv.put(put("v1", 7, 1)).await.expect("retry").into_inner();
    assert_eq!(
        retry.commit_ts, first.commit_ts,
        "the retry is answered with the first application's commit timestamp"
    );
    let read = kv
        .get(GetRequest {
            key: key.clone(),
            consistency: 0,
            ..Default::default()
        })
        .await
        .expect("get")
        .into_inner();
    assert_eq!(
        read.value,
        Bytes::from("v2"),
        "the retry did not apply again"
    );
    assert_eq!(read.version_ts, other.commit_ts);
    eprintln!(
        "retried write answered from the dedup table (commit_ts {})",
        first.commit_ts
    );
}

/// One-shard commits on a key: A reads it at its version and writes it; A's answer is "lost"
/// and A is resent with the same write id; B read the same version and commits after A. The
/// resend must be answered as committed at A's timestamp: A's own write is now newer than its
/// read, so a node that judged the read before consulting the dedup table (a check before the
/// proposal, bench/results/2026-12-06/early-refusal) would call a committed transaction a
/// conflict, and its closure would run twice. B must be a conflict naming the key.
async fn resent_commit_is_answered_committed(client: &meridian_client::Client) {
    let key = keys_across_shards(&client.shard_map(), 1).remove(0);
    let mut kv = KvClient::new(channel(&leader_of(client, &key).await).await);
    let base = kv
        .put(PutRequest {
            key: key.clone(),
            value: Bytes::from("base"),
            ..Default::default()
        })
        .await
        .expect("put")
        .into_inner();
    let commit = |value: &str, seq: u64| CommitRequest {
        reads: vec![TxnRead {
            key: key.clone(),
            found: true,
            version_ts: base.commit_ts,
        }],
        writes: vec![TxnWrite {
            key: key.clone(),
            action: Some(txn_write::Action::PutValue(Bytes::from(value.to_string()))),
        }],
        write_id: Some(WriteId { client_id: 9, seq }),
        ..Default::default()
    };
    let a = kv.commit(commit("a", 1)).await.expect("A").into_inner();
    assert!(a.committed, "A read the current version: {a:?}");
    let resent = kv
        .commit(commit("a", 1))
        .await
        .expect("A again")
        .into_inner();
    assert!(
        resent.committed && resent.commit_ts == a.commit_ts,
        "the resend of a committed transaction answers its commit: {resent:?} after {a:?}"
    );
    let b = kv.commit(commit("b", 2)).await.expect("B").into_inner();
    assert!(!b.committed, "B read an overwritten version: {b:?}");
    assert_eq!(b.conflict_key, key, "B's conflict names the key");
    let read = kv
        .get(GetRequest {
            key: key.clone(),
            ..Default::default()
        })
        .await
        .expect("get")
        .into_inner();
    assert_eq!(read.value, Bytes::from("a"));
    assert_eq!(read.version_ts, a.commit_ts);
    eprintln!("a resent commit answered committed; a stale one a conflict");
}

/// A client sending a token 480 ms ahead (max_offset 500 ms) on every request: requests wait
/// for the clock instead of moving it, so no node's HLC runs ahead of wall time. A token beyond
/// max_offset is CLOCK_OFFSET; a malformed one is INVALID_ARGUMENT.
async fn causality_token_never_moves_node_clocks(
    cluster: &meridian_cli::LocalCluster,
    client: &meridian_client::Client,
) {
    let key = keys_across_shards(&client.shard_map(), 1).remove(0);
    let address = leader_of(client, &key).await;
    let kv = KvClient::new(channel(&address).await);
    let get_with_token = |token: String| {
        let mut kv = kv.clone();
        let key = key.clone();
        async move {
            let mut request = tonic::Request::new(GetRequest {
                key,
                consistency: 0,
                ..Default::default()
            });
            request
                .metadata_mut()
                .insert("meridian-hlc", token.parse().expect("ascii"));
            kv.get(request).await
        }
    };
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..50 {
        let token = Timestamp::from_physical_ms(now_ms() + 480).0.to_string();
        let call = get_with_token(token);
        tasks.spawn(call);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    while let Some(result) = tasks.join_next().await {
        result
            .expect("task")
            .expect("a get with a token inside max_offset is served");
    }
    for node in cluster.node_ids() {
        let address = cluster.client_addr(node).unwrap();
        let before = now_ms();
        let status = fetch_status(&address, Duration::from_secs(2))
            .await
            .expect("status");
        let ahead_ms = Timestamp(status.hlc_now).physical_ms() as i64 - before as i64;
        eprintln!("node {node}: HLC {ahead_ms} ms from wall time after the tokens");
        assert!(
            ahead_ms < 150,
            "node {node}'s clock was pushed {ahead_ms} ms ahead of wall time by client tokens"
        );
    }
    let far = Timestamp::from_physical_ms(now_ms() + 5_000).0.to_string();
    let refused = get_with_token(far)
        .await
        .expect_err("a token 5 s ahead is refused");
    assert_eq!(meridian_code(&refused), "CLOCK_OFFSET", "{refused:?}");
    let malformed = get_with_token("soon".into())
        .await
        .expect_err("a malformed token is refused");
    assert_eq!(
        meridian_code(&malformed),
        "INVALID_ARGUMENT",
        "{malformed:?}"
    );
}

/// Sends raw bytes as a request body (what a buggy or hostile client can do).
#[derive(Default)]
struct RawCodec;

struct RawEncoder;
struct RawDecoder;

impl Codec for RawCodec {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = RawEncoder;
    type Decoder = RawDecoder;
    fn encoder(&mut self) -> RawEncoder {
        RawEncoder
    }
    fn decoder(&mut self) -> RawDecoder {
        RawDecoder
    }
}

impl Encoder for RawEncoder {
    type Item = Bytes;
    type Error = tonic::Status;
    fn encode(&mut self, item: Bytes, buf: &mut EncodeBuf<'_>) -> Result<(), tonic::Status> {
        buf.put(item);
        Ok(())
    }
}

impl Decoder for RawDecoder {
    type Item = Bytes;
    type Error = tonic::Status;
    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, tonic::Status> {
        Ok(Some(buf.copy_to_bytes(buf.remaining())))
    }
}

/// A Put whose body is not protobuf gets INVALID_ARGUMENT with the meridian code (it was
/// INTERNAL, a server fault, for a client's mistake).
async fn malformed_body_is_invalid_argument(cluster: &meridian_cli::LocalCluster) {
    let address = cluster.client_addr(1).unwrap();
    let mut grpc = tonic::client::Grpc::new(channel(&address).await);
    grpc.ready().await.expect("ready");
    let path = tonic::codegen::http::uri::PathAndQuery::from_static("/meridian.v1.Kv/Put");
    // Field 1 with wire type 7 (invalid).
    let garbage = Bytes::from_static(&[0x0f, 0xff, 0xff, 0xff]);
    let status = grpc
        .unary(tonic::Request::new(garbage), path, RawCodec)
        .await
        .expect_err("garbage is refused");
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert_eq!(meridian_code(&status), "INVALID_ARGUMENT", "{status:?}");
}

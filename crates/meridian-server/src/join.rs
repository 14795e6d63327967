//! Joining a running cluster: `meridian start --join ADDR`.
//!
//! # What a member is
//! The founding members are the configuration's `initial_cluster`; every founding member
//! computes the founding shard map from it (`shard_map`). A node that joins later is recorded
//! in the stored shard map itself (`ShardMap::joined`), so it travels the way replica moves do
//! (`membership`): written by compare-and-swap to the next version in the metadata shard,
//! pushed to every member, adopted (persisted, then acted on) by each, read at every start.
//! A member learns of a join when it adopts that map: from then on it pings the new node,
//! sends it closed timestamps, counts it in the clock fence, and can move replicas to it.
//!
//! # The exchange
//! 1. The joining node binds its listeners, then asks ADDR (any member's client address)
//!    `Cluster.Join` with its id, addresses, region and zone.
//! 2. That member checks the id and peer address are nobody's, stores the map with the node
//!    joined and pushes it, then answers what the joining node needs to compute the same
//!    founding map: the founding members, the replication factor, the split points, the home
//!    regions, `max_offset_ms`, and the cluster id they make.
//! 3. The joining node checks it computes that cluster id, writes the answer to
//!    `DATA_DIR/joined.json` (fsynced, then renamed into place), and starts as a founding member
//!    whose founding map places nothing on it. It registers its client address in the
//!    metadata shard as every member does, learns the stored map (which lists it) from that
//!    registration, and hosts replicas once moves place them (`cluster add-replica`,
//!    `cluster decommission`).
//!
//! A restart reads `joined.json` and asks nobody (`--join` is then ignored). A node that died
//! between the join and writing the file asks again: a join is idempotent for the same id,
//! addresses and location.
//!
//! **Forgetting** ([`forget`], `Cluster.Forget`, `meridian cluster forget NODE`) is the way
//! out: a member that no shard lists as a replica, and that no Raft group hosted by the asked
//! node still counts (a move under way), is added to the map's `forgotten` list by the same
//! compare-and-swap. Every member then drops it from its peers (no pings, closed timestamps or
//! clock-fence vote), from `Status`, and refuses its Raft messages (`PERMISSION_DENIED`).
//! A forgotten node still running learns it from the first ping a member refuses, and stops
//! (exit status 79, `meridian_raft::host::EXIT_FORGOTTEN`); restarted, it stops again.
//!
//! # Invariants
//! - A node id is never reused: a join naming a member's id (founding, joined or forgotten)
//!   is refused, as is a peer address a member has.
//! - A joined node never initializes a Raft group: the founding map places no replica on it,
//!   and a replica a move places is fed by its group's leader.
//!
//! # Not done yet
//! - Only the asked node's own Raft groups are checked for a move still counting the node
//!   being forgotten; a group it does not host is trusted to the map. A forgotten node cut off
//!   from every member keeps running until a ping reaches one.
//! - The joining node's own `--max-offset-ms`, `--initial-shards`, `--home-regions` and the
//!   like are replaced by the cluster's; its other settings (GC, closed timestamps, Raft
//!   timing) are its own, as they are for a founding member.
//! - `peer_dial` on a member that was running when a node joined applies to the new node only
//!   once that member learns of it (the next map it adopts).

use crate::config::{Member, NodeConfig};
use crate::error::{Result, ServerError};
use crate::node::Node;
use meridian_proto::kv::{JoinRequest, JoinResponse};
use meridian_raft::types::NodeId;
use openraft::type_config::async_runtime::WatchReceiver;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The file in the data directory that records a joined node's founding configuration.
pub const JOINED_FILE: &str = "joined.json";
/// The deadline of one `Cluster.Join` call.
const JOIN_CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a joining node keeps asking (the member unreachable or the metadata shard
/// without a leader) before it gives up.
const JOIN_PATIENCE: Duration = Duration::from_secs(60);

/// What `joined.json` holds: the cluster's founding parameters, as the member that admitted
/// this node answered them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JoinedRecord {
    pub initial_cluster: Vec<String>,
    pub replication_factor: u32,
    pub initial_shards: u32,
    pub split_points: Vec<String>,
    pub home_regions: Vec<String>,
    /// Absent from records written before replica constraints existed.
    #[serde(default)]
    pub replica_constraints: Vec<String>,
    pub max_offset_ms: u64,
    pub cluster_id: String,
    /// The member this node joined through, for the record.
    pub joined_via: String,
}

/// Server side: admits `req`'s node (see the module docs).
pub async fn admit(node: &Node, req: JoinRequest) -> Result<JoinResponse> {
    let member = requested_member(&req).map_err(ServerError::InvalidArgument)?;
    let founders = node.config.initial_cluster.clone();
    let version = crate::membership::change_map(node, |map| {
        map.with_member_joined(&member, &founders)
            .map_err(ServerError::InvalidArgument)
    })
    .await?;
    tracing::info!(
        node = member.node_id,
        peer = %member.peer_addr,
        region = %member.region,
        version,
        "a node joined the cluster"
    );
    let c = &node.config.cluster;
    Ok(JoinResponse {
        initial_cluster: founders.iter().map(member_text).collect(),
        replication_factor: c.replication_factor,
        initial_shards: c.initial_shards,
        split_points: c.split_points.clone(),
        home_regions: c.home_regions.clone(),
        replica_constraints: c.replica_constraints.clone(),
        max_offset_ms: c.max_offset_ms,
        cluster_id: node.cluster_id.clone(),
        map_version: version,
    })
}

/// Serves a `Cluster.Forget`: lists `node` as forgotten in the stored map, once no shard lists
/// it and no Raft group this node hosts counts it (a move still under way may).
pub async fn forget(node: &Node, id: NodeId) -> Result<u64> {
    let founders = node.config.initial_cluster.clone();
    // The map's reasons first (an unknown id, replicas it still lists): they name the fix.
    node.map()
        .with_member_forgotten(id, &founders)
        .map_err(ServerError::InvalidArgument)?;
    if id == node.config.node_id {
        return Err(ServerError::InvalidArgument(format!(
            "node {id} cannot forget itself; ask another member"
        )));
    }
    for replica in node.host.replicas() {
        let metrics = replica.raft.metrics().borrow_watched().clone();
        let membership = metrics.membership_config.membership();
        if membership
            .voter_ids()
            .chain(membership.learner_ids())
            .any(|n| n == id)
        {
            return Err(ServerError::InvalidArgument(format!(
                "node {id} is still in shard {}'s Raft group (a move under way?); let it \
                 finish (cluster status, MOVES) and ask again",
                replica.shard
            )));
        }
    }
    let version = crate::membership::change_map(node, |map| {
        map.with_member_forgotten(id, &founders)
            .map_err(ServerError::InvalidArgument)
    })
    .await?;
    tracing::info!(node = id, version, "forgot a member");
    Ok(version)
}

/// The member `req` describes, or why it is not one.
fn requested_member(req: &JoinRequest) -> std::result::Result<Member, String> {
    if req.node_id == 0 {
        return Err("node id 0 is reserved; use an id > 0".into());
    }
    req.client_addr
        .parse::<std::net::SocketAddr>()
        .map_err(|e| format!("client address {:?}: {e}", req.client_addr))?;
    let field = |what: &str, v: &str| -> std::result::Result<(), String> {
        if v.is_empty()
            || v.len() > 64
            || v.contains(['@', '/', ',', '='])
            || v.contains(char::is_whitespace)
        {
            return Err(format!(
                "{what} {v:?} must be 1 to 64 characters without spaces, '@', '/', ',' or '='"
            ));
        }
        Ok(())
    };
    field("region", &req.region)?;
    field("zone", &req.zone)?;
    Member::parse(&format!(
        "{}={}@{}/{}",
        req.node_id, req.peer_addr, req.region, req.zone
    ))
}

/// `id=peer_addr@region/zone`, as `initial_cluster` lists a member.
fn member_text(m: &Member) -> String {
    format!("{}={}@{}/{}", m.node_id, m.peer_addr, m.region, m.zone)
}

/// Joining side: completes `config` (its `initial_cluster` and the cluster's founding
/// parameters) from `joined.json`, or, on a first start, by joining through `config.join`.
/// Does nothing for a founding member.
pub async fn prepare(config: &mut NodeConfig) -> anyhow::Result<()> {
    let path = config.data_dir.join(JOINED_FILE);
    let record = match read_record(&path)? {
        Some(record) => {
            if let Some(via) = &config.join {
                tracing::info!(%via, joined_via = %record.joined_via, "this node joined the cluster before; --join is ignored");
            }
            record
        }
        None => {
            let Some(via) = config.join.clone() else {
                return Ok(());
            };
            let record = ask(config, &via).await?;
            std::fs::create_dir_all(&config.data_dir).map_err(|e| {
                anyhow::anyhow!("cannot create data_dir {}: {e}", config.data_dir.display())
            })?;
            write_record(&path, &record)?;
            record
        }
    };
    apply(config, &record)
}

/// Fills `config` from `record`, and checks it makes the cluster id the member answered.
fn apply(config: &mut NodeConfig, record: &JoinedRecord) -> anyhow::Result<()> {
    let mut founders = Vec::new();
    for (i, s) in record.initial_cluster.iter().enumerate() {
        founders.push(
            Member::parse(s)
                .map_err(|e| anyhow::anyhow!("{JOINED_FILE}: initial_cluster[{i}]: {e}"))?,
        );
    }
    if founders.iter().any(|m| m.node_id == config.node_id) {
        anyhow::bail!(
            "node {} is a founding member of the cluster it joined; start it with initial_cluster, not --join",
            config.node_id
        );
    }
    let c = &mut config.cluster;
    c.replication_factor = record.replication_factor;
    c.initial_shards = record.initial_shards;
    c.split_points = record.split_points.clone();
    c.home_regions = record.home_regions.clone();
    c.replica_constraints = record.replica_constraints.clone();
    c.max_offset_ms = record.max_offset_ms;
    (config.home_regions, config.replica_constraints) = crate::home::parse_rules(c, &founders)?;
    config.initial_cluster = founders;
    let id = crate::node::founding_cluster_id(config);
    if id != record.cluster_id {
        anyhow::bail!(
            "the cluster's founding configuration gives cluster id {id} here, but the member \
             answered {}; this build and the cluster's disagree on the founding map",
            record.cluster_id
        );
    }
    Ok(())
}

/// Asks `via` to admit this node, retrying while it cannot (bounded by [`JOIN_PATIENCE`]).
async fn ask(config: &NodeConfig, via: &str) -> anyhow::Result<JoinedRecord> {
    let request = JoinRequest {
        node_id: config.node_id,
        peer_addr: config.peer_addr.to_string(),
        client_addr: config.client_addr.to_string(),
        region: config.region.clone(),
        zone: config.zone.clone(),
    };
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{via}"))
        .map_err(|e| anyhow::anyhow!("--join {via:?} is not an address: {e}"))?
        .connect_timeout(Duration::from_secs(5))
        .timeout(JOIN_CALL_TIMEOUT);
    let give_up = Instant::now() + JOIN_PATIENCE;
    let mut delay = Duration::from_millis(200);
    loop {
        let answer = match endpoint.connect().await {
            Ok(channel) => {
                let mut client = meridian_proto::kv::cluster_client::ClusterClient::new(channel);
                client
                    .join(request.clone())
                    .await
                    .map(|r| r.into_inner())
                    .map_err(|s| (s.code(), s.message().to_string()))
            }
            Err(e) => Err((tonic::Code::Unavailable, format!("cannot connect: {e}"))),
        };
        match answer {
            Ok(reply) => {
                eprintln!(
                    "joined the cluster through {via} as node {} (shard map version {})",
                    config.node_id, reply.map_version
                );
                return Ok(JoinedRecord {
                    initial_cluster: reply.initial_cluster,
                    replication_factor: reply.replication_factor,
                    initial_shards: reply.initial_shards,
                    split_points: reply.split_points,
                    home_regions: reply.home_regions,
                    replica_constraints: reply.replica_constraints,
                    max_offset_ms: reply.max_offset_ms,
                    cluster_id: reply.cluster_id,
                    joined_via: via.to_string(),
                });
            }
            Err((tonic::Code::InvalidArgument, why)) => {
                anyhow::bail!(
                    "the cluster refused to let node {} join: {why}",
                    config.node_id
                )
            }
            Err((code, why)) if Instant::now() + delay < give_up => {
                eprintln!("joining through {via}: {code:?}: {why}; asking again in {delay:?}");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(5));
            }
            Err((code, why)) => anyhow::bail!(
                "could not join through {via} within {} s: {code:?}: {why}",
                JOIN_PATIENCE.as_secs()
            ),
        }
    }
}

fn read_record(path: &Path) -> anyhow::Result<Option<JoinedRecord>> {
    match std::fs::read(path) {
        Ok(raw) => serde_json::from_slice(&raw)
            .map(Some)
            .map_err(|e| anyhow::anyhow!("{} does not parse: {e}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(anyhow::anyhow!("cannot read {}: {e}", path.display())),
    }
}

/// Writes `record` durably: a temporary file, fsynced, renamed over `path`, the directory
/// fsynced, so a crash leaves either no record or the whole one.
fn write_record(path: &Path, record: &JoinedRecord) -> anyhow::Result<()> {
    use std::io::Write;
    let tmp: PathBuf = path.with_extension("json.tmp");
    let raw = serde_json::to_vec_pretty(record)?;
    let mut f = std::fs::File::create(&tmp)
        .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", tmp.display()))?;
    f.write_all(&raw)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(id: u64) -> JoinRequest {
        JoinRequest {
            node_id: id,
            peer_addr: "127.0.0.1:7104".into(),
            client_addr: "127.0.0.1:7004".into(),
            region: "us-east".into(),
            zone: "b".into(),
        }
    }

    #[test]
    fn a_join_request_with_bad_fields_is_refused_with_the_field_named() {
        assert!(requested_member(&request(4)).is_ok());
        assert!(requested_member(&request(0))
            .unwrap_err()
            .contains("reserved"));
        let mut bad = request(4);
        bad.peer_addr = "nowhere".into();
        assert!(requested_member(&bad).unwrap_err().contains("peer address"));
        let mut bad = request(4);
        bad.client_addr = "nowhere".into();
        assert!(requested_member(&bad)
            .unwrap_err()
            .contains("client address"));
        let mut bad = request(4);
        bad.region = "us/east".into();
        assert!(requested_member(&bad).unwrap_err().contains("region"));
        let mut bad = request(4);
        bad.zone = String::new();
        assert!(requested_member(&bad).unwrap_err().contains("zone"));
    }

    #[test]
    fn the_record_is_written_whole_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(JOINED_FILE);
        assert_eq!(read_record(&path).unwrap(), None);
        let record = JoinedRecord {
            initial_cluster: vec!["1=127.0.0.1:7101@us-east/a".into()],
            replication_factor: 1,
            initial_shards: 8,
            split_points: vec![],
            home_regions: vec![],
            replica_constraints: vec![":-zone=b".into()],
            max_offset_ms: 500,
            cluster_id: "mer-0".into(),
            joined_via: "127.0.0.1:7001".into(),
        };
        write_record(&path, &record).unwrap();
        assert_eq!(read_record(&path).unwrap(), Some(record.clone()));
        // A record written before replica constraints existed reads as having none.
        let mut older: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        older.as_object_mut().unwrap().remove("replica_constraints");
        std::fs::write(&path, serde_json::to_vec(&older).unwrap()).unwrap();
        let read = read_record(&path).unwrap().unwrap();
        assert!(read.replica_constraints.is_empty());
        assert_eq!(read.cluster_id, record.cluster_id);
        std::fs::write(&path, b"{").unwrap();
        assert!(read_record(&path)
            .unwrap_err()
            .to_string()
            .contains("does not parse"));
    }
}

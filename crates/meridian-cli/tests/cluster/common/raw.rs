//! Raw `Kv` requests sent straight to a shard's leader, for tests that must see what a node
//! answers before the client's own handling (lock waits, recovery, retries) hides it.

use bytes::Bytes;
use meridian_client::proto::{self, kv_client::KvClient};
use meridian_client::Error;
use std::time::Duration;

/// Bound on one raw request.
const RPC_TIMEOUT: Duration = Duration::from_secs(5);
/// Rounds over every endpoint before `at_leader` gives up.
const LEADER_ROUNDS: usize = 20;

/// Sends `call` to each node in turn until one that leads the shard answers (anything but
/// `NOT_LEADER` or a transport error); returns that answer.
pub async fn at_leader<T, F, Fut>(endpoints: &[String], mut call: F) -> Result<T, Error>
where
    F: FnMut(KvClient<tonic::transport::Channel>) -> Fut,
    Fut: std::future::Future<Output = Result<T, tonic::Status>>,
{
    let mut last = None;
    for _ in 0..LEADER_ROUNDS {
        for endpoint in endpoints {
            let channel = tonic::transport::Endpoint::from_shared(format!("http://{endpoint}"))
                .expect("endpoint")
                .timeout(RPC_TIMEOUT)
                .connect()
                .await;
            let Ok(channel) = channel else { continue };
            match call(KvClient::new(channel)).await {
                Ok(answer) => return Ok(answer),
                Err(status) => match Error::from_status(&status, endpoint) {
                    e @ (Error::NotLeader { .. } | Error::Transport { .. }) => last = Some(e),
                    other => return Err(other),
                },
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no leader answered: {last:?}");
}

/// A raw linearizable read of `key` at its leader: `Locked` while a lock is in the way (it
/// never waits for or recovers anything), else the value.
pub async fn raw_get(endpoints: &[String], key: &str) -> Result<proto::GetResponse, Error> {
    at_leader(endpoints, |mut kv| async move {
        kv.get(proto::GetRequest {
            key: Bytes::copy_from_slice(key.as_bytes()),
            ..Default::default()
        })
        .await
        .map(|r| r.into_inner())
    })
    .await
}

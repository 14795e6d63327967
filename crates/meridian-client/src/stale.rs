//! Stale reads from the nearest replica (see the server's `kv_follower` for what they
//! promise): [`Client::get_with`], [`Client::stale_snapshot`] (many keys, on any shards, read
//! at one timestamp), and the routing rule every stale read follows.
//!
//! # Routing
//! A stale read ([`ReadConsistency::BoundedStaleness`], `ExactStaleness`, `AsOf`) from a
//! client with a [`crate::ClientConfig::region`] goes first to a live, non-suspect replica of
//! the shard in that region (rotating over them by attempt). If that replica cannot serve it
//! (`NOT_LEADER`: its closed timestamp does not cover the read; `LOCKED`: an intent it cannot
//! judge; `UNAVAILABLE` or a transport failure), the rest of the call goes to the leader,
//! which serves every stale read (fresh for a bounded one). Without a region, or with no
//! replica there, a stale read goes to the leader.
//!
//! A multi-page stale scan reads its later pages `AsOf` the first page's `read_ts`, so the
//! whole scan is one snapshot (see `multi`).
//!
//! # Stale snapshots
//! [`StaleSnapshot`] is a read-only transaction over stale reads: its first read is an
//! `ExactStaleness` read, served by the nearest replica at that replica's clock minus the
//! staleness, and every later read is `AsOf` the first one's `read_ts`. Every key it reads, on
//! any shard, is therefore its state at one timestamp — a consistent snapshot, as a read-only
//! transaction's reads are, but served near the client and without a leader round. It sees
//! every write committed at or below that timestamp and none above (a replica serves an
//! `AsOf` read only once its closed timestamp covers it, and waits out or refuses intents).
//!
//! A stale snapshot's [`StaleSnapshot::scan`] pages across shards like any stale scan, at the
//! snapshot's timestamp (its first page fixes it if nothing did before).
//!
//! # Not done yet
//! - The nearest replica is the one in the client's region; no latency measurements.
//! - Stale snapshots read keys one by one (keys after the first concurrently), not one
//!   `BatchGet` per shard; their scans are forward only.

use crate::error::{Error, Result};
use crate::routing::{RoutingState, Target};
use crate::snapshot::SnapRead;
use crate::{Client, KeyValue, ReadConsistency};
use bytes::Bytes;
use meridian_types::Timestamp;
use std::time::{Duration, Instant};

/// One stale (or linearizable) read's answer with where and when it was served.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StaleRead {
    /// The value (`None`: absent or deleted at `read_ts`).
    pub value: Option<Bytes>,
    /// The version's timestamp (`None` when absent).
    pub version_ts: Option<Timestamp>,
    /// The timestamp the read was served at: the answer is the key's state then.
    pub read_ts: Timestamp,
    /// The node that served it.
    pub served_by: u64,
}

/// A replica of `shard_id` in `region` for attempt number `attempt`: live in the cached map
/// and not suspect, rotating over those there; `None` if there is none.
pub(crate) fn nearest_target(
    state: &RoutingState,
    shard_id: u64,
    region: &str,
    attempt: u32,
    now: Instant,
) -> Option<Target> {
    let shard = state.map.shard(shard_id)?;
    let local: Vec<(u64, String)> = shard
        .replicas
        .iter()
        .filter_map(|id| state.map.nodes().get(id))
        .filter(|n| n.region == region && n.live && !state.is_suspect(n.node_id, now))
        .map(|n| (n.node_id, n.address.clone()))
        .collect();
    if local.is_empty() {
        return None;
    }
    let (node_id, address) = local[attempt as usize % local.len()].clone();
    Some(Target {
        shard_id,
        node_id,
        address,
        generation: shard.generation,
    })
}

impl Client {
    /// Reads `key` with `consistency` (whatever the client's configured one): a stale read
    /// is served by the nearest replica that can (see the module docs). Returns the value
    /// with the timestamp it was read at and the node that served it.
    pub async fn get_with(
        &self,
        key: impl Into<Bytes>,
        consistency: ReadConsistency,
    ) -> Result<StaleRead> {
        let reply = self.get_call(key.into(), consistency).await?;
        Ok(StaleRead {
            value: reply.found.then_some(reply.value),
            version_ts: reply.found.then_some(Timestamp(reply.version_ts)),
            read_ts: Timestamp(reply.read_ts),
            served_by: reply.served_by,
        })
    }
}

/// A read-only snapshot over stale reads: every read at one timestamp, `staleness` behind the
/// clock of the replica that serves the first read (see the module docs).
pub struct StaleSnapshot<'c> {
    client: &'c Client,
    staleness: Duration,
    read_ts: Option<Timestamp>,
}

impl Client {
    /// A stale snapshot whose reads all happen at one timestamp, `staleness` behind now.
    pub fn stale_snapshot(&self, staleness: Duration) -> StaleSnapshot<'_> {
        StaleSnapshot {
            client: self,
            staleness,
            read_ts: None,
        }
    }
}

impl StaleSnapshot<'_> {
    /// The snapshot's timestamp, once its first read has fixed it.
    pub fn read_ts(&self) -> Option<Timestamp> {
        self.read_ts
    }

    fn consistency(&self) -> ReadConsistency {
        match self.read_ts {
            Some(ts) => ReadConsistency::AsOf(ts),
            None => ReadConsistency::ExactStaleness {
                staleness: self.staleness,
            },
        }
    }

    /// Reads `key` at the snapshot's timestamp (the first read fixes it).
    pub async fn get(&mut self, key: impl Into<Bytes>) -> Result<StaleRead> {
        let read = self.client.get_with(key, self.consistency()).await?;
        self.read_ts.get_or_insert(read.read_ts);
        Ok(read)
    }

    /// Reads `keys` at the snapshot's timestamp, in input order: the first alone (if the
    /// timestamp is not fixed yet), the rest at most `max_parallel_shard_requests` at a time.
    /// At most `MAX_BATCH_KEYS` keys, as any batch.
    pub async fn batch_get<K: Into<Bytes>>(
        &mut self,
        keys: impl IntoIterator<Item = K>,
    ) -> Result<Vec<StaleRead>> {
        use futures::{StreamExt, TryStreamExt};
        let keys: Vec<Bytes> = keys.into_iter().map(Into::into).collect();
        crate::validate::batch_len(keys.len())?;
        let mut out = Vec::with_capacity(keys.len());
        let mut rest = keys.into_iter();
        if self.read_ts.is_none() {
            match rest.next() {
                Some(first) => out.push(self.get(first).await?),
                None => return Ok(out),
            }
        }
        let consistency = self.consistency();
        let reads: Vec<StaleRead> = futures::stream::iter(rest)
            .map(|key| self.client.get_with(key, consistency))
            .buffered(self.client.config().max_parallel_shard_requests)
            .try_collect()
            .await?;
        out.extend(reads);
        Ok(out)
    }

    /// Up to `limit` rows of `[start, end)` (`end` `None` = to the end of the keyspace),
    /// ascending, at the snapshot's timestamp (the scan's first page fixes it if no read did).
    /// Pages across shards; every page is served near the client when a replica there can.
    pub async fn scan(
        &mut self,
        start: impl Into<Bytes>,
        end: Option<Bytes>,
        limit: u32,
    ) -> Result<Vec<KeyValue>> {
        let mut consistency = self.consistency();
        let rows = match self
            .client
            .scan_pages(
                start.into(),
                end,
                limit,
                false,
                None,
                Some(&mut consistency),
            )
            .await?
        {
            SnapRead::Done(rows) => rows,
            SnapRead::Uncertain(_) => {
                return Err(Error::internal("uncertain reply to a stale scan"));
            }
        };
        if let ReadConsistency::AsOf(ts) = consistency {
            self.read_ts.get_or_insert(ts);
        }
        Ok(rows)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::{NodeRoute, ShardMap, ShardRoute};

    fn state() -> RoutingState {
        let node = |id: u64, region: &str| NodeRoute {
            node_id: id,
            address: format!("127.0.0.1:700{id}"),
            region: region.into(),
            zone: "a".into(),
            live: true,
        };
        let shard = ShardRoute {
            shard_id: 1,
            start: Bytes::new(),
            end: Bytes::new(),
            replicas: vec![1, 2, 3, 4],
            leader_id: Some(1),
            generation: 1,
        };
        let mut state = RoutingState::default();
        state.install(ShardMap::new(
            "c",
            [shard],
            [node(1, "us"), node(2, "eu"), node(3, "ap"), node(4, "ap")],
        ));
        state
    }

    /// A stale read goes to a replica in the client's region (rotating over them), never to
    /// a suspect one, and to none when the region has no replica.
    #[test]
    fn the_nearest_replica_is_a_live_one_in_the_clients_region() {
        let mut state = state();
        let now = Instant::now();
        let pick = |state: &RoutingState, region, attempt| {
            nearest_target(state, 1, region, attempt, now).map(|t| t.node_id)
        };
        assert_eq!(pick(&state, "eu", 0), Some(2));
        assert_eq!(pick(&state, "ap", 0), Some(3));
        assert_eq!(pick(&state, "ap", 1), Some(4));
        assert_eq!(pick(&state, "mars", 0), None);
        assert_eq!(
            nearest_target(&state, 9, "eu", 0, now),
            None,
            "unknown shard"
        );
        state.note_node_failure(3, now);
        assert_eq!(
            pick(&state, "ap", 0),
            Some(4),
            "the suspect node is skipped"
        );
        state.note_node_failure(2, now);
        assert_eq!(pick(&state, "eu", 0), None);
    }
}

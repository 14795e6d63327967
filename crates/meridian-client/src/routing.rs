//! The routing cache: which shard owns a key, and which node to ask about that shard.
//!
//! ```text
//!   key ──► ShardMap (data shards sorted by start) ──► ShardRoute { replicas, leader }
//!                                                          │
//!                        leader known and not suspect ─────┴──► that node
//!                        otherwise ──────────────────────────► a non-suspect replica,
//!                                                               live ones first,
//!                                                               rotating per attempt
//! ```
//!
//! The map comes from `Cluster.Status` (any node answers it). Shard 0, the metadata group,
//! owns no user keys and is left out. Ranges are `[start, end)`; an empty `start` is the
//! beginning of the keyspace and an empty `end` its end.
//!
//! Leaders are learnt three ways: from Status, from `NOT_LEADER` hints, and by forgetting a
//! leader that failed at the transport level. A node that failed at the transport level is
//! *suspect* for [`SUSPECT_FOR`]: it is not chosen (nor is a hint naming it followed) while a
//! non-suspect replica exists, so a dead leader does not absorb every retry until the next
//! election shows up in Status.
//!
//! # Invariants
//! - `ShardMap::shards` is sorted by `start`; lookups are binary searches.
//! - Everything here is pure (time is passed in), so it is unit-tested without a cluster.
//!
//! # Not done yet
//! - Ranges are trusted as served; overlapping ranges from a buggy server route to the one
//!   with the greater start.
//! - No proximity preference (nearest region) for follower reads: every call goes to the leader.

use crate::error::LeaderHint;
use bytes::Bytes;
use meridian_proto::kv::StatusResponse;
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

/// How long a node that failed at the transport level is avoided.
pub const SUSPECT_FOR: Duration = Duration::from_secs(2);

/// One data shard as the client routes to it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardRoute {
    pub shard_id: u64,
    /// Inclusive; empty = the beginning of the keyspace.
    pub start: Bytes,
    /// Exclusive; empty = the end of the keyspace.
    pub end: Bytes,
    pub replicas: Vec<u64>,
    /// The cached leader, if known.
    pub leader_id: Option<u64>,
    /// The shard's range generation (`ShardInfo.generation`; 0 = not reported): sent with
    /// every request routed by this entry, so a node whose map disagrees answers `WRONG_SHARD`.
    pub generation: u64,
}

impl ShardRoute {
    /// Whether `key` is in `[start, end)`.
    pub fn contains(&self, key: &[u8]) -> bool {
        key >= self.start.as_ref() && (self.end.is_empty() || key < self.end.as_ref())
    }
}

/// A node as the client knows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeRoute {
    pub node_id: u64,
    /// Client address (`host:port`).
    pub address: String,
    pub region: String,
    pub zone: String,
    /// Whether the node that answered Status could reach it.
    pub live: bool,
}

/// A snapshot of the cluster's data shards and nodes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ShardMap {
    pub cluster_id: String,
    shards: Vec<ShardRoute>,
    nodes: BTreeMap<u64, NodeRoute>,
}

impl ShardMap {
    /// Builds a map from data shards and nodes (sorts the shards; drops shard 0).
    pub fn new(
        cluster_id: impl Into<String>,
        shards: impl IntoIterator<Item = ShardRoute>,
        nodes: impl IntoIterator<Item = NodeRoute>,
    ) -> ShardMap {
        let mut shards: Vec<ShardRoute> = shards.into_iter().filter(|s| s.shard_id != 0).collect();
        shards.sort_by(|a, b| a.start.cmp(&b.start));
        ShardMap {
            cluster_id: cluster_id.into(),
            shards,
            nodes: nodes.into_iter().map(|n| (n.node_id, n)).collect(),
        }
    }

    /// Builds a map from a `Cluster.Status` answer.
    pub fn from_status(status: &StatusResponse) -> ShardMap {
        let shards = status.shards.iter().map(|s| ShardRoute {
            shard_id: s.shard_id,
            start: s.start.clone(),
            end: s.end.clone(),
            replicas: s.replicas.clone(),
            leader_id: (s.leader_id != 0).then_some(s.leader_id),
            generation: s.generation,
        });
        let nodes = status
            .nodes
            .iter()
            .filter(|n| n.node_id != 0 && !n.client_addr.is_empty())
            .map(|n| NodeRoute {
                node_id: n.node_id,
                address: n.client_addr.clone(),
                region: n.region.clone(),
                zone: n.zone.clone(),
                live: n.live,
            });
        ShardMap::new(status.cluster_id.clone(), shards, nodes)
    }

    /// Data shards sorted by start key.
    pub fn shards(&self) -> &[ShardRoute] {
        &self.shards
    }

    /// Known nodes by id.
    pub fn nodes(&self) -> &BTreeMap<u64, NodeRoute> {
        &self.nodes
    }

    pub fn is_empty(&self) -> bool {
        self.shards.is_empty()
    }

    fn index_for_key(&self, key: &[u8]) -> Option<usize> {
        let after = self.shards.partition_point(|s| s.start.as_ref() <= key);
        let index = after.checked_sub(1)?;
        self.shards[index].contains(key).then_some(index)
    }

    /// The shard that owns `key`, if the map covers it.
    ///
    /// ```
    /// use bytes::Bytes;
    /// use meridian_client::{ShardMap, ShardRoute};
    /// let shard = |id, start: &'static str, end: &'static str| ShardRoute {
    ///     shard_id: id, start: Bytes::from(start), end: Bytes::from(end),
    ///     replicas: vec![1, 2, 3], leader_id: None, generation: 1,
    /// };
    /// let map = ShardMap::new("c", [shard(2, "m", ""), shard(1, "", "m")], []);
    /// assert_eq!(map.shard_for_key(b"a").unwrap().shard_id, 1);
    /// assert_eq!(map.shard_for_key(b"m").unwrap().shard_id, 2);
    /// ```
    pub fn shard_for_key(&self, key: &[u8]) -> Option<&ShardRoute> {
        self.index_for_key(key).map(|i| &self.shards[i])
    }

    /// The shard owning the greatest key below the exclusive bound `end` (empty = +inf): where a
    /// reverse scan ending at `end` starts.
    pub fn shard_below(&self, end: &[u8]) -> Option<&ShardRoute> {
        if end.is_empty() {
            return self.shards.last().filter(|s| s.end.is_empty());
        }
        let after = self.shards.partition_point(|s| s.start.as_ref() < end);
        let shard = &self.shards[after.checked_sub(1)?];
        (shard.end.is_empty() || end <= shard.end.as_ref()).then_some(shard)
    }

    /// The shard with this id.
    pub fn shard(&self, shard_id: u64) -> Option<&ShardRoute> {
        self.shards.iter().find(|s| s.shard_id == shard_id)
    }

    fn shard_mut(&mut self, shard_id: u64) -> Option<&mut ShardRoute> {
        self.shards.iter_mut().find(|s| s.shard_id == shard_id)
    }

    /// Groups keys by owning shard: `(shard_id, positions in the input)` with positions in
    /// input order, groups in shard order. `Err(position)` names the first key no shard owns.
    pub fn group_by_shard<'a, I>(&self, keys: I) -> Result<Vec<(u64, Vec<usize>)>, usize>
    where
        I: IntoIterator<Item = &'a [u8]>,
    {
        let mut groups: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for (position, key) in keys.into_iter().enumerate() {
            let index = self.index_for_key(key).ok_or(position)?;
            groups.entry(index).or_default().push(position);
        }
        Ok(groups
            .into_iter()
            .map(|(index, positions)| (self.shards[index].shard_id, positions))
            .collect())
    }
}

/// The node chosen for one attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Target {
    pub shard_id: u64,
    pub node_id: u64,
    pub address: String,
    /// The shard's range generation in the cached map (0 = unknown: no route is sent).
    pub generation: u64,
}

/// A request message that carries a [`meridian_proto::kv::Route`]: each attempt sends a copy
/// routed by that attempt's target.
pub(crate) trait Routed: Clone {
    fn routed(&self, route: Option<meridian_proto::kv::Route>) -> Self;
}

macro_rules! routed {
    ($($t:ident),*) => {$(
        impl Routed for meridian_proto::kv::$t {
            fn routed(&self, route: Option<meridian_proto::kv::Route>) -> Self {
                let mut message = self.clone();
                message.route = route;
                message
            }
        }
    )*};
}
routed!(
    GetRequest,
    PutRequest,
    DeleteRequest,
    CasRequest,
    ScanRequest,
    BatchGetRequest,
    BatchPutRequest,
    CommitRequest,
    ResolveRequest,
    ReleaseLocksRequest
);

impl Target {
    /// What the request tells the node about how it was routed.
    pub fn route(&self) -> Option<meridian_proto::kv::Route> {
        (self.generation > 0).then_some(meridian_proto::kv::Route {
            shard_id: self.shard_id,
            generation: self.generation,
        })
    }
}

/// The shard map plus what the client learnt since fetching it.
#[derive(Debug, Default)]
pub(crate) struct RoutingState {
    pub map: ShardMap,
    /// Bumped on every installed map; callers use it to skip redundant refreshes.
    pub generation: u64,
    suspects: HashMap<u64, Instant>,
}

impl RoutingState {
    /// Installs a freshly fetched map. A leader the new map does not know (leader_id 0) keeps
    /// the cached one if that node is still a replica: a follower answering Status during an
    /// election should not erase a good hint.
    pub fn install(&mut self, mut map: ShardMap) {
        for shard in &mut map.shards {
            if shard.leader_id.is_none() {
                if let Some(old) = self.map.shard(shard.shard_id) {
                    shard.leader_id = old.leader_id.filter(|id| shard.replicas.contains(id));
                }
            }
        }
        // Keep addresses learnt from hints for nodes the new map does not list.
        for (id, node) in &self.map.nodes {
            map.nodes.entry(*id).or_insert_with(|| node.clone());
        }
        self.map = map;
        self.generation += 1;
    }

    pub fn is_suspect(&self, node_id: u64, now: Instant) -> bool {
        self.suspects
            .get(&node_id)
            .is_some_and(|until| *until > now)
    }

    /// The node to ask about `shard_id` on attempt number `attempt`.
    pub fn target(&self, shard_id: u64, attempt: u32, now: Instant) -> Option<Target> {
        let shard = self.map.shard(shard_id)?;
        let address_of = |node_id: u64| self.map.nodes.get(&node_id).map(|n| n.address.clone());
        let make = |node_id: u64| {
            address_of(node_id).map(|address| Target {
                shard_id,
                node_id,
                address,
                generation: shard.generation,
            })
        };
        if let Some(leader) = shard.leader_id {
            if !self.is_suspect(leader, now) {
                if let Some(target) = make(leader) {
                    return Some(target);
                }
            }
        }
        // Leader unknown or suspect: rotate over replicas with an address; any of them
        // redirects us. Replicas the map reports live come first (a dead node's address may
        // black-hole the connect until its timeout); the others stay in the rotation, as
        // liveness is only the answering node's view. From the attempt's place in that order,
        // the first non-suspect replica is taken (wrapping), so a suspect's turn goes to the
        // next replica in order rather than shifting everyone else's; if all are suspect, the
        // one at the attempt's place.
        let live = |id: &u64| self.map.nodes.get(id).is_some_and(|n| n.live);
        let mut candidates: Vec<u64> = shard
            .replicas
            .iter()
            .copied()
            .filter(|id| address_of(*id).is_some())
            .collect();
        if candidates.is_empty() {
            return None;
        }
        candidates.sort_by_key(|id| !live(id));
        let start = attempt as usize % candidates.len();
        let chosen = (0..candidates.len())
            .map(|step| candidates[(start + step) % candidates.len()])
            .find(|id| !self.is_suspect(*id, now))
            .unwrap_or(candidates[start]);
        make(chosen)
    }

    /// Records a `NOT_LEADER` answer from `from_node`. Returns whether the hint is worth an
    /// immediate retry (it names another, non-suspect node).
    pub fn note_not_leader(
        &mut self,
        shard_id: u64,
        from_node: u64,
        hint: Option<&LeaderHint>,
        now: Instant,
    ) -> bool {
        let usable = hint.filter(|h| h.node_id != from_node && !self.is_suspect(h.node_id, now));
        if let Some(hint) = usable {
            let node = self
                .map
                .nodes
                .entry(hint.node_id)
                .or_insert_with(|| NodeRoute {
                    node_id: hint.node_id,
                    address: hint.address.clone(),
                    region: String::new(),
                    zone: String::new(),
                    live: true,
                });
            node.address = hint.address.clone();
        }
        if let Some(shard) = self.map.shard_mut(shard_id) {
            match usable {
                Some(hint) => shard.leader_id = Some(hint.node_id),
                None if shard.leader_id == Some(from_node) => shard.leader_id = None,
                None => {}
            }
        }
        usable.is_some()
    }

    /// Records that `node_id` did not answer: suspect it and forget it as anyone's leader.
    pub fn note_node_failure(&mut self, node_id: u64, now: Instant) {
        self.suspects.insert(node_id, now + SUSPECT_FOR);
        for shard in &mut self.map.shards {
            if shard.leader_id == Some(node_id) {
                shard.leader_id = None;
            }
        }
    }

    /// Addresses to ask for a fresh map: non-suspect known nodes (live first), then seeds,
    /// then suspects. Deduplicated.
    pub fn refresh_candidates(&self, seeds: &[String], now: Instant) -> Vec<(Option<u64>, String)> {
        let mut ordered: Vec<(Option<u64>, String)> = Vec::new();
        let mut nodes: Vec<&NodeRoute> = self.map.nodes.values().collect();
        nodes.sort_by_key(|n| (self.is_suspect(n.node_id, now), !n.live));
        let (healthy, suspect): (Vec<&NodeRoute>, Vec<&NodeRoute>) = nodes
            .into_iter()
            .partition(|n| !self.is_suspect(n.node_id, now));
        for node in healthy {
            ordered.push((Some(node.node_id), node.address.clone()));
        }
        for seed in seeds {
            let seed = seed.trim().to_string();
            if !ordered.iter().any(|(_, a)| *a == seed) {
                let id = self
                    .map
                    .nodes
                    .values()
                    .find(|n| n.address == seed)
                    .map(|n| n.node_id);
                if id.is_none_or(|id| !self.is_suspect(id, now)) {
                    ordered.push((id, seed));
                }
            }
        }
        for node in suspect {
            if !ordered.iter().any(|(_, a)| *a == node.address) {
                ordered.push((Some(node.node_id), node.address.clone()));
            }
        }
        ordered
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shard(id: u64, start: &'static [u8], end: &'static [u8], leader: Option<u64>) -> ShardRoute {
        ShardRoute {
            shard_id: id,
            start: Bytes::from_static(start),
            end: Bytes::from_static(end),
            replicas: vec![1, 2, 3],
            leader_id: leader,
            generation: 1,
        }
    }

    fn node(id: u64) -> NodeRoute {
        NodeRoute {
            node_id: id,
            address: format!("127.0.0.1:700{id}"),
            region: "r".into(),
            zone: "z".into(),
            live: true,
        }
    }

    /// Shards (-inf,"g") ["g","p") ["p",+inf), given out of order.
    fn three_shards() -> ShardMap {
        ShardMap::new(
            "c",
            [
                shard(3, b"p", b"", Some(3)),
                shard(1, b"", b"g", Some(1)),
                shard(2, b"g", b"p", None),
                shard(0, b"", b"", Some(1)),
            ],
            [node(1), node(2), node(3)],
        )
    }

    /// Keys route to the shard whose [start, end) contains them, including the open ends.
    #[test]
    fn key_lookup_over_ranges() {
        let map = three_shards();
        let owner = |key: &[u8]| map.shard_for_key(key).map(|s| s.shard_id);
        assert_eq!(owner(b""), Some(1));
        assert_eq!(owner(b"\x00"), Some(1));
        assert_eq!(owner(b"a"), Some(1));
        assert_eq!(owner(b"fzzz"), Some(1));
        assert_eq!(owner(b"g"), Some(2));
        assert_eq!(owner(b"g\x00"), Some(2));
        assert_eq!(owner(b"ozz"), Some(2));
        assert_eq!(owner(b"p"), Some(3));
        assert_eq!(owner(b"\xff\xff\xff"), Some(3));
        assert_eq!(map.shards().len(), 3, "the metadata shard is not routable");
    }

    /// Keys in a gap of the map, or with no map, have no owner.
    #[test]
    fn gaps_have_no_owner() {
        let map = ShardMap::new(
            "c",
            [shard(1, b"b", b"d", None), shard(2, b"f", b"", None)],
            [],
        );
        assert!(map.shard_for_key(b"a").is_none());
        assert!(map.shard_for_key(b"d").is_none());
        assert_eq!(map.shard_for_key(b"c").unwrap().shard_id, 1);
        assert!(ShardMap::default().shard_for_key(b"x").is_none());
    }

    /// Reverse scans start in the shard owning the greatest key below the exclusive end.
    #[test]
    fn shard_below_bounds() {
        let map = three_shards();
        let below = |end: &[u8]| map.shard_below(end).map(|s| s.shard_id);
        assert_eq!(below(b""), Some(3), "empty end is +inf");
        assert_eq!(below(b"p"), Some(2), "end is exclusive");
        assert_eq!(below(b"p\x00"), Some(3));
        assert_eq!(below(b"g"), Some(1));
        assert_eq!(below(b"b"), Some(1));
        assert_eq!(below(b"\x00"), Some(1));
    }

    /// Grouping keeps input positions in order within each shard and covers every key.
    #[test]
    fn grouping_keeps_order() {
        let map = three_shards();
        let keys: Vec<&[u8]> = vec![b"z", b"a", b"h", b"b", b"q", b"i", b"a"];
        let groups = map.group_by_shard(keys.iter().copied()).unwrap();
        assert_eq!(
            groups,
            vec![(1, vec![1, 3, 6]), (2, vec![2, 5]), (3, vec![0, 4])]
        );
        // Scattering per-group results back by position restores input order.
        let mut out = vec![""; keys.len()];
        for (_, positions) in &groups {
            for &p in positions {
                out[p] = std::str::from_utf8(keys[p]).unwrap();
            }
        }
        assert_eq!(out, vec!["z", "a", "h", "b", "q", "i", "a"]);
        let gappy = ShardMap::new("c", [shard(1, b"b", b"", None)], []);
        assert_eq!(gappy.group_by_shard([&b"c"[..], b"a"]), Err(1));
    }

    /// The leader is preferred; without one, replicas rotate; suspects are skipped.
    #[test]
    fn target_selection() {
        let now = Instant::now();
        let mut state = RoutingState::default();
        state.install(three_shards());
        assert_eq!(state.target(1, 0, now).unwrap().node_id, 1);
        let rotated: Vec<u64> = (0..3)
            .map(|a| state.target(2, a, now).unwrap().node_id)
            .collect();
        assert_eq!(rotated, vec![1, 2, 3]);
        state.note_node_failure(1, now);
        assert_ne!(state.target(1, 0, now).unwrap().node_id, 1);
        for attempt in 0..6 {
            assert_ne!(state.target(2, attempt, now).unwrap().node_id, 1);
        }
        // Suspicion expires.
        assert_eq!(
            state.target(2, 0, now + SUSPECT_FOR * 2).unwrap().node_id,
            1
        );
        assert!(state.target(99, 0, now).is_none());
    }

    /// Without a known leader, replicas the map reports live are tried before those it does not
    /// (a killed node's address may black-hole connects until the connect timeout), but the
    /// rotation still reaches them: the answering node's view of liveness may be wrong.
    #[test]
    fn leaderless_rotation_tries_live_replicas_first() {
        let now = Instant::now();
        let mut state = RoutingState::default();
        let mut map = three_shards();
        map.nodes.get_mut(&1).unwrap().live = false;
        state.install(map);
        let rotated: Vec<u64> = (0..3)
            .map(|a| state.target(2, a, now).unwrap().node_id)
            .collect();
        assert_eq!(rotated, vec![2, 3, 1]);
        // Node 2 (live) times out and is suspect: attempt 1 goes to live node 3, not dead 1.
        state.note_node_failure(2, now);
        assert_eq!(state.target(2, 0, now).unwrap().node_id, 3);
        assert_eq!(state.target(2, 1, now).unwrap().node_id, 3);
        assert_eq!(state.target(2, 2, now).unwrap().node_id, 1);
        // A known leader is still asked even if the answering node has not heard from it.
        assert_eq!(state.target(1, 0, now).unwrap().node_id, 1);
    }

    /// NOT_LEADER hints update the leader unless they name the answering or a suspect node.
    #[test]
    fn leader_hints() {
        let now = Instant::now();
        let mut state = RoutingState::default();
        state.install(three_shards());
        let hint = |id: u64| LeaderHint {
            node_id: id,
            address: format!("127.0.0.1:700{id}"),
        };
        assert!(state.note_not_leader(1, 1, Some(&hint(2)), now));
        assert_eq!(state.target(1, 0, now).unwrap().node_id, 2);
        // A hint naming the node that just refused is useless; the leader is forgotten.
        assert!(!state.note_not_leader(1, 2, Some(&hint(2)), now));
        assert_eq!(state.map.shard(1).unwrap().leader_id, None);
        state.note_node_failure(3, now);
        assert!(!state.note_not_leader(1, 1, Some(&hint(3)), now));
        // A hint may introduce a node the map does not know yet.
        let new_node = LeaderHint {
            node_id: 9,
            address: "10.0.0.9:7001".into(),
        };
        assert!(state.note_not_leader(3, 3, Some(&new_node), now));
        assert_eq!(state.target(3, 0, now).unwrap().address, "10.0.0.9:7001");
    }

    /// A refreshed map that does not know a leader keeps the cached one.
    #[test]
    fn install_keeps_known_leaders() {
        let mut state = RoutingState::default();
        state.install(three_shards());
        let generation = state.generation;
        let mut unknown = three_shards();
        for s in &mut unknown.shards {
            s.leader_id = None;
        }
        state.install(unknown);
        assert_eq!(state.generation, generation + 1);
        assert_eq!(state.map.shard(1).unwrap().leader_id, Some(1));
        assert_eq!(state.map.shard(3).unwrap().leader_id, Some(3));
    }

    /// Refresh candidates put healthy nodes first, then seeds, then suspects, without duplicates.
    #[test]
    fn refresh_order() {
        let now = Instant::now();
        let mut state = RoutingState::default();
        state.install(three_shards());
        state.note_node_failure(1, now);
        let seeds = vec!["127.0.0.1:7001".to_string(), "seed:1".to_string()];
        let order: Vec<String> = state
            .refresh_candidates(&seeds, now)
            .into_iter()
            .map(|(_, a)| a)
            .collect();
        assert_eq!(
            order,
            vec![
                "127.0.0.1:7002",
                "127.0.0.1:7003",
                "seed:1",
                "127.0.0.1:7001"
            ]
        );
    }
}

//! The founding shard map and replica placement: pure functions of the configuration, so every
//! founding member computes the same map without talking to anyone.
//!
//! ```text
//!  keyspace:  ["" ─── split₁) [split₁ ─── split₂) ... [splitₙ₋₁ ─── +∞)
//!  shard id:        1               2                       n          (0 = metadata group)
//! ```
//!
//! # Default split points
//! With no explicit `split_points`, the keyspace is pre-split for hashed keys of the YCSB shape
//! `user<decimal u63>`: the decimal numbers are uniform over [0, 2^63), so the split points are
//! the evenly spaced numbers' leading digits (`user1844…`, `user2767…`, ...). Other key shapes
//! should set `cluster.split_points`.
//!
//! # Placement
//! Each shard's replicas are chosen greedily: first a node in a region the shard does not use
//! yet, then a zone it does not use yet, then any node; ties go to the node with the fewest
//! replicas so far, then to a rotation by shard id so leaders' initial homes spread out.

use crate::config::Member;
use meridian_storage::keys::{Keyspace, Span};
use meridian_types::{NodeId, ShardId};
use std::collections::{BTreeMap, HashSet};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardDescriptor {
    pub id: ShardId,
    /// Inclusive; empty = start of keyspace.
    pub start: Vec<u8>,
    /// Exclusive; empty = end of keyspace.
    pub end: Vec<u8>,
    pub replicas: Vec<NodeId>,
    /// The region that should lead this shard (`home`), if any.
    pub home: Option<String>,
    /// Which failure the shard's voters are placed to survive (`survival`): a region's
    /// (every replica votes) or, with a home, a zone's (only the home region's replicas
    /// vote; the others are learners).
    pub survival: crate::survival::Survival,
    /// Which nodes may hold the shard's replicas (`constraints`; empty: any). Data shards
    /// only.
    pub constraints: meridian_types::Constraints,
    /// The range generation: bumped whenever the shard's range changes (a split or a merge;
    /// none exists yet, so every founding shard has generation 1). Clients send the
    /// generation they routed by, and a node whose map disagrees answers `WRONG_SHARD`.
    pub generation: u64,
}

impl ShardDescriptor {
    pub fn contains(&self, key: &[u8]) -> bool {
        self.span().contains(key)
    }

    /// The keys this shard owns in storage: its range of the user keyspace, or (the metadata
    /// group) the whole system keyspace.
    pub fn span(&self) -> Span {
        Span {
            space: Keyspace::from(self.id),
            start: self.start.clone(),
            end: self.end.clone(),
        }
    }
}

/// Data shards sorted by start key, plus the metadata group's replicas, plus the nodes that
/// joined the cluster after its founding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardMap {
    /// Bumped by every change to the map (the founding map is version 1).
    pub version: u64,
    pub meta: ShardDescriptor,
    pub data: Vec<ShardDescriptor>,
    /// Members that joined a running cluster (`--join`), in the order they joined; the
    /// founding members are the configuration's `initial_cluster`. A member is never taken
    /// off this list (its id is never reused).
    pub joined: Vec<Member>,
    /// Members forgotten (`meridian cluster forget`) after every replica moved off them: no
    /// longer pinged, listed or admitted as peers. Their ids stay taken.
    pub forgotten: Vec<NodeId>,
}

/// Split keys for `n` shards over YCSB-style `user<u63>` keys: exactly `n - 1` distinct,
/// sorted keys.
///
/// Keys compare as bytes, not numbers, and nine in ten decimal u63s have 19 digits (they are
/// uniform over [0, 2^63) ≈ [0, 9.22·10^18)). So the boundaries are evenly spaced 6-digit
/// prefixes of 19-digit numbers, `user100000` … `user922337`: every split point has the same
/// length, so byte order is numeric order and no two collide while `n` ≤ 822,337. (An earlier
/// version spaced the numbers themselves and kept their first 6 digits; numbers of different
/// lengths share prefixes, so `--initial-shards 1024` silently made 923 shards.)
pub fn default_split_points(n: u32) -> Vec<Vec<u8>> {
    const LOW: u64 = 100_000; // 10^18's first 6 digits
    const HIGH: u64 = 922_337; // 2^63's first 6 digits
    let n = u64::from(n.max(1));
    (1..n)
        .map(|i| format!("user{}", LOW + (HIGH - LOW) * i / n).into_bytes())
        .collect()
}

/// Chooses `rf` replicas for `shard` among `members`.
pub fn place(
    members: &[Member],
    rf: usize,
    shard: ShardId,
    load: &mut BTreeMap<NodeId, usize>,
) -> Vec<NodeId> {
    let rf = rf.min(members.len());
    let mut chosen: Vec<&Member> = Vec::with_capacity(rf);
    let n = members.len() as u64;
    while chosen.len() < rf {
        let regions: HashSet<&str> = chosen.iter().map(|m| m.region.as_str()).collect();
        let zones: HashSet<(&str, &str)> = chosen
            .iter()
            .map(|m| (m.region.as_str(), m.zone.as_str()))
            .collect();
        let best = members
            .iter()
            .enumerate()
            .filter(|(_, m)| !chosen.iter().any(|c| c.node_id == m.node_id))
            .min_by_key(|(i, m)| {
                (
                    regions.contains(m.region.as_str()),
                    zones.contains(&(m.region.as_str(), m.zone.as_str())),
                    load.get(&m.node_id).copied().unwrap_or(0),
                    (*i as u64 + n - shard.0 % n) % n,
                )
            })
            .map(|(_, m)| m)
            .expect("fewer candidates than replicas");
        *load.entry(best.node_id).or_default() += 1;
        chosen.push(best);
    }
    chosen.into_iter().map(|m| m.node_id).collect()
}

impl ShardMap {
    /// The founding map for `members`, `rf` replicas, and either explicit split points or
    /// `initial_shards` default splits.
    pub fn founding(
        members: &[Member],
        rf: usize,
        split_points: &[Vec<u8>],
        initial_shards: u32,
    ) -> ShardMap {
        let mut splits: Vec<Vec<u8>> = if split_points.is_empty() {
            default_split_points(initial_shards)
        } else {
            split_points.to_vec()
        };
        splits.sort();
        splits.dedup();
        splits.retain(|s| !s.is_empty());
        let mut sorted: Vec<Member> = members.to_vec();
        sorted.sort_by_key(|m| m.node_id);
        let mut load = BTreeMap::new();
        let meta = ShardDescriptor {
            id: ShardId::META,
            start: Vec::new(),
            end: Vec::new(),
            replicas: place(&sorted, rf, ShardId::META, &mut load),
            home: None,
            survival: Default::default(),
            constraints: Default::default(),
            generation: 1,
        };
        let mut data = Vec::new();
        let mut start = Vec::new();
        for (i, end) in splits
            .iter()
            .cloned()
            .chain(std::iter::once(Vec::new()))
            .enumerate()
        {
            let id = ShardId(i as u64 + 1);
            data.push(ShardDescriptor {
                id,
                start: std::mem::replace(&mut start, end.clone()),
                end,
                replicas: place(&sorted, rf, id, &mut load),
                home: None,
                survival: Default::default(),
                constraints: Default::default(),
                generation: 1,
            });
        }
        ShardMap {
            version: 1,
            meta,
            data,
            joined: Vec::new(),
            forgotten: Vec::new(),
        }
    }

    /// How many replicas (of every shard, the metadata one included) each node holds.
    fn replicas_per_node(&self) -> BTreeMap<NodeId, usize> {
        let mut load: BTreeMap<NodeId, usize> = BTreeMap::new();
        for shard in self.all() {
            for r in &shard.replicas {
                *load.entry(*r).or_default() += 1;
            }
        }
        load
    }

    /// Gives each data shard the replica constraints its start key has under `rules` (see
    /// `constraints`), and places again, among the members they allow only (as [`place`]
    /// does), the replicas of a shard some of whose replicas they exclude. `parse_rules`
    /// checked that enough members are allowed.
    pub fn with_constraints(
        mut self,
        rules: &[crate::constraints::ConstraintRule],
        members: &[Member],
        rf: usize,
    ) -> ShardMap {
        if rules.is_empty() {
            return self;
        }
        let mut sorted: Vec<Member> = members.to_vec();
        sorted.sort_by_key(|m| m.node_id);
        let mut load = self.replicas_per_node();
        for shard in &mut self.data {
            let Some(rule) = crate::constraints::rule_of(rules, &shard.start) else {
                continue;
            };
            shard.constraints = rule.constraints.clone();
            let allowed: Vec<Member> = sorted
                .iter()
                .filter(|m| crate::constraints::admits(&rule.constraints, m))
                .cloned()
                .collect();
            let obeys = shard
                .replicas
                .iter()
                .all(|id| allowed.iter().any(|m| m.node_id == *id));
            if obeys {
                continue;
            }
            for r in &shard.replicas {
                if let Some(n) = load.get_mut(r) {
                    *n -= 1;
                }
            }
            shard.replicas = place(&allowed, rf, shard.id, &mut load);
        }
        self
    }

    /// Gives each data shard the home region and survival goal its start key has under
    /// `rules` (see `home`) and moves a replica of that region, if it has one, to the front of
    /// its replicas: the first replica bootstraps the group and so usually leads it first. A
    /// shard with zone survival also gets replicas on other members of its home region until
    /// it has [`crate::survival::ZONE_VOTERS`] there (zones it lacks first, then the members
    /// holding fewest replicas, then the lowest id); its group is founded with every replica
    /// voting, and its leader makes the others learners (`survival::step`).
    pub fn with_homes(mut self, rules: &[crate::home::HomeRule], members: &[Member]) -> ShardMap {
        let member = |id: &NodeId| members.iter().find(|m| m.node_id == *id);
        let region_of = |id: &NodeId| member(id).map(|m| m.region.as_str());
        let mut load = self.replicas_per_node();
        for shard in &mut self.data {
            let Some(rule) = crate::home::rule_of(rules, &shard.start) else {
                continue;
            };
            let home = rule.region.as_str();
            shard.home = Some(home.to_string());
            shard.survival = rule.survival;
            if rule.survival == crate::survival::Survival::Zone {
                let constraints = shard.constraints.clone();
                loop {
                    let held: Vec<&Member> = shard.replicas.iter().filter_map(&member).collect();
                    let at_home = held.iter().filter(|m| m.region == home).count();
                    if at_home >= crate::survival::ZONE_VOTERS {
                        break;
                    }
                    // The key ends in the node id, so the members' order does not matter.
                    let Some(next) = members
                        .iter()
                        .filter(|m| m.region == home && !shard.replicas.contains(&m.node_id))
                        .filter(|m| crate::constraints::admits(&constraints, m))
                        .min_by_key(|m| {
                            (
                                held.iter().any(|h| h.region == home && h.zone == m.zone),
                                load.get(&m.node_id).copied().unwrap_or(0),
                                m.node_id,
                            )
                        })
                    else {
                        // Too few (allowed) members there: `parse_home_regions` and
                        // `constraints::check_homes` refuse that.
                        break;
                    };
                    *load.entry(next.node_id).or_default() += 1;
                    shard.replicas.push(next.node_id);
                }
            }
            if let Some(i) = shard
                .replicas
                .iter()
                .position(|id| region_of(id) == Some(home))
            {
                let first = shard.replicas.remove(i);
                shard.replicas.insert(0, first);
            }
        }
        self
    }

    /// The data shard owning `key`.
    pub fn lookup(&self, key: &[u8]) -> &ShardDescriptor {
        let idx = self.data.partition_point(|s| s.start.as_slice() <= key);
        &self.data[idx.saturating_sub(1)]
    }

    /// The data shard owning the largest key below `end` (empty `end` = +∞), for reverse scans.
    pub fn lookup_before(&self, end: &[u8]) -> &ShardDescriptor {
        if end.is_empty() {
            return self.data.last().expect("at least one data shard");
        }
        let idx = self.data.partition_point(|s| s.start.as_slice() < end);
        &self.data[idx.saturating_sub(1)]
    }

    pub fn get(&self, id: ShardId) -> Option<&ShardDescriptor> {
        if id == ShardId::META {
            return Some(&self.meta);
        }
        self.data.iter().find(|s| s.id == id)
    }

    pub fn all(&self) -> impl Iterator<Item = &ShardDescriptor> {
        std::iter::once(&self.meta).chain(self.data.iter())
    }

    fn get_mut(&mut self, id: ShardId) -> Option<&mut ShardDescriptor> {
        if id == ShardId::META {
            return Some(&mut self.meta);
        }
        self.data.iter_mut().find(|s| s.id == id)
    }

    /// The next version of this map, with `node` listed among `shard`'s replicas (appended:
    /// the order of the others, which places the home region's first, is kept). `None` if it
    /// is listed already or the shard does not exist.
    pub fn with_replica_added(&self, shard: ShardId, node: NodeId) -> Option<ShardMap> {
        let mut next = self.clone();
        let desc = next.get_mut(shard)?;
        if desc.replicas.contains(&node) {
            return None;
        }
        desc.replicas.push(node);
        next.version += 1;
        Some(next)
    }

    /// The next version of this map, without `node` among `shard`'s replicas. `None` if it is
    /// not listed or the shard does not exist.
    pub fn with_replica_removed(&self, shard: ShardId, node: NodeId) -> Option<ShardMap> {
        let mut next = self.clone();
        let desc = next.get_mut(shard)?;
        let at = desc.replicas.iter().position(|id| *id == node)?;
        desc.replicas.remove(at);
        next.version += 1;
        Some(next)
    }

    /// The next version of this map, with `member` joined. `Ok(None)` if it joined already
    /// with the same address and location (a joining node asking again); an error if its id
    /// is taken by a founding member (`founders`) or another joined one, forgotten or not, or
    /// its peer address by one not forgotten.
    pub fn with_member_joined(
        &self,
        member: &Member,
        founders: &[Member],
    ) -> Result<Option<ShardMap>, String> {
        if self.forgotten.contains(&member.node_id) {
            return Err(format!(
                "node id {} was forgotten (meridian cluster forget); ids are never reused: \
                 join with a new id",
                member.node_id
            ));
        }
        if self.joined.contains(member) {
            return Ok(None);
        }
        for other in founders.iter().chain(&self.joined) {
            if other.node_id == member.node_id {
                return Err(format!(
                    "node id {} is taken (by {}@{}/{}); ids are never reused",
                    member.node_id, other.peer_addr, other.region, other.zone
                ));
            }
            if other.peer_addr == member.peer_addr && !self.forgotten.contains(&other.node_id) {
                return Err(format!(
                    "peer address {} is node {}'s",
                    member.peer_addr, other.node_id
                ));
            }
        }
        let mut next = self.clone();
        next.joined.push(member.clone());
        next.version += 1;
        Ok(Some(next))
    }

    /// The next version of this map, with member `node` forgotten. `Ok(None)` if it is
    /// already; an error if no member (of `founders` or those who joined) has that id, or if
    /// any shard still lists it as a replica.
    pub fn with_member_forgotten(
        &self,
        node: NodeId,
        founders: &[Member],
    ) -> Result<Option<ShardMap>, String> {
        if self.forgotten.contains(&node) {
            return Ok(None);
        }
        if !founders
            .iter()
            .chain(&self.joined)
            .any(|m| m.node_id == node)
        {
            return Err(format!("there is no member {node}"));
        }
        let holding: Vec<String> = self
            .all()
            .filter(|d| d.replicas.contains(&node))
            .map(|d| d.id.to_string())
            .collect();
        if !holding.is_empty() {
            return Err(format!(
                "node {node} holds replicas of shards {} (move them first: meridian cluster \
                 decommission {node})",
                holding.join(", ")
            ));
        }
        let mut next = self.clone();
        next.forgotten.push(node);
        next.version += 1;
        Ok(Some(next))
    }

    /// Whether `other` has the same shards with the same ranges and generations: it differs
    /// from this map in replica lists, homes and survival goals (`home::with_placement`), members that joined or were
    /// forgotten (and version) only.
    pub fn same_layout(&self, other: &ShardMap) -> bool {
        let layout = |d: &ShardDescriptor| (d.id, d.start.clone(), d.end.clone(), d.generation);
        self.data.len() == other.data.len() && self.all().map(layout).eq(other.all().map(layout))
    }
}

/// The map a node routes by and hosts replicas of: replaced whole when a newer version is
/// adopted (a replica move), read as one consistent `Arc` by each request.
pub struct MapCell(std::sync::RwLock<std::sync::Arc<ShardMap>>);

impl MapCell {
    pub fn new(map: ShardMap) -> MapCell {
        MapCell(std::sync::RwLock::new(std::sync::Arc::new(map)))
    }

    pub fn get(&self) -> std::sync::Arc<ShardMap> {
        self.0.read().expect("shard map lock poisoned").clone()
    }

    /// Replaces the map with `next` if it is newer; returns whether it did.
    pub fn adopt(&self, next: ShardMap) -> bool {
        let mut cur = self.0.write().expect("shard map lock poisoned");
        if next.version <= cur.version {
            return false;
        }
        *cur = std::sync::Arc::new(next);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(id: u64, region: &str, zone: &str) -> Member {
        Member {
            node_id: id,
            peer_addr: format!("127.0.0.1:{}", 7000 + id).parse().unwrap(),
            region: region.into(),
            zone: zone.into(),
        }
    }

    #[test]
    fn replica_edits_bump_the_version_and_keep_the_layout() {
        let members: Vec<Member> = (1..=4).map(|i| member(i, &format!("r{i}"), "z")).collect();
        let map = ShardMap::founding(&members, 3, &[], 4);
        let shard = map
            .data
            .iter()
            .find(|s| !s.replicas.contains(&4))
            .unwrap()
            .clone();
        let added = map
            .with_replica_added(shard.id, 4)
            .expect("4 is not a replica yet");
        assert_eq!(added.version, 2);
        let now = added.get(shard.id).unwrap();
        assert_eq!(
            now.replicas[..3],
            shard.replicas[..],
            "others keep their order"
        );
        assert_eq!(now.replicas[3], 4);
        assert!(added.same_layout(&map));
        assert!(
            added.with_replica_added(shard.id, 4).is_none(),
            "listed already"
        );
        let removed = added
            .with_replica_removed(shard.id, shard.replicas[0])
            .unwrap();
        assert_eq!(removed.version, 3);
        assert!(!removed
            .get(shard.id)
            .unwrap()
            .replicas
            .contains(&shard.replicas[0]));
        assert!(removed
            .with_replica_removed(shard.id, shard.replicas[0])
            .is_none());
        assert!(
            map.with_replica_added(ShardId(999), 4).is_none(),
            "no such shard"
        );
        let meta = map.with_replica_added(ShardId::META, 4);
        assert!(meta.is_some() != map.meta.replicas.contains(&4));
        let other = ShardMap::founding(&members, 3, &[], 5);
        assert!(!other.same_layout(&map));
    }

    #[test]
    fn the_cell_adopts_only_newer_maps() {
        let members: Vec<Member> = (1..=3).map(|i| member(i, "a", "z")).collect();
        let map = ShardMap::founding(&members, 2, &[], 2);
        let cell = MapCell::new(map.clone());
        let shard = map.data[0].id;
        let out = *map
            .get(shard)
            .unwrap()
            .replicas
            .iter()
            .find(|n| **n != 1)
            .unwrap_or(&2);
        let v2 = map.with_replica_removed(shard, out).unwrap();
        assert!(!cell.adopt(map.clone()), "same version");
        assert!(cell.adopt(v2.clone()));
        assert_eq!(cell.get().version, 2);
        assert!(!cell.adopt(map), "older");
        assert_eq!(*cell.get(), v2);
    }

    #[test]
    fn default_splits_are_sorted_and_spread_over_ycsb_keys() {
        let s = default_split_points(8);
        assert_eq!(s.len(), 7);
        assert!(s.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(s[0], b"user202792".to_vec());
    }

    #[test]
    fn default_splits_make_exactly_the_shards_asked_for() {
        let members = [member(1, "a", "x")];
        for n in [1u32, 2, 7, 64, 256, 1000, 1024] {
            let s = default_split_points(n);
            assert_eq!(s.len() as u32, n - 1, "split points for {n}");
            assert!(
                s.windows(2).all(|w| w[0] < w[1]),
                "{n}: not strictly sorted"
            );
            let map = ShardMap::founding(&members, 1, &[], n);
            assert_eq!(map.data.len() as u32, n, "{n} shards asked for");
        }
    }

    #[test]
    fn lookup_finds_owning_shard() {
        let members = [member(1, "a", "x")];
        let map = ShardMap::founding(&members, 1, &[b"g".to_vec(), b"p".to_vec()], 0);
        assert_eq!(map.lookup(b"").id, ShardId(1));
        assert_eq!(map.lookup(b"f").id, ShardId(1));
        assert_eq!(map.lookup(b"g").id, ShardId(2));
        assert_eq!(map.lookup(b"zzz").id, ShardId(3));
        assert_eq!(map.lookup_before(b"g").id, ShardId(1));
        assert_eq!(map.lookup_before(b"g\0").id, ShardId(2));
        assert_eq!(map.lookup_before(b"").id, ShardId(3));
    }

    /// Shards 3 and 4 start at or after "user5": zone survival adds us-east replicas in the
    /// zones they lack (3: a and b beside 6's c; 4: a and c beside 5's b), shard 4 taking node
    /// 4 over node 1 in zone a because node 1 got shard 3's.
    const EXPECTED_ZONE_PLACEMENT: [&[NodeId]; 4] =
        [&[4, 2, 3], &[5, 3, 2], &[6, 2, 3, 1, 5], &[5, 2, 3, 4, 6]];

    #[test]
    fn zone_survival_at_founding_places_three_replicas_at_home() {
        let members = vec![
            member(1, "us-east", "a"),
            member(2, "eu-west", "a"),
            member(3, "ap-south", "a"),
            member(4, "us-east", "a"),
            member(5, "us-east", "b"),
            member(6, "us-east", "c"),
        ];
        let rules =
            crate::home::parse_home_regions(&["user5=us-east:zone".to_string()], &members).unwrap();
        let plain = ShardMap::founding(&members, 3, &[], 4);
        let homed = plain.clone().with_homes(&rules, &members);
        let region = |id: &NodeId| members.iter().find(|m| m.node_id == *id).unwrap();
        for (before, after) in plain.data.iter().zip(&homed.data) {
            if after.survival == crate::survival::Survival::Region {
                assert_eq!(before.replicas, after.replicas);
                continue;
            }
            let home: Vec<&Member> = after
                .replicas
                .iter()
                .map(region)
                .filter(|m| m.region == "us-east")
                .collect();
            assert_eq!(home.len(), 3, "{after:?}");
            let zones: HashSet<&str> = home.iter().map(|m| m.zone.as_str()).collect();
            assert_eq!(zones.len(), 3, "distinct zones first: {after:?}");
            assert_eq!(region(&after.replicas[0]).region, "us-east");
            for r in &before.replicas {
                assert!(after.replicas.contains(r), "the founding replicas stay");
            }
        }
        assert!(homed
            .data
            .iter()
            .any(|s| s.survival == crate::survival::Survival::Zone));
        // The exact placement (zones lacking first, then load, then id).
        let placed: Vec<Vec<NodeId>> = homed.data.iter().map(|s| s.replicas.clone()).collect();
        assert_eq!(placed, EXPECTED_ZONE_PLACEMENT.map(<[NodeId]>::to_vec));
    }

    #[test]
    fn founding_replicas_obey_the_constraints_of_their_rule() {
        let members = vec![
            member(1, "us-east", "a"),
            member(2, "eu-west", "a"),
            member(3, "ap-south", "a"),
            member(4, "us-east", "b"),
            member(5, "eu-west", "b"),
        ];
        let plain = ShardMap::founding(&members, 3, &[], 8);
        let rules = crate::constraints::parse_rules(
            &[
                "user5:-region=ap-south".to_string(),
                "user7:-zone=b".to_string(),
            ],
            &members,
            3,
        )
        .unwrap();
        let constrained = plain.clone().with_constraints(&rules, &members, 3);
        assert_eq!(
            constrained.meta, plain.meta,
            "the metadata shard has no constraints"
        );
        for (before, after) in plain.data.iter().zip(&constrained.data) {
            let rule = crate::constraints::rule_of(&rules, &before.start);
            let want = rule.map(|r| r.constraints.clone()).unwrap_or_default();
            assert_eq!(after.constraints, want, "{after:?}");
            assert_eq!(after.replicas.len(), 3, "{after:?}");
            for id in &after.replicas {
                let m = members.iter().find(|m| m.node_id == *id).unwrap();
                assert!(crate::constraints::admits(&want, m), "{after:?}");
            }
            if rule.is_none() {
                assert_eq!(after.replicas, before.replicas, "no rule, no change");
            }
        }
        let placed = |text: &str| -> Vec<Vec<NodeId>> {
            constrained
                .data
                .iter()
                .filter(|d| d.constraints.to_string() == text)
                .map(|d| d.replicas.clone())
                .collect()
        };
        // From user7 on only zone a's three nodes are allowed; before it, not ap-south.
        let zone_a = placed("-zone=b");
        assert!(!zone_a.is_empty() && zone_a.iter().all(|r| r.iter().all(|id| *id <= 3)));
        let not_ap = placed("-region=ap-south");
        assert!(!not_ap.is_empty() && not_ap.iter().all(|r| !r.contains(&3)));
    }

    #[test]
    fn a_home_region_puts_its_replica_first() {
        let members = vec![
            member(1, "us-east", "a"),
            member(2, "eu-west", "a"),
            member(3, "ap-south", "a"),
        ];
        let rules = crate::home::parse_home_regions(
            &["user5=eu-west".to_string(), "user7=ap-south".to_string()],
            &members,
        )
        .unwrap();
        let plain = ShardMap::founding(&members, 3, &[], 8);
        let homed = plain.clone().with_homes(&rules, &members);
        for (before, after) in plain.data.iter().zip(&homed.data) {
            let mut sorted = (before.replicas.clone(), after.replicas.clone());
            sorted.0.sort();
            sorted.1.sort();
            assert_eq!(sorted.0, sorted.1, "the same replicas, maybe reordered");
            let want = crate::home::home_of(&rules, &before.start);
            assert_eq!(after.home.as_deref(), want);
            match want {
                None => assert_eq!(before.replicas, after.replicas),
                Some("eu-west") => assert_eq!(after.replicas[0], 2),
                Some(_) => assert_eq!(after.replicas[0], 3),
            }
        }
        assert!(homed.data.iter().any(|s| s.home.is_none()));
        assert!(homed
            .data
            .iter()
            .any(|s| s.home.as_deref() == Some("ap-south")));
    }

    #[test]
    fn placement_prefers_distinct_regions_then_zones() {
        let members = [
            member(1, "us", "a"),
            member(2, "us", "b"),
            member(3, "eu", "a"),
            member(4, "eu", "b"),
            member(5, "ap", "a"),
        ];
        let map = ShardMap::founding(&members, 3, &[], 16);
        for s in map.all() {
            let regions: HashSet<_> = s
                .replicas
                .iter()
                .map(|id| {
                    members
                        .iter()
                        .find(|m| m.node_id == *id)
                        .unwrap()
                        .region
                        .clone()
                })
                .collect();
            assert_eq!(regions.len(), 3, "shard {} replicas {:?}", s.id, s.replicas);
        }
        // Region spread wins over balance: the only node in "ap" hosts every shard; within the
        // two-node regions the load is balanced.
        let mut count = BTreeMap::new();
        for s in map.all() {
            for r in &s.replicas {
                *count.entry(*r).or_insert(0) += 1;
            }
        }
        assert_eq!(count[&5], map.all().count(), "{count:?}");
        let others: Vec<usize> = (1..=4).map(|id| count[&id]).collect();
        assert!(
            others.iter().max().unwrap() - others.iter().min().unwrap() <= 1,
            "{count:?}"
        );
    }

    #[test]
    fn placement_falls_back_to_zones_then_nodes() {
        let members = [
            member(1, "us", "a"),
            member(2, "us", "a"),
            member(3, "us", "b"),
        ];
        let map = ShardMap::founding(&members, 3, &[], 1);
        assert_eq!(map.meta.replicas.len(), 3);
        let members = [
            member(1, "us", "a"),
            member(2, "us", "b"),
            member(3, "us", "b"),
            member(4, "eu", "a"),
        ];
        let mut load = BTreeMap::new();
        let r = place(&members, 2, ShardId(1), &mut load);
        assert!(
            r.contains(&4),
            "one replica must be in the other region: {r:?}"
        );
    }
}

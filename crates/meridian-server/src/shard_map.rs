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
#[path = "shard_map_tests.rs"]
mod tests;

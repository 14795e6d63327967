//! The shard map as replicated state: one versioned record in the metadata shard.
//!
//! Every founding member computes the same founding map from its configuration (`shard_map`),
//! but a map computed from configuration is only as good as the configuration: a node
//! restarted with another `replication_factor`, other `home_regions` or other split points
//! would route by, and host replicas of, a layout the rest of the cluster does not share. So
//! the map the cluster agreed on is stored, once, in the metadata shard under
//! [`SHARD_MAP_KEY`] (in the system keyspace, out of reach of user keys):
//!
//! - **Founded once.** Every node proposes its founding map as a compare-and-swap that
//!   succeeds only while the key is absent; the first one applied wins and every later one
//!   is a mismatch that returns the stored map, which that node compares with its own.
//! - **Changed by compare-and-swap.** A replica move (`membership`), a join or a forget
//!   (`join`), or a placement (`home`) writes the next version
//!   only if the stored record is still the one it started from, so two moves at once never
//!   lose one another; the loser re-reads and tries again.
//! - **Read at start.** A node holding a replica of the metadata shard reads the stored map
//!   from its local replica before it opens any shard, and refuses to start if its layout
//!   differs from the map its configuration gives (naming the first difference; see
//!   [`founding_difference`]). A node without a
//!   replica (more nodes than the replication factor) learns the stored map from its
//!   registration's compare-and-swap, and a node whose map differs then stops (exit status
//!   [`EXIT_MAP_MISMATCH`]) instead of serving a layout nobody else has.
//! - **Versioned.** The map carries a version and each shard a range generation (see
//!   `shard_map`); clients route with a shard's generation and a node whose map disagrees
//!   answers `WRONG_SHARD`.
//!
//! - **Members that joined** (`ShardMap::joined`) are stored after the shards; a map without
//!   any is stored exactly as before joins existed, so clusters founded earlier keep their
//!   record's bytes (a compare-and-swap compares bytes). Forgotten members, then the shards
//!   with zone survival (`survival`), then the shards with replica constraints
//!   (`meridian_types::constraints`), follow in longer forms the same way: each only when
//!   there is one.
//!
//! # Invariants
//! - The record is exact: keys are stored as bytes, not as text, and decoding rejects trailing
//!   bytes.
//! - The record is only ever replaced by its next version, by compare-and-swap on its bytes.
//!
//! # Not done yet
//! - No split or merge changes the map, so ranges and generations stay as founded; only
//!   replica lists, homes and members change (and the version with them).
//! - Once the map changed, a restarted node's configuration is checked against the stored
//!   layout (ranges, generations) but no longer against its replica lists or homes (moves and
//!   `cluster placement` change those), so a changed `replication_factor` or `home_regions`
//!   in one node's configuration goes unnoticed.
//! - A node without a metadata replica cannot read the map before it starts serving; it
//!   checks it as soon as its registration is applied (normally within a second).

use crate::config::Member;
use crate::shard_map::{ShardDescriptor, ShardMap};
use crate::survival::Survival;
use bytes::Bytes;
use meridian_raft::types::codec;
use meridian_storage::{mvcc, Engine};
use meridian_types::limits::MAX_VALUE_BYTES;
use meridian_types::{NodeId, ShardId, Timestamp};
use serde::{Deserialize, Serialize};

/// The metadata shard's key of the stored shard map.
pub const SHARD_MAP_KEY: &[u8] = b"shardmap";

/// The exit status of a node that found its configuration's map differs from the stored one.
pub const EXIT_MAP_MISMATCH: i32 = 78;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct StoredShard {
    id: u64,
    start: Vec<u8>,
    end: Vec<u8>,
    replicas: Vec<NodeId>,
    home: Option<String>,
    generation: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct StoredMap {
    version: u64,
    /// The metadata group first, then the data shards by start key.
    shards: Vec<StoredShard>,
}

/// A member that joined after the founding (`ShardMap::joined`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct StoredMember {
    node_id: NodeId,
    peer_addr: String,
    region: String,
    zone: String,
}

/// The record of a map with joined members: [`StoredMap`]'s fields, then the members. A map
/// without any is stored as a [`StoredMap`], byte for byte as before members could join, so
/// the compare-and-swap of a cluster founded by an older version still matches.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct StoredMapWithMembers {
    version: u64,
    shards: Vec<StoredShard>,
    joined: Vec<StoredMember>,
}

/// The record of a map that forgot a member (`ShardMap::forgotten`): [`StoredMapWithMembers`]'
/// fields, then the forgotten ids. Used only when there is one, for the same reason.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct StoredMapWithForgotten {
    version: u64,
    shards: Vec<StoredShard>,
    joined: Vec<StoredMember>,
    forgotten: Vec<NodeId>,
}

/// The record of a map where some shard has zone survival (`ShardDescriptor::survival`):
/// [`StoredMapWithForgotten`]'s fields, then those shards' ids. Used only when there is one,
/// for the same reason.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct StoredMapWithSurvival {
    version: u64,
    shards: Vec<StoredShard>,
    joined: Vec<StoredMember>,
    forgotten: Vec<NodeId>,
    zone_survival: Vec<u64>,
}

/// The record of a map where some shard has replica constraints
/// (`ShardDescriptor::constraints`): [`StoredMapWithSurvival`]'s fields, then those shards'
/// ids with their constraints' canonical text. Used only when there is one, for the same
/// reason.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct StoredMapWithConstraints {
    version: u64,
    shards: Vec<StoredShard>,
    joined: Vec<StoredMember>,
    forgotten: Vec<NodeId>,
    zone_survival: Vec<u64>,
    constraints: Vec<(u64, String)>,
}

fn stored_shard(d: &ShardDescriptor) -> StoredShard {
    StoredShard {
        id: d.id.0,
        start: d.start.clone(),
        end: d.end.clone(),
        replicas: d.replicas.clone(),
        home: d.home.clone(),
        generation: d.generation,
    }
}

fn descriptor(s: StoredShard) -> ShardDescriptor {
    ShardDescriptor {
        id: ShardId(s.id),
        start: s.start,
        end: s.end,
        replicas: s.replicas,
        home: s.home,
        survival: Default::default(),
        constraints: Default::default(),
        generation: s.generation,
    }
}

/// The record of `map`, or why it cannot be stored (larger than a value may be).
pub fn encode(map: &ShardMap) -> Result<Bytes, String> {
    let shards: Vec<StoredShard> = map.all().map(stored_shard).collect();
    let joined = || -> Vec<StoredMember> {
        map.joined
            .iter()
            .map(|m| StoredMember {
                node_id: m.node_id,
                peer_addr: m.peer_addr.to_string(),
                region: m.region.clone(),
                zone: m.zone.clone(),
            })
            .collect()
    };
    let zone_survival: Vec<u64> = map
        .all()
        .filter(|d| d.survival == Survival::Zone)
        .map(|d| d.id.0)
        .collect();
    let constraints: Vec<(u64, String)> = map
        .all()
        .filter(|d| !d.constraints.is_empty())
        .map(|d| (d.id.0, d.constraints.to_string()))
        .collect();
    let raw = if !constraints.is_empty() {
        codec::encode(&StoredMapWithConstraints {
            version: map.version,
            shards,
            joined: joined(),
            forgotten: map.forgotten.clone(),
            zone_survival,
            constraints,
        })
    } else if !zone_survival.is_empty() {
        codec::encode(&StoredMapWithSurvival {
            version: map.version,
            shards,
            joined: joined(),
            forgotten: map.forgotten.clone(),
            zone_survival,
        })
    } else if !map.forgotten.is_empty() {
        codec::encode(&StoredMapWithForgotten {
            version: map.version,
            shards,
            joined: joined(),
            forgotten: map.forgotten.clone(),
        })
    } else if !map.joined.is_empty() {
        codec::encode(&StoredMapWithMembers {
            version: map.version,
            shards,
            joined: joined(),
        })
    } else {
        codec::encode(&StoredMap {
            version: map.version,
            shards,
        })
    }
    .map_err(|e| format!("encoding the shard map: {e}"))?;
    if raw.len() > MAX_VALUE_BYTES {
        return Err(format!(
            "the shard map encodes to {} bytes, over MAX_VALUE_BYTES ({MAX_VALUE_BYTES}); \
             use fewer shards or shorter split points",
            raw.len()
        ));
    }
    Ok(Bytes::from(raw))
}

/// Decodes a stored record.
pub fn decode(raw: &[u8]) -> Result<ShardMap, String> {
    // Exact decoding tells the five apart: each form has bytes after the shorter ones', and
    // ends before the longer ones' next list.
    let stored: StoredMapWithConstraints = if let Ok(m) = codec::decode::<StoredMap>(raw) {
        StoredMapWithConstraints {
            version: m.version,
            shards: m.shards,
            joined: Vec::new(),
            forgotten: Vec::new(),
            zone_survival: Vec::new(),
            constraints: Vec::new(),
        }
    } else if let Ok(m) = codec::decode::<StoredMapWithMembers>(raw) {
        StoredMapWithConstraints {
            version: m.version,
            shards: m.shards,
            joined: m.joined,
            forgotten: Vec::new(),
            zone_survival: Vec::new(),
            constraints: Vec::new(),
        }
    } else if let Ok(m) = codec::decode::<StoredMapWithForgotten>(raw) {
        StoredMapWithConstraints {
            version: m.version,
            shards: m.shards,
            joined: m.joined,
            forgotten: m.forgotten,
            zone_survival: Vec::new(),
            constraints: Vec::new(),
        }
    } else if let Ok(m) = codec::decode::<StoredMapWithSurvival>(raw) {
        StoredMapWithConstraints {
            version: m.version,
            shards: m.shards,
            joined: m.joined,
            forgotten: m.forgotten,
            zone_survival: m.zone_survival,
            constraints: Vec::new(),
        }
    } else {
        codec::decode(raw).map_err(|e| format!("the stored shard map does not decode: {e}"))?
    };
    let mut joined = Vec::with_capacity(stored.joined.len());
    for m in stored.joined {
        joined.push(Member {
            node_id: m.node_id,
            peer_addr: m.peer_addr.parse().map_err(|e| {
                format!(
                    "the stored shard map's member {} has a bad address: {e}",
                    m.node_id
                )
            })?,
            region: m.region,
            zone: m.zone,
        });
    }
    let zone = stored.zone_survival;
    let mut constrained = std::collections::BTreeMap::new();
    for (id, text) in stored.constraints {
        let parsed = meridian_types::Constraints::parse(&text)
            .map_err(|e| format!("the stored shard map's shard {id} constraints: {e}"))?;
        constrained.insert(id, parsed);
    }
    let mut shards = stored.shards.into_iter().map(descriptor).map(|mut d| {
        if zone.contains(&d.id.0) {
            d.survival = Survival::Zone;
        }
        if let Some(c) = constrained.remove(&d.id.0) {
            d.constraints = c;
        }
        d
    });
    let meta = shards
        .next()
        .filter(|m| m.id == ShardId::META)
        .ok_or("the stored shard map does not begin with the metadata group")?;
    Ok(ShardMap {
        version: stored.version,
        meta,
        data: shards.collect(),
        joined,
        forgotten: stored.forgotten,
    })
}

/// The map stored in this node's replica of the metadata shard, if it holds one that has
/// applied the record.
pub fn read_local(engine: &dyn Engine) -> Result<Option<ShardMap>, String> {
    match mvcc::get(engine, ShardId::META, SHARD_MAP_KEY, Timestamp::MAX) {
        Ok(None) => Ok(None),
        Ok(Some((_, raw))) => decode(&raw).map(Some),
        Err(e) => Err(format!("reading the stored shard map: {e}")),
    }
}

/// `None` if the stored map is `founding` or a later version of it (replica lists changed by
/// moves, the layout the same), else the first difference, for an error message.
pub fn founding_difference(stored: &ShardMap, founding: &ShardMap) -> Option<String> {
    if stored.version > founding.version && stored.same_layout(founding) {
        return None;
    }
    difference(stored, founding)
}

/// `None` if `ours` is the stored map, else the first difference, for an error message.
pub fn difference(stored: &ShardMap, ours: &ShardMap) -> Option<String> {
    if stored == ours {
        return None;
    }
    if stored.version != ours.version {
        return Some(format!(
            "stored version {}, this node's {}",
            stored.version, ours.version
        ));
    }
    if stored.data.len() != ours.data.len() {
        return Some(format!(
            "stored map has {} data shards, this node's {}",
            stored.data.len(),
            ours.data.len()
        ));
    }
    stored
        .all()
        .zip(ours.all())
        .find(|(a, b)| a != b)
        .map(|(a, b)| format!("shard {}: stored {a:?}, this node's {b:?}", a.id))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn members() -> Vec<Member> {
        (1..=3)
            .map(|id| Member {
                node_id: id,
                peer_addr: format!("127.0.0.1:{}", 7100 + id).parse().unwrap(),
                region: format!("r{id}"),
                zone: "a".into(),
            })
            .collect()
    }

    /// Node 4, joining in region r1.
    fn newcomer() -> Member {
        Member {
            node_id: 4,
            peer_addr: "127.0.0.1:7104".parse().unwrap(),
            region: "r1".into(),
            zone: "b".into(),
        }
    }

    #[test]
    fn the_record_round_trips_exactly() {
        let map = ShardMap::founding(&members(), 3, &[b"a\0\xff".to_vec(), b"m".to_vec()], 0);
        let raw = encode(&map).unwrap();
        assert_eq!(decode(&raw).unwrap(), map);
        assert_eq!(difference(&map, &map), None);
        let mut extra = raw.to_vec();
        extra.push(0);
        assert!(decode(&extra).is_err(), "trailing bytes");
        assert!(decode(&raw[..raw.len() - 1]).is_err(), "truncated");
    }

    /// A map without joined members keeps the record's old bytes (a stored record of a
    /// cluster founded earlier must still match a compare-and-swap computed today); one with
    /// members round-trips them and is a later version of the same founding map.
    #[test]
    fn joined_members_round_trip_and_leave_a_map_without_them_as_it_was() {
        let map = ShardMap::founding(&members(), 3, &[], 4);
        let old_bytes = codec::encode(&StoredMap {
            version: map.version,
            shards: map.all().map(stored_shard).collect(),
        })
        .unwrap();
        assert_eq!(encode(&map).unwrap().to_vec(), old_bytes);
        let newcomer = newcomer();
        let joined = map
            .with_member_joined(&newcomer, &members())
            .unwrap()
            .expect("a new member");
        assert_eq!(joined.version, 2);
        let raw = encode(&joined).unwrap();
        assert_eq!(decode(&raw).unwrap(), joined);
        assert_eq!(founding_difference(&joined, &map), None);
        assert_eq!(joined.with_member_joined(&newcomer, &members()), Ok(None));
        let mut taken = newcomer.clone();
        taken.node_id = 2;
        assert!(map
            .with_member_joined(&taken, &members())
            .unwrap_err()
            .contains("node id 2 is taken"));
        let mut same_addr = newcomer.clone();
        same_addr.node_id = 5;
        assert!(joined
            .with_member_joined(&same_addr, &members())
            .unwrap_err()
            .contains("is node 4's"));
    }

    #[test]
    fn a_forgotten_member_round_trips_and_only_one_without_replicas_can_be_forgotten() {
        let founding = ShardMap::founding(&members(), 3, &[], 4);
        let newcomer = newcomer();
        let joined = founding
            .with_member_joined(&newcomer, &members())
            .unwrap()
            .unwrap();
        let joined_bytes = encode(&joined).unwrap();
        // Node 1 holds replicas: refused. Moved off every shard, it can be forgotten.
        assert!(joined
            .with_member_forgotten(1, &members())
            .unwrap_err()
            .contains("holds replicas"));
        let mut moved = joined.clone();
        for desc in std::iter::once(&mut moved.meta).chain(moved.data.iter_mut()) {
            for id in desc.replicas.iter_mut().filter(|id| **id == 1) {
                *id = 4;
            }
        }
        let forgot = moved.with_member_forgotten(1, &members()).unwrap().unwrap();
        assert_eq!(forgot.forgotten, vec![1]);
        assert_eq!(forgot.version, moved.version + 1);
        let raw = encode(&forgot).unwrap();
        assert_eq!(decode(&raw).unwrap(), forgot);
        // A map that forgot nobody is stored as before.
        assert_eq!(encode(&joined).unwrap(), joined_bytes);
        assert_eq!(forgot.with_member_forgotten(1, &members()), Ok(None));
        assert!(forgot
            .with_member_forgotten(9, &members())
            .unwrap_err()
            .contains("no member 9"));
        // Its id stays taken, even for a node asking to join as it did (node 4 here); its
        // address does not.
        let mut again = newcomer.clone();
        again.node_id = 1;
        assert!(forgot
            .with_member_joined(&again, &members())
            .unwrap_err()
            .contains("node id 1 was forgotten"));
        let forgot_4 = joined
            .with_member_forgotten(4, &members())
            .expect("node 4 holds nothing in `joined`")
            .unwrap();
        assert!(forgot_4
            .with_member_joined(&newcomer, &members())
            .unwrap_err()
            .contains("node id 4 was forgotten"));
        let mut new_id = newcomer.clone();
        new_id.node_id = 5;
        assert!(forgot_4
            .with_member_joined(&new_id, &members())
            .unwrap()
            .is_some());
    }

    #[test]
    fn zone_survival_round_trips_and_leaves_a_map_without_it_as_it_was() {
        let founding = ShardMap::founding(&members(), 3, &[], 4);
        let before = encode(&founding).unwrap();
        for plain in [founding.clone(), {
            let mut forgot = founding.clone();
            forgot.forgotten = vec![7];
            forgot
        }] {
            let mut zoned = plain.clone();
            zoned.data[1].home = Some("eu-west".into());
            zoned.data[1].survival = Survival::Zone;
            zoned.version += 1;
            let raw = encode(&zoned).unwrap();
            let back = decode(&raw).unwrap();
            assert_eq!(back, zoned);
            assert_eq!(back.data[1].survival, Survival::Zone);
            assert_eq!(back.data[0].survival, Survival::Region);
            assert_eq!(decode(&encode(&plain).unwrap()).unwrap(), plain);
        }
        assert_eq!(
            encode(&founding).unwrap(),
            before,
            "no zone survival: bytes as before"
        );
    }

    #[test]
    fn constraints_round_trip_and_leave_a_map_without_them_as_it_was() {
        let founding = ShardMap::founding(&members(), 3, &[], 4);
        let mut zoned = founding.clone();
        zoned.data[1].home = Some("eu-west".into());
        zoned.data[1].survival = Survival::Zone;
        // The bytes of the form before constraints existed.
        let zoned_bytes = codec::encode(&StoredMapWithSurvival {
            version: zoned.version,
            shards: zoned.all().map(stored_shard).collect(),
            joined: Vec::new(),
            forgotten: Vec::new(),
            zone_survival: vec![zoned.data[1].id.0],
        })
        .unwrap();
        for plain in [founding.clone(), zoned.clone()] {
            let mut constrained = plain.clone();
            constrained.data[2].constraints =
                meridian_types::Constraints::parse("-region=ap-south,-zone=c").unwrap();
            constrained.version += 1;
            let back = decode(&encode(&constrained).unwrap()).unwrap();
            assert_eq!(back, constrained);
            assert!(back.data[1].constraints.is_empty());
            assert_eq!(back.data[1].survival, plain.data[1].survival);
            assert_eq!(
                back.data[2].constraints.to_string(),
                "-region=ap-south,-zone=c"
            );
        }
        assert_eq!(
            encode(&zoned).unwrap(),
            zoned_bytes,
            "no constraints: bytes as before"
        );
    }

    #[test]
    fn a_map_from_another_configuration_is_a_named_difference() {
        let stored = ShardMap::founding(&members(), 3, &[], 8);
        let other_rf = ShardMap::founding(&members(), 2, &[], 8);
        let why = difference(&stored, &other_rf).expect("replicas differ");
        assert!(
            why.contains("shard s0") && why.contains("replicas: [1, 2]"),
            "{why}"
        );
        let moved = stored.with_replica_removed(stored.data[0].id, 1).unwrap();
        assert_eq!(
            founding_difference(&moved, &stored),
            None,
            "a later version"
        );
        let other_splits = ShardMap::founding(&members(), 3, &[], 4);
        let mut moved_other = other_splits.clone();
        moved_other.version = 2;
        assert!(
            founding_difference(&moved_other, &stored).is_some(),
            "another layout"
        );
        assert!(difference(&stored, &other_splits)
            .unwrap()
            .contains("data shards"));
    }

    #[test]
    fn a_map_too_large_for_one_value_is_refused() {
        let long: Vec<Vec<u8>> = (0..400u32)
            .map(|i| {
                let mut k = format!("{i:08}").into_bytes();
                k.resize(4_000, b'x');
                k
            })
            .collect();
        let map = ShardMap::founding(&members(), 3, &long, 0);
        let err = encode(&map).unwrap_err();
        assert!(err.contains("MAX_VALUE_BYTES"), "{err}");
    }
}

//! Unit tests of `shard_map`: founding maps and default split points, lookups, placement
//! across regions and zones, homes, zone survival and constraints, replica edits, and the
//! map cell.

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

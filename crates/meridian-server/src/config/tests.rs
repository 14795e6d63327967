//! Unit tests of config loading: flags over the file, defaults, and every validation error
//! naming its field.

use super::*;

#[test]
fn valid_flags_load() {
    let c = NodeConfig::load(&test_args()).unwrap();
    assert_eq!(c.region, "us");
    assert_eq!(c.initial_cluster[1].zone, "b");
}

#[test]
fn errors_name_the_field() {
    let mut a = test_args();
    a.peer_addr = Some("nope".into());
    assert!(NodeConfig::load(&a)
        .unwrap_err()
        .to_string()
        .contains("\"peer_addr\""));
    let mut a = test_args();
    a.initial_cluster = Some(vec!["1=127.0.0.1:7101".into(), "x=1".into()]);
    assert!(NodeConfig::load(&a)
        .unwrap_err()
        .to_string()
        .contains("initial_cluster[1]"));
    let mut a = test_args();
    a.initial_shards = Some(0);
    assert!(NodeConfig::load(&a)
        .unwrap_err()
        .to_string()
        .contains("cluster.initial_shards"));
}

#[test]
fn gc_and_home_region_flags_are_validated() {
    let c = NodeConfig::load(&test_args()).unwrap();
    assert_eq!(
        (c.cluster.gc_ttl_ms, c.cluster.gc_interval_ms),
        (900_000, 60_000)
    );
    let mut a = test_args();
    a.gc_ttl_ms = Some(0);
    assert!(NodeConfig::load(&a).is_ok(), "0 turns GC off");
    // At max_offset 500 ms, the TTL must cover 4 of them.
    for (ttl, ok) in [(1_999, false), (2_000, true)] {
        let mut a = test_args();
        a.gc_ttl_ms = Some(ttl);
        let loaded = NodeConfig::load(&a);
        assert_eq!(loaded.is_ok(), ok, "{ttl}: {loaded:?}");
        if let Err(e) = loaded {
            assert!(e.to_string().contains("cluster.gc_ttl_ms"), "{e}");
        }
    }
    let mut a = test_args();
    a.gc_interval_ms = Some(0);
    assert!(NodeConfig::load(&a)
        .unwrap_err()
        .to_string()
        .contains("cluster.gc_interval_ms"));
    let mut a = test_args();
    a.home_regions = Some(vec!["user5=eu".into(), "=us".into()]);
    let c = NodeConfig::load(&a).unwrap();
    let starts: Vec<&[u8]> = c.home_regions.iter().map(|r| &r.start[..]).collect();
    assert_eq!(starts, [&b""[..], &b"user5"[..]], "sorted by start key");
    a.home_regions = Some(vec!["=mars".into()]);
    assert!(NodeConfig::load(&a)
        .unwrap_err()
        .to_string()
        .contains("cluster.home_regions[0]"));
}

#[test]
fn replica_constraints_are_checked_at_startup() {
    let mut a = test_args();
    a.initial_cluster = Some(vec![
        "1=127.0.0.1:7101@us/a".into(),
        "2=127.0.0.1:7102@eu/b".into(),
        "3=127.0.0.1:7103@ap/a".into(),
        "4=127.0.0.1:7104@us/c".into(),
    ]);
    a.replica_constraints = Some(vec!["user5:-region=eu".into(), ":-zone=c".into()]);
    let c = NodeConfig::load(&a).unwrap();
    let starts: Vec<&[u8]> = c.replica_constraints.iter().map(|r| &r.start[..]).collect();
    assert_eq!(starts, [&b""[..], &b"user5"[..]], "sorted by start key");
    for (rules, field, want) in [
        (
            vec![":+region=mars"],
            "cluster.replica_constraints[0]",
            "no member has",
        ),
        (
            vec!["a:-zone=b", "b:+region=us,+region=eu"],
            "cluster.replica_constraints[1]",
            "cannot both hold",
        ),
        (
            vec!["a:-zone=a"],
            "cluster.replica_constraints[0]",
            "allow 2 member(s)",
        ),
    ] {
        a.replica_constraints = Some(rules.iter().map(|r| r.to_string()).collect());
        let e = NodeConfig::load(&a).unwrap_err().to_string();
        assert!(e.contains(field) && e.contains(want), "{e}");
    }
    // A home the constraints exclude.
    a.replica_constraints = Some(vec![":-region=eu".into()]);
    a.home_regions = Some(vec!["=eu".into()]);
    let e = NodeConfig::load(&a).unwrap_err().to_string();
    assert!(e.contains("allow 0 member(s) in the home region eu"), "{e}");
}

/// The closed-timestamp lag is 0 (off) or at least four publication intervals.
#[test]
fn closed_ts_flags_are_validated() {
    let c = NodeConfig::load(&test_args()).unwrap();
    assert_eq!(
        (c.cluster.closed_ts_lag_ms, c.cluster.closed_ts_interval_ms),
        (3_000, 200)
    );
    for (lag, interval, ok) in [
        (0, 200, true),
        (799, 200, false),
        (800, 200, true),
        (800, 0, false),
    ] {
        let mut a = test_args();
        a.closed_ts_lag_ms = Some(lag);
        a.closed_ts_interval_ms = Some(interval);
        let loaded = NodeConfig::load(&a);
        assert_eq!(loaded.is_ok(), ok, "{lag}/{interval}: {loaded:?}");
        if let Err(e) = loaded {
            assert!(e.to_string().contains("cluster.closed_ts_"), "{e}");
        }
    }
}

/// A joining node names a member instead of listing the founders; giving both is an error,
/// and the location it does not give defaults as an `initial_cluster` entry's does.
#[test]
fn join_replaces_initial_cluster() {
    let mut a = test_args();
    a.join = Some("127.0.0.1:7001".into());
    let e = NodeConfig::load(&a).unwrap_err().to_string();
    assert!(e.contains("\"join\"") && e.contains("not both"), "{e}");
    a.initial_cluster = None;
    a.node_id = Some(4);
    a.region = Some("eu".into());
    let c = NodeConfig::load(&a).unwrap();
    assert_eq!(c.join.as_deref(), Some("127.0.0.1:7001"));
    assert!(c.initial_cluster.is_empty());
    assert_eq!((c.region.as_str(), c.zone.as_str()), ("eu", "default"));
    a.join = None;
    let e = NodeConfig::load(&a).unwrap_err().to_string();
    assert!(e.contains("initial_cluster") && e.contains("join"), "{e}");
}

#[test]
fn peer_dial_overrides_are_validated() {
    let mut a = test_args();
    a.peer_dial = Some(vec!["2=127.0.0.1:9002".into()]);
    let c = NodeConfig::load(&a).unwrap();
    assert_eq!(c.peer_dial[&2].to_string(), "127.0.0.1:9002");
    for (bad, needle) in [
        ("9=127.0.0.1:1", "not in initial_cluster"),
        ("2", "id=host:port"),
        ("x=127.0.0.1:1", "not a node id"),
        ("2=nowhere", "ip:port"),
    ] {
        let mut a = test_args();
        a.peer_dial = Some(vec![bad.into()]);
        let e = NodeConfig::load(&a).unwrap_err().to_string();
        assert!(
            e.contains("peer_dial[0]") && e.contains(needle),
            "{bad}: {e}"
        );
    }
}

#[test]
fn repeated_or_empty_split_points_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.toml");
    let load = |points: &str| {
        std::fs::write(&path, format!("[cluster]\nsplit_points = {points}\n")).unwrap();
        let mut a = test_args();
        a.config = Some(path.clone());
        NodeConfig::load(&a)
    };
    assert!(load(r#"["g", "p"]"#).is_ok());
    let e = load(r#"["g", "p", "g"]"#).unwrap_err().to_string();
    assert!(
        e.contains("cluster.split_points[2]") && e.contains("twice"),
        "{e}"
    );
    let e = load(r#"["g", ""]"#).unwrap_err().to_string();
    assert!(
        e.contains("cluster.split_points[1]") && e.contains("empty"),
        "{e}"
    );
}

#[test]
fn election_timeout_min_flag_sets_the_maximum_to_twice_it() {
    let mut a = test_args();
    a.election_timeout_min_ms = Some(600);
    a.heartbeat_interval_ms = Some(100);
    let c = NodeConfig::load(&a).unwrap();
    assert_eq!(c.raft.election_timeout_min_ms, 600);
    assert_eq!(c.raft.election_timeout_max_ms, 1_200);
    a.election_timeout_max_ms = Some(900);
    assert_eq!(
        NodeConfig::load(&a).unwrap().raft.election_timeout_max_ms,
        900
    );
}

#[test]
fn proposals_in_flight_defaults_to_two_and_is_bounded() {
    let mut a = test_args();
    assert_eq!(NodeConfig::load(&a).unwrap().raft.proposals_in_flight, 2);
    a.proposals_in_flight = Some(0);
    assert_eq!(NodeConfig::load(&a).unwrap().raft.proposals_in_flight, 0);
    a.proposals_in_flight = Some(MAX_PROPOSALS_IN_FLIGHT + 1);
    let e = NodeConfig::load(&a).unwrap_err().to_string();
    assert!(e.contains("raft.proposals_in_flight"), "{e}");
}

#[test]
fn election_timeout_min_at_or_above_max_is_rejected() {
    let mut a = test_args();
    a.election_timeout_min_ms = Some(600);
    a.election_timeout_max_ms = Some(600);
    a.heartbeat_interval_ms = Some(100);
    let e = NodeConfig::load(&a).unwrap_err().to_string();
    assert!(e.contains("raft.election_timeout_max_ms"), "{e}");
    assert!(e.contains("must exceed"), "{e}");
}

#[test]
fn unknown_file_fields_are_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.toml");
    std::fs::write(&path, "node_id = 1\nbogus = 2\n").unwrap();
    let a = StartArgs {
        config: Some(path),
        ..Default::default()
    };
    let e = NodeConfig::load(&a).unwrap_err().to_string();
    assert!(e.contains("bogus"), "{e}");
}

/// A bound computed from a huge setting must not wrap around and let a small one pass: each
/// of these was accepted in a release build (and panicked in a debug one).
#[test]
fn huge_settings_do_not_wrap_the_bounds_they_set() {
    let mut a = test_args();
    a.max_offset_ms = Some(u64::MAX / 4 + 1);
    a.gc_ttl_ms = Some(60_000);
    let e = NodeConfig::load(&a).expect_err("a wrapped 4 x max_offset_ms");
    assert!(e.to_string().contains("cluster.max_offset_ms"), "{e}");
    let mut a = test_args();
    a.closed_ts_interval_ms = Some(u64::MAX / 4 + 1);
    a.closed_ts_lag_ms = Some(60_000);
    let e = NodeConfig::load(&a).expect_err("a wrapped 4 x closed_ts_interval_ms");
    assert!(e.to_string().contains("cluster.closed_ts_lag_ms"), "{e}");
    let mut a = test_args();
    a.heartbeat_interval_ms = Some(u64::MAX / 3 + 1);
    a.election_timeout_min_ms = Some(3_000);
    a.election_timeout_max_ms = Some(6_000);
    assert!(
        NodeConfig::load(&a).is_err(),
        "a wrapped 3 x interval passed"
    );
}

/// `max_offset_ms` has an upper bound: every wait it sets (a new leader's, a commit's, a
/// restarted node's) is that long, and HLC admission converts it into uhlc's 32.32 fixed point,
/// where a value near `u64::MAX` ms wraps. 4.6e18 ms was accepted.
#[test]
fn max_offset_above_a_minute_is_refused() {
    let mut a = test_args();
    a.max_offset_ms = Some(MAX_MAX_OFFSET_MS);
    a.gc_ttl_ms = Some(0);
    NodeConfig::load(&a).expect("a minute is accepted");
    for v in [MAX_MAX_OFFSET_MS + 1, u64::MAX / 4 + 1, u64::MAX] {
        a.max_offset_ms = Some(v);
        let e = NodeConfig::load(&a).expect_err("past a minute");
        assert!(e.to_string().contains("cluster.max_offset_ms"), "{v}: {e}");
        assert!(e.to_string().contains("at most 60000"), "{v}: {e}");
    }
}

//! Cluster test: leaders follow their shard's home region (`--home-regions`).
//!
//! Three nodes in us-east, eu-west and ap-south; every data shard homed in eu-west (node 2).
//! 1. After bootstrap every data shard is led by node 2 (its replica bootstraps the group).
//! 2. SIGKILL node 2: the others elect leaders among themselves.
//! 3. Restart node 2: every data shard's leadership comes back to it, by the leader-follow
//!    loop's transfers. Quiescence is off, so live leaders keep heartbeating and the restarted
//!    node cannot win an election on its own: without the loop the leaders would stay where
//!    the failover put them. A value written while node 2 was down is still read afterwards.
//!
//! A second cluster starts without home rules (quiescence on) and gives a shard a home at run
//! time (`meridian cluster placement SHARD --home REGION`, a region where a follower of it
//! is): the leader moves there, and every node's status shows the home. Bad requests are
//! refused with their reason (a region without a replica, the metadata shard, an unknown
//! shard). A restarted node, configured as at the founding (no home rules), starts and keeps
//! the stored home (it compares its configuration with the stored map, and a home is not part
//! of the layout it checks); the leader is back in the home region afterwards.
//! `--home none` drops the home.
//!
//! A third cluster (four nodes: nodes 1 and 4 in us-east) homes its shard in us-east and gives
//! it a replica on both us-east nodes. Four times, the leader (in us-east) is SIGKILLed: the
//! first leader any survivor reports afterwards must be the other us-east node, because the
//! replicas outside the home leave elections to a live home voter (`election_bias`). Without
//! the bias each of the three survivors may win the first election (the loop would then
//! move the lead home later), so four home wins in a row would be luck of about 1 in 80.

use crate::common::*;
use meridian_client::fetch_status;
use nix::sys::signal::Signal;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

const BASE_PORT: u16 = 25_400;
const PLACEMENT_PORT: u16 = 32_400;
const BIAS_PORT: u16 = 22_700;
/// Leader crashes in the election-bias scenario.
const BIAS_ROUNDS: usize = 4;
const SHARDS: u32 = 4;
const HOME_NODE: u64 = 2;
/// Bound on leadership reaching the wanted nodes.
const CONVERGE_TIMEOUT: Duration = Duration::from_secs(90);

#[test]
fn leaders_return_to_the_home_region_after_a_restart() {
    run_scenario(scenario());
}

#[test]
fn a_home_set_at_run_time_is_followed_and_outlives_restarts() {
    run_scenario(placement_scenario());
}

#[test]
fn a_home_region_with_two_voters_wins_the_election_after_its_leader_crashes() {
    run_scenario(bias_scenario());
}

/// Data shard id → leader, as the first of `nodes` that answers sees it.
async fn leaders(cluster: &meridian_cli::LocalCluster, nodes: &[u64]) -> BTreeMap<u64, u64> {
    for id in nodes {
        let Ok(addr) = cluster.client_addr(*id) else {
            continue;
        };
        if let Ok(status) = fetch_status(&addr, Duration::from_secs(2)).await {
            return status
                .shards
                .iter()
                .filter(|s| s.shard_id != 0)
                .map(|s| (s.shard_id, s.leader_id))
                .collect();
        }
    }
    BTreeMap::new()
}

/// Waits until `want` holds for every data shard's leader; returns how long it took.
async fn wait_leaders(
    cluster: &meridian_cli::LocalCluster,
    nodes: &[u64],
    what: &str,
    want: impl Fn(u64) -> bool,
) -> Duration {
    let started = Instant::now();
    loop {
        let seen = leaders(cluster, nodes).await;
        if seen.len() == SHARDS as usize && seen.values().all(|l| want(*l)) {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < CONVERGE_TIMEOUT,
            "{what}: leaders after {CONVERGE_TIMEOUT:?}: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn scenario() {
    let dir = tempfile::tempdir().unwrap();
    // Quiescence off: live leaders heartbeat, so the restarted node 2 does not win elections
    // on its own (its pre-votes are refused) and only the leader-follow loop can bring
    // leadership home.
    let home: &[&str] = &["--home-regions", "=eu-west", "--quiesce", "false"];
    let per_node: Vec<(u64, &[&str])> = (1..=3).map(|id| (id, home)).collect();
    let cluster = start_cluster(BASE_PORT, dir.path(), SHARDS, &per_node);
    cluster
        .wait_ready(READY_TIMEOUT)
        .await
        .expect("cluster ready");
    let status = fetch_status(&cluster.client_addr(1).unwrap(), Duration::from_secs(2))
        .await
        .expect("status");
    for shard in status.shards.iter().filter(|s| s.shard_id != 0) {
        assert_eq!(shard.home_region, "eu-west", "shard {}", shard.shard_id);
        assert_eq!(shard.replicas[0], HOME_NODE, "home replica first");
    }

    let took = wait_leaders(&cluster, &[1, 2, 3], "after bootstrap", |l| l == HOME_NODE).await;
    eprintln!("every data shard led from eu-west {took:?} after ready");

    cluster.kill(HOME_NODE, Signal::SIGKILL).expect("kill");
    let took = wait_leaders(&cluster, &[1, 3], "after the kill", |l| {
        l != 0 && l != HOME_NODE
    })
    .await;
    eprintln!("failover to the other regions took {took:?}");
    let client = connect_client(vec![cluster.client_addr(1).unwrap()]).await;
    client
        .put("user1home", "written while eu-west was down")
        .await
        .expect("put");

    cluster.restart(HOME_NODE).expect("restart");
    let took = wait_leaders(&cluster, &[1, 3], "after the restart", |l| l == HOME_NODE).await;
    eprintln!("leadership back in eu-west {took:?} after the restart");
    assert_eq!(
        client.get("user1home").await.expect("get").as_deref(),
        Some(&b"written while eu-west was down"[..])
    );
    let log = cluster.log_contents(1).unwrap() + &cluster.log_contents(3).unwrap();
    assert!(
        log.contains("handing leadership to the shard's home region"),
        "the move home was the leader-follow loop's"
    );
}

/// Data shard id → its home region ("" for none), as node `id` reports it.
async fn homes(cluster: &meridian_cli::LocalCluster, id: u64) -> Option<BTreeMap<u64, String>> {
    let status = fetch_status(&cluster.client_addr(id).ok()?, Duration::from_secs(2))
        .await
        .ok()?;
    Some(
        status
            .shards
            .iter()
            .filter(|s| s.shard_id != 0)
            .map(|s| (s.shard_id, s.home_region.clone()))
            .collect(),
    )
}

/// Waits until node `id` reports `shard`'s home as `want`.
async fn wait_home(cluster: &meridian_cli::LocalCluster, id: u64, shard: u64, want: &str) {
    let started = Instant::now();
    loop {
        let seen = homes(cluster, id).await;
        if seen
            .as_ref()
            .and_then(|h| h.get(&shard))
            .map(String::as_str)
            == Some(want)
        {
            return;
        }
        assert!(
            started.elapsed() < CONVERGE_TIMEOUT,
            "node {id}: homes after {CONVERGE_TIMEOUT:?}: {seen:?}, want shard {shard} in {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits until `shard` is led by `want`; returns how long it took.
async fn wait_shard_leader(
    cluster: &meridian_cli::LocalCluster,
    shard: u64,
    want: u64,
    what: &str,
) -> Duration {
    let started = Instant::now();
    loop {
        let seen = leaders(cluster, &[1, 2, 3]).await;
        if seen.get(&shard) == Some(&want) {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < CONVERGE_TIMEOUT,
            "{what}: shard {shard} not led by node {want} after {CONVERGE_TIMEOUT:?}: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn placement_scenario() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = start_cluster(PLACEMENT_PORT, dir.path(), SHARDS, &[]);
    let status = cluster
        .wait_ready(READY_TIMEOUT)
        .await
        .expect("cluster ready");
    let endpoints: Vec<String> = (1..=3).map(|id| cluster.client_addr(id).unwrap()).collect();
    let shard = 1;
    let desc = status
        .shards
        .iter()
        .find(|s| s.shard_id == shard)
        .expect("shard 1")
        .clone();
    assert_eq!(desc.home_region, "", "no home rules at the founding");
    let led_by = leaders(&cluster, &[1, 2, 3]).await[&shard];
    let target = *desc
        .replicas
        .iter()
        .find(|n| **n != led_by)
        .expect("a follower");
    let region = status
        .nodes
        .iter()
        .find(|n| n.node_id == target)
        .expect("the follower's node")
        .region
        .clone();
    eprintln!("shard {shard}: led by node {led_by}; homing it in {region} (node {target})");

    let shard_text = shard.to_string();
    let said = cli(
        &endpoints,
        &["cluster", "placement", &shard_text, "--home", &region],
    );
    assert!(
        said.contains(&format!("shard {shard}: home {region}")),
        "{said}"
    );
    let took = wait_shard_leader(&cluster, shard, target, "after the placement").await;
    eprintln!("shard {shard} led from {region} {took:?} after the placement");
    for id in 1..=3 {
        wait_home(&cluster, id, shard, &region).await;
    }
    let others = homes(&cluster, 1).await.expect("status");
    assert!(
        others.iter().all(|(s, h)| *s == shard || h.is_empty()),
        "only shard {shard} has a home: {others:?}"
    );

    let endpoints_arg = endpoints.join(",");
    for (args, want) in [
        (["2", "--home", "mars"], "has no replica in region"),
        (["0", "--home", "none"], "metadata shard"),
        (["99", "--home", "none"], "no data shard 99"),
    ] {
        let mut full: Vec<String> = ["cluster", "placement"].map(String::from).to_vec();
        full.extend(args.map(String::from));
        full.extend(["--endpoints".to_string(), endpoints_arg.clone()]);
        let said = cli_refused(full).await;
        assert!(said.contains(want), "{args:?}: {said}");
    }

    // Restarted with the founding configuration (no home rules), a node keeps the stored home.
    let other = (1..=3).find(|n| *n != target).unwrap();
    cluster.kill(other, Signal::SIGKILL).expect("kill");
    cluster.restart(other).expect("restart");
    wait_home(&cluster, other, shard, &region).await;
    assert!(
        cluster
            .log_contents(other)
            .unwrap()
            .contains("differs from this node's home_regions; the shard map's applies"),
        "the restarted node says its configuration's home is overridden"
    );
    let took = wait_shard_leader(&cluster, shard, target, "after the restart").await;
    eprintln!("node {other} restarted with the stored home; shard {shard} led from {region} {took:?} later");
    let log = cluster.log_contents(led_by).unwrap();
    assert!(
        log.contains("handing leadership to the shard's home region"),
        "the move was the leader-follow loop's"
    );

    let said = cli(
        &endpoints,
        &["cluster", "placement", &shard_text, "--home", "none"],
    );
    assert!(
        said.contains(&format!("shard {shard}: home none")),
        "{said}"
    );
    for id in 1..=3 {
        wait_home(&cluster, id, shard, "").await;
    }
}

/// `shard`'s (leader, term, last log index) as node `id` reports it.
async fn view(
    cluster: &meridian_cli::LocalCluster,
    id: u64,
    shard: u64,
) -> Option<(u64, u64, u64)> {
    let status = fetch_status(&cluster.client_addr(id).ok()?, Duration::from_secs(1))
        .await
        .ok()?;
    let s = status.shards.iter().find(|s| s.shard_id == shard)?;
    Some((s.leader_id, s.term, s.last_log_index))
}

/// Whether node `id`'s last election-bias line says it holds back (one data shard).
fn held_back(cluster: &meridian_cli::LocalCluster, id: u64) -> bool {
    let log = cluster.log_contents(id).unwrap_or_default();
    let holds = log.rfind("leaves elections to the home region");
    let campaigns = log.rfind("may start elections again");
    holds.is_some() && holds > campaigns
}

async fn bias_scenario() {
    let dir = tempfile::tempdir().unwrap();
    let config = meridian_cli::LocalClusterConfig::new(binary(), 4, BIAS_PORT, dir.path())
        // Quiescence off: every follower's election timer runs, so without the bias the
        // three survivors race fairly (a parked follower waits for the liveness watchdog,
        // while a just-restarted node's timer runs: that alone would favour the restarted one).
        .common_args([
            "--initial-shards",
            "1",
            "--home-regions",
            "=us-east",
            "--quiesce",
            "false",
        ]);
    let cluster = meridian_cli::LocalCluster::start(config).expect("spawning the cluster");
    eprintln!(
        "cluster at ports {BIAS_PORT}+, logs in {}",
        dir.path().display()
    );
    let status = cluster.wait_ready(READY_TIMEOUT).await.expect("ready");
    let desc = status
        .shards
        .iter()
        .find(|s| s.shard_id != 0)
        .expect("a data shard")
        .clone();
    let shard = desc.shard_id;
    let home_nodes = [1u64, 4];
    let missing = *home_nodes
        .iter()
        .find(|n| !desc.replicas.contains(n))
        .expect("one voter per region at the founding");
    let client = connect_client(cluster.endpoints()).await;
    let added = client
        .add_replica(shard, missing)
        .await
        .expect("add-replica");
    eprintln!("shard {shard}: second us-east voter on node {missing}: {added:?}");

    for round in 0..BIAS_ROUNDS {
        // A settled leader in us-east, every voter's log at its last index.
        let give_up = Instant::now() + CONVERGE_TIMEOUT;
        let (leader, term) = loop {
            let mut views = Vec::new();
            for id in 1..=4 {
                views.push(view(&cluster, id, shard).await);
            }
            // And the bias in force again on the nodes outside the home (after a restart, it
            // takes a leader-follow round to see the restarted home voter live).
            let held = [2, 3].map(|n| held_back(&cluster, n));
            let first = views[0];
            if let Some((l, t, last)) = first {
                if home_nodes.contains(&l)
                    && views.iter().all(|v| *v == Some((l, t, last)))
                    && held.iter().all(|h| *h)
                {
                    break (l, t);
                }
            }
            assert!(
                Instant::now() < give_up,
                "round {round}: views {views:?}, held back {held:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        cluster.kill(leader, Signal::SIGKILL).expect("kill");
        let killed_at = Instant::now();
        let survivors: Vec<u64> = (1..=4).filter(|n| *n != leader).collect();
        let (next, next_term) = loop {
            let mut found = None;
            for id in &survivors {
                if let Some((l, t, _)) = view(&cluster, *id, shard).await {
                    if l != 0 && l != leader && t > term {
                        found = Some((l, t));
                        break;
                    }
                }
            }
            if let Some(f) = found {
                break f;
            }
            assert!(
                killed_at.elapsed() < CONVERGE_TIMEOUT,
                "round {round}: no new leader of shard {shard}"
            );
            tokio::time::sleep(Duration::from_millis(30)).await;
        };
        eprintln!(
            "round {round}: node {leader} (term {term}) killed; node {next} leads in term \
             {next_term} {:?} later",
            killed_at.elapsed()
        );
        assert!(
            home_nodes.contains(&next),
            "round {round}: the first leader after node {leader}'s crash is node {next}, \
             outside the home region"
        );
        cluster.restart(leader).expect("restart");
    }
}

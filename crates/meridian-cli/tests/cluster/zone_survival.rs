//! Cluster test: survival goals (`meridian cluster placement SHARD --home R --survive zone`).
//!
//! Five nodes: 1, 4 and 5 in us-east (zones a, b, c), 2 in eu-west, 3 in ap-south; one data
//! shard, given a replica on nodes 1 to 4 (four voters).
//! 1. Zone survival is refused where the shard cannot have three replicas (eu-west has one
//!    node).
//! 2. **Control**, region survival: with nodes 2, 3 and 5 killed, two of the four voters are
//!    left and a write cannot commit. The nodes are restarted.
//! 3. `--home us-east --survive zone`: the command adds a replica on node 5 (us-east had two),
//!    and the shard's leader changes the group to voters {1, 4, 5} and learners {2, 3};
//!    status shows `us-east (zone)`. The learners keep
//!    receiving closed timestamps and serve follower reads in their regions.
//! 4. The same three nodes killed: two of the three voters are left, and writes commit.
//! 5. The nodes restarted, `--survive region` makes every replica vote again and removes
//!    the two us-east replicas not needed any more (one per region is left). With every
//!    us-east node killed, writes commit in eu-west and ap-south. Every write acknowledged
//!    throughout (a writer ran from the start) is read back.

use crate::common::*;
use meridian_cli::{LocalCluster, LocalClusterConfig};
use meridian_client::{fetch_status, proto::ShardInfo, Client};
use nix::sys::signal::Signal;
use std::time::{Duration, Instant};

const BASE_PORT: u16 = 26_400;
/// The bootstrap test's cluster.
const BOOT_PORT: u16 = 27_300;
/// The parked-leader test's cluster.
const PARKED_PORT: u16 = 26_600;
/// Twice the local cluster's election_timeout_max (1.2 s): openraft's lease of a leader
/// parked that long ago has lapsed.
const LEASE_LAPSED: Duration = Duration::from_millis(2_400);
const NODES: u64 = 5;
const SHARD: u64 = 1;
/// The nodes killed in the control and again under zone survival: both replicas outside
/// us-east and one us-east voter.
const KILLED: [u64; 3] = [2, 3, 5];
/// The nodes of the shard's home region.
const US_EAST: [u64; 3] = [1, 4, 5];
/// Bound on the group reaching the roles wanted, and on a write under zone survival.
const CONVERGE_TIMEOUT: Duration = Duration::from_secs(90);
/// How long the control's write is given to commit: several election timeouts of the local
/// test cluster's Raft timings.
const CONTROL_WAIT: Duration = Duration::from_secs(8);

#[test]
fn zone_survival_keeps_the_votes_in_the_home_region() {
    run_scenario(scenario());
}

#[test]
fn zone_survival_set_at_bootstrap() {
    run_scenario(bootstrap_scenario());
}

/// The goal given while the shard is quiesced: its leader is parked, and openraft refuses any
/// entry from a leader whose quorum lease lapsed (a `ForwardToLeader` naming nobody), so the
/// role change failed at every attempt (each 10 election timeouts later, the group parked
/// again in between) and the roles never changed (CI's container test, stop 52). The change
/// must renew the lease first, as a client write does.
#[test]
fn zone_survival_given_while_the_leader_is_parked() {
    run_scenario(parked_scenario());
}

async fn parked_scenario() {
    let (_dir, cluster, endpoints, founding) = start_ready(PARKED_PORT).await;
    // A replica on every node: us-east then holds three (1, 4, 5), so the placement command
    // adds nothing and leaves the role change to the parked leader alone.
    let all: Vec<u64> = (1..=NODES).collect();
    for node in all.iter().filter(|n| !founding.contains(n)) {
        cli(
            &endpoints,
            &[
                "cluster",
                "add-replica",
                &SHARD.to_string(),
                &node.to_string(),
            ],
        );
    }
    wait_roles(&cluster, &all, &all, &[]).await;
    wait_all_live(&cluster).await;
    let quiet = wait_all_quiesced(&cluster, &all).await;
    eprintln!("every replica quiesced {quiet:?} after the adds");
    // Past openraft's lease of the parked leader (election_timeout_max, 1.2 s here): quiet
    // from the last heartbeat answered, which the parking came after.
    tokio::time::sleep(LEASE_LAPSED).await;
    let (quiet, total) = quiesced(&node_statuses(&cluster, &all).await);
    assert_eq!(quiet, total, "a replica woke while the cluster was idle");

    let said = home_us_east(&endpoints, "zone");
    assert!(
        !said.contains("added a replica") && said.contains("survives a zone failure"),
        "{said}"
    );
    let placed = Instant::now();
    let view = wait_roles(&cluster, &all, &US_EAST, &[2, 3]).await;
    eprintln!(
        "voters {:?}, learners {:?} {:?} after the placement",
        view.voters,
        view.learners,
        placed.elapsed()
    );
}

/// The five-node cluster at `base_port`, once ready: its data dir, the cluster, every node's
/// client address and the data shard's founding replicas.
async fn start_ready(base_port: u16) -> (tempfile::TempDir, LocalCluster, Vec<String>, Vec<u64>) {
    let (dir, cluster) = start_with(base_port, &[]);
    let status = cluster
        .wait_ready(READY_TIMEOUT)
        .await
        .expect("cluster ready");
    let endpoints: Vec<String> = (1..=NODES)
        .map(|id| cluster.client_addr(id).unwrap())
        .collect();
    let founding = status
        .shards
        .iter()
        .find(|s| s.shard_id == SHARD)
        .expect("the data shard")
        .replicas
        .clone();
    (dir, cluster, endpoints, founding)
}

fn start_with(base_port: u16, args: &[&str]) -> (tempfile::TempDir, LocalCluster) {
    let dir = tempfile::tempdir().unwrap();
    let mut common = vec!["--initial-shards", "1"];
    common.extend_from_slice(args);
    let config = LocalClusterConfig::new(binary(), NODES as usize, base_port, dir.path())
        .common_args(common)
        .node_labels(1, "us-east", "a")
        .node_labels(2, "eu-west", "a")
        .node_labels(3, "ap-south", "a")
        .node_labels(4, "us-east", "b")
        .node_labels(5, "us-east", "c");
    let cluster = LocalCluster::start(config).expect("spawning the cluster");
    eprintln!(
        "cluster at ports {base_port}+, logs in {}",
        dir.path().display()
    );
    (dir, cluster)
}

/// The data shard as node `node` sees it, if it answers.
async fn shard_at(cluster: &LocalCluster, node: u64) -> Option<ShardInfo> {
    shard_info_at(cluster, node, SHARD).await
}

/// Waits until the data shard's leader (asked through `nodes`) reports voters `voters` and
/// learners `learners`, not joint; returns that view.
async fn wait_roles(
    cluster: &LocalCluster,
    nodes: &[u64],
    voters: &[u64],
    learners: &[u64],
) -> ShardInfo {
    wait_shard_roles(cluster, SHARD, nodes, (voters, learners), CONVERGE_TIMEOUT).await
}

/// Waits until node 1 reports every node live (the placement command adds replicas on live
/// nodes only).
async fn wait_all_live(cluster: &LocalCluster) {
    let started = Instant::now();
    loop {
        let addr = cluster.client_addr(1).unwrap();
        if let Ok(status) = fetch_status(&addr, Duration::from_secs(2)).await {
            if status.nodes.len() == NODES as usize && status.nodes.iter().all(|n| n.live) {
                return;
            }
        }
        assert!(
            started.elapsed() < CONVERGE_TIMEOUT,
            "not every node live after {CONVERGE_TIMEOUT:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `meridian cluster placement SHARD --home us-east --survive GOAL`; its output.
fn home_us_east(endpoints: &[String], goal: &str) -> String {
    let shard = SHARD.to_string();
    let args = [
        "cluster",
        "placement",
        &shard,
        "--home",
        "us-east",
        "--survive",
        goal,
    ];
    cli(endpoints, &args)
}

/// Whether a put through `client` commits within `wait`.
async fn commits(client: &Client, key: &str, wait: Duration) -> bool {
    matches!(
        tokio::time::timeout(wait, client.put(key.to_string(), key.to_string())).await,
        Ok(Ok(_))
    )
}

fn kill_and_restart(cluster: &LocalCluster, kill: bool) {
    for node in KILLED {
        match kill {
            true => cluster.kill(node, Signal::SIGKILL).expect("kill"),
            false => cluster.restart(node).expect("restart"),
        }
    }
}

async fn scenario() {
    let (_dir, cluster, endpoints, founding) = start_ready(BASE_PORT).await;
    eprintln!("shard {SHARD}'s founding replicas: {founding:?}");
    let shard_text = SHARD.to_string();
    // Nodes 1 to 4 hold replicas; node 5 gets one from the placement command.
    let four: Vec<u64> = (1..=4).collect();
    assert!(
        !founding.contains(&5),
        "placement gives node 5 no founding replica"
    );
    for node in four.iter().filter(|n| !founding.contains(n)) {
        cli(
            &endpoints,
            &["cluster", "add-replica", &shard_text, &node.to_string()],
        );
    }
    let all: Vec<u64> = (1..=NODES).collect();
    wait_roles(&cluster, &all, &four, &[]).await;

    // 1. Not where the shard lacks three replicas.
    let said = cli_refused(
        [
            "cluster",
            "placement",
            &shard_text,
            "--home",
            "eu-west",
            "--survive",
            "zone",
            "--endpoints",
            &endpoints.join(","),
        ]
        .map(String::from)
        .to_vec(),
    )
    .await;
    assert!(
        said.contains("zone survival needs 3 replicas of shard 1 in eu-west: it has 1 and 0 live"),
        "{said}"
    );

    let client = connect_client(vec![endpoints[0].clone(), endpoints[3].clone()]).await;
    let (acked, stop, writer) = start_writer(&client, "zone").await;

    // 2. Control: four voters, two of them killed (and node 5, which holds none yet).
    kill_and_restart(&cluster, true);
    let control = commits(&client, "control-write", CONTROL_WAIT).await;
    assert!(
        !control,
        "with 2 of 4 voters left a write committed: the control does not test what it should"
    );
    eprintln!("control: no write committed within {CONTROL_WAIT:?} with 2 of 4 voters");
    kill_and_restart(&cluster, false);
    wait_roles(&cluster, &all, &four, &[]).await;
    wait_all_live(&cluster).await;

    // 3. Zone survival in us-east.
    let said = home_us_east(&endpoints, "zone");
    assert!(
        said.contains("added a replica on node 5 for zone survival")
            && said.contains("survives a zone failure"),
        "{said}"
    );
    let placed = Instant::now();
    let view = wait_roles(&cluster, &all, &[1, 4, 5], &[2, 3]).await;
    eprintln!(
        "voters {:?}, learners {:?} {:?} after the placement",
        view.voters,
        view.learners,
        placed.elapsed()
    );
    assert_eq!(view.survival, "zone");
    let shown = cli(&endpoints, &["cluster", "status"]);
    assert!(shown.contains("us-east (zone)"), "{shown}");
    for learner in [2, 3] {
        let started = Instant::now();
        let mut first = 0;
        loop {
            let now = shard_at(&cluster, learner).await.map_or(0, |s| s.closed_ts);
            if first == 0 {
                first = now;
            } else if now > first {
                break;
            }
            assert!(
                started.elapsed() < CONVERGE_TIMEOUT,
                "learner {learner}'s closed timestamp does not advance: {first} then {now}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    // ... and serve follower reads in their regions.
    client
        .put("zone-learner-read".to_string(), "seen abroad".to_string())
        .await
        .expect("put");
    for (learner, region) in [(2, "eu-west"), (3, "ap-south")] {
        let started = Instant::now();
        loop {
            let output = run_bounded(
                std::process::Command::new(binary()).args([
                    "kv",
                    "get",
                    "zone-learner-read",
                    "--max-staleness-ms",
                    "10000",
                    "--region",
                    region,
                    "--endpoints",
                    &endpoints.join(","),
                ]),
                Duration::from_secs(30),
            );
            let (stdout, stderr) = (
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr),
            );
            // Bounded staleness may read before the put; the learner must serve it, and
            // once its closed timestamp passes the put, return it.
            if output.status.success()
                && stderr.contains(&format!("served_by={learner}"))
                && stdout.trim() == "seen abroad"
            {
                break;
            }
            assert!(
                started.elapsed() < CONVERGE_TIMEOUT,
                "learner {learner} does not serve the follower read: {stdout} {stderr}"
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    eprintln!("the learners in eu-west and ap-south serve follower reads");

    // 4. The same failure: two of the three voters are left.
    kill_and_restart(&cluster, true);
    let committed = commits(&client, "zone-write", CONVERGE_TIMEOUT).await;
    assert!(committed, "no write committed with 2 of 3 home voters up");
    eprintln!("zone survival: writes commit with nodes {KILLED:?} down");
    kill_and_restart(&cluster, false);

    // 5. Region survival again: every replica votes, and the command removes the two us-east
    // replicas zone survival needed, leaving one per region.
    let said = home_us_east(&endpoints, "region");
    let removed: Vec<u64> = said
        .lines()
        .filter_map(|l| l.split("removed node ").nth(1))
        .filter_map(|rest| rest.split('\'').next()?.parse().ok())
        .collect();
    assert_eq!(removed.len(), 2, "{said}");
    // Nothing is removed before every replica votes: never down to one or two voters.
    for line in said.lines().filter(|l| l.contains("removed node")) {
        assert!(
            line.contains("learners []"),
            "removed while learners wait: {said}"
        );
    }
    let kept: Vec<u64> = all
        .iter()
        .copied()
        .filter(|n| !removed.contains(n))
        .collect();
    let view = wait_roles(&cluster, &all, &kept, &[]).await;
    let home_voters: Vec<u64> = view
        .voters
        .iter()
        .copied()
        .filter(|v| US_EAST.contains(v))
        .collect();
    assert_eq!(home_voters.len(), 1, "one us-east voter: {view:?}");
    eprintln!(
        "region survival: voters {:?} after removing {removed:?}",
        view.voters
    );
    // Again: nothing left to remove. The client's status comes from node 1, which may hold no
    // replica now (it names no leader then): the leader is found by asking the replicas.
    let again = home_us_east(&endpoints, "region");
    assert!(
        again.contains("survives a region failure") && !again.contains("removed node"),
        "{again}"
    );

    // ... so the shard survives losing all of us-east.
    for node in US_EAST {
        cluster.kill(node, Signal::SIGKILL).expect("kill");
    }
    let abroad = connect_client(vec![endpoints[1].clone(), endpoints[2].clone()]).await;
    let committed = commits(&abroad, "region-write", CONVERGE_TIMEOUT).await;
    assert!(
        committed,
        "no write committed with us-east down under region survival"
    );
    eprintln!("region survival: writes commit with every us-east node down");
    for node in US_EAST {
        cluster.restart(node).expect("restart");
    }

    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    writer.await.unwrap();
    let written = acked.lock().unwrap().clone();
    eprintln!("reading back {} acknowledged writes", written.len());
    read_back(&client, &written).await;
    for key in ["zone-write", "region-write"] {
        assert_eq!(
            client.get(key).await.expect("get").as_deref(),
            Some(key.as_bytes())
        );
    }
}

/// `--home-regions "=us-east:zone"`: the founding map gives the shard three us-east replicas
/// (zones a, b, c) plus the others, and the group settles with only those voting; with the
/// replicas outside us-east and one home voter killed, writes commit.
async fn bootstrap_scenario() {
    let (_dir, cluster) = start_with(BOOT_PORT, &["--home-regions", "=us-east:zone"]);
    cluster
        .wait_ready(READY_TIMEOUT)
        .await
        .expect("cluster ready");
    let all: Vec<u64> = (1..=NODES).collect();
    let started = Instant::now();
    let view = wait_roles(&cluster, &all, &US_EAST, &[2, 3]).await;
    eprintln!(
        "founded with voters {:?}, learners {:?}, {:?} after ready",
        view.voters,
        view.learners,
        started.elapsed()
    );
    assert_eq!(
        (view.home_region.as_str(), view.survival.as_str()),
        ("us-east", "zone")
    );
    let endpoints: Vec<String> = all
        .iter()
        .map(|id| cluster.client_addr(*id).unwrap())
        .collect();
    let client = connect_client(vec![endpoints[0].clone(), endpoints[3].clone()]).await;
    let killed: Vec<u64> = [2, 3]
        .into_iter()
        .chain(US_EAST.into_iter().filter(|n| *n != view.leader_id).take(1))
        .collect();
    for node in &killed {
        cluster.kill(*node, Signal::SIGKILL).expect("kill");
    }
    assert!(
        commits(&client, "boot-write", CONVERGE_TIMEOUT).await,
        "no write committed with nodes {killed:?} down"
    );
    eprintln!("a write commits with nodes {killed:?} down");
}

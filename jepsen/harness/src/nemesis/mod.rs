//! Executes the nemesis schedule ([`crate::plan`]) against the live cluster, and heals.
//!
//! What each fault really does:
//! - **kill**: `SIGKILL` to the nodes' processes (a minority, or a majority at once; reaped at
//!   once); heal = start them again with the same data directory and arguments.
//! - **pause**: `SIGSTOP`; heal = `SIGCONT`. Held 2–4 s, longer than the 1.2 s lease.
//! - **partition**: nftables drop rules between the two sides' Raft traffic (see `nft.rs`);
//!   heal = flush them. While it holds, the majority side is polled (`Cluster.Status`; views
//!   merged, the leader reported with the highest term wins) to confirm that every shard the
//!   minority led, and whose replicas have a majority on the other side, gets a leader there —
//!   evidence the cut is real; the result is a note on the interval (a warning if it never
//!   happened). Shards without such a majority are noted as unavailable until healed.
//! - **power-loss**: SIGKILL every target node, then kill each one's lazyfs, which drops every
//!   write the node had not fsynced (see `power`); heal = a new lazyfs on the same backing
//!   directory, then start the node again. Any number of nodes, all of them included.
//! - **membership**: `remove_replica` of the target's replica of the key's shard (the node
//!   leaves the Raft group and deletes the replica); heal = `add_replica` of it again, retried
//!   until it votes (bounded by [`READD_TIMEOUT`]). The target's leader or follower is looked up
//!   when the step runs.
//! - **clock**: a restart with a clock offset, or a jump or strobe of a running node's wall
//!   clock through libfaketime; see [`clock`] for each and its heal.
//!
//! Node processes are started from the thread that polls this code, which must be the main
//! thread (`run.rs` joins, never spawns, the nemesis): `PR_SET_PDEATHSIG` fires when the
//! spawning *thread* exits. Faults never overlap; a kill or a power loss may take down a majority
//! (or every node) at once.

mod clock;

use crate::clocks::FakeClocks;
use crate::cluster::STOP_TIMEOUT;
use crate::nft::NftTable;
use crate::plan::{Fault, Shape, Step, Target, MAX_OFFSET_MS};
use crate::power::PowerSupply;
use crate::status;
use meridian_cli::LocalCluster;
use meridian_client::{fetch_status, Client};
use nix::sys::signal::Signal;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A fault as it happened: shaded on the timeline, listed in results.json.
#[derive(Debug, Clone, Serialize)]
pub struct IntervalRecord {
    pub step: usize,
    pub start_ns: u64,
    pub end_ns: u64,
    pub label: String,
    pub nodes: Vec<u64>,
    pub notes: Vec<String>,
    pub errors: Vec<String>,
    /// False while the fault holds (and in an interrupted run, if it never got healed here).
    pub healed: bool,
}

/// A node process that exited without the nemesis asking it to.
#[derive(Debug, Clone, Serialize)]
pub struct NodeExit {
    pub node: u64,
    pub time_ns: u64,
    pub status: String,
}

/// What the nemesis did, shared with `run.rs` so it survives an interrupted run.
#[derive(Debug, Default)]
pub struct NemesisLog {
    pub intervals: Vec<IntervalRecord>,
    pub exits: Vec<NodeExit>,
}

/// What the nemesis left behind, to heal.
#[derive(Debug, Default)]
struct Faults {
    paused: BTreeSet<u64>,
    killed: BTreeSet<u64>,
    /// Nodes whose lazyfs was killed: their storage comes back before they restart.
    unpowered: BTreeSet<u64>,
    skewed: BTreeMap<u64, i64>,
    /// Nodes whose wall clock was stepped (libfaketime), with the offset.
    jumped: BTreeMap<u64, i64>,
    partitioned: bool,
    /// Replicas removed by a membership step, as (shard, node): added back at the heal.
    removed: Vec<(u64, u64)>,
}

/// Bound on adding a removed replica back at a heal (the new replica catches up first).
pub const READD_TIMEOUT: Duration = Duration::from_secs(60);

/// What the nemesis cuts the network, the power and the clocks with (each only for the nemeses
/// that need it).
#[derive(Clone, Default)]
pub struct FaultTools {
    pub nft: Option<Arc<NftTable>>,
    /// The nodes' lazyfs mounts, for power losses.
    pub power: Option<Arc<PowerSupply>>,
    /// The nodes' libfaketime offset files, for clock jumps and strobes.
    pub clocks: Option<Arc<FakeClocks>>,
}

pub struct Nemesis {
    pub cluster: Arc<LocalCluster>,
    pub nft: Option<Arc<NftTable>>,
    /// The nodes' lazyfs mounts, for `power-loss`.
    pub power: Option<Arc<PowerSupply>>,
    /// The nodes' libfaketime offset files, for clock jumps and strobes.
    pub clocks: Option<Arc<FakeClocks>>,
    /// For leader lookups (may be absent if it could not connect).
    pub client: Option<Client>,
    /// Workload keys that `Target::LeaderOfKey` indexes.
    pub keys: Vec<String>,
    /// The history's clock.
    pub start: Instant,
    rng: StdRng,
    faults: Faults,
    log: Arc<Mutex<NemesisLog>>,
}

fn ns_since(start: Instant) -> u64 {
    u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

impl Nemesis {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        cluster: Arc<LocalCluster>,
        tools: FaultTools,
        client: Option<Client>,
        keys: Vec<String>,
        start: Instant,
        seed: u64,
        log: Arc<Mutex<NemesisLog>>,
    ) -> Nemesis {
        Nemesis {
            cluster,
            nft: tools.nft,
            power: tools.power,
            clocks: tools.clocks,
            client,
            keys,
            start,
            rng: StdRng::seed_from_u64(seed ^ 0x7461_7267_6574),
            faults: Faults::default(),
            log,
        }
    }

    fn log(&self) -> std::sync::MutexGuard<'_, NemesisLog> {
        self.log.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn note_exits(&mut self) {
        for (node, status) in self.cluster.exited_nodes() {
            eprintln!("nemesis: node {node} exited on its own ({status})");
            self.log().exits.push(NodeExit {
                node,
                time_ns: ns_since(self.start),
                status: status.to_string(),
            });
        }
    }

    /// Sleeps until `at`, watching for nodes that exit by themselves.
    async fn sleep_until(&mut self, at: Instant) {
        for _ in 0..100_000 {
            self.note_exits();
            let now = Instant::now();
            if now >= at {
                return;
            }
            tokio::time::sleep((at - now).min(Duration::from_millis(250))).await;
        }
    }

    fn running(&self) -> Vec<u64> {
        self.cluster
            .node_ids()
            .into_iter()
            .filter(|n| self.cluster.is_running(*n).unwrap_or(false))
            .collect()
    }

    /// The node a target names, and a description.
    async fn resolve(&mut self, target: &Target) -> (u64, String) {
        let running = self.running();
        let (key, want_follower) = match target {
            Target::Node { node } => return (*node, format!("n{node}")),
            Target::LeaderOfKey { key } => {
                (self.keys.get(*key).cloned().unwrap_or_default(), false)
            }
            Target::FollowerOfKey { key } => {
                (self.keys.get(*key).cloned().unwrap_or_default(), true)
            }
        };
        // The key's shard from the (static) shard map; its leader from the nodes themselves:
        // the first running node that names a running leader (a just-restarted node may not
        // know one yet).
        let route = self.client.as_ref().and_then(|c| c.route(key.as_bytes()));
        let leader = match &route {
            Some(route) => self.leader_of(route.shard_id, &running).await,
            None => None,
        };
        if want_follower {
            if let Some(route) = &route {
                // A running replica that is not the leader (if the leader is unknown, any
                // running replica).
                let mut followers: Vec<u64> = route
                    .replicas
                    .iter()
                    .copied()
                    .filter(|r| running.contains(r) && Some(*r) != leader.map(|(_, l)| l))
                    .collect();
                followers.sort_unstable();
                if let Some(&node) = followers.choose(&mut self.rng) {
                    let of = match leader {
                        Some((term, l)) => format!("leader n{l}, term {term}"),
                        None => "leader unknown".into(),
                    };
                    return (
                        node,
                        format!(
                            "n{node} (follower of shard {} of {key:?}, replicas {:?}, {of})",
                            route.shard_id, route.replicas
                        ),
                    );
                }
            }
        } else if let (Some(route), Some((term, leader))) = (&route, leader) {
            return (
                leader,
                format!(
                    "n{leader} (leader of shard {} of {key:?}, term {term})",
                    route.shard_id
                ),
            );
        }
        let node = *running
            .choose(&mut self.rng)
            .or(self.cluster.node_ids().first())
            .unwrap_or(&1);
        let role = if want_follower { "follower" } else { "leader" };
        (node, format!("n{node} ({role} of {key:?} unknown; random)"))
    }

    /// The leader of `shard` and its term, as `(term, node)`: a node's own claim (its status
    /// names itself leader) at the highest term wins; other nodes' views may lag behind an
    /// election.
    /// Resolves every target, each node once (a key's leader may also be named by number).
    async fn resolve_all(&mut self, targets: &[Target]) -> (Vec<u64>, Vec<String>) {
        let mut nodes = Vec::new();
        let mut labels = Vec::new();
        for t in targets {
            let (node, label) = self.resolve(t).await;
            if !nodes.contains(&node) {
                nodes.push(node);
                labels.push(label);
            }
        }
        (nodes, labels)
    }

    async fn leader_of(&self, shard: u64, running: &[u64]) -> Option<(u64, u64)> {
        let mut best: Option<(u64, u64)> = None;
        for &asker in running {
            let Ok(address) = self.cluster.client_addr(asker) else {
                continue;
            };
            let Ok(status) = fetch_status(&address, Duration::from_secs(1)).await else {
                continue;
            };
            if let Some(s) = status.shards.iter().find(|s| s.shard_id == shard) {
                if s.leader_id == asker && best.is_none_or(|(term, _)| s.term > term) {
                    best = Some((s.term, asker));
                }
            }
        }
        best
    }

    /// Runs `plan` until it ends or `until`, healing each fault after its hold.
    pub async fn run(&mut self, plan: &[Step], until: Instant) {
        for (index, step) in plan.iter().enumerate() {
            let at = self.start + Duration::from_millis(step.at_ms);
            if at >= until {
                break;
            }
            self.sleep_until(at).await;
            let start_ns = ns_since(self.start);
            let mut record = IntervalRecord {
                step: index,
                start_ns,
                end_ns: start_ns,
                label: String::new(),
                nodes: Vec::new(),
                notes: Vec::new(),
                errors: Vec::new(),
                healed: false,
            };
            let hold_until = (Instant::now() + Duration::from_millis(step.hold_ms)).min(until);
            // A chain runs its first phase inside `apply`; its final hold starts after that.
            let hold_until = self
                .apply(&step.fault, hold_until, step.hold_ms, until, &mut record)
                .await;
            eprintln!(
                "nemesis: {:>6.1} s  {}",
                start_ns as f64 / 1e9,
                record.label
            );
            for note in &record.notes {
                eprintln!("nemesis:           {note}");
            }
            let slot = {
                let mut log = self.log();
                log.intervals.push(record.clone());
                log.intervals.len() - 1
            };
            self.sleep_until(hold_until).await;
            self.heal(&mut record.errors).await;
            record.end_ns = ns_since(self.start);
            record.healed = true;
            for e in &record.errors {
                eprintln!("nemesis: error: {e}");
            }
            self.log().intervals[slot] = record;
        }
    }

    /// Starts `fault` and returns when its hold ends: `hold_until`, except for a chain, whose
    /// final hold (`hold_ms`, bounded by `until`) starts after its first phase.
    async fn apply(
        &mut self,
        fault: &Fault,
        hold_until: Instant,
        hold_ms: u64,
        until: Instant,
        record: &mut IntervalRecord,
    ) -> Instant {
        match fault {
            Fault::Kill { targets } => {
                let (nodes, labels) = self.resolve_all(targets).await;
                for &node in &nodes {
                    match self.cluster.kill(node, Signal::SIGKILL) {
                        Ok(()) => {
                            self.faults.killed.insert(node);
                        }
                        Err(e) => record.errors.push(format!("kill n{node}: {e:#}")),
                    }
                }
                record.label = format!("kill {}", labels.join(", "));
                record.nodes = nodes;
            }
            Fault::PowerLoss { targets } => {
                let (nodes, labels) = self.resolve_all(targets).await;
                // All processes first, then all storage: nothing writes once power goes.
                for &node in &nodes {
                    if let Err(e) = self.cluster.kill(node, Signal::SIGKILL) {
                        record.errors.push(format!("kill n{node}: {e:#}"));
                    }
                }
                let Some(power) = self.power.clone() else {
                    record
                        .errors
                        .push("power-loss without lazyfs mounts (a harness bug)".into());
                    return hold_until;
                };
                for &node in &nodes {
                    match power.cut(node) {
                        Ok(()) => {
                            self.faults.unpowered.insert(node);
                        }
                        Err(e) => record.errors.push(format!("cut power of n{node}: {e:#}")),
                    }
                }
                record.label = format!("power loss {}", labels.join(", "));
                record.nodes = nodes;
            }
            Fault::Move { target } => {
                let (node, label) = self.resolve(target).await;
                record.label = format!("remove replica {label}");
                record.nodes = vec![node];
                self.remove_replica(target, node, record).await;
            }
            Fault::Pause { target } => {
                let (node, label) = self.resolve(target).await;
                match self.cluster.kill(node, Signal::SIGSTOP) {
                    Ok(()) => {
                        self.faults.paused.insert(node);
                    }
                    Err(e) => record.errors.push(format!("pause n{node}: {e:#}")),
                }
                record.label = format!("pause {label}");
                record.nodes = vec![node];
            }
            Fault::Partition {
                shape: shape @ (Shape::Bridge { .. } | Shape::Ring),
            } => {
                let names = |s: &[u64]| {
                    s.iter()
                        .map(|n| format!("n{n}"))
                        .collect::<Vec<_>>()
                        .join(" ")
                };
                let (cuts, label, note) = match shape {
                    Shape::Bridge {
                        bridge,
                        left,
                        right,
                    } => (
                        vec![(left.clone(), right.clone())],
                        format!("bridge {} | {} via n{bridge}", names(left), names(right)),
                        "no leader has to move: every majority includes the bridge",
                    ),
                    _ => (
                        crate::nft::ring_cuts(self.cluster.node_ids().len()),
                        "ring (each node reaches only its neighbours)".to_string(),
                        "no node reaches a majority directly: leaders may move or stall",
                    ),
                };
                record.label = format!("partition {label}");
                record.nodes = self.cluster.node_ids();
                let Some(nft) = self.nft.clone() else {
                    record
                        .errors
                        .push("partition without an nftables table".into());
                    return hold_until;
                };
                if let Err(e) = nft.cut(&cuts) {
                    record.errors.push(format!("partition: {e:#}"));
                    return hold_until;
                }
                self.faults.partitioned = true;
                record.notes.push(note.to_string());
            }
            Fault::Partition { shape } => {
                let (side_a, label) = match shape {
                    Shape::Isolate { target } => {
                        let (node, label) = self.resolve(target).await;
                        (vec![node], format!("isolate {label}"))
                    }
                    Shape::Halves { minority } => (minority.clone(), String::new()),
                    Shape::Bridge { .. } | Shape::Ring => unreachable!("handled above"),
                };
                let side_b: Vec<u64> = self
                    .cluster
                    .node_ids()
                    .into_iter()
                    .filter(|n| !side_a.contains(n))
                    .collect();
                let names = |s: &[u64]| {
                    s.iter()
                        .map(|n| format!("n{n}"))
                        .collect::<Vec<_>>()
                        .join(" ")
                };
                record.label = format!(
                    "partition {} | {}{}",
                    names(&side_a),
                    names(&side_b),
                    if label.is_empty() {
                        String::new()
                    } else {
                        format!(" ({label})")
                    }
                );
                record.nodes = side_a.clone();
                let Some(nft) = self.nft.clone() else {
                    record
                        .errors
                        .push("partition without an nftables table".into());
                    return hold_until;
                };
                let to_move = status::shards_to_move(&self.cluster, &side_b, &side_a).await;
                if let Some((_, stuck)) = to_move.as_ref().filter(|(_, s)| !s.is_empty()) {
                    record.notes.push(format!(
                        "shards {stuck:?} have no replica majority on the majority side: \
                         unavailable until healed"
                    ));
                }
                let led_by_a = to_move.map(|(movable, _)| movable);
                if let Err(e) = nft.partition(&side_a, &side_b) {
                    record.errors.push(format!("partition: {e:#}"));
                    return hold_until;
                }
                self.faults.partitioned = true;
                let note = self
                    .verify_moved(&side_b, &side_a, led_by_a, hold_until)
                    .await;
                record.notes.push(note);
            }
            Fault::Clock { target, offset_ms } => {
                let (node, label) = self.resolve(target).await;
                record.label = format!("clock {label} {offset_ms:+} ms");
                record.nodes = vec![node];
                self.skew(node, *offset_ms, record);
                if offset_ms.abs() > MAX_OFFSET_MS {
                    self.sleep_until(hold_until).await;
                    self.note_fenced(node, *offset_ms, record).await;
                }
            }
            Fault::ClockJump { target, offset_ms } => {
                let (node, label) = self.resolve(target).await;
                record.label = format!("clock jump {label} {offset_ms:+} ms");
                record.nodes = vec![node];
                self.jump(node, *offset_ms, record);
                if offset_ms.abs() > MAX_OFFSET_MS {
                    self.sleep_until(hold_until).await;
                    self.note_fenced(node, *offset_ms, record).await;
                } else {
                    let deadline = hold_until.min(Instant::now() + Duration::from_secs(5));
                    self.verify_offset(node, *offset_ms, deadline, record).await;
                }
            }
            Fault::ClockStrobe {
                target,
                offset_ms,
                period_ms,
            } => {
                let (node, label) = self.resolve(target).await;
                record.label =
                    format!("clock strobe {label} 0/{offset_ms:+} ms every {period_ms} ms");
                record.nodes = vec![node];
                let period = Duration::from_millis(*period_ms);
                self.strobe(node, *offset_ms, period, hold_until, record)
                    .await;
            }
            Fault::ClockChain {
                first,
                first_hold_ms,
                gap_ms,
                then,
                offset_ms,
            } => {
                return self
                    .clock_chain(
                        (first, *first_hold_ms, *gap_ms, then, *offset_ms),
                        hold_ms,
                        until,
                        record,
                    )
                    .await;
            }
        }
        hold_until
    }

    /// Polls the majority until none of `shards` is led by the minority, or `deadline`.
    async fn verify_moved(
        &mut self,
        majority: &[u64],
        minority_side: &[u64],
        shards: Option<Vec<u64>>,
        deadline: Instant,
    ) -> String {
        let Some(shards) = shards else {
            return "could not learn the leaders before the partition".into();
        };
        if shards.is_empty() {
            return "the minority side led no shard the majority side can take over".into();
        }
        let started = Instant::now();
        while Instant::now() < deadline {
            let all_moved = status::shard_view(&self.cluster, majority)
                .await
                .is_some_and(|view| {
                    shards.iter().all(|id| {
                        view.iter().any(|(shard, leader, _)| {
                            shard == id && *leader != 0 && !minority_side.contains(leader)
                        })
                    })
                });
            if all_moved {
                return format!(
                    "leadership of shards {shards:?} moved to the majority side after {} ms",
                    started.elapsed().as_millis()
                );
            }
            self.note_exits();
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        format!(
            "WARNING: shards {shards:?} had no majority-side leader during the partition ({} ms)",
            started.elapsed().as_millis()
        )
    }

    /// Undoes every active fault; errors are appended to `errors`.
    pub async fn heal(&mut self, errors: &mut Vec<String>) {
        if self.faults.partitioned {
            if let Some(nft) = &self.nft {
                if let Err(e) = nft.heal() {
                    errors.push(format!("heal partition: {e:#}"));
                }
            }
            self.faults.partitioned = false;
        }
        for node in std::mem::take(&mut self.faults.paused) {
            if let Err(e) = self.cluster.kill(node, Signal::SIGCONT) {
                errors.push(format!("SIGCONT n{node}: {e:#}"));
            }
        }
        for (node, offset_ms) in std::mem::take(&mut self.faults.skewed) {
            if self.cluster.is_running(node).unwrap_or(false) {
                if let Err(e) = self.cluster.stop(node, STOP_TIMEOUT) {
                    errors.push(format!("stop skewed n{node}: {e:#}"));
                }
            }
            self.restart_unskewed(node, offset_ms, errors).await;
        }
        for (node, offset_ms) in std::mem::take(&mut self.faults.jumped) {
            self.heal_jump(node, offset_ms, errors).await;
        }
        self.note_exits();
        self.faults.killed.clear();
        for node in std::mem::take(&mut self.faults.unpowered) {
            if let Some(power) = &self.power {
                if let Err(e) = power.restore(node) {
                    errors.push(format!("restore power of n{node}: {e:#}"));
                }
            }
        }
        for node in self.cluster.node_ids() {
            if !self.cluster.is_running(node).unwrap_or(true) {
                if let Err(e) = self.cluster.restart(node) {
                    errors.push(format!("restart n{node}: {e:#}"));
                }
            }
        }
        for (shard, node) in std::mem::take(&mut self.faults.removed) {
            self.add_replica_back(shard, node, errors).await;
        }
    }

    /// Removes `node`'s replica of the shard of `target`'s key (a membership step).
    async fn remove_replica(&mut self, target: &Target, node: u64, record: &mut IntervalRecord) {
        let (Target::LeaderOfKey { key } | Target::FollowerOfKey { key }) = target else {
            record
                .errors
                .push("a replica move needs a key's shard".into());
            return;
        };
        let key = self.keys.get(*key).cloned().unwrap_or_default();
        let Some(client) = self.client.clone() else {
            record.errors.push("no client for a replica move".into());
            return;
        };
        let Some(shard) = client.route(key.as_bytes()).map(|r| r.shard_id) else {
            record.errors.push(format!("no shard for key {key:?}"));
            return;
        };
        match client.remove_replica(shard, node).await {
            Ok(change) => {
                record.notes.push(format!(
                    "shard {shard}: voters {:?} (shard map version {})",
                    change.voters, change.map_version
                ));
                self.faults.removed.push((shard, node));
            }
            Err(e) => record
                .errors
                .push(format!("remove n{node}'s replica of shard {shard}: {e}")),
        }
    }

    /// Adds `node`'s replica of `shard` back, retrying until it votes or [`READD_TIMEOUT`].
    async fn add_replica_back(&mut self, shard: u64, node: u64, errors: &mut Vec<String>) {
        let Some(client) = self.client.clone() else {
            errors.push("no client to add a removed replica back".into());
            return;
        };
        let give_up = Instant::now() + READD_TIMEOUT;
        loop {
            match client.add_replica(shard, node).await {
                Ok(change) => {
                    eprintln!(
                        "nemesis:           shard {shard}: n{node} votes again: voters {:?}",
                        change.voters
                    );
                    return;
                }
                // An earlier attempt finished after its answer was lost.
                Err(e) if e.to_string().contains("voter of shard") => return,
                Err(e) if Instant::now() >= give_up => {
                    errors.push(format!("add n{node}'s replica of shard {shard} back: {e}"));
                    return;
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
            }
        }
    }
}

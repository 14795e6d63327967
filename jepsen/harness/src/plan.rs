//! The nemesis schedule: a pure function of (nemesis, cluster size, workload keys, time limit,
//! seed), computed before the run and written to `results.json`.
//!
//! Faults never overlap: each step starts a fault, holds it, heals it, and a quiet gap follows.
//! What depends on the cluster's state at the time (which node leads a key's shard) is kept
//! symbolic ([`Target::LeaderOfKey`]) and resolved when the step runs; everything else (which
//! node, which halves, how long, which clock offset) is decided here from the seed, so the same
//! seed gives the same schedule.
//!
//! Durations, with the loopback Raft timings (election timeout 600–1200 ms = the lease):
//! - kill: SIGKILL 1 node (5 nodes: 1 or 2) or, a quarter of the time, a majority at once,
//!   restart 2–5 s later;
//! - pause: SIGSTOP for 2–4 s (longer than the 1.2 s lease), then SIGCONT;
//! - partition: 3–6 s; shapes: isolate a key's leader, isolate a random node, split off a
//!   random minority (halves), a bridge (two halves cut apart, one node reaching both), or
//!   with 5 nodes a ring (each node reaches only its two neighbours);
//! - clock, held 4–8 s, one of three (a third each):
//!   - *offset*: restart a node with a clock offset, restart it without at the heal;
//!   - *jump*: the wall clock of a running node (or of a key's leader) steps by an offset at
//!     once, and steps back at the heal (libfaketime, see `clocks`);
//!   - *strobe*: a running node's wall clock flips between real time and an offset every
//!     50–250 ms for the whole hold.
//!
//!   `clock` uses ±50–200 ms offsets and ±50–300 ms jumps and strobes (inside max_offset
//!   500 ms and its 400 ms fence threshold: nothing may break); `all` also uses, a third of the
//!   time, +2000 ms offsets and ±2000 ms jumps (beyond: refused by the peers, and the node stops
//!   itself, the clock fence).
//! - power-loss: SIGKILL a node and drop every write it had not fsynced (its lazyfs is killed,
//!   see `power`), power back on and restart 2–4 s later; one node (half the time), a
//!   majority (a quarter) or every node at once (a quarter): acknowledged writes were fsynced
//!   by a quorum, so they must survive even that;
//! - membership: remove the replica of a key's shard held by its leader (half the time) or by
//!   a follower from the shard's Raft group (the node deletes it), hold 3–6 s, add it back at
//!   the heal (an empty replica that catches up from the log or a snapshot, then votes again);
//! - clock-chain: a fixed sequence, not a random mix (the sequence of the lost-writes run kept
//!   in `jepsen/evidence/`): restart a *follower* of the workload key's shard at +2000 ms, hold
//!   6–8 s, restart it without the offset, and 200–600 ms later (while it still waits for its
//!   HLC ceiling) restart the key's *leader* at +2000 ms, hold 6–8 s, heal; a quiet gap; repeat.

use crate::args::NemesisKind;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::Serialize;

/// `max_offset_ms` every node is started with.
pub const MAX_OFFSET_MS: i64 = 500;
/// The offset used for "beyond max_offset" clock faults.
pub const BEYOND_OFFSET_MS: i64 = 2_000;

/// Which node a fault hits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Target {
    Node {
        node: u64,
    },
    /// The leader of the shard holding workload key number `key`, looked up when the step runs.
    LeaderOfKey {
        key: usize,
    },
    /// A replica of that shard other than its leader (looked up when the step runs).
    FollowerOfKey {
        key: usize,
    },
}

/// How the network is cut.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "shape", rename_all = "kebab-case")]
pub enum Shape {
    /// One node against the rest.
    Isolate { target: Target },
    /// A fixed minority against the majority.
    Halves { minority: Vec<u64> },
    /// `left` and `right` cannot reach each other; `bridge` reaches both (with 3 nodes: two
    /// nodes cut apart, both talking to the third). Every majority needs the bridge.
    Bridge {
        bridge: u64,
        left: Vec<u64>,
        right: Vec<u64>,
    },
    /// 5 nodes or more in a circle: each reaches only its two neighbours, so no node reaches a
    /// majority directly (for 5: itself and two of four).
    Ring,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "fault", rename_all = "kebab-case")]
pub enum Fault {
    Kill {
        targets: Vec<Target>,
    },
    /// Kill the targets and drop their unsynced writes; unlike `Kill`, any number of nodes.
    PowerLoss {
        targets: Vec<Target>,
    },
    Pause {
        target: Target,
    },
    Partition {
        shape: Shape,
    },
    Clock {
        target: Target,
        offset_ms: i64,
    },
    /// Step a running node's wall clock by `offset_ms`; step it back at the heal.
    ClockJump {
        target: Target,
        offset_ms: i64,
    },
    /// Flip a running node's wall clock between real time and `offset_ms` every `period_ms`.
    ClockStrobe {
        target: Target,
        offset_ms: i64,
        period_ms: u64,
    },
    /// Remove `target`'s replica of the target key's shard; add it back at the heal.
    Move {
        target: Target,
    },
    /// Skew `first` by `offset_ms` for `first_hold_ms`, restart it without the offset, wait
    /// `gap_ms`, then skew `then` by `offset_ms` for the step's `hold_ms` (healed as usual).
    ClockChain {
        first: Target,
        first_hold_ms: u64,
        gap_ms: u64,
        then: Target,
        offset_ms: i64,
    },
}

/// What the plan assumes a clock heal (graceful stop, restart) takes, to space chain steps.
pub const CLOCK_HEAL_ESTIMATE_MS: u64 = 3_000;

impl Fault {
    /// How long the step runs before its final hold starts (only a chain has a first phase).
    pub fn lead_in_ms(&self) -> u64 {
        match self {
            Fault::ClockChain {
                first_hold_ms,
                gap_ms,
                ..
            } => first_hold_ms + CLOCK_HEAL_ESTIMATE_MS + gap_ms,
            _ => 0,
        }
    }
}

/// One fault: start `at_ms` after the workload starts, heal `hold_ms` later.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Step {
    pub at_ms: u64,
    pub hold_ms: u64,
    pub fault: Fault,
}

#[derive(Clone, Copy)]
enum Kind {
    Kill,
    PowerLoss,
    Pause,
    Partition,
    Clock { beyond_allowed: bool },
    Move,
}

fn hold_range(kind: Kind) -> (u64, u64) {
    match kind {
        Kind::Kill => (2_000, 5_000),
        Kind::PowerLoss => (2_000, 4_000),
        Kind::Pause => (2_000, 4_000),
        Kind::Partition => (3_000, 6_000),
        Kind::Clock { .. } => (4_000, 8_000),
        Kind::Move => (3_000, 6_000),
    }
}

/// Most nodes that may be down at once.
pub fn minority(nodes: usize) -> usize {
    (nodes - 1) / 2
}

fn random_target(rng: &mut StdRng, nodes: usize, keys: usize) -> Target {
    if keys > 0 && rng.gen_bool(0.5) {
        Target::LeaderOfKey {
            key: rng.gen_range(0..keys),
        }
    } else {
        Target::Node {
            node: rng.gen_range(1..=nodes as u64),
        }
    }
}

fn fault(rng: &mut StdRng, kind: Kind, nodes: usize, keys: usize) -> Fault {
    match kind {
        Kind::Kill => {
            let mut others: Vec<u64> = (1..=nodes as u64).collect();
            others.shuffle(rng);
            if rng.gen_bool(0.25) {
                // A majority at once: every shard stops until the heal.
                let targets = others
                    .into_iter()
                    .take(minority(nodes) + 1)
                    .map(|node| Target::Node { node })
                    .collect();
                return Fault::Kill { targets };
            }
            let count = rng.gen_range(1..=minority(nodes).max(1));
            let mut targets = vec![random_target(rng, nodes, keys)];
            targets.extend(
                others
                    .into_iter()
                    .take(count - 1)
                    .map(|node| Target::Node { node }),
            );
            Fault::Kill { targets }
        }
        Kind::PowerLoss => {
            let mut all: Vec<u64> = (1..=nodes as u64).collect();
            all.shuffle(rng);
            let targets = match rng.gen_range(0..4) {
                0 | 1 => vec![random_target(rng, nodes, keys)],
                2 => all
                    .into_iter()
                    .take(minority(nodes) + 1)
                    .map(|node| Target::Node { node })
                    .collect(),
                _ => (1..=nodes as u64)
                    .map(|node| Target::Node { node })
                    .collect(),
            };
            Fault::PowerLoss { targets }
        }
        Kind::Pause => Fault::Pause {
            target: random_target(rng, nodes, keys),
        },
        Kind::Partition => {
            let roll = rng.gen_range(0..10);
            let shape = if roll < 4 && keys > 0 {
                Shape::Isolate {
                    target: Target::LeaderOfKey {
                        key: rng.gen_range(0..keys),
                    },
                }
            } else if roll < 6 {
                Shape::Isolate {
                    target: Target::Node {
                        node: rng.gen_range(1..=nodes as u64),
                    },
                }
            } else if roll < 8 || (roll == 8 && nodes < 5) {
                let mut all: Vec<u64> = (1..=nodes as u64).collect();
                all.shuffle(rng);
                let bridge = all.remove(0);
                let mut left: Vec<u64> = all.iter().copied().take(all.len() / 2).collect();
                let mut right: Vec<u64> = all.iter().copied().skip(all.len() / 2).collect();
                left.sort_unstable();
                right.sort_unstable();
                Shape::Bridge {
                    bridge,
                    left,
                    right,
                }
            } else if roll == 8 {
                Shape::Ring
            } else {
                let mut all: Vec<u64> = (1..=nodes as u64).collect();
                all.shuffle(rng);
                let mut minority: Vec<u64> = all.into_iter().take(nodes / 2).collect();
                minority.sort_unstable();
                Shape::Halves { minority }
            };
            Fault::Partition { shape }
        }
        Kind::Clock { beyond_allowed } => clock_fault(rng, nodes, keys, beyond_allowed),
        Kind::Move => {
            let key = rng.gen_range(0..keys.max(1));
            Fault::Move {
                target: if rng.gen_bool(0.5) {
                    Target::LeaderOfKey { key }
                } else {
                    Target::FollowerOfKey { key }
                },
            }
        }
    }
}

/// A signed magnitude in `low..=high`, either sign equally likely.
fn signed(rng: &mut StdRng, low: i64, high: i64) -> i64 {
    let magnitude = rng.gen_range(low..=high);
    if rng.gen_bool(0.5) {
        magnitude
    } else {
        -magnitude
    }
}

fn clock_fault(rng: &mut StdRng, nodes: usize, keys: usize, beyond_allowed: bool) -> Fault {
    let beyond = beyond_allowed && rng.gen_bool(1.0 / 3.0);
    match rng.gen_range(0..3) {
        0 => Fault::Clock {
            target: Target::Node {
                node: rng.gen_range(1..=nodes as u64),
            },
            offset_ms: if beyond {
                BEYOND_OFFSET_MS
            } else {
                signed(rng, 50, 200)
            },
        },
        1 => Fault::ClockJump {
            target: random_target(rng, nodes, keys),
            offset_ms: if beyond {
                signed(rng, BEYOND_OFFSET_MS, BEYOND_OFFSET_MS)
            } else {
                signed(rng, 50, JUMP_WITHIN_MS)
            },
        },
        _ => Fault::ClockStrobe {
            target: random_target(rng, nodes, keys),
            offset_ms: signed(rng, 50, JUMP_WITHIN_MS),
            period_ms: rng.gen_range(50..=250),
        },
    }
}

/// The largest jump or strobe `clock` makes: inside the 400 ms fence threshold with room for
/// the offset measurement's uncertainty.
pub const JUMP_WITHIN_MS: i64 = 300;

/// The schedule for a run. `keys` is how many workload keys [`Target::LeaderOfKey`] may name.
pub fn plan(
    nemesis: NemesisKind,
    nodes: usize,
    keys: usize,
    time_limit_ms: u64,
    seed: u64,
) -> Vec<Step> {
    let kinds: Vec<Kind> = match nemesis {
        NemesisKind::None => return Vec::new(),
        NemesisKind::PowerLoss => vec![Kind::PowerLoss],
        NemesisKind::Membership => vec![Kind::Move],
        NemesisKind::ClockChain => return clock_chain(keys, time_limit_ms, seed),
        NemesisKind::Kill => vec![Kind::Kill],
        NemesisKind::Pause => vec![Kind::Pause],
        NemesisKind::Partition => vec![Kind::Partition],
        NemesisKind::Clock => vec![Kind::Clock {
            beyond_allowed: false,
        }],
        NemesisKind::All => vec![
            Kind::Kill,
            Kind::PowerLoss,
            Kind::Pause,
            Kind::Partition,
            Kind::Clock {
                beyond_allowed: true,
            },
            Kind::Move,
        ],
    };
    // A distinct stream from the clients' (which use seed + process).
    let mut rng = StdRng::seed_from_u64(seed ^ 0x6e65_6d65_7369_7300);
    let mut steps = Vec::new();
    let mut at = rng.gen_range(2_000..3_000);
    for _ in 0..10_000 {
        let kind = kinds[rng.gen_range(0..kinds.len())];
        let (low, high) = hold_range(kind);
        if at + low > time_limit_ms {
            break;
        }
        let hold = rng.gen_range(low..=high).min(time_limit_ms - at);
        steps.push(Step {
            at_ms: at,
            hold_ms: hold,
            fault: fault(&mut rng, kind, nodes, keys),
        });
        at += hold + rng.gen_range(2_000..4_000);
    }
    steps
}

/// The `clock-chain` schedule: follower of key 0 at +2000 ms, heal, at once the leader of
/// key 0 at +2000 ms, heal; repeated while a whole chain fits in the time limit.
fn clock_chain(keys: usize, time_limit_ms: u64, seed: u64) -> Vec<Step> {
    if keys == 0 {
        return Vec::new();
    }
    let mut rng = StdRng::seed_from_u64(seed ^ 0x6368_6169_6e00);
    let mut steps = Vec::new();
    let mut at = rng.gen_range(2_000..3_000);
    for _ in 0..10_000 {
        let fault = Fault::ClockChain {
            first: Target::FollowerOfKey { key: 0 },
            first_hold_ms: rng.gen_range(6_000..=8_000),
            gap_ms: rng.gen_range(200..=600),
            then: Target::LeaderOfKey { key: 0 },
            offset_ms: BEYOND_OFFSET_MS,
        };
        let hold = rng.gen_range(6_000..=8_000);
        let end = at + fault.lead_in_ms() + hold;
        if end > time_limit_ms {
            break;
        }
        steps.push(Step {
            at_ms: at,
            hold_ms: hold,
            fault,
        });
        at = end + CLOCK_HEAL_ESTIMATE_MS + rng.gen_range(2_000..4_000);
    }
    steps
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Same seed, same schedule; another seed, another schedule.
    #[test]
    fn schedule_is_reproducible_for_a_seed() {
        for nemesis in [
            NemesisKind::Kill,
            NemesisKind::Pause,
            NemesisKind::Partition,
            NemesisKind::Clock,
            NemesisKind::PowerLoss,
            NemesisKind::Membership,
            NemesisKind::All,
        ] {
            let a = plan(nemesis, 3, 4, 60_000, 42);
            assert!(!a.is_empty());
            assert_eq!(a, plan(nemesis, 3, 4, 60_000, 42));
            assert_ne!(a, plan(nemesis, 3, 4, 60_000, 43), "{nemesis:?}");
        }
        assert!(plan(NemesisKind::None, 3, 4, 60_000, 1).is_empty());
    }

    /// Steps do not overlap, fit in the time limit, and respect each fault's bounds.
    #[test]
    fn steps_are_sequential_bounded_and_safe() {
        for seed in 0..200 {
            for nodes in [3, 5] {
                let steps = plan(NemesisKind::All, nodes, 3, 45_000, seed);
                let mut free_at = 0;
                for s in &steps {
                    assert!(s.at_ms >= free_at + 2_000 || free_at == 0, "{s:?}");
                    assert!(s.at_ms + s.hold_ms <= 45_000);
                    free_at = s.at_ms + s.hold_ms;
                    match &s.fault {
                        Fault::Kill { targets } => {
                            assert!(!targets.is_empty());
                            assert!(
                                targets.len() <= minority(nodes)
                                    || targets.len() == minority(nodes) + 1
                                        && targets.iter().all(|t| matches!(t, Target::Node { .. }))
                            );
                        }
                        Fault::Pause { .. } => assert!(s.hold_ms >= 2_000, "longer than the lease"),
                        Fault::Partition {
                            shape: Shape::Halves { minority: m },
                        } => {
                            assert_eq!(m.len(), nodes / 2);
                            assert!(m.iter().all(|n| (1..=nodes as u64).contains(n)));
                        }
                        Fault::Partition {
                            shape:
                                Shape::Bridge {
                                    bridge,
                                    left,
                                    right,
                                },
                        } => {
                            let mut all: Vec<u64> =
                                left.iter().chain(right).chain([bridge]).copied().collect();
                            all.sort_unstable();
                            assert_eq!(all, (1..=nodes as u64).collect::<Vec<_>>(), "{s:?}");
                            assert!(!left.is_empty() && !right.is_empty(), "{s:?}");
                        }
                        Fault::Partition { shape: Shape::Ring } => {
                            assert!(nodes >= 5, "a ring of {nodes} cuts nothing")
                        }
                        Fault::Partition { .. } => {}
                        Fault::Move { .. } => {}
                        Fault::Clock { offset_ms, .. } => assert!(
                            offset_ms.abs() <= 200 && offset_ms.abs() >= 50
                                || *offset_ms == BEYOND_OFFSET_MS
                        ),
                        Fault::ClockJump { offset_ms, .. } => assert!(
                            (50..=JUMP_WITHIN_MS).contains(&offset_ms.abs())
                                || offset_ms.abs() == BEYOND_OFFSET_MS
                        ),
                        Fault::ClockStrobe {
                            offset_ms,
                            period_ms,
                            ..
                        } => {
                            assert!((50..=JUMP_WITHIN_MS).contains(&offset_ms.abs()));
                            assert!((50..=250).contains(period_ms));
                        }
                        Fault::ClockChain { .. } => panic!("`all` never chains: {s:?}"),
                        Fault::PowerLoss { targets } => {
                            assert!(!targets.is_empty() && targets.len() <= nodes)
                        }
                    }
                }
            }
        }
    }

    /// Every partition shape shows up for some seed; rings only with 5 nodes.
    #[test]
    fn partition_shapes_include_bridges_and_rings() {
        let shapes = |nodes| {
            let mut seen = std::collections::BTreeSet::new();
            for seed in 0..100 {
                for step in plan(NemesisKind::Partition, nodes, 3, 60_000, seed) {
                    if let Fault::Partition { shape } = step.fault {
                        seen.insert(match shape {
                            Shape::Isolate { .. } => "isolate",
                            Shape::Halves { .. } => "halves",
                            Shape::Bridge { .. } => "bridge",
                            Shape::Ring => "ring",
                        });
                    }
                }
            }
            seen.into_iter().collect::<Vec<_>>()
        };
        assert_eq!(shapes(3), ["bridge", "halves", "isolate"]);
        assert_eq!(shapes(5), ["bridge", "halves", "isolate", "ring"]);
    }

    /// `clock` alone stays within max_offset; `all` sometimes goes beyond.
    #[test]
    fn clock_offsets_by_nemesis() {
        // (restart offsets, jumps, strobes) over 50 seeds.
        let faults = |nemesis| {
            let (mut offsets, mut jumps, mut strobes) = (Vec::new(), Vec::new(), Vec::new());
            for step in (0..50).flat_map(|seed| plan(nemesis, 3, 2, 60_000, seed)) {
                match step.fault {
                    Fault::Clock { offset_ms, .. } => offsets.push(offset_ms),
                    Fault::ClockJump { offset_ms, .. } => jumps.push(offset_ms),
                    Fault::ClockStrobe { offset_ms, .. } => strobes.push(offset_ms),
                    _ => {}
                }
            }
            (offsets, jumps, strobes)
        };
        let (offsets, jumps, strobes) = faults(NemesisKind::Clock);
        for kind in [&offsets, &jumps, &strobes] {
            assert!(!kind.is_empty());
            assert!(kind.iter().all(|o| o.abs() < MAX_OFFSET_MS));
            assert!(kind.iter().any(|o| *o < 0) && kind.iter().any(|o| *o > 0));
        }
        let (offsets, jumps, strobes) = faults(NemesisKind::All);
        assert!(offsets.contains(&BEYOND_OFFSET_MS));
        assert!(jumps.contains(&BEYOND_OFFSET_MS) && jumps.contains(&-BEYOND_OFFSET_MS));
        assert!(strobes.iter().all(|o| o.abs() < MAX_OFFSET_MS));
    }

    /// `all` mixes in every fault kind but the chain, power losses and replica moves included.
    #[test]
    fn all_mixes_every_kind() {
        let mut kinds = std::collections::BTreeSet::new();
        for step in (0..30).flat_map(|seed| plan(NemesisKind::All, 3, 2, 60_000, seed)) {
            kinds.insert(match step.fault {
                Fault::Kill { .. } => "kill",
                Fault::PowerLoss { .. } => "power-loss",
                Fault::Pause { .. } => "pause",
                Fault::Partition { .. } => "partition",
                Fault::Clock { .. } => "clock",
                Fault::ClockJump { .. } => "clock-jump",
                Fault::ClockStrobe { .. } => "clock-strobe",
                Fault::ClockChain { .. } => "clock-chain",
                Fault::Move { .. } => "move",
            });
        }
        assert_eq!(
            kinds.into_iter().collect::<Vec<_>>(),
            [
                "clock",
                "clock-jump",
                "clock-strobe",
                "kill",
                "move",
                "partition",
                "pause",
                "power-loss"
            ]
        );
    }

    /// `membership` only moves replicas, of workload keys' shards, leaders' and followers'.
    #[test]
    fn membership_moves_leaders_and_followers_replicas() {
        let (mut leaders, mut followers) = (0, 0);
        for step in (0..20).flat_map(|seed| plan(NemesisKind::Membership, 3, 2, 40_000, seed)) {
            assert!((3_000..=6_000).contains(&step.hold_ms) || step.at_ms + step.hold_ms == 40_000);
            match step.fault {
                Fault::Move {
                    target: Target::LeaderOfKey { key },
                } if key < 2 => leaders += 1,
                Fault::Move {
                    target: Target::FollowerOfKey { key },
                } if key < 2 => followers += 1,
                other => panic!("{other:?}"),
            }
        }
        assert!(leaders > 0 && followers > 0, "{leaders} {followers}");
    }

    /// `kill` hits a minority, or a majority of distinct nodes, each for some seed.
    #[test]
    fn kill_hits_a_minority_or_a_majority() {
        for nodes in [3usize, 5] {
            let mut sizes = std::collections::BTreeSet::new();
            for step in (0..50).flat_map(|seed| plan(NemesisKind::Kill, nodes, 2, 40_000, seed)) {
                let Fault::Kill { targets } = &step.fault else {
                    panic!("{step:?}");
                };
                sizes.insert(targets.len());
            }
            let expected: Vec<usize> = (1..=minority(nodes) + 1).collect();
            assert_eq!(
                sizes.into_iter().collect::<Vec<_>>(),
                expected,
                "{nodes} nodes"
            );
        }
    }

    /// `power-loss` hits one node, a majority, or every node at once, and each for some seed.
    #[test]
    fn power_loss_hits_one_node_a_majority_or_all() {
        for nodes in [3usize, 5] {
            let mut sizes = std::collections::BTreeSet::new();
            for seed in 0..100 {
                for step in plan(NemesisKind::PowerLoss, nodes, 2, 40_000, seed) {
                    let Fault::PowerLoss { targets } = &step.fault else {
                        panic!("{step:?}");
                    };
                    assert!((2_000..=4_000).contains(&step.hold_ms), "{step:?}");
                    sizes.insert(targets.len());
                }
            }
            let majority = minority(nodes) + 1;
            assert_eq!(
                sizes.into_iter().collect::<Vec<_>>(),
                [1, majority, nodes],
                "{nodes} nodes"
            );
        }
    }

    /// Too short a time limit for any fault gives an empty schedule, not a truncated pause.
    #[test]
    fn short_runs_have_no_truncated_faults() {
        assert!(plan(NemesisKind::Pause, 3, 1, 3_000, 5).is_empty());
    }

    /// `clock-chain`: follower then leader of key 0, both beyond max_offset, the leader within
    /// 0.6 s of the follower's heal; whole chains only, never overlapping; reproducible.
    #[test]
    fn clock_chain_is_follower_then_leader_beyond_max_offset() {
        for seed in 0..100 {
            let steps = plan(NemesisKind::ClockChain, 5, 1, 60_000, seed);
            assert!(steps.len() >= 2, "seed {seed}: {steps:?}");
            assert_eq!(steps, plan(NemesisKind::ClockChain, 5, 1, 60_000, seed));
            let mut free_at = 0;
            for s in &steps {
                assert!(s.at_ms >= free_at, "{s:?}");
                let Fault::ClockChain {
                    first,
                    first_hold_ms,
                    gap_ms,
                    then,
                    offset_ms,
                } = &s.fault
                else {
                    panic!("not a chain: {s:?}");
                };
                assert_eq!(first, &Target::FollowerOfKey { key: 0 });
                assert_eq!(then, &Target::LeaderOfKey { key: 0 });
                assert_eq!(*offset_ms, BEYOND_OFFSET_MS);
                assert!((6_000..=8_000).contains(first_hold_ms));
                assert!((6_000..=8_000).contains(&s.hold_ms));
                assert!((200..=600).contains(gap_ms));
                free_at = s.at_ms + s.fault.lead_in_ms() + s.hold_ms;
                assert!(free_at <= 60_000);
                free_at += CLOCK_HEAL_ESTIMATE_MS;
            }
        }
        assert_ne!(
            plan(NemesisKind::ClockChain, 5, 1, 60_000, 1),
            plan(NemesisKind::ClockChain, 5, 1, 60_000, 2)
        );
        // Too short for one whole chain: nothing, rather than a truncated one.
        assert!(plan(NemesisKind::ClockChain, 5, 1, 15_000, 1).is_empty());
    }
}

//! Command-line arguments and their validation (pure; unit-tested).
//!
//! `clap` parses the flags; [`Args::validate`] turns them into a [`RunConfig`] or a
//! [`UsageError`] (exit status 2).

use clap::{Parser, ValueEnum};
use meridian_jepsen::controls::NegativeControl;
use std::path::PathBuf;

/// Node i serves its metrics on 127.0.0.1:<base + this + i> (after the client API at base+i
/// and Raft at base+100+i).
pub const METRICS_PORT_OFFSET: u32 = 200;

/// Ports the cluster test suite uses; a harness run must stay out of them.
pub const RESERVED_TEST_PORTS: std::ops::RangeInclusive<u32> = 21_000..=22_999;

#[derive(Parser, Debug, Clone)]
#[command(
    name = "meridian-jepsen",
    about = "Runs a Meridian cluster of real processes under faults and checks the history",
    long_about = "Starts a fresh local cluster of `meridian start` processes, runs a workload \
                  (register: per-key linearizability; set: no lost acknowledged inserts; \
                  bank: transactions keep the total; append: transactions are serializable) while a \
                  nemesis injects real faults (SIGKILL, SIGSTOP, nftables packet drops, clock \
                  offsets), heals, reads back, checks, and writes jepsen/store/<run>/. Exit \
                  status 0 iff the history is valid."
)]
pub struct Args {
    /// What the clients do.
    #[arg(long, value_enum)]
    pub workload: Workload,
    /// Which faults to inject.
    #[arg(long, value_enum, default_value = "none")]
    pub nemesis: NemesisKind,
    /// Seconds of workload (and faults), before healing and the final read.
    #[arg(long, default_value_t = 30)]
    pub time_limit: u64,
    /// Client tasks (processes of the history), each with its own client.
    #[arg(long, default_value_t = 5)]
    pub concurrency: usize,
    /// Cluster size: 3 or 5 nodes.
    #[arg(long, default_value_t = 3)]
    pub nodes: usize,
    /// Seed of the nemesis schedule and the clients' choices (random if absent; printed).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Corrupt the recorded history with this checker-library mutation before checking
    /// (`lost-ack` for set, `stale-read` for register, `wrong-total` for bank,
    /// `fractured-read` for append); the run passes only if the checker then finds it invalid.
    #[arg(long)]
    pub negative_control: Option<String>,
    /// Node i listens on 127.0.0.1:<base+i> (clients), <base+100+i> (Raft) and <base+200+i>
    /// (metrics).
    #[arg(long, default_value_t = 23_000)]
    pub base_port: u16,
    /// Directory under which the run directory is created (default: jepsen/store).
    #[arg(long)]
    pub store: Option<PathBuf>,
    /// Data shards the cluster is pre-split into.
    #[arg(long, default_value_t = 4)]
    pub shards: u32,
    /// Register keys (register workload).
    #[arg(long, default_value_t = 4)]
    pub keys: usize,
    /// Register workload: write each key at most once per this many milliseconds (whichever
    /// client comes first; every other operation on it is a read), so its shard sits idle
    /// between writes, quiesces, and serves the reads on its parked lease. 0 (the default):
    /// half of the operations write.
    #[arg(long, default_value_t = 0)]
    pub write_gap_ms: u64,
    /// The `meridian` binary (default: $CARGO_TARGET_DIR/release/meridian).
    #[arg(long)]
    pub meridian_bin: Option<PathBuf>,
    /// Print the nemesis schedule for these arguments (as JSON) and exit, starting nothing.
    #[arg(long)]
    pub plan_only: bool,
    /// Append only: every transaction commit-waits (`TxnOptions::linearizable`), and the
    /// checker requires real-time order between all transactions even when the nemesis skews
    /// clocks (without it, only between transactions that share a key). Not with `all` or
    /// `clock-chain`, which skew clocks beyond max_offset.
    #[arg(long)]
    pub linearizable: bool,
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Workload {
    Register,
    Set,
    Bank,
    Append,
}

impl Workload {
    pub fn name(self) -> &'static str {
        match self {
            Workload::Register => "register",
            Workload::Set => "set",
            Workload::Bank => "bank",
            Workload::Append => "append",
        }
    }
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum NemesisKind {
    None,
    Kill,
    Pause,
    Partition,
    Clock,
    /// Follower of the key's shard at +2000 ms, heal, then at once its leader (see plan.rs).
    ClockChain,
    /// SIGKILL nodes and drop their unsynced writes (data directories on lazyfs, see power.rs).
    PowerLoss,
    /// Replica moves: remove a replica of a key's shard (its leader's or a follower's), add it
    /// back at the heal (an empty replica that catches up).
    Membership,
    All,
}

impl NemesisKind {
    pub fn name(self) -> &'static str {
        match self {
            NemesisKind::None => "none",
            NemesisKind::Kill => "kill",
            NemesisKind::Pause => "pause",
            NemesisKind::Partition => "partition",
            NemesisKind::Clock => "clock",
            NemesisKind::ClockChain => "clock-chain",
            NemesisKind::PowerLoss => "power-loss",
            NemesisKind::Membership => "membership",
            NemesisKind::All => "all",
        }
    }

    /// Whether this nemesis may cut the network (needs nftables and per-node uids).
    /// Whether it runs nodes with skewed clocks: the append checker then requires real-time
    /// order per key only (see `meridian_jepsen::checker::append::RealTime`).
    pub fn skews_clocks(self) -> bool {
        matches!(
            self,
            NemesisKind::Clock | NemesisKind::ClockChain | NemesisKind::All
        )
    }

    /// Whether it jumps or strobes running nodes' wall clocks (libfaketime, see `clocks`).
    pub fn jumps_clocks(self) -> bool {
        matches!(self, NemesisKind::Clock | NemesisKind::All)
    }

    pub fn partitions(self) -> bool {
        matches!(self, NemesisKind::Partition | NemesisKind::All)
    }

    /// Whether the nodes' data directories sit on lazyfs mounts (see `power`).
    pub fn cuts_power(self) -> bool {
        matches!(self, NemesisKind::PowerLoss | NemesisKind::All)
    }
}

/// A refused command line: printed, exit status 2.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageError(pub String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A validated run.
#[derive(Debug, Clone)]
pub struct RunConfig {
    pub workload: Workload,
    pub nemesis: NemesisKind,
    pub time_limit_s: u64,
    pub concurrency: usize,
    pub nodes: usize,
    pub seed: u64,
    pub seed_given: bool,
    pub negative_control: Option<NegativeControl>,
    pub base_port: u16,
    pub store: Option<PathBuf>,
    pub shards: u32,
    pub keys: usize,
    /// Register: the least time between two writes of one key (`None`: half the ops write).
    pub write_gap: Option<std::time::Duration>,
    pub meridian_bin: Option<PathBuf>,
    pub plan_only: bool,
    pub linearizable: bool,
}

fn usage(message: impl Into<String>) -> Result<RunConfig, UsageError> {
    Err(UsageError(message.into()))
}

impl Args {
    /// Checks everything that can be checked without touching the machine. `random_seed` is
    /// used when `--seed` is absent (passed in so this stays pure).
    pub fn validate(&self, random_seed: u64) -> Result<RunConfig, UsageError> {
        match self.workload {
            Workload::Register | Workload::Set | Workload::Bank | Workload::Append => {}
        }
        if !(1..=3600).contains(&self.time_limit) {
            return usage(format!(
                "--time-limit must be 1..=3600 seconds, got {}",
                self.time_limit
            ));
        }
        if !(1..=64).contains(&self.concurrency) {
            return usage(format!(
                "--concurrency must be 1..=64, got {}",
                self.concurrency
            ));
        }
        if self.linearizable && self.workload != Workload::Append {
            return usage("--linearizable applies to the append workload only");
        }
        if self.linearizable && matches!(self.nemesis, NemesisKind::All | NemesisKind::ClockChain) {
            // They skew clocks beyond max_offset, where commit-wait promises nothing.
            return usage(format!(
                "--linearizable cannot be checked under --nemesis {}: it skews clocks beyond \
                 max_offset",
                self.nemesis.name()
            ));
        }
        if self.nodes != 3 && self.nodes != 5 {
            return usage(format!("--nodes must be 3 or 5, got {}", self.nodes));
        }
        if !(1..=64).contains(&self.shards) {
            return usage(format!("--shards must be 1..=64, got {}", self.shards));
        }
        if !(1..=64).contains(&self.keys) {
            return usage(format!("--keys must be 1..=64, got {}", self.keys));
        }
        if self.write_gap_ms > 0 && self.workload != Workload::Register {
            return usage("--write-gap-ms applies to the register workload only");
        }
        if self.write_gap_ms > 60_000 {
            return usage(format!(
                "--write-gap-ms must be 0..=60000, got {}",
                self.write_gap_ms
            ));
        }
        let low = u32::from(self.base_port) + 1;
        let high = u32::from(self.base_port) + METRICS_PORT_OFFSET + self.nodes as u32;
        if self.base_port < 1024 || high > u32::from(u16::MAX) {
            return usage(format!(
                "--base-port {} must leave ports {low}..={high} inside 1025..=65535",
                self.base_port
            ));
        }
        if low <= *RESERVED_TEST_PORTS.end() && high >= *RESERVED_TEST_PORTS.start() {
            return usage(format!(
                "--base-port {} would use ports {low}..={high}, which overlap 21000..=22999 (the \
                 cluster test suite's ports); pick e.g. 23000",
                self.base_port
            ));
        }
        let negative_control = match &self.negative_control {
            None => None,
            Some(name) => {
                let control: NegativeControl =
                    name.parse().map_err(|e| UsageError(format!("{e}")))?;
                let expected = match self.workload {
                    Workload::Set => NegativeControl::LostAck,
                    Workload::Bank => NegativeControl::WrongTotal,
                    Workload::Append => NegativeControl::FracturedRead,
                    _ => NegativeControl::StaleRead,
                };
                if control != expected {
                    return usage(format!(
                        "negative control {control} does not apply to the {} workload (use {expected})",
                        self.workload.name()
                    ));
                }
                Some(control)
            }
        };
        Ok(RunConfig {
            workload: self.workload,
            nemesis: self.nemesis,
            time_limit_s: self.time_limit,
            concurrency: self.concurrency,
            nodes: self.nodes,
            seed: self.seed.unwrap_or(random_seed),
            seed_given: self.seed.is_some(),
            negative_control,
            base_port: self.base_port,
            store: self.store.clone(),
            shards: self.shards,
            keys: self.keys,
            write_gap: (self.write_gap_ms > 0)
                .then(|| std::time::Duration::from_millis(self.write_gap_ms)),
            meridian_bin: self.meridian_bin.clone(),
            plan_only: self.plan_only,
            linearizable: self.linearizable,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(line: &str) -> Args {
        Args::try_parse_from(std::iter::once("meridian-jepsen").chain(line.split_whitespace()))
            .unwrap()
    }

    /// Defaults, and an explicit seed wins over the random one.
    #[test]
    fn defaults_and_seed() {
        let c = parse("--workload register").validate(7).unwrap();
        assert_eq!(c.nemesis, NemesisKind::None);
        assert_eq!((c.time_limit_s, c.concurrency, c.nodes), (30, 5, 3));
        assert_eq!((c.seed, c.seed_given), (7, false));
        let c = parse("--workload set --nemesis all --seed 42 --nodes 5")
            .validate(7)
            .unwrap();
        assert_eq!((c.seed, c.seed_given, c.nodes), (42, true, 5));
    }

    /// Power-loss parses but is refused with the reason; `bank` and `append` run, each with
    /// its own negative control only.
    #[test]
    fn unavailable_choices_are_refused_with_reason() {
        assert!(parse("--workload append --negative-control fractured-read")
            .validate(0)
            .is_ok());
        assert!(parse("--workload bank --negative-control wrong-total")
            .validate(0)
            .is_ok());
        let e = parse("--workload bank --negative-control stale-read")
            .validate(0)
            .unwrap_err();
        assert!(e.0.contains("use wrong-total"), "{e}");
        assert!(parse("--workload set --nemesis power-loss")
            .validate(0)
            .is_ok());
    }

    /// Out-of-range numbers and unknown names are refused.
    #[test]
    fn bad_values_are_refused() {
        for line in [
            "--workload set --nodes 4",
            "--workload set --concurrency 0",
            "--workload set --time-limit 0",
            "--workload set --base-port 21500",
            "--workload set --base-port 20950",
            "--workload set --base-port 65500",
            "--workload set --negative-control nope",
            "--workload set --negative-control stale-read",
            "--workload register --negative-control lost-ack",
            "--workload bank --linearizable",
            "--workload append --nemesis all --linearizable",
            "--workload set --write-gap-ms 5000",
            "--workload register --write-gap-ms 60001",
            "--workload set --base-port 20800", // only its metrics ports overlap
        ] {
            assert!(parse(line).validate(0).is_err(), "{line}");
        }
        assert!(parse("--workload append --nemesis clock --linearizable")
            .validate(0)
            .is_ok_and(|c| c.linearizable));
        assert!(Args::try_parse_from(["x", "--workload", "kv"]).is_err());
        assert!(Args::try_parse_from(["x", "--workload", "set", "--nemesis", "flood"]).is_err());
    }

    /// The fixed follower-then-leader clock sequence parses, and does not need nftables.
    #[test]
    fn clock_chain_parses() {
        let c = parse("--workload set --nemesis clock-chain --nodes 5")
            .validate(0)
            .unwrap();
        assert_eq!(c.nemesis, NemesisKind::ClockChain);
        assert_eq!(c.nemesis.name(), "clock-chain");
        assert!(!c.nemesis.partitions());
    }

    /// Each workload accepts its own negative control.
    #[test]
    fn matching_controls_are_accepted() {
        let c = parse("--workload set --negative-control lost-ack")
            .validate(0)
            .unwrap();
        assert_eq!(c.negative_control, Some(NegativeControl::LostAck));
        let c = parse("--workload register --negative-control stale-read")
            .validate(0)
            .unwrap();
        assert_eq!(c.negative_control, Some(NegativeControl::StaleRead));
    }

    /// A register write gap is kept as a duration; 0 means none.
    #[test]
    fn write_gap_parses() {
        let c = parse("--workload register --write-gap-ms 4000")
            .validate(0)
            .unwrap();
        assert_eq!(c.write_gap, Some(std::time::Duration::from_secs(4)));
        assert_eq!(
            parse("--workload register").validate(0).unwrap().write_gap,
            None
        );
    }
}

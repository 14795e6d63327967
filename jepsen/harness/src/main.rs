//! `meridian-jepsen`: runs a Meridian cluster of real processes under real faults, records what
//! the clients saw, and checks it. Usually started through `jepsen/run.sh`, which installs
//! nftables if missing, builds `meridian` and this binary, and passes its arguments on:
//!
//! ```text
//! jepsen/run.sh --workload register|set|bank|append --nemesis none|kill|pause|partition|clock|clock-chain|power-loss|all
//!               [--time-limit SECONDS] [--concurrency N] [--nodes 3|5] [--seed S]
//!               [--negative-control lost-ack|stale-read|wrong-total|fractured-read]
//!               [--base-port P] [--store DIR]
//!               [--shards N] [--keys N] [--write-gap-ms MS (register)] [--meridian-bin PATH]
//!               [--plan-only]
//! ```
//!
//! # One run
//! 1. A fresh `LocalCluster` (meridian-cli) of `--nodes` `meridian start` processes on
//!    127.0.0.1 (client API base+i, Raft base+100+i; loopback Raft timings: heartbeat 100 ms,
//!    election timeout 600–1200 ms; `--shards` data shards; max_offset 500 ms), data in
//!    `/var/tmp/meridian-jepsen-<base>-<pid>/`. Waits (bounded) until every shard has a leader.
//! 2. `--concurrency` client tasks, each with its own `meridian_client::Client` (call timeout
//!    4 s, attempt timeout 1 s), run the workload for `--time-limit` seconds while the nemesis
//!    runs its seeded schedule (faults never overlap; each is healed after its hold).
//! 3. Heal everything (flush partitions, SIGCONT, restart killed and clock-skewed nodes
//!    without skew), wait for every shard to have a leader (bounded, 3 tries), then a final read
//!    phase (register: read every key; set: scan the whole set; bank: read every account),
//!    retried until it succeeds
//!    (bounded).
//! 4. Stop every node (SIGCONT, SIGTERM, SIGKILL after 20 s), delete the nftables table, copy
//!    the node logs; check; write the run directory; print a summary.
//!
//! SIGINT/SIGTERM at any point of steps 1–3 jump to step 4 (recorded history written, verdict
//! `"unknown"`, exit 130). `LocalCluster`'s `Drop` and `PR_SET_PDEATHSIG` cover panics and a
//! SIGKILLed harness; the nftables table is deleted by a guard's `Drop`.
//!
//! # Workloads and what is checked
//! - **register** (`workload.rs`): `--keys` keys spread over the shards; each op reads or
//!   writes a unique value `"<process>-<counter>"` on a random key. Checked per key for
//!   linearizability (WGL search in `meridian-jepsen`, `Info` writes may or may not have
//!   happened). Writes: `Ambiguous` → info, other errors → fail; reads: errors → fail.
//!   With `--write-gap-ms G`, a key is written at most once per G ms (by whichever client
//!   draws it first) and every other op on it reads: its shard quiesces between writes (after
//!   1.2 s idle) and its leader serves the reads on its parked lease, which is what such a run
//!   checks. Every run reports, per node, the reads it served on parked leases (its
//!   `/metrics`, scraped after the heal) and fails a write-gap run that served none (exit
//!   status 3; the counters restart with a node, so use write gaps with nemeses that restart
//!   no node: pause, partition).
//! - **set**: each op puts `set/<x:010>` = x for a fresh integer x (recorded as `add x`); after
//!   healing one paged scan of `set/` is the final `read_all`. Checked: every acknowledged add
//!   is present, nothing unattempted or failed is, no duplicates (`meridian-jepsen`'s set
//!   checker; stale/never-read are counted).
//! - **bank** (`bank.rs`): two accounts in every shard, opened with 100 each before the
//!   workload; each op is a transfer between two accounts (a transaction: half of them within
//!   one shard, half across two, a two-phase commit) or a read of every account (one
//!   read-only transaction across the shards). Checked: every ok
//!   read shows exactly the accounts, no negative balance, the opening total.
//! - **append** (`append.rs`): three list keys in every shard; read-write transactions of 1–4
//!   appends and reads on the keys of one shard or, half of the time, two; read-only
//!   transactions of every key. Checked with
//!   the Elle-style list-append checker: no dependency cycle, real-time edges included
//!   (strictly serializable; under a nemesis that skews clocks, real-time edges only between
//!   transactions sharing a key), no read of an aborted or unknown value, reads of a key are
//!   prefixes of one another.
//! - **negative controls** (`--negative-control`): the checker library's `lost-ack` (set),
//!   `stale-read` (register), `wrong-total` (bank) or `fractured-read` (append) mutation is
//!   applied to a copy of the recorded history; the run
//!   passes only if the checker finds the copy invalid *and* the real history valid.
//!
//! # Nemeses (`plan.rs` decides, `nemesis.rs` does)
//! - **kill**: SIGKILL a random node or the leader of a workload key's shard (5 nodes: up to
//!   two), restart it 2–5 s later.
//! - **pause**: SIGSTOP a node (random or a key's leader) for 2–4 s, past the 1.2 s lease, then
//!   SIGCONT.
//! - **partition**: nftables drops (`nft.rs`) between the Raft traffic of two sides — one node
//!   (random or a key's leader) against the rest, or a random minority against the majority —
//!   for 3–6 s. Nodes then run as uids 61000+i so connections can be attributed (see
//!   `nft.rs`, `cluster.rs`). Each partition is verified: the majority must take over the
//!   shards the minority led (noted on the interval; a warning if not).
//! - **clock**, for 4–8 s, one of: restart a node with `--clock-offset-ms` ±50–200 ms; *jump*
//!   a running node's (or a key leader's) wall clock ±50–300 ms at once, and back at the heal
//!   (a peer's measurement of the new offset is noted as evidence); *strobe* it between real
//!   time and ±50–300 ms every 50–250 ms. Jumps and strobes run on libfaketime (`clocks.rs`).
//!   In **all**, a third of offsets and jumps go beyond max_offset (+2000 ms, jumps also
//!   −2000 ms): the node's clock fence stops it within seconds, exit status 5 in `node_exits`,
//!   and the heal starts it again on real time; the notes say whether it stopped and still led
//!   anything.
//! - **power-loss**: SIGKILL one node (half the time), a majority or every node at once, and
//!   drop every write they had not fsynced: the nodes' data directories are
//!   `meridian-lazyfs` mounts (`power.rs`, `jepsen/lazyfs`), killed with them; 2–4 s later a
//!   new lazyfs mounts the same backing directory and the nodes start again.
//! - **membership**: remove a key's shard's replica held by its leader or a follower (the node
//!   leaves the group and deletes it), add it back at the heal; it catches up and votes again.
//! - **all**: a seeded mix of kill, power-loss, pause, partition, every clock fault and replica
//!   moves (the nodes run on lazyfs and libfaketime, as their own uids).
//! - **clock-chain**: not a mix but one fixed sequence, repeated (the lost-acknowledged-writes
//!   run in `jepsen/evidence/`): restart a follower of the workload key's shard at +2000 ms
//!   (it stops itself: the clock fence), hold 6–8 s, restart it without the offset, and 200–600 ms later — while it still waits
//!   for its HLC ceiling — restart the shard's leader at +2000 ms, hold 6–8 s, heal. The
//!   shard has three replicas, so from the leader's stop until the follower's Raft is back
//!   only one of them runs. A chain takes about 20 s; `--time-limit 60` fits two.
//!
//! # Exit status
//! 0 valid (or negative control fired); 1 invalid, unknown, or control did not fire; 2 bad
//! arguments; 3 harness failure (cluster
//! did not start, nftables unusable...); 130 interrupted.
//!
//! # Not done yet
//! - libfaketime clock jumps or strobes: the clock nemesis only restarts nodes with a fixed
//!   offset.
//! - Power loss of file metadata (lazyfs applies creates, renames and deletes at once) and torn
//!   writes; `all` does not mix power losses in.
//! - Partitions of the client API, packet delay instead of loss.
//! - Intermediate set reads and per-element visibility latency.

mod append;
mod args;
mod bank;
mod check;
mod clocks;
mod cluster;
mod nemesis;
mod nft;
mod output;
mod plan;
mod power;
mod replicas;
mod run;
mod status;
mod workload;

use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    // The uid wrapper for partitioning runs (see cluster.rs): `<harness> start ...`.
    let argv: Vec<String> = std::env::args().collect();
    if argv.get(1).map(String::as_str) == Some("start") {
        if let Some(meridian) = std::env::var_os(cluster::WRAP_ENV_BINARY) {
            let error = cluster::exec_node(std::path::Path::new(&meridian), &argv[1..]);
            eprintln!("meridian-jepsen node wrapper: {error:#}");
            return ExitCode::from(126);
        }
    }

    let args = args::Args::parse();
    let cfg = match args.validate(rand::random()) {
        Ok(cfg) => cfg,
        Err(e) => {
            eprintln!("meridian-jepsen: {e}");
            return ExitCode::from(2);
        }
    };
    if cfg.plan_only {
        // Register keys are spread over the shards, one key per shard up to --keys.
        let keys = match cfg.workload {
            args::Workload::Register => cfg.keys,
            args::Workload::Bank => cfg.shards as usize * bank::ACCOUNTS_PER_SHARD,
            args::Workload::Append => cfg.shards as usize * append::KEYS_PER_SHARD,
            _ => 1,
        };
        let steps = plan::plan(
            cfg.nemesis,
            cfg.nodes,
            keys,
            cfg.time_limit_s * 1_000,
            cfg.seed,
        );
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({"seed": cfg.seed, "steps": steps}))
                .unwrap_or_default()
        );
        return ExitCode::SUCCESS;
    }
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .try_init();
    let meridian = cfg
        .meridian_bin
        .clone()
        .unwrap_or_else(cluster::default_meridian_binary);
    if cfg.nemesis.partitions() {
        // Before any other thread exists: it changes the process environment.
        cluster::set_wrapper_env(&meridian);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("meridian-jepsen: building the runtime: {e}");
            return ExitCode::from(run::EXIT_HARNESS);
        }
    };
    let status = runtime.block_on(run::run(cfg, meridian));
    // Client tasks left over from an interrupted run must not hold the process open.
    runtime.shutdown_timeout(std::time::Duration::from_secs(5));
    match status {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("meridian-jepsen: error: {e:#}");
            ExitCode::from(run::EXIT_HARNESS)
        }
    }
}

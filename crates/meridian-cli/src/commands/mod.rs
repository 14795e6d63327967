//! `meridian kv …` and `meridian cluster …`: thin wrappers over [`meridian_client`].
//!
//! Output goes to stdout (values, tables), diagnostics to stderr; any error makes the process
//! exit non-zero (see `main.rs`). With `--hex`, key and value arguments are hexadecimal.

use crate::display::{format_bytes, parse_hex, ClusterView};
use crate::txn_steps::{parse_steps, Step};
use anyhow::Context;
use bytes::Bytes;
use meridian_client::survival_plan::Move;
use meridian_client::{
    CasOutcome, Client, ClientConfig, Expect, ReadConsistency, Timestamp, TxnOptions,
};
use std::time::Duration;

/// How to reach the cluster.
#[derive(Clone, Debug, clap::Args)]
pub struct ConnectArgs {
    /// Client addresses of cluster nodes, comma-separated.
    #[arg(
        long,
        env = "MERIDIAN_ENDPOINTS",
        value_delimiter = ',',
        default_value = "127.0.0.1:7001",
        global = true
    )]
    pub endpoints: Vec<String>,
    /// Budget of each command including retries, in milliseconds.
    #[arg(long, default_value_t = 10_000, global = true)]
    pub timeout_ms: u64,
    /// Dial overrides, comma-separated `ADVERTISED=DIAL` client addresses (e.g. through a
    /// `meridian-wan` proxy link): a node the cluster advertises at ADVERTISED is reached at DIAL.
    #[arg(long, env = "MERIDIAN_DIAL", value_delimiter = ',', global = true)]
    pub dial: Vec<String>,
    /// The region this client runs in: stale reads (--max-staleness-ms, ...) go to a replica
    /// there first.
    #[arg(long, env = "MERIDIAN_REGION", global = true)]
    pub region: Option<String>,
}

/// A stale read instead of a linearizable one: at most one of these. Served by the nearest
/// replica that can (see --region), else by the leader.
#[derive(Clone, Debug, Default, clap::Args)]
#[group(multiple = false)]
pub struct StalenessArgs {
    /// Bounded staleness: the replica's closed timestamp, if at most this many milliseconds
    /// behind its clock (the leader reads fresh).
    #[arg(long)]
    pub max_staleness_ms: Option<u64>,
    /// Exact staleness: read at the serving node's clock minus this many milliseconds.
    #[arg(long)]
    pub exact_staleness_ms: Option<u64>,
    /// Read at exactly this HLC timestamp (as printed by `kv put` or a stale read).
    #[arg(long)]
    pub as_of: Option<u64>,
}

impl StalenessArgs {
    /// The stale consistency asked for, `None` for a linearizable read.
    pub fn consistency(&self) -> Option<ReadConsistency> {
        match (self.max_staleness_ms, self.exact_staleness_ms, self.as_of) {
            (Some(ms), _, _) => Some(ReadConsistency::BoundedStaleness {
                max_staleness: Duration::from_millis(ms),
            }),
            (_, Some(ms), _) => Some(ReadConsistency::ExactStaleness {
                staleness: Duration::from_millis(ms),
            }),
            (_, _, Some(ts)) => Some(ReadConsistency::AsOf(Timestamp(ts))),
            _ => None,
        }
    }
}

impl ConnectArgs {
    pub fn client_config(&self) -> ClientConfig {
        let mut config = ClientConfig::new(self.endpoints.iter().map(|e| e.trim().to_string()));
        config.region = self.region.clone();
        config.call_timeout = Duration::from_millis(self.timeout_ms.max(1));
        config.rpc_timeout = config.rpc_timeout.min(config.call_timeout);
        // An empty entry (e.g. MERIDIAN_DIAL="") means no override.
        for pair in self.dial.iter().filter(|p| !p.trim().is_empty()) {
            let (from, to) = pair.split_once('=').unwrap_or((pair.as_str(), ""));
            // An entry without '=' maps to "", which validation rejects with its text.
            config
                .dial
                .insert(from.trim().to_string(), to.trim().to_string());
        }
        config
    }

    pub async fn connect(&self) -> anyhow::Result<Client> {
        Client::connect(self.client_config())
            .await
            .with_context(|| format!("connecting to {}", self.endpoints.join(",")))
    }
}

/// A `kv cas` whose condition did not hold: nothing was written (`main` exits with status 4).
#[derive(Debug)]
pub struct CasMismatch {
    /// The key's current value and version, `None` if it has none.
    pub current: Option<String>,
}

impl std::fmt::Display for CasMismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.current {
            Some(current) => write!(
                f,
                "condition not met, nothing written; current value: {current}"
            ),
            None => write!(
                f,
                "condition not met, nothing written; the key has no value"
            ),
        }
    }
}

impl std::error::Error for CasMismatch {}

/// `meridian kv`: read and write keys.
#[derive(Clone, Debug, clap::Args)]
pub struct KvCommand {
    #[command(flatten)]
    pub connect: ConnectArgs,
    /// Keys and values on the command line are hex (optionally 0x-prefixed).
    #[arg(long, global = true)]
    pub hex: bool,
    #[command(subcommand)]
    pub op: KvOp,
}

#[derive(Clone, Debug, clap::Subcommand)]
pub enum KvOp {
    /// Print a key's value (text if printable UTF-8, else 0x-hex). A stale read also prints
    /// `read_ts=... served_by=...` on stderr.
    Get {
        key: String,
        #[command(flatten)]
        staleness: StalenessArgs,
    },
    /// Write a value; prints the commit timestamp.
    Put { key: String, value: String },
    /// Delete a key; prints the commit timestamp.
    Del { key: String },
    /// Compare-and-swap: write VALUE (or delete, with --delete) only if the key's newest
    /// version matches exactly one --expect-* condition, atomically. Prints the commit
    /// timestamp; on a mismatch prints the key's current state and exits with status 4.
    Cas {
        key: String,
        /// The value to write when the condition holds.
        #[arg(required_unless_present = "delete", conflicts_with = "delete")]
        value: Option<String>,
        /// Delete the key when the condition holds.
        #[arg(long)]
        delete: bool,
        /// Condition: the key's current value equals this.
        #[arg(long, group = "expect")]
        expect_value: Option<String>,
        /// Condition: the key's newest version has this commit timestamp (from `kv put`/`cas`).
        #[arg(long, group = "expect")]
        expect_version: Option<u64>,
        /// Condition: the key has no value (never written, or deleted).
        #[arg(long, group = "expect")]
        expect_absent: bool,
    },
    /// Run a transaction of steps `get KEY`, `put KEY VALUE`, `del KEY` (one per
    /// argument, or per line of --file), re-run on conflicts. After the commit prints each get
    /// as `KEY<TAB>VALUE` (or `KEY<TAB>(absent)`), then the commit timestamp and the attempts.
    /// Reads and writes may span shards (a parallel commit); a read-only one commits nothing.
    Txn {
        /// The steps, e.g. 'get a' 'put b 1' 'del c'; 'get a for update' reads a key the
        /// commit checks even under snapshot isolation.
        steps: Vec<String>,
        /// Read the steps from this file (one per line; `#` starts a comment line).
        #[arg(long, conflicts_with = "steps")]
        file: Option<std::path::PathBuf>,
        /// Most runs of the transaction before giving up on conflicts.
        #[arg(long, default_value_t = meridian_types::limits::DEFAULT_TXN_MAX_ATTEMPTS)]
        max_attempts: u32,
        /// What a transaction that writes is checked for at commit: every read
        /// (serializable) or only the keys it writes (snapshot; write skew possible).
        #[arg(long, value_enum, default_value = "serializable")]
        isolation: IsolationArg,
        /// Who gives way when its multi-shard commit meets another transaction's lock: a
        /// higher priority wins, then the older transaction (wound-wait).
        #[arg(long, value_enum, default_value = "normal")]
        priority: PriorityArg,
        /// Commit-wait: return only once every node's clock has passed the commit timestamp,
        /// so any transaction begun afterwards commits above it (costs max_offset to 2 x
        /// max_offset per writing commit, about max_offset for a read-only one).
        #[arg(long)]
        linearizable: bool,
    },
    /// Print `key<TAB>value` lines of a key range.
    Scan {
        /// Inclusive start (default: beginning of the keyspace).
        #[arg(long, default_value = "")]
        start: String,
        /// Exclusive end (default: end of the keyspace).
        #[arg(long)]
        end: Option<String>,
        /// Most rows to print.
        #[arg(long, default_value_t = 100)]
        limit: u32,
        /// Descending order.
        #[arg(long)]
        reverse: bool,
        /// A stale scan is one snapshot: later pages read at the first page's timestamp.
        #[command(flatten)]
        staleness: StalenessArgs,
    },
}

impl KvCommand {
    fn bytes(&self, text: &str) -> anyhow::Result<Bytes> {
        if self.hex {
            Ok(Bytes::from(parse_hex(text).map_err(anyhow::Error::msg)?))
        } else {
            Ok(Bytes::copy_from_slice(text.as_bytes()))
        }
    }

    pub async fn run(&self) -> anyhow::Result<()> {
        // Parse arguments before connecting, so typos fail fast.
        match &self.op {
            KvOp::Get { key, staleness } => {
                let key = self.bytes(key)?;
                let client = self.connect.connect().await?;
                let value = match staleness.consistency() {
                    None => client.get(key).await?,
                    Some(consistency) => {
                        let read = client.get_with(key, consistency).await?;
                        eprintln!("read_ts={} served_by={}", read.read_ts.0, read.served_by);
                        read.value
                    }
                };
                match value {
                    Some(value) => println!("{}", format_bytes(&value)),
                    None => eprintln!("(not found)"),
                }
            }
            KvOp::Put { key, value } => {
                let (key, value) = (self.bytes(key)?, self.bytes(value)?);
                let client = self.connect.connect().await?;
                let commit_ts = client.put(key, value).await?;
                println!("OK commit_ts={commit_ts}");
            }
            KvOp::Del { key } => {
                let key = self.bytes(key)?;
                let client = self.connect.connect().await?;
                let commit_ts = client.delete(key).await?;
                println!("OK commit_ts={commit_ts}");
            }
            KvOp::Cas {
                key,
                value,
                delete: _,
                expect_value,
                expect_version,
                expect_absent,
            } => {
                let key = self.bytes(key)?;
                let new = value.as_deref().map(|v| self.bytes(v)).transpose()?;
                let expect = match (expect_value, expect_version, expect_absent) {
                    (Some(v), None, false) => Expect::Value(self.bytes(v)?),
                    (None, Some(ts), false) => Expect::Version(Timestamp(*ts)),
                    (None, None, true) => Expect::Absent,
                    _ => anyhow::bail!(
                        "kv cas needs exactly one of --expect-value, --expect-version, --expect-absent"
                    ),
                };
                let client = self.connect.connect().await?;
                match client.compare_and_swap(key, expect, new).await? {
                    CasOutcome::Swapped { commit_ts } => println!("OK commit_ts={commit_ts}"),
                    CasOutcome::Mismatch { current } => {
                        return Err(CasMismatch {
                            current: current.map(|v| {
                                format!("{} (version {})", format_bytes(&v.value), v.version_ts)
                            }),
                        }
                        .into())
                    }
                }
            }
            KvOp::Scan {
                start,
                end,
                limit,
                reverse,
                staleness,
            } => {
                let start = self.bytes(start)?;
                let end = end.as_deref().map(|e| self.bytes(e)).transpose()?;
                let mut config = self.connect.client_config();
                if let Some(consistency) = staleness.consistency() {
                    config.read_consistency = consistency;
                }
                let client = Client::connect(config).await?;
                let rows = client.scan(start, end, *limit, *reverse).await?;
                for row in &rows {
                    println!("{}\t{}", format_bytes(&row.key), format_bytes(&row.value));
                }
                eprintln!("({} rows)", rows.len());
            }
            KvOp::Txn {
                steps,
                file,
                max_attempts,
                isolation,
                priority,
                linearizable,
            } => {
                let options = TxnOptions {
                    max_attempts: (*max_attempts).max(1),
                    isolation: isolation.into_client(),
                    priority: priority.into_client(),
                    linearizable: *linearizable,
                    ..TxnOptions::default()
                };
                self.run_txn(steps, file.as_deref(), options).await?
            }
        }
        Ok(())
    }

    async fn run_txn(
        &self,
        args: &[String],
        file: Option<&std::path::Path>,
        options: TxnOptions,
    ) -> anyhow::Result<()> {
        let text = match file {
            Some(path) => std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?,
            None => args.join("\n"),
        };
        let steps = parse_steps(text.lines()).map_err(anyhow::Error::msg)?;
        // Keys and values as bytes, checked before connecting.
        let mut ops: Vec<(Step, Bytes, Option<Bytes>)> = Vec::with_capacity(steps.len());
        for step in steps {
            let (key, value) = match &step {
                Step::Get(k) | Step::GetForUpdate(k) | Step::Del(k) => (self.bytes(k)?, None),
                Step::Put(k, v) => (self.bytes(k)?, Some(self.bytes(v)?)),
            };
            ops.push((step, key, value));
        }
        let client = self.connect.connect().await?;
        let ops = std::sync::Arc::new(ops);
        let (reads, info) = client
            .txn(options, move |txn| {
                let ops = ops.clone();
                Box::pin(async move {
                    let mut reads = Vec::new();
                    for (step, key, value) in ops.iter() {
                        match step {
                            Step::Get(_) => reads.push((key.clone(), txn.get(key.clone()).await?)),
                            Step::GetForUpdate(_) => {
                                reads.push((key.clone(), txn.get_for_update(key.clone()).await?))
                            }
                            Step::Put(..) => {
                                txn.put(key.clone(), value.clone().unwrap_or_default())?
                            }
                            Step::Del(_) => txn.delete(key.clone())?,
                        }
                    }
                    Ok::<_, meridian_client::Error>(reads)
                })
            })
            .await?;
        for (key, value) in reads {
            match value {
                Some(value) => println!("{}\t{}", format_bytes(&key), format_bytes(&value)),
                None => println!("{}\t(absent)", format_bytes(&key)),
            }
        }
        match info.commit_ts {
            Some(ts) => println!("OK commit_ts={ts} attempts={}", info.attempts),
            None => println!("OK read-only attempts={}", info.attempts),
        }
        Ok(())
    }
}

/// `--isolation` of `meridian kv txn`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum IsolationArg {
    Serializable,
    Snapshot,
}

impl IsolationArg {
    fn into_client(self) -> meridian_client::Isolation {
        match self {
            IsolationArg::Serializable => meridian_client::Isolation::Serializable,
            IsolationArg::Snapshot => meridian_client::Isolation::Snapshot,
        }
    }
}

/// `--priority` of `meridian kv txn`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum PriorityArg {
    Low,
    Normal,
    High,
}

impl PriorityArg {
    fn into_client(self) -> meridian_client::TxnPriority {
        match self {
            PriorityArg::Low => meridian_client::TxnPriority::Low,
            PriorityArg::Normal => meridian_client::TxnPriority::Normal,
            PriorityArg::High => meridian_client::TxnPriority::High,
        }
    }
}

/// `meridian cluster`: inspect the cluster, move a shard's leadership or replicas, change its
/// placement.
#[derive(Clone, Debug, clap::Args)]
pub struct ClusterCommand {
    #[command(flatten)]
    pub connect: ConnectArgs,
    #[command(subcommand)]
    pub op: ClusterOp,
}

#[derive(Clone, Debug, clap::Subcommand)]
pub enum ClusterOp {
    /// Nodes (labels, addresses, liveness) and shards (ranges, leaders, terms, indexes, lag).
    Status,
    /// Hand SHARD's leadership to NODE (a voter of the shard whose log has caught up) and wait
    /// until it leads. A shard with a home region moves back home unless NODE is in it.
    TransferLeader {
        /// The shard's id (`meridian cluster status` lists them).
        shard: u64,
        /// The node that should lead it.
        node: u64,
    },
    /// Add a replica of SHARD on NODE (a member without one): the stored shard map lists it,
    /// NODE catches up as a learner (log or snapshot), then it votes. Waits for all of it
    /// (raise --timeout-ms for a large shard); if cut short, run it again to finish the move.
    AddReplica {
        /// The shard's id (`meridian cluster status` lists them).
        shard: u64,
        /// The node that should hold the new replica.
        node: u64,
    },
    /// Remove NODE's replica of SHARD: it leaves the shard's Raft group, then the stored map;
    /// then NODE deletes the replica's data. The last voter cannot be removed.
    RemoveReplica {
        /// The shard's id.
        shard: u64,
        /// The node whose replica goes.
        node: u64,
    },
    /// Move every replica off NODE (an add-replica elsewhere, then a remove-replica, per
    /// shard; only the remove for a shard with enough replicas without NODE's), preferring
    /// targets in NODE's region, then regions the shard lacks, then the least loaded; then
    /// report NODE safe to stop. Run it again to finish an interrupted one.
    Decommission {
        /// The node to empty.
        node: u64,
    },
    /// Forget NODE, a member that holds no replica any more (after decommission): the
    /// members stop pinging it, counting it in the clock fence and listing it in status, and
    /// refuse its messages. Its id is never reused.
    Forget {
        /// The former member.
        node: u64,
    },
    /// Change SHARD's placement at run time: --home REGION makes REGION the shard's home (its
    /// leader moves to a caught-up replica there within a few election timeouts and returns
    /// after failovers), --home none drops it. REGION must hold a replica of SHARD. --survive
    /// zone keeps the votes in the home region (3 of the shard's replicas must be there: the
    /// command first adds the missing ones on live nodes of the region, new zones first; the
    /// others become learners: writes commit inside the region, follower reads still work
    /// elsewhere, losing the home region stops the shard); --survive region makes every
    /// replica vote again, then removes replicas while one region holds half of them or more
    /// (never the leader, never below three). --constraints "+region=eu-west,-zone=c" says
    /// which nodes may hold the shard's replicas (+ required, - prohibited; attributes region
    /// and zone; none clears them): stored first, then each replica that breaks them is
    /// replaced by one on an allowed live node (same region first), and every later move must
    /// obey them. Stored in the shard map: it overrides --home-regions and
    /// --replica-constraints from then on, restarts included.
    Placement {
        /// The data shard's id (`meridian cluster status` lists them).
        shard: u64,
        /// A region holding a replica of the shard, or `none`.
        #[arg(long, value_name = "REGION|none")]
        home: String,
        /// The failure the shard's voters survive: `region` (every replica votes) or `zone`
        /// (only the home region's). Unchanged when not given.
        #[arg(long, value_name = "region|zone")]
        survive: Option<meridian_client::Survival>,
        /// Replica constraints, comma-separated `+attribute=value` / `-attribute=value`
        /// (attributes: region, zone), or `none`. Unchanged when not given.
        #[arg(long, value_name = "CONSTRAINTS|none", allow_hyphen_values = true, value_parser = meridian_client::Constraints::parse)]
        constraints: Option<meridian_client::Constraints>,
    },
}

impl ClusterCommand {
    pub async fn run(&self) -> anyhow::Result<()> {
        match self.op {
            ClusterOp::Status => {
                let client = self.connect.connect().await?;
                print!("{}", gather_cluster_view(&client).await?.render());
            }
            ClusterOp::TransferLeader { shard, node } => {
                let client = self.connect.connect().await?;
                let (leader, term) = client
                    .transfer_leader(shard, node)
                    .await
                    .with_context(|| format!("transferring shard {shard} to node {node}"))?;
                println!("shard {shard}: node {leader} leads (term {term})");
            }
            ClusterOp::AddReplica { shard, node } => {
                let client = self.connect.connect().await?;
                let done = client
                    .add_replica(shard, node)
                    .await
                    .with_context(|| format!("adding a replica of shard {shard} on node {node}"))?;
                println!("shard {shard}: {}", render_change(&done));
            }
            ClusterOp::RemoveReplica { shard, node } => {
                let client = self.connect.connect().await?;
                let done = client
                    .remove_replica(shard, node)
                    .await
                    .with_context(|| format!("removing node {node}'s replica of shard {shard}"))?;
                println!("shard {shard}: {}", render_change(&done));
            }
            ClusterOp::Decommission { node } => {
                let client = self.connect.connect().await?;
                let moves = client
                    .decommission(node, |step| match step.to {
                        Some(to) => println!(
                            "shard {}: moved node {node}'s replica to node {to}: {}",
                            step.shard,
                            render_change(&step.change)
                        ),
                        None => println!(
                            "shard {}: removed node {node}'s replica (enough without it): {}",
                            step.shard,
                            render_change(&step.change)
                        ),
                    })
                    .await
                    .with_context(|| format!("decommissioning node {node}"))?;
                println!(
                    "node {node} holds no replicas ({} moved): safe to stop",
                    moves.len()
                );
            }
            ClusterOp::Forget { node } => {
                let client = self.connect.connect().await?;
                let version = client
                    .forget_member(node)
                    .await
                    .with_context(|| format!("forgetting node {node}"))?;
                println!("node {node} forgotten (shard map version {version})");
            }
            ClusterOp::Placement {
                shard,
                ref home,
                survive,
                ref constraints,
            } => {
                let region = Some(home.as_str()).filter(|h| *h != "none");
                let client = self.connect.connect().await?;
                let placed = client
                    .place(
                        shard,
                        region,
                        survive,
                        constraints.as_ref(),
                        |step, node, change| match step {
                            Move::Obeying { instead } => println!(
                                "shard {shard}: added a replica on node {node} in place of node \
                             {instead}'s, which breaks the constraints: {}",
                                render_change(change)
                            ),
                            Move::Breaking => println!(
                                "shard {shard}: removed node {node}'s replica, which breaks the \
                             constraints: {}",
                                render_change(change)
                            ),
                            Move::Added => println!(
                            "shard {shard}: added a replica on node {node} for zone survival: {}",
                            render_change(change)
                        ),
                            Move::Removed => println!(
                            "shard {shard}: removed node {node}'s replica, not needed for region \
                             survival: {}",
                            render_change(change)
                        ),
                        },
                    )
                    .await
                    .with_context(|| format!("placing shard {shard} (home {home})"))?;
                let version = placed.map_version;
                if let Some(warning) = &placed.warning {
                    eprintln!("warning: {warning}");
                }
                match survive {
                    Some(goal) if placed.warning.is_none() => println!(
                        "shard {shard}: home {home}, survives a {} failure (shard map version {version})",
                        goal.as_str()
                    ),
                    Some(goal) => println!(
                        "shard {shard}: home {home}, survival goal {} stored, not achieved (see \
                         the warning; shard map version {version})",
                        goal.as_str()
                    ),
                    None => println!("shard {shard}: home {home} (shard map version {version})"),
                }
                if let Some(constraints) = constraints {
                    println!("shard {shard}: replica constraints {constraints}");
                }
            }
        }
        Ok(())
    }
}

/// `voters [1, 2, 4] learners [] (shard map version 3)`.
fn render_change(done: &meridian_client::ReplicaChange) -> String {
    format!(
        "voters {:?} learners {:?} (shard map version {})",
        done.voters, done.learners, done.map_version
    )
}

/// Asks any node for the node list, then every node for its own view, concurrently.
pub async fn gather_cluster_view(client: &Client) -> anyhow::Result<ClusterView> {
    let base = client.status().await.context("cluster status")?;
    let answers =
        futures::future::join_all(base.nodes.iter().map(|node| async move {
            (node.node_id, client.node_status(&node.client_addr).await)
        }))
        .await;
    let mut view = ClusterView {
        base,
        ..Default::default()
    };
    for (node_id, answer) in answers {
        if let Ok(answer) = answer {
            view.answers.insert(node_id, answer);
        }
    }
    Ok(view)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(dial: &[&str]) -> ConnectArgs {
        ConnectArgs {
            endpoints: vec!["127.0.0.1:7001".into()],
            timeout_ms: 1_000,
            dial: dial.iter().map(|s| s.to_string()).collect(),
            region: None,
        }
    }

    /// At most one staleness flag; each maps to its consistency; none is a linearizable read.
    #[test]
    fn staleness_flags_map_to_one_consistency() {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            staleness: StalenessArgs,
        }
        let parse = |args: &[&str]| {
            Cli::try_parse_from(std::iter::once("x").chain(args.iter().copied()))
                .map(|c| c.staleness.consistency())
        };
        assert_eq!(parse(&[]).unwrap(), None);
        assert_eq!(
            parse(&["--max-staleness-ms", "5000"]).unwrap(),
            Some(ReadConsistency::BoundedStaleness {
                max_staleness: Duration::from_secs(5)
            })
        );
        assert_eq!(
            parse(&["--as-of", "42"]).unwrap(),
            Some(ReadConsistency::AsOf(Timestamp(42)))
        );
        assert!(
            parse(&["--max-staleness-ms", "1", "--exact-staleness-ms", "2"]).is_err(),
            "two staleness flags"
        );
    }

    #[test]
    fn dial_overrides_parse_and_an_empty_one_means_none() {
        let c = args(&["127.0.0.1:7001=127.0.0.1:7301", " "]).client_config();
        assert_eq!(c.dial.len(), 1);
        assert_eq!(c.dial["127.0.0.1:7001"], "127.0.0.1:7301");
        assert!(c.validate().is_ok());
        let c = args(&[""]).client_config();
        assert!(
            c.dial.is_empty() && c.validate().is_ok(),
            "MERIDIAN_DIAL=\"\""
        );
        let e = args(&["127.0.0.1:7001"])
            .client_config()
            .validate()
            .unwrap_err();
        assert!(e.to_string().contains("dial"), "{e}");
    }
}

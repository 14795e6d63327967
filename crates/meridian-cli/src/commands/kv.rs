//! `meridian kv …`: reads, writes, compare-and-swap, scans and transactions.

use super::{ConnectArgs, StalenessArgs};
use crate::display::{format_bytes, parse_hex};
use crate::txn_steps::{parse_steps, Step};
use anyhow::Context;
use bytes::Bytes;
use meridian_client::{CasOutcome, Client, Expect, Timestamp, TxnOptions};
use std::time::Duration;

/// Longest `kv txn` waits, after its answer, for the commit's background work (resolving its
/// other shards' locks) before it exits.
const BACKGROUND_SETTLE: Duration = Duration::from_secs(5);

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
    /// Before exiting it waits, up to 5 s, for the commit to resolve its other shards' locks.
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
        let outcome = client
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
            .await;
        if let Ok((reads, info)) = &outcome {
            for (key, value) in reads {
                match value {
                    Some(value) => println!("{}\t{}", format_bytes(key), format_bytes(value)),
                    None => println!("{}\t(absent)", format_bytes(key)),
                }
            }
            match info.commit_ts {
                Some(ts) => println!("OK commit_ts={ts} attempts={}", info.attempts),
                None => println!("OK read-only attempts={}", info.attempts),
            }
        }
        // A multi-shard commit resolves its other shards' locks after it answers (an aborted
        // attempt releases its early locks); exiting first would leave them for the next
        // reader to wait on and recover.
        let left = client.settle_background(BACKGROUND_SETTLE).await;
        if left > 0 {
            eprintln!(
                "warning: exiting with {left} background task(s) of the transaction unfinished \
                 (its locks are settled by the next reader or the nodes' sweeper)"
            );
        }
        outcome?;
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

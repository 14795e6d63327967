//! `meridian kv …` and `meridian cluster …`: thin wrappers over [`meridian_client`].
//!
//! Output goes to stdout (values, tables), diagnostics to stderr; any error makes the process
//! exit non-zero (see `main.rs`). With `--hex`, key and value arguments are hexadecimal.
//!
//! `mod.rs` (this file) holds what both share (how to reach the cluster, stale-read flags);
//! `kv` the `kv` commands, `cluster` the `cluster` ones.

mod cluster;
mod kv;

pub use cluster::{gather_cluster_view, ClusterCommand, ClusterOp};
pub use kv::{CasMismatch, IsolationArg, KvCommand, KvOp, PriorityArg};

use anyhow::Context;
use meridian_client::{Client, ClientConfig, ReadConsistency, Timestamp};
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

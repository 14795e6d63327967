//! Client configuration: seeds, timeouts, backoff and concurrency, with validation.
//!
//! Every duration is explicit and has a default chosen for a WAN cluster. Validation names the
//! offending field so a misconfiguration fails at [`crate::Client::connect`], not mid-call.

use crate::error::{Error, Result, MAX_ADDRESS_BYTES};
use meridian_types::Timestamp;
use std::collections::BTreeMap;
use std::time::Duration;

/// Most shard requests one batch or status call runs at once.
pub const MAX_PARALLEL_SHARD_REQUESTS: usize = 256;
/// Most seed addresses a configuration may list.
pub const MAX_SEEDS: usize = 64;

/// How reads are served (see `ReadConsistency` and `Staleness` in `proto/meridian.proto`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ReadConsistency {
    /// Leader lease when valid, else a ReadIndex quorum round (the server default).
    #[default]
    Linearizable,
    /// Always a ReadIndex quorum round: does not trust clock rates.
    LinearizableReadIndex,
    /// A stale read from the nearest replica (same region as [`ClientConfig::region`]) that
    /// can serve it at most `max_staleness` behind its clock, else from the leader (fresh).
    BoundedStaleness { max_staleness: Duration },
    /// A stale read at the serving node's clock minus `staleness`.
    ExactStaleness { staleness: Duration },
    /// A stale read at exactly this timestamp.
    AsOf(Timestamp),
}

impl ReadConsistency {
    pub(crate) fn to_proto(self) -> i32 {
        use meridian_proto::kv::ReadConsistency as Proto;
        match self {
            ReadConsistency::Linearizable => Proto::Linearizable as i32,
            ReadConsistency::LinearizableReadIndex => Proto::LinearizableReadIndex as i32,
            ReadConsistency::BoundedStaleness { .. } => Proto::BoundedStaleness as i32,
            ReadConsistency::ExactStaleness { .. } | ReadConsistency::AsOf(_) => {
                Proto::ExactStaleness as i32
            }
        }
    }

    /// The barrier of a snapshot read (a transaction's read, a multi-page scan's snapshot
    /// pages), which is never stale: ReadIndex when this is [`Self::LinearizableReadIndex`]
    /// (the client does not trust clock rates), else the lease.
    pub(crate) fn snapshot_barrier(self) -> ReadConsistency {
        match self {
            ReadConsistency::LinearizableReadIndex => ReadConsistency::LinearizableReadIndex,
            _ => ReadConsistency::Linearizable,
        }
    }

    /// The request's `Staleness` (`None` for linearizable reads).
    pub(crate) fn staleness(self) -> Option<meridian_proto::kv::Staleness> {
        use meridian_proto::kv::Staleness;
        let ms = |d: Duration| d.as_millis().min(u128::from(u64::MAX)) as u64;
        match self {
            ReadConsistency::Linearizable | ReadConsistency::LinearizableReadIndex => None,
            ReadConsistency::BoundedStaleness { max_staleness } => Some(Staleness {
                max_staleness_ms: ms(max_staleness),
                ..Default::default()
            }),
            ReadConsistency::ExactStaleness { staleness } => Some(Staleness {
                exact_staleness_ms: ms(staleness),
                ..Default::default()
            }),
            ReadConsistency::AsOf(ts) => Some(Staleness {
                as_of_ts: ts.0,
                ..Default::default()
            }),
        }
    }

    /// Whether this is a stale read (served by the nearest replica that can).
    pub fn is_stale(self) -> bool {
        self.staleness().is_some()
    }
}

/// Configuration of a [`crate::Client`].
///
/// ```
/// use meridian_client::ClientConfig;
/// use std::time::Duration;
/// let mut config = ClientConfig::new(["127.0.0.1:7001", "127.0.0.1:7002"]);
/// config.call_timeout = Duration::from_secs(5);
/// assert_eq!(config.rpc_timeout, Duration::from_secs(3));
/// ```
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// Client addresses (`host:port`) of nodes to fetch the shard map from, tried in order.
    pub seeds: Vec<String>,
    /// Budget of one public call including every retry and backoff (default 10 s).
    pub call_timeout: Duration,
    /// Timeout of one attempt, sent as the gRPC request timeout (default 3 s).
    pub rpc_timeout: Duration,
    /// Timeout of establishing a TCP connection to a node (default 1 s).
    pub connect_timeout: Duration,
    /// First backoff delay after a retryable failure (default 20 ms).
    pub backoff_initial: Duration,
    /// Largest backoff delay (default 1 s).
    pub backoff_max: Duration,
    /// Most attempts of one shard request (default 64); the call deadline usually ends first.
    pub max_attempts: u32,
    /// Most shard requests a batch call runs concurrently (default 16).
    pub max_parallel_shard_requests: usize,
    /// Consistency of every read (default [`ReadConsistency::Linearizable`]); a
    /// transaction's reads are always snapshot reads.
    pub read_consistency: ReadConsistency,
    /// The region this client runs in: stale reads go to a replica there first (default
    /// `None`: to the leader).
    pub region: Option<String>,
    /// Seed of the backoff jitter RNG; `None` seeds from the OS. Set it in tests for
    /// reproducible delays.
    pub jitter_seed: Option<u64>,
    /// Address overrides: a node's client address (as the cluster advertises it) → the
    /// address to dial instead, e.g. a WAN-emulating proxy link (`meridian-wan`) or a NAT.
    /// Addresses not listed are dialled as they are.
    pub dial: BTreeMap<String, String>,
    /// **Test-only** (`bench/geo`'s oracle mode, default `false`): every attempt of `Client::txn`
    /// fetches its read timestamp from the metadata shard's leader (`Cluster.Timestamp`), as a
    /// design with a central timestamp oracle does, instead of letting the first node it reads
    /// pick it. It exists to measure what Meridian avoids; it adds a round trip to the
    /// oracle's region to every transaction and makes no guarantee stronger.
    pub timestamp_oracle: bool,
}

impl ClientConfig {
    /// A configuration with the given seeds and every other field at its default.
    pub fn new<I, S>(seeds: I) -> ClientConfig
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        ClientConfig {
            seeds: seeds.into_iter().map(Into::into).collect(),
            ..ClientConfig::default()
        }
    }

    /// Checks every field; the error names the field.
    pub fn validate(&self) -> Result<()> {
        if self.seeds.is_empty() {
            return Err(Error::NoSeeds);
        }
        if self.seeds.len() > MAX_SEEDS {
            return Err(Error::invalid(format!(
                "seeds: {} addresses, over MAX_SEEDS ({MAX_SEEDS})",
                self.seeds.len()
            )));
        }
        for (index, seed) in self.seeds.iter().enumerate() {
            let seed = seed.trim();
            if seed.is_empty() || seed.len() > MAX_ADDRESS_BYTES {
                return Err(Error::invalid(format!(
                    "seeds[{index}]: {seed:?} is not a host:port address"
                )));
            }
        }
        for (from, to) in &self.dial {
            if from.trim().is_empty() || to.trim().is_empty() || to.len() > MAX_ADDRESS_BYTES {
                return Err(Error::invalid(format!(
                    "dial: {from:?} -> {to:?} is not an address mapping"
                )));
            }
        }
        for (name, value) in [
            ("call_timeout", self.call_timeout),
            ("rpc_timeout", self.rpc_timeout),
            ("connect_timeout", self.connect_timeout),
            ("backoff_initial", self.backoff_initial),
            ("backoff_max", self.backoff_max),
        ] {
            if value.is_zero() {
                return Err(Error::invalid(format!("{name} must be > 0")));
            }
        }
        if self.backoff_initial > self.backoff_max {
            return Err(Error::invalid(
                "backoff_initial must not exceed backoff_max",
            ));
        }
        if self
            .region
            .as_ref()
            .is_some_and(|r| r.trim().is_empty() || r.len() > MAX_ADDRESS_BYTES)
        {
            return Err(Error::invalid("region must be a non-empty name"));
        }
        if self.max_attempts == 0 {
            return Err(Error::invalid("max_attempts must be > 0"));
        }
        if !(1..=MAX_PARALLEL_SHARD_REQUESTS).contains(&self.max_parallel_shard_requests) {
            return Err(Error::invalid(format!(
                "max_parallel_shard_requests must be in 1..={MAX_PARALLEL_SHARD_REQUESTS}"
            )));
        }
        Ok(())
    }
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            seeds: Vec::new(),
            call_timeout: Duration::from_secs(10),
            rpc_timeout: Duration::from_secs(3),
            connect_timeout: Duration::from_secs(1),
            backoff_initial: Duration::from_millis(20),
            backoff_max: Duration::from_secs(1),
            max_attempts: 64,
            max_parallel_shard_requests: 16,
            read_consistency: ReadConsistency::Linearizable,
            region: None,
            jitter_seed: None,
            dial: BTreeMap::new(),
            timestamp_oracle: false,
        }
    }
}

/// Turns `host:port` (or a full `http://` URI) into the URI tonic dials.
pub(crate) fn endpoint_uri(address: &str) -> String {
    let address = address.trim();
    if address.starts_with("http://") || address.starts_with("https://") {
        address.to_string()
    } else {
        format!("http://{address}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Validation names the field at fault.
    #[test]
    fn validation_names_fields() {
        assert_eq!(ClientConfig::default().validate(), Err(Error::NoSeeds));
        let mut config = ClientConfig::new(["a:1"]);
        assert!(config.validate().is_ok());
        config.rpc_timeout = Duration::ZERO;
        assert!(config
            .validate()
            .unwrap_err()
            .to_string()
            .contains("rpc_timeout"));
        let mut config = ClientConfig::new(["a:1"]);
        config.backoff_initial = Duration::from_secs(5);
        assert!(config
            .validate()
            .unwrap_err()
            .to_string()
            .contains("backoff_initial"));
        let config = ClientConfig::new(["a:1", " "]);
        assert!(config
            .validate()
            .unwrap_err()
            .to_string()
            .contains("seeds[1]"));
    }

    /// Bare host:port gets an http scheme; full URIs pass through.
    #[test]
    fn endpoint_uris() {
        assert_eq!(endpoint_uri("127.0.0.1:7001"), "http://127.0.0.1:7001");
        assert_eq!(endpoint_uri("http://h:1"), "http://h:1");
    }
}

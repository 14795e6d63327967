//! Client configuration: seeds, timeouts, backoff and concurrency, with validation.
//!
//! Every duration is explicit and has a default chosen for a WAN cluster. Validation names the
//! offending field so a misconfiguration fails at [`crate::Client::connect`], not mid-call.

use crate::error::{Error, Result, MAX_ADDRESS_BYTES};
use std::collections::BTreeMap;
use std::time::Duration;

/// Most shard requests one batch or status call runs at once.
pub const MAX_PARALLEL_SHARD_REQUESTS: usize = 256;
/// Most seed addresses a configuration may list.
pub const MAX_SEEDS: usize = 64;

/// How reads are made linearizable (see `ReadConsistency` in `proto/meridian.proto`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ReadConsistency {
    /// Leader lease when valid, else a ReadIndex quorum round (the server default).
    #[default]
    Linearizable,
    /// Always a ReadIndex quorum round: does not trust clock rates.
    LinearizableReadIndex,
}

impl ReadConsistency {
    pub(crate) fn to_proto(self) -> i32 {
        use meridian_proto::kv::ReadConsistency as Proto;
        match self {
            ReadConsistency::Linearizable => Proto::Linearizable as i32,
            ReadConsistency::LinearizableReadIndex => Proto::LinearizableReadIndex as i32,
        }
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
    /// Consistency of every read (default [`ReadConsistency::Linearizable`]).
    pub read_consistency: ReadConsistency,
    /// Seed of the backoff jitter RNG; `None` seeds from the OS. Set it in tests for
    /// reproducible delays.
    pub jitter_seed: Option<u64>,
    /// Address overrides: a node's client address (as the cluster advertises it) → the
    /// address to dial instead, e.g. a WAN-emulating proxy link (`meridian-wan`) or a NAT.
    /// Addresses not listed are dialled as they are.
    pub dial: BTreeMap<String, String>,
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
            jitter_seed: None,
            dial: BTreeMap::new(),
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

//! The crate's one error type.
//!
//! Every variant carries the names an operator needs to find the mistake (the link, the address,
//! the region pair, the config path). None of them is retryable in the RPC sense: they are
//! configuration or start-up errors, reported once and fatal to the command that caused them.
//! Per-connection I/O failures are not errors of the emulator; they are logged where they happen
//! and end only that connection.

use std::net::SocketAddr;
use std::path::PathBuf;

/// Errors raised while building, starting or reconfiguring links.
#[derive(Debug, thiserror::Error)]
pub enum WanError {
    /// A link could not bind its listen address (the OS error is the `source`).
    #[error("link {name}: cannot listen on {addr}")]
    Bind {
        name: String,
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },

    /// A `--link` flag value did not parse.
    #[error("invalid link spec '{spec}': {reason}")]
    InvalidLinkSpec { spec: String, reason: String },

    /// A link's settings are outside the limits (name, delay, jitter).
    #[error("invalid link '{name}': {reason}")]
    InvalidLink { name: String, reason: String },

    /// Two links share a name, so the control protocol could not address them.
    #[error("duplicate link name '{name}'")]
    DuplicateLinkName { name: String },

    /// Two links would listen on the same address.
    #[error("links '{first}' and '{second}' both listen on {addr}")]
    DuplicateListenAddr {
        addr: SocketAddr,
        first: String,
        second: String,
    },

    /// The latency matrix has no entry for a pair of regions that a node list needs.
    #[error("no latency defined between regions '{a}' and '{b}'")]
    UnknownRegionPair { a: String, b: String },

    /// A region name is empty or contains characters the control protocol cannot carry.
    #[error("invalid region name '{region}': {reason}")]
    InvalidRegion { region: String, reason: String },

    /// The node list or port plan is inconsistent (duplicate ids, port overflow, ...).
    #[error("invalid topology: {reason}")]
    InvalidTopology { reason: String },

    /// The TOML configuration file could not be read or is invalid.
    #[error("config {}: {reason}", path.display())]
    Config { path: PathBuf, reason: String },
}

/// Checks that `name` can be used as a token of the line-based control protocol.
pub(crate) fn check_token(name: &str) -> Result<(), String> {
    const MAX_TOKEN_CHARS: usize = 64;
    if name.is_empty() {
        return Err("must not be empty".to_string());
    }
    if name.chars().count() > MAX_TOKEN_CHARS {
        return Err(format!("longer than {MAX_TOKEN_CHARS} characters"));
    }
    if let Some(bad) = name
        .chars()
        .find(|c| c.is_whitespace() || c.is_control() || *c == ',' || *c == '=')
    {
        return Err(format!(
            "contains {bad:?} (whitespace, ',' and '=' are not allowed)"
        ));
    }
    Ok(())
}

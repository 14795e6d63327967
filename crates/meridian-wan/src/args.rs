//! Command-line arguments of the `meridian-wan` binary and the `--link` value syntax.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgGroup, Parser};

use crate::error::WanError;
use crate::link::{
    HealPolicy, LinkOptions, LinkSpec, DEFAULT_CONNECT_TIMEOUT, DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_IN_FLIGHT_BYTES,
};

const AFTER_HELP: &str = "\
LINK SPEC:
  LISTEN=TARGET[,delay_ms=N][,jitter_ms=N][,name=NAME][,from=REGION,to=REGION]
  LISTEN and TARGET are numeric socket addresses (127.0.0.1:24001). delay_ms is the one-way
  delay (a round trip pays it twice); each chunk also waits a uniform sample of [0, jitter_ms].
  NAME defaults to LISTEN. from/to tag the link for drop-region/heal-region.

OUTPUT:
  stdout: one `link NAME LISTEN TARGET` line per link, `control ADDR`, then `ready`.
  With --print-dial-map: `node ID MAP` and `client REGION MAP` lines, MAP = id=addr,...
  Logs go to stderr (RUST_LOG filters them; default info).

CONTROL PROTOCOL (one command per line, answers `ok ...` or `error ...`):
  status | drop NAME | reset NAME | heal NAME | delay NAME MS [JITTER_MS]
  drop-region A B | heal-region A B | help";

/// WAN emulator: delaying TCP proxy links with run-time faults.
#[derive(Debug, Parser)]
#[command(name = "meridian-wan", version, after_help = AFTER_HELP)]
#[command(group(ArgGroup::new("source").required(true).multiple(true).args(["links", "config"])))]
pub struct Args {
    /// A proxy link (repeatable); see LINK SPEC below.
    #[arg(long = "link", value_name = "SPEC", value_parser = parse_link_arg)]
    pub links: Vec<LinkSpec>,

    /// TOML topology file (regions matrix and nodes); its links are added to --link ones.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// Address of the line-based control protocol (e.g. 127.0.0.1:24999).
    #[arg(long, value_name = "ADDR")]
    pub control: Option<SocketAddr>,

    /// Print each node's and client region's dial map from --config, then exit.
    #[arg(long, requires = "config")]
    pub print_dial_map: bool,

    /// Concurrent connections per link; excess connections are closed at once.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_CONNECTIONS)]
    pub max_connections_per_link: usize,

    /// Bytes queued inside the proxy per direction per connection before reading stops.
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_MAX_IN_FLIGHT_BYTES)]
    pub max_in_flight_bytes: usize,

    /// Deadline of the proxy's connect to a link's target.
    #[arg(long, value_name = "MS", default_value_t = DEFAULT_CONNECT_TIMEOUT.as_millis() as u64)]
    pub connect_timeout_ms: u64,

    /// What heal does to connections black-holed by drop.
    #[arg(long, value_enum, default_value = "close")]
    pub heal: HealPolicy,

    /// Seed of the jitter generators (same seed, same jitter sequence per connection).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

impl Args {
    pub fn link_options(&self) -> LinkOptions {
        LinkOptions {
            max_connections: self.max_connections_per_link,
            max_in_flight_bytes: self.max_in_flight_bytes,
            connect_timeout: Duration::from_millis(self.connect_timeout_ms),
            heal_policy: self.heal,
            seed: self.seed,
        }
    }
}

fn parse_link_arg(text: &str) -> Result<LinkSpec, String> {
    parse_link_spec(text).map_err(|error| match error {
        WanError::InvalidLinkSpec { reason, .. } => reason,
        other => other.to_string(),
    })
}

/// Parses `LISTEN=TARGET[,delay_ms=N][,jitter_ms=N][,name=NAME][,from=R,to=R]`.
pub fn parse_link_spec(text: &str) -> Result<LinkSpec, WanError> {
    let invalid = |reason: String| WanError::InvalidLinkSpec {
        spec: text.to_string(),
        reason,
    };
    let mut parts = text.split(',');
    let head = parts.next().unwrap_or_default();
    let (listen, target) = head
        .split_once('=')
        .ok_or_else(|| invalid("expected LISTEN=TARGET first".to_string()))?;
    let address = |what: &str, value: &str| {
        value.parse::<SocketAddr>().map_err(|_| {
            invalid(format!(
                "{what} '{value}' is not a numeric socket address like 127.0.0.1:24001"
            ))
        })
    };
    let listen = address("listen address", listen)?;
    let target = address("target address", target)?;
    let mut spec = LinkSpec {
        name: listen.to_string(),
        listen,
        target,
        one_way_delay: Duration::ZERO,
        jitter: Duration::ZERO,
        regions: None,
    };
    let (mut from, mut to) = (None, None);
    let mut seen = Vec::new();
    for part in parts {
        let (key, value) = part
            .split_once('=')
            .ok_or_else(|| invalid(format!("option '{part}' is not KEY=VALUE")))?;
        if seen.contains(&key) {
            return Err(invalid(format!("option '{key}' given twice")));
        }
        seen.push(key);
        let millis = |value: &str| {
            value
                .parse::<u64>()
                .map(Duration::from_millis)
                .map_err(|_| {
                    invalid(format!(
                        "{key} '{value}' is not a whole number of milliseconds"
                    ))
                })
        };
        match key {
            "delay_ms" => spec.one_way_delay = millis(value)?,
            "jitter_ms" => spec.jitter = millis(value)?,
            "name" => spec.name = value.to_string(),
            "from" => from = Some(value.to_string()),
            "to" => to = Some(value.to_string()),
            other => {
                return Err(invalid(format!(
                    "unknown option '{other}' (expected delay_ms, jitter_ms, name, from, to)"
                )))
            }
        }
    }
    spec.regions = match (from, to) {
        (Some(from), Some(to)) => Some((from, to)),
        (None, None) => None,
        _ => return Err(invalid("from and to must be given together".to_string())),
    };
    spec.validate()
        .map_err(|error| invalid(error.to_string()))?;
    Ok(spec)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A full spec sets every field; a bare one takes the defaults.
    #[test]
    fn parses_link_specs() {
        let spec = parse_link_spec(
            "127.0.0.1:24001=127.0.0.1:7101,delay_ms=40,jitter_ms=5,name=a,from=us,to=eu",
        )
        .unwrap();
        assert_eq!(spec.name, "a");
        assert_eq!(spec.listen, "127.0.0.1:24001".parse().unwrap());
        assert_eq!(spec.target, "127.0.0.1:7101".parse().unwrap());
        assert_eq!(spec.one_way_delay, Duration::from_millis(40));
        assert_eq!(spec.jitter, Duration::from_millis(5));
        assert_eq!(spec.regions, Some(("us".into(), "eu".into())));
        let bare = parse_link_spec("[::1]:0=127.0.0.1:1").unwrap();
        assert_eq!(bare.name, "[::1]:0");
        assert_eq!(bare.one_way_delay, Duration::ZERO);
    }

    /// Every malformed spec is refused with a reason that names the problem.
    #[test]
    fn rejects_bad_link_specs() {
        let reason = |text: &str| parse_link_arg(text).unwrap_err();
        assert!(reason("127.0.0.1:1").contains("LISTEN=TARGET"));
        assert!(reason("localhost:1=127.0.0.1:2").contains("listen address 'localhost:1'"));
        assert!(reason("127.0.0.1:1=127.0.0.1").contains("target address"));
        assert!(reason("127.0.0.1:1=127.0.0.1:2,delay_ms=x").contains("whole number"));
        assert!(reason("127.0.0.1:1=127.0.0.1:2,delay=4").contains("unknown option 'delay'"));
        assert!(reason("127.0.0.1:1=127.0.0.1:2,delay_ms=1,delay_ms=2").contains("twice"));
        assert!(reason("127.0.0.1:1=127.0.0.1:2,from=us").contains("together"));
        assert!(reason("127.0.0.1:1=127.0.0.1:2,delay_ms=600000").contains("at most"));
        assert!(reason("127.0.0.1:1=127.0.0.1:2,name=").contains("empty"));
    }

    /// clap enforces "at least one source" and "--print-dial-map needs --config".
    #[test]
    fn flag_combinations_are_checked() {
        assert!(Args::try_parse_from(["meridian-wan"]).is_err());
        assert!(Args::try_parse_from([
            "meridian-wan",
            "--link",
            "127.0.0.1:0=127.0.0.1:1",
            "--print-dial-map"
        ])
        .is_err());
        let args = Args::try_parse_from([
            "meridian-wan",
            "--link",
            "127.0.0.1:0=127.0.0.1:1",
            "--heal",
            "resume",
        ])
        .unwrap();
        assert_eq!(args.link_options().heal_policy, HealPolicy::Resume);
    }
}

//! The set of running links, addressed by name or by region pair.
//!
//! Names and listen addresses are checked for duplicates before anything binds, and a failure
//! to bind any link stops the links already started, so a `Wan` is either complete or absent.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::time::Duration;

use crate::error::WanError;
use crate::link::{Link, LinkOptions, LinkSpec};

/// Running links by name.
pub struct Wan {
    links: BTreeMap<String, Link>,
}

impl Wan {
    /// Validates every spec, then starts all links.
    pub async fn start(specs: Vec<LinkSpec>, options: &LinkOptions) -> Result<Wan, WanError> {
        check_unique(&specs)?;
        let mut links = BTreeMap::new();
        for spec in specs {
            // On error the links started so far are dropped here, which shuts them down.
            let link = Link::start(spec, options.clone()).await?;
            links.insert(link.name().to_string(), link);
        }
        Ok(Wan { links })
    }

    pub fn link(&self, name: &str) -> Option<&Link> {
        self.links.get(name)
    }

    pub fn links(&self) -> impl Iterator<Item = &Link> {
        self.links.values()
    }

    /// Links whose regions are `(a, b)` or `(b, a)`.
    pub fn links_between_regions(&self, a: &str, b: &str) -> Vec<&Link> {
        self.links
            .values()
            .filter(|link| match &link.spec().regions {
                Some((from, to)) => (from == a && to == b) || (from == b && to == a),
                None => false,
            })
            .collect()
    }

    /// One line per link: name, addresses, state and counters, as `key=value` words.
    pub fn status_lines(&self) -> Vec<String> {
        self.links.values().map(status_line).collect()
    }

    pub fn shutdown(&self) {
        for link in self.links.values() {
            link.shutdown();
        }
    }
}

fn status_line(link: &Link) -> String {
    let state = link.state();
    let stats = link.stats();
    let mut line = format!(
        "name={} listen={} target={}",
        link.name(),
        link.local_addr(),
        link.spec().target
    );
    if let Some((from, to)) = &link.spec().regions {
        let _ = write!(line, " from={from} to={to}");
    }
    let _ = write!(
        line,
        " state={} one_way_ms={} jitter_ms={} active={} accepted={} over_limit={} \
         connect_failures={} forwarded_bytes={} queued_bytes={} queued_peak_bytes={}",
        state.mode.as_str(),
        format_ms(state.one_way_delay),
        format_ms(state.jitter),
        stats.connections_active,
        stats.connections_accepted,
        stats.connections_over_limit,
        stats.connect_failures,
        stats.bytes_forwarded,
        stats.queued_bytes,
        stats.queued_bytes_peak_per_direction,
    );
    line
}

/// Milliseconds without a trailing `.0` for whole values (`40`, `40.5`).
pub fn format_ms(duration: Duration) -> String {
    let micros = duration.as_micros();
    let (whole_ms, fraction_us) = (micros / 1000, micros % 1000);
    if fraction_us == 0 {
        format!("{whole_ms}")
    } else {
        format!("{}", micros as f64 / 1000.0)
    }
}

fn check_unique(specs: &[LinkSpec]) -> Result<(), WanError> {
    let mut names = HashMap::new();
    let mut listens: HashMap<_, &str> = HashMap::new();
    for spec in specs {
        spec.validate()?;
        if names.insert(spec.name.as_str(), ()).is_some() {
            return Err(WanError::DuplicateLinkName {
                name: spec.name.clone(),
            });
        }
        // Port 0 asks the kernel for a fresh port each time, so it never collides.
        if spec.listen.port() != 0 {
            if let Some(first) = listens.insert(spec.listen, &spec.name) {
                return Err(WanError::DuplicateListenAddr {
                    addr: spec.listen,
                    first: first.to_string(),
                    second: spec.name.clone(),
                });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(name: &str, listen: &str) -> LinkSpec {
        LinkSpec {
            name: name.to_string(),
            listen: listen.parse().unwrap(),
            target: "127.0.0.1:9".parse().unwrap(),
            one_way_delay: Duration::ZERO,
            jitter: Duration::ZERO,
            regions: None,
        }
    }

    /// Duplicate names and listen addresses are refused before anything binds.
    #[test]
    fn duplicates_are_refused() {
        let names = [spec("a", "127.0.0.1:0"), spec("a", "127.0.0.1:0")];
        assert!(matches!(
            check_unique(&names),
            Err(WanError::DuplicateLinkName { .. })
        ));
        let listens = [spec("a", "127.0.0.1:24999"), spec("b", "127.0.0.1:24999")];
        assert!(matches!(
            check_unique(&listens),
            Err(WanError::DuplicateListenAddr { .. })
        ));
        let fine = [spec("a", "127.0.0.1:0"), spec("b", "127.0.0.1:0")];
        assert!(check_unique(&fine).is_ok());
    }

    /// Milliseconds print without noise.
    #[test]
    fn format_ms_drops_the_fraction_when_whole() {
        assert_eq!(format_ms(Duration::from_millis(40)), "40");
        assert_eq!(format_ms(Duration::from_micros(40_500)), "40.5");
    }
}

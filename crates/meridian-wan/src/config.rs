//! The TOML topology file and the plan it turns into.
//!
//! ```toml
//! listen_host = "127.0.0.1"      # where the proxy listens (default 127.0.0.1)
//! peer_base_port = 24000         # node i → node j links, one port per ordered pair
//! client_base_port = 24100       # optional: client links, one port per (region, node), in
//!                                # the listed regions' order, then node id
//! client_regions = ["us-east"]   # regions clients sit in (needs client_base_port)
//! jitter_ms = 0                  # added uniformly in [0, jitter_ms] to every link
//!
//! [matrix]                       # optional: starts from the defaults, then overrides
//! same_region_rtt_ms = 2
//! rtt = [{ a = "us-east", b = "eu-west", rtt_ms = 90 }]
//!
//! [[node]]
//! id = 1
//! region = "us-east"
//! peer_addr = "127.0.0.1:7101"   # target of peer links
//! client_addr = "127.0.0.1:7001" # target of client links (needed with client_regions)
//! ```
//!
//! Unknown fields are rejected, so a misspelt key is an error rather than a silent default.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use crate::error::WanError;
use crate::link::{LinkSpec, MAX_ONE_WAY_DELAY};
use crate::matrix::{plan_client_links, plan_peer_links, DialMaps, LatencyMatrix, NodeEndpoint};

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TopologyFile {
    #[serde(default = "default_listen_host")]
    pub listen_host: IpAddr,
    pub peer_base_port: u16,
    #[serde(default)]
    pub client_base_port: Option<u16>,
    #[serde(default)]
    pub client_regions: Vec<String>,
    #[serde(default)]
    pub jitter_ms: u64,
    #[serde(default)]
    pub matrix: Option<MatrixSection>,
    #[serde(rename = "node", default)]
    pub nodes: Vec<NodeSection>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MatrixSection {
    #[serde(default)]
    pub same_region_rtt_ms: Option<u64>,
    #[serde(default)]
    pub rtt: Vec<RttEntry>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RttEntry {
    pub a: String,
    pub b: String,
    pub rtt_ms: u64,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeSection {
    pub id: u64,
    pub region: String,
    pub peer_addr: SocketAddr,
    #[serde(default)]
    pub client_addr: Option<SocketAddr>,
}

fn default_listen_host() -> IpAddr {
    IpAddr::V4(Ipv4Addr::LOCALHOST)
}

/// Everything a topology file produces: the links to run and who dials what.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WanPlan {
    pub links: Vec<LinkSpec>,
    pub peer_dial_maps: DialMaps<u64>,
    pub client_dial_maps: DialMaps<String>,
}

/// Reads and plans a topology file.
pub fn load_plan(path: &Path) -> Result<WanPlan, WanError> {
    let fail = |reason: String| WanError::Config {
        path: path.to_path_buf(),
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|error| fail(error.to_string()))?;
    let file: TopologyFile = toml::from_str(&text).map_err(|error| fail(error.to_string()))?;
    file.plan().map_err(|error| match error {
        WanError::Config { .. } => error,
        other => fail(other.to_string()),
    })
}

impl TopologyFile {
    pub fn matrix(&self) -> Result<LatencyMatrix, WanError> {
        let mut matrix = LatencyMatrix::default();
        if let Some(section) = &self.matrix {
            if let Some(rtt_ms) = section.same_region_rtt_ms {
                matrix.set_same_region_rtt(checked_rtt(rtt_ms)?);
            }
            for entry in &section.rtt {
                matrix.set_rtt(&entry.a, &entry.b, checked_rtt(entry.rtt_ms)?)?;
            }
        }
        Ok(matrix)
    }

    /// Plans peer links, then client links, and checks they collide with nothing.
    pub fn plan(&self) -> Result<WanPlan, WanError> {
        let invalid = |reason: String| WanError::InvalidTopology { reason };
        if self.nodes.is_empty() {
            return Err(invalid("no [[node]] entries".to_string()));
        }
        let jitter = Duration::from_millis(self.jitter_ms);
        if jitter > MAX_ONE_WAY_DELAY {
            return Err(invalid(format!(
                "jitter_ms must be at most {}",
                MAX_ONE_WAY_DELAY.as_millis()
            )));
        }
        let matrix = self.matrix()?;
        let peers: Vec<NodeEndpoint> = self
            .nodes
            .iter()
            .map(|node| NodeEndpoint {
                id: node.id,
                region: node.region.clone(),
                addr: node.peer_addr,
            })
            .collect();
        let peer_plan = plan_peer_links(&matrix, &peers, self.listen_host, self.peer_base_port)?;
        let mut plan = WanPlan {
            links: peer_plan.links,
            peer_dial_maps: peer_plan.dial_maps,
            client_dial_maps: BTreeMap::new(),
        };
        match (self.client_base_port, self.client_regions.is_empty()) {
            (None, true) => {}
            (None, false) => return Err(invalid("client_regions needs client_base_port".into())),
            (Some(_), true) => return Err(invalid("client_base_port needs client_regions".into())),
            (Some(base_port), false) => {
                let clients = self
                    .nodes
                    .iter()
                    .map(|node| {
                        let addr = node.client_addr.ok_or_else(|| {
                            invalid(format!(
                                "node {} needs client_addr for client links",
                                node.id
                            ))
                        })?;
                        Ok(NodeEndpoint {
                            id: node.id,
                            region: node.region.clone(),
                            addr,
                        })
                    })
                    .collect::<Result<Vec<_>, WanError>>()?;
                let client_plan = plan_client_links(
                    &matrix,
                    &self.client_regions,
                    &clients,
                    self.listen_host,
                    base_port,
                )?;
                plan.links.extend(client_plan.links);
                plan.client_dial_maps = client_plan.dial_maps;
            }
        }
        for link in &mut plan.links {
            link.jitter = jitter;
        }
        self.check_no_collisions(&plan)?;
        Ok(plan)
    }

    /// A proxy port that equals another proxy port or a node's own port would loop or fail.
    fn check_no_collisions(&self, plan: &WanPlan) -> Result<(), WanError> {
        let mut taken: HashMap<SocketAddr, String> = HashMap::new();
        for node in &self.nodes {
            taken.insert(node.peer_addr, format!("node {} peer_addr", node.id));
            if let Some(addr) = node.client_addr {
                taken.insert(addr, format!("node {} client_addr", node.id));
            }
        }
        for link in &plan.links {
            if let Some(owner) = taken.insert(link.listen, format!("link {}", link.name)) {
                return Err(WanError::InvalidTopology {
                    reason: format!(
                        "{} would listen on {}, already used by {owner}",
                        link.name, link.listen
                    ),
                });
            }
        }
        Ok(())
    }
}

fn checked_rtt(rtt_ms: u64) -> Result<Duration, WanError> {
    let rtt = Duration::from_millis(rtt_ms);
    if rtt > 2 * MAX_ONE_WAY_DELAY {
        return Err(WanError::InvalidTopology {
            reason: format!(
                "rtt_ms {rtt_ms} is above {}",
                2 * MAX_ONE_WAY_DELAY.as_millis()
            ),
        });
    }
    Ok(rtt)
}

#[cfg(test)]
mod tests {
    use super::*;

    const THREE_NODES: &str = r#"
        peer_base_port = 24000
        client_base_port = 24100
        client_regions = ["us-east"]
        jitter_ms = 3

        [matrix]
        same_region_rtt_ms = 2
        rtt = [{ a = "us-east", b = "eu-west", rtt_ms = 90 }]

        [[node]]
        id = 1
        region = "us-east"
        peer_addr = "127.0.0.1:7101"
        client_addr = "127.0.0.1:7001"

        [[node]]
        id = 2
        region = "eu-west"
        peer_addr = "127.0.0.1:7102"
        client_addr = "127.0.0.1:7002"
    "#;

    fn parse(text: &str) -> Result<WanPlan, String> {
        let file: TopologyFile = toml::from_str(text).map_err(|e| e.to_string())?;
        file.plan().map_err(|e| e.to_string())
    }

    /// A full file: overrides apply, jitter reaches every link, both dial maps are filled.
    #[test]
    fn plans_a_full_file() {
        let plan = parse(THREE_NODES).unwrap();
        assert_eq!(plan.links.len(), 2 + 2);
        let peer = plan.links.iter().find(|l| l.name == "peer-1-to-2").unwrap();
        assert_eq!(peer.one_way_delay, Duration::from_millis(45));
        assert_eq!(peer.target, "127.0.0.1:7102".parse().unwrap());
        let local = plan
            .links
            .iter()
            .find(|l| l.name == "client-us-east-to-1")
            .unwrap();
        assert_eq!(local.one_way_delay, Duration::from_millis(1));
        assert_eq!(local.target, "127.0.0.1:7001".parse().unwrap());
        assert!(plan
            .links
            .iter()
            .all(|l| l.jitter == Duration::from_millis(3)));
        assert_eq!(
            plan.peer_dial_maps[&2][&1],
            "127.0.0.1:24001".parse().unwrap()
        );
        assert_eq!(
            plan.client_dial_maps["us-east"][&2],
            "127.0.0.1:24101".parse().unwrap()
        );
    }

    /// Mistakes are named: unknown keys, missing pieces, port collisions.
    #[test]
    fn rejects_inconsistent_files() {
        let typo = THREE_NODES.replace("jitter_ms", "jiter_ms");
        assert!(parse(&typo).unwrap_err().contains("unknown field"));
        let no_client_port = THREE_NODES.replace("client_base_port = 24100", "");
        assert!(parse(&no_client_port)
            .unwrap_err()
            .contains("client_base_port"));
        let collision = THREE_NODES.replace("peer_base_port = 24000", "peer_base_port = 7101");
        assert!(parse(&collision)
            .unwrap_err()
            .contains("already used by node 1"));
        let overlap = THREE_NODES.replace("client_base_port = 24100", "client_base_port = 24001");
        assert!(parse(&overlap)
            .unwrap_err()
            .contains("already used by link"));
        let no_nodes = "peer_base_port = 24000";
        assert!(parse(no_nodes).unwrap_err().contains("no [[node]]"));
    }
}

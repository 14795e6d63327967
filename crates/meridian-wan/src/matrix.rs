//! Regions, the latency between them, and the links a set of nodes needs.
//!
//! Every ordered pair of nodes `(i, j)` gets its own link, so the delay can depend on both ends
//! and a fault can cut one direction of dialing without the other:
//!
//! ```text
//!   node 1 (us-east) ──dials──► 127.0.0.1:24000 ──link peer-1-to-2, 40 ms each way──► node 2
//!   node 2 (eu-west) ──dials──► 127.0.0.1:24002 ──link peer-2-to-1, 40 ms each way──► node 1
//! ```
//!
//! A link carries both directions of the connections its dialer opens, and both pay the same
//! one-way delay (the matrix is symmetric). Node `i`'s dial map says which address to dial for
//! each peer `j`. Client links do the same for a client in region `R` reaching node `j`.
//!
//! Ports are assigned in a stable order (peer links: sorted node ids, then sorted peers; client
//! links: the client regions as listed, then sorted node ids), so a launcher that runs the
//! planner twice with the same input gets the same addresses.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use crate::error::{check_token, WanError};
use crate::link::LinkSpec;

/// Most nodes a plan accepts; 64 nodes already need 4032 peer links.
pub const MAX_NODES: usize = 64;

/// One-way delays between regions; symmetric, with one value for any same-region pair.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LatencyMatrix {
    same_region_one_way: Duration,
    /// Keyed by the region pair in sorted order.
    one_way: BTreeMap<(String, String), Duration>,
}

impl Default for LatencyMatrix {
    /// The three demo regions: us-east↔eu-west 80 ms RTT, eu-west↔ap-south 130 ms RTT,
    /// us-east↔ap-south 200 ms RTT, same region 0.
    fn default() -> Self {
        let mut matrix = LatencyMatrix::new(Duration::ZERO);
        for (a, b, rtt_ms) in [
            ("us-east", "eu-west", 80),
            ("eu-west", "ap-south", 130),
            ("us-east", "ap-south", 200),
        ] {
            matrix
                .set_rtt(a, b, Duration::from_millis(rtt_ms))
                .expect("the default regions are valid names");
        }
        matrix
    }
}

impl LatencyMatrix {
    /// An empty matrix: only same-region pairs have a latency.
    pub fn new(same_region_one_way: Duration) -> Self {
        LatencyMatrix {
            same_region_one_way,
            one_way: BTreeMap::new(),
        }
    }

    pub fn set_same_region_rtt(&mut self, rtt: Duration) {
        self.same_region_one_way = rtt / 2;
    }

    /// Sets the round trip between two distinct regions (each direction pays half).
    pub fn set_rtt(&mut self, a: &str, b: &str, rtt: Duration) -> Result<(), WanError> {
        for region in [a, b] {
            check_token(region).map_err(|reason| WanError::InvalidRegion {
                region: region.to_string(),
                reason,
            })?;
        }
        if a == b {
            return Err(WanError::InvalidRegion {
                region: a.to_string(),
                reason: "a pair needs two distinct regions (same-region latency is one value)"
                    .to_string(),
            });
        }
        self.one_way.insert(pair_key(a, b), rtt / 2);
        Ok(())
    }

    /// The one-way delay from region `a` to region `b`.
    pub fn one_way(&self, a: &str, b: &str) -> Result<Duration, WanError> {
        if a == b {
            return Ok(self.same_region_one_way);
        }
        self.one_way
            .get(&pair_key(a, b))
            .copied()
            .ok_or_else(|| WanError::UnknownRegionPair {
                a: a.to_string(),
                b: b.to_string(),
            })
    }

    /// Every region named by some pair.
    pub fn regions(&self) -> BTreeSet<String> {
        self.one_way
            .keys()
            .flat_map(|(a, b)| [a.clone(), b.clone()])
            .collect()
    }
}

fn pair_key(a: &str, b: &str) -> (String, String) {
    if a <= b {
        (a.to_string(), b.to_string())
    } else {
        (b.to_string(), a.to_string())
    }
}

/// A node as the planner sees it: the real address is the one its links forward to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeEndpoint {
    pub id: u64,
    pub region: String,
    pub addr: SocketAddr,
}

/// For each dialer, peer id → the address to dial.
pub type DialMaps<K> = BTreeMap<K, BTreeMap<u64, SocketAddr>>;

/// The links between nodes and each node's dial map.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PeerPlan {
    pub links: Vec<LinkSpec>,
    pub dial_maps: DialMaps<u64>,
}

/// The links from client regions to nodes and each region's dial map.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClientPlan {
    pub links: Vec<LinkSpec>,
    pub dial_maps: DialMaps<String>,
}

/// Plans one link per ordered node pair, listening on `listen_ip` from `base_port` upwards.
pub fn plan_peer_links(
    matrix: &LatencyMatrix,
    nodes: &[NodeEndpoint],
    listen_ip: IpAddr,
    base_port: u16,
) -> Result<PeerPlan, WanError> {
    let nodes = sorted_checked(matrix, nodes)?;
    let mut ports = PortAllocator::new(base_port);
    let mut plan = PeerPlan::default();
    for from in &nodes {
        let dial_map = plan.dial_maps.entry(from.id).or_default();
        for to in nodes.iter().filter(|to| to.id != from.id) {
            let listen = SocketAddr::new(listen_ip, ports.next_port()?);
            plan.links.push(LinkSpec {
                name: format!("peer-{}-to-{}", from.id, to.id),
                listen,
                target: to.addr,
                one_way_delay: matrix.one_way(&from.region, &to.region)?,
                jitter: Duration::ZERO,
                regions: Some((from.region.clone(), to.region.clone())),
            });
            dial_map.insert(to.id, listen);
        }
    }
    Ok(plan)
}

/// Plans one link per (client region, node), listening on `listen_ip` from `base_port` upwards:
/// the regions in the order listed, each one's nodes by id (so a region added at the end of the
/// list leaves every existing link's port as it was).
pub fn plan_client_links(
    matrix: &LatencyMatrix,
    client_regions: &[String],
    nodes: &[NodeEndpoint],
    listen_ip: IpAddr,
    base_port: u16,
) -> Result<ClientPlan, WanError> {
    let nodes = sorted_checked(matrix, nodes)?;
    let regions: BTreeSet<&String> = client_regions.iter().collect();
    if regions.len() != client_regions.len() {
        return Err(topology("client regions are listed twice".to_string()));
    }
    let mut ports = PortAllocator::new(base_port);
    let mut plan = ClientPlan::default();
    for region in client_regions {
        let dial_map = plan.dial_maps.entry(region.clone()).or_default();
        for to in &nodes {
            let listen = SocketAddr::new(listen_ip, ports.next_port()?);
            plan.links.push(LinkSpec {
                name: format!("client-{region}-to-{}", to.id),
                listen,
                target: to.addr,
                one_way_delay: matrix.one_way(region, &to.region)?,
                jitter: Duration::ZERO,
                regions: Some((region.clone(), to.region.clone())),
            });
            dial_map.insert(to.id, listen);
        }
    }
    Ok(plan)
}

/// Formats a dial map as the `id=addr,id=addr` list nodes take on their command line.
pub fn format_dial_map(map: &BTreeMap<u64, SocketAddr>) -> String {
    map.iter()
        .map(|(id, addr)| format!("{id}={addr}"))
        .collect::<Vec<_>>()
        .join(",")
}

fn topology(reason: String) -> WanError {
    WanError::InvalidTopology { reason }
}

/// Sorts nodes by id after checking ids are unique, the count bounded and regions known.
fn sorted_checked(
    matrix: &LatencyMatrix,
    nodes: &[NodeEndpoint],
) -> Result<Vec<NodeEndpoint>, WanError> {
    if nodes.len() > MAX_NODES {
        return Err(topology(format!(
            "{} nodes, at most {MAX_NODES} supported",
            nodes.len()
        )));
    }
    let mut sorted = nodes.to_vec();
    sorted.sort_by_key(|node| node.id);
    if let Some(pair) = sorted.windows(2).find(|pair| pair[0].id == pair[1].id) {
        return Err(topology(format!("node id {} is listed twice", pair[0].id)));
    }
    for node in &sorted {
        check_token(&node.region).map_err(|reason| WanError::InvalidRegion {
            region: node.region.clone(),
            reason,
        })?;
        // Fail on the first unknown pair before any port is handed out.
        for other in &sorted {
            matrix.one_way(&node.region, &other.region)?;
        }
    }
    Ok(sorted)
}

struct PortAllocator {
    next: u32,
}

impl PortAllocator {
    fn new(base_port: u16) -> Self {
        PortAllocator {
            next: u32::from(base_port),
        }
    }

    fn next_port(&mut self) -> Result<u16, WanError> {
        if self.next == 0 {
            return Err(topology(
                "base port 0 cannot be used for planned links".to_string(),
            ));
        }
        let port = u16::try_from(self.next)
            .map_err(|_| topology("the planned links run past port 65535".to_string()))?;
        self.next += 1;
        Ok(port)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    const LOOPBACK: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

    fn node(id: u64, region: &str, port: u16) -> NodeEndpoint {
        NodeEndpoint {
            id,
            region: region.to_string(),
            addr: SocketAddr::new(LOOPBACK, port),
        }
    }

    fn three_nodes() -> Vec<NodeEndpoint> {
        // Deliberately unsorted: the plan must not depend on input order.
        vec![
            node(3, "ap-south", 7103),
            node(1, "us-east", 7101),
            node(2, "eu-west", 7102),
        ]
    }

    /// The default matrix holds the documented round trips, halved, in both directions.
    #[test]
    fn default_matrix_has_the_documented_delays() {
        let matrix = LatencyMatrix::default();
        let ms = Duration::from_millis;
        assert_eq!(matrix.one_way("us-east", "eu-west").unwrap(), ms(40));
        assert_eq!(matrix.one_way("eu-west", "us-east").unwrap(), ms(40));
        assert_eq!(matrix.one_way("eu-west", "ap-south").unwrap(), ms(65));
        assert_eq!(matrix.one_way("ap-south", "us-east").unwrap(), ms(100));
        assert_eq!(
            matrix.one_way("ap-south", "ap-south").unwrap(),
            Duration::ZERO
        );
        assert!(matches!(
            matrix.one_way("us-east", "mars"),
            Err(WanError::UnknownRegionPair { .. })
        ));
        assert_eq!(matrix.regions().len(), 3);
    }

    /// Every ordered pair gets its own address, forwarding to the right node with the right delay.
    #[test]
    fn peer_plan_gives_each_ordered_pair_its_own_link() {
        let matrix = LatencyMatrix::default();
        let plan = plan_peer_links(&matrix, &three_nodes(), LOOPBACK, 24000).unwrap();
        assert_eq!(plan.links.len(), 6);
        let listens: BTreeSet<_> = plan.links.iter().map(|link| link.listen).collect();
        assert_eq!(listens.len(), 6, "listen addresses must be distinct");
        let by_name = |name: &str| plan.links.iter().find(|l| l.name == name).unwrap();
        let one_to_three = by_name("peer-1-to-3");
        assert_eq!(one_to_three.target.port(), 7103);
        assert_eq!(one_to_three.one_way_delay, Duration::from_millis(100));
        let three_to_two = by_name("peer-3-to-2");
        assert_eq!(three_to_two.target.port(), 7102);
        assert_eq!(three_to_two.one_way_delay, Duration::from_millis(65));
        assert_eq!(
            three_to_two.regions,
            Some(("ap-south".to_string(), "eu-west".to_string()))
        );
        // Node 1 dials peer 3 through exactly the link that forwards 1 → 3.
        assert_eq!(plan.dial_maps[&1][&3], one_to_three.listen);
        assert!(!plan.dial_maps[&1].contains_key(&1), "no self link");
        assert_eq!(plan.dial_maps.len(), 3);
        assert_eq!(plan.links[0].listen.port(), 24000);
        assert_eq!(plan.links[0].name, "peer-1-to-2");
        assert_eq!(
            format_dial_map(&plan.dial_maps[&2]),
            "1=127.0.0.1:24002,3=127.0.0.1:24003"
        );
    }

    /// Client links: one per (region, node), delay of (client region, node region), ports in
    /// the order the regions are listed (then node id), so adding a region at the end of the
    /// list keeps every existing link's port.
    #[test]
    fn client_plan_covers_every_region_and_node() {
        let matrix = LatencyMatrix::default();
        let regions = vec!["us-east".to_string(), "ap-south".to_string()];
        let plan = plan_client_links(&matrix, &regions, &three_nodes(), LOOPBACK, 24500).unwrap();
        assert_eq!(plan.links.len(), 6);
        let ports: Vec<(&str, u16)> = plan
            .links
            .iter()
            .map(|l| (l.name.as_str(), l.listen.port()))
            .collect();
        assert_eq!(
            ports,
            [
                ("client-us-east-to-1", 24500),
                ("client-us-east-to-2", 24501),
                ("client-us-east-to-3", 24502),
                ("client-ap-south-to-1", 24503),
                ("client-ap-south-to-2", 24504),
                ("client-ap-south-to-3", 24505),
            ]
        );
        let us_to_node_1 = plan.dial_maps["us-east"][&1];
        let link = plan
            .links
            .iter()
            .find(|l| l.listen == us_to_node_1)
            .unwrap();
        assert_eq!(link.name, "client-us-east-to-1");
        assert_eq!(link.one_way_delay, Duration::ZERO);
        let ap_to_node_2 = plan.links.iter().find(|l| l.name == "client-ap-south-to-2");
        assert_eq!(
            ap_to_node_2.unwrap().one_way_delay,
            Duration::from_millis(65)
        );
    }

    /// Bad input is refused with a named reason, never planned around.
    #[test]
    fn planner_rejects_bad_topologies() {
        let matrix = LatencyMatrix::default();
        let mut duplicate = three_nodes();
        duplicate.push(node(2, "us-east", 7104));
        assert!(matches!(
            plan_peer_links(&matrix, &duplicate, LOOPBACK, 24000),
            Err(WanError::InvalidTopology { .. })
        ));
        let unknown = vec![node(1, "us-east", 7101), node(2, "mars", 7102)];
        assert!(matches!(
            plan_peer_links(&matrix, &unknown, LOOPBACK, 24000),
            Err(WanError::UnknownRegionPair { .. })
        ));
        assert!(matches!(
            plan_peer_links(&matrix, &three_nodes(), LOOPBACK, 65533),
            Err(WanError::InvalidTopology { .. })
        ));
        let mut custom = LatencyMatrix::new(Duration::from_millis(1));
        assert!(custom.set_rtt("a", "a", Duration::from_millis(5)).is_err());
        assert!(custom
            .set_rtt("a b", "c", Duration::from_millis(5))
            .is_err());
    }
}

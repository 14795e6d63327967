//! One founding member as listed in `initial_cluster` (`id=peer_addr@region/zone`), and the
//! parsing of such an entry; a missing region or zone is `default`.

use meridian_types::NodeId;
use std::net::SocketAddr;

/// One founding member as listed in `initial_cluster`: `id=peer_addr@region/zone`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    pub node_id: NodeId,
    pub peer_addr: SocketAddr,
    pub region: String,
    pub zone: String,
}

impl Member {
    pub fn parse(s: &str) -> Result<Member, String> {
        let (id, rest) = s
            .split_once('=')
            .ok_or_else(|| format!("{s:?} is not of the form id=peer_addr@region/zone"))?;
        let node_id: NodeId = id
            .trim()
            .parse()
            .map_err(|_| format!("node id {id:?} is not an unsigned integer"))?;
        if node_id == 0 {
            return Err("node id 0 is reserved".into());
        }
        let (addr, location) = rest.split_once('@').unwrap_or((rest, ""));
        let peer_addr: SocketAddr = addr
            .trim()
            .parse()
            .map_err(|e| format!("peer address {addr:?}: {e}"))?;
        let (region, zone) = location.split_once('/').unwrap_or((location, ""));
        let region = if region.is_empty() { "default" } else { region };
        let zone = if zone.is_empty() { "default" } else { zone };
        Ok(Member {
            node_id,
            peer_addr,
            region: region.to_string(),
            zone: zone.to_string(),
        })
    }
}

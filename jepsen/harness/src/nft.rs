//! Real packet loss between nodes with nftables.
//!
//! # The problem with ports alone
//! Every node listens on 127.0.0.1, so addresses identify nobody, and of a Raft connection's two
//! ports only the server's (`base+100+i`) is known: the client end is an ephemeral port. A rule
//! "drop tcp from A's ports to B's ports" therefore cannot see A's outgoing connections.
//!
//! # How connections are attributed to nodes
//! When the run may partition, each node runs under its own uid ([`NODE_UID_BASE`] + node id;
//! see `cluster.rs`, the harness re-executes itself as a small wrapper that `setuid`s and
//! `exec`s `meridian`). A table `inet meridian_jepsen_<base_port>` is created *before* the
//! nodes start, with a chain on the `output` hook that stamps each new connection's conntrack
//! entry with its originating node (`ct state new meta skuid <uid> ct mark set <mark>`). Every
//! packet of that connection, both directions, then carries the client node's mark, and the
//! server node is the one whose peer port appears as `tcp dport` (client to server) or
//! `tcp sport` (server to client).
//!
//! # A partition
//! For sides A and B, for both orientations (X, Y) = (A, B) and (B, A): drop on the `output`
//! and `input` hooks every TCP packet with `ct mark` of a node in X and a `tcp dport` or
//! `tcp sport` among Y's peer ports; and on `output`, as a second net for connections that
//! escaped marking, every packet from a socket of X's uids to Y's peer ports. Established
//! connections break (their packets are dropped mid-stream) and new ones cannot form. Healing
//! flushes the drop chains; the marking chain stays. The client API ports are never touched:
//! clients reach every node, as clients in another network would.
//!
//! [`NftTable`] deletes the table when dropped (end of run, error, panic, Ctrl-C), and a stale
//! table of the same name (a crashed earlier run) is replaced at creation.

use anyhow::{bail, Context};
use std::io::Write;
use std::process::{Command, Stdio};

/// Node `i` runs as uid and gid `NODE_UID_BASE + i` when the run may partition.
pub const NODE_UID_BASE: u32 = 61_000;

/// Names and numbers of one run's table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NftLayout {
    pub table: String,
    pub base_port: u16,
    pub nodes: Vec<u64>,
}

impl NftLayout {
    pub fn new(base_port: u16, nodes: usize) -> NftLayout {
        NftLayout {
            table: format!("meridian_jepsen_{base_port}"),
            base_port,
            nodes: (1..=nodes as u64).collect(),
        }
    }

    pub fn uid(&self, node: u64) -> u32 {
        NODE_UID_BASE + node as u32
    }

    /// The conntrack mark of connections opened by `node` (distinct per run's base port).
    pub fn mark(&self, node: u64) -> u32 {
        (u32::from(self.base_port) << 8) | node as u32
    }

    pub fn peer_port(&self, node: u64) -> u32 {
        u32::from(self.base_port) + 100 + node as u32
    }

    /// Script creating the table: marking chain filled, drop chains empty.
    pub fn create_script(&self) -> String {
        let t = &self.table;
        let mut s = String::new();
        // `add` then `delete` makes the delete succeed whether or not a stale table exists.
        s.push_str(&format!("add table inet {t}\ndelete table inet {t}\n"));
        s.push_str(&format!("table inet {t} {{\n"));
        s.push_str("  chain tag {\n    type filter hook output priority -10; policy accept;\n");
        for &n in &self.nodes {
            s.push_str(&format!(
                "    ct state new meta skuid {} ct mark set {}\n",
                self.uid(n),
                self.mark(n)
            ));
        }
        s.push_str("  }\n");
        s.push_str(
            "  chain egress {\n    type filter hook output priority 0; policy accept;\n  }\n",
        );
        s.push_str(
            "  chain ingress {\n    type filter hook input priority 0; policy accept;\n  }\n",
        );
        s.push_str("}\n");
        s
    }

    /// Script replacing the drop rules with a cut between `side_a` and `side_b`.
    pub fn partition_script(&self, side_a: &[u64], side_b: &[u64]) -> String {
        self.cuts_script(&[(side_a.to_vec(), side_b.to_vec())])
    }

    /// Script replacing the drop rules with every cut in `cuts`: for each `(x, y)`, nothing
    /// passes between a node of `x` and a node of `y` (nodes in neither, or on the same side,
    /// still talk). A bridge is one cut that leaves the bridge node out; a ring is several.
    pub fn cuts_script(&self, cuts: &[(Vec<u64>, Vec<u64>)]) -> String {
        let mut s = self.heal_script();
        for (side_a, side_b) in cuts {
            s.push_str(&self.cut_rules(side_a, side_b));
        }
        s
    }

    fn cut_rules(&self, side_a: &[u64], side_b: &[u64]) -> String {
        let t = &self.table;
        let set = |items: Vec<u32>| {
            format!(
                "{{ {} }}",
                items
                    .iter()
                    .map(u32::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        let mut s = String::new();
        for (x, y) in [(side_a, side_b), (side_b, side_a)] {
            if x.is_empty() || y.is_empty() {
                continue;
            }
            let marks = set(x.iter().map(|&n| self.mark(n)).collect());
            let uids = set(x.iter().map(|&n| self.uid(n)).collect());
            let ports = set(y.iter().map(|&n| self.peer_port(n)).collect());
            for chain in ["egress", "ingress"] {
                for dir in ["dport", "sport"] {
                    s.push_str(&format!(
                        "add rule inet {t} {chain} ct mark {marks} tcp {dir} {ports} drop\n"
                    ));
                }
            }
            s.push_str(&format!(
                "add rule inet {t} egress meta skuid {uids} tcp dport {ports} drop\n"
            ));
        }
        s
    }

    /// Script removing every drop rule.
    pub fn heal_script(&self) -> String {
        let t = &self.table;
        format!("flush chain inet {t} egress\nflush chain inet {t} ingress\n")
    }
}

/// Runs `nft -f -` with `script` on stdin.
pub fn run_nft(script: &str) -> anyhow::Result<()> {
    let mut child = Command::new("nft")
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("running `nft` (Debian package nftables; the harness must run as root)")?;
    child
        .stdin
        .take()
        .expect("stdin is piped")
        .write_all(script.as_bytes())
        .context("writing the nft script")?;
    let output = child.wait_with_output().context("waiting for nft")?;
    if !output.status.success() {
        bail!(
            "nft failed ({}): {}\nscript:\n{script}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(())
}

/// The run's table; deleted on drop.
pub struct NftTable {
    pub layout: NftLayout,
}

impl NftTable {
    /// Creates the table (replacing a stale one of the same name). Fails with a clear message
    /// if nftables is missing or not usable (not root, no netfilter in this kernel).
    pub fn create(layout: NftLayout) -> anyhow::Result<NftTable> {
        run_nft(&layout.create_script()).context(
            "the partition nemesis needs nftables (`apt-get install -y nftables`) and root \
             (CAP_NET_ADMIN); jepsen/run.sh installs nftables",
        )?;
        Ok(NftTable { layout })
    }

    pub fn partition(&self, side_a: &[u64], side_b: &[u64]) -> anyhow::Result<()> {
        run_nft(&self.layout.partition_script(side_a, side_b))
    }

    /// Applies every cut of `cuts` at once (see [`NftLayout::cuts_script`]).
    pub fn cut(&self, cuts: &[(Vec<u64>, Vec<u64>)]) -> anyhow::Result<()> {
        run_nft(&self.layout.cuts_script(cuts))
    }

    pub fn heal(&self) -> anyhow::Result<()> {
        run_nft(&self.layout.heal_script())
    }
}

impl Drop for NftTable {
    fn drop(&mut self) {
        if let Err(error) = run_nft(&format!("delete table inet {}\n", self.layout.table)) {
            eprintln!(
                "warning: could not delete nftables table {}: {error:#}",
                self.layout.table
            );
        }
    }
}

/// The cuts that leave each of `nodes` nodes (1..=n, in a circle) talking only to its two
/// neighbours. Empty for 3 nodes or fewer (everyone is a neighbour).
pub fn ring_cuts(nodes: usize) -> Vec<(Vec<u64>, Vec<u64>)> {
    let n = nodes as u64;
    let mut cuts = Vec::new();
    for a in 1..=n {
        for b in a + 1..=n {
            let gap = b - a;
            if gap != 1 && gap != n - 1 {
                cuts.push((vec![a], vec![b]));
            }
        }
    }
    cuts
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table marks each node's connections by uid; nothing is dropped yet.
    #[test]
    fn create_script_marks_every_node() {
        let layout = NftLayout::new(23_000, 3);
        let s = layout.create_script();
        assert!(s.starts_with(
            "add table inet meridian_jepsen_23000\ndelete table inet meridian_jepsen_23000\n"
        ));
        for (uid, mark) in [
            (61_001, 5_888_001),
            (61_002, 5_888_002),
            (61_003, 5_888_003),
        ] {
            assert!(
                s.contains(&format!(
                    "ct state new meta skuid {uid} ct mark set {mark}\n"
                )),
                "{s}"
            );
        }
        assert!(s.contains("chain egress {\n    type filter hook output priority 0;"));
        assert!(s.contains("chain ingress {\n    type filter hook input priority 0;"));
        assert!(!s.contains("drop"));
        assert_eq!(layout.mark(1), (23_000 << 8) | 1);
    }

    /// Isolating node 1 from 2 and 3 drops both directions of connections either side opened.
    #[test]
    fn partition_script_cuts_both_orientations() {
        let layout = NftLayout::new(23_000, 3);
        let s = layout.partition_script(&[1], &[2, 3]);
        let t = "meridian_jepsen_23000";
        let expected = format!(
            "flush chain inet {t} egress\nflush chain inet {t} ingress\n\
             add rule inet {t} egress ct mark {{ 5888001 }} tcp dport {{ 23102, 23103 }} drop\n\
             add rule inet {t} egress ct mark {{ 5888001 }} tcp sport {{ 23102, 23103 }} drop\n\
             add rule inet {t} ingress ct mark {{ 5888001 }} tcp dport {{ 23102, 23103 }} drop\n\
             add rule inet {t} ingress ct mark {{ 5888001 }} tcp sport {{ 23102, 23103 }} drop\n\
             add rule inet {t} egress meta skuid {{ 61001 }} tcp dport {{ 23102, 23103 }} drop\n\
             add rule inet {t} egress ct mark {{ 5888002, 5888003 }} tcp dport {{ 23101 }} drop\n\
             add rule inet {t} egress ct mark {{ 5888002, 5888003 }} tcp sport {{ 23101 }} drop\n\
             add rule inet {t} ingress ct mark {{ 5888002, 5888003 }} tcp dport {{ 23101 }} drop\n\
             add rule inet {t} ingress ct mark {{ 5888002, 5888003 }} tcp sport {{ 23101 }} drop\n\
             add rule inet {t} egress meta skuid {{ 61002, 61003 }} tcp dport {{ 23101 }} drop\n"
        );
        assert_eq!(s, expected);
        // Client ports (base+i) are never mentioned.
        assert!(!s.contains("23001") && !s.contains("23002"));
    }

    /// Healing flushes only the drop chains; an empty side cuts nothing.
    /// A ring of 5 cuts each node from the two it is not next to: five cuts, each both ways.
    #[test]
    fn a_ring_is_several_cuts_after_one_heal() {
        let layout = NftLayout::new(23_000, 5);
        let cuts = ring_cuts(5);
        assert_eq!(
            cuts,
            vec![
                (vec![1], vec![3]),
                (vec![1], vec![4]),
                (vec![2], vec![4]),
                (vec![2], vec![5]),
                (vec![3], vec![5]),
            ]
        );
        let s = layout.cuts_script(&cuts);
        assert!(s.starts_with(&layout.heal_script()));
        assert_eq!(s.matches("flush chain").count(), 2, "one heal, first");
        // Per cut and direction: 2 chains x 2 port directions by mark, 1 by uid.
        assert_eq!(s.matches(" drop\n").count(), cuts.len() * 2 * 5);
        assert_eq!(
            layout.partition_script(&[1], &[3]),
            layout.cuts_script(&[(vec![1], vec![3])])
        );
    }

    #[test]
    fn heal_and_empty_sides() {
        let layout = NftLayout::new(24_000, 5);
        assert_eq!(
            layout.heal_script(),
            "flush chain inet meridian_jepsen_24000 egress\nflush chain inet meridian_jepsen_24000 ingress\n"
        );
        assert_eq!(layout.partition_script(&[], &[1, 2]), layout.heal_script());
        let halves = layout.partition_script(&[1, 2], &[3, 4, 5]);
        assert_eq!(halves.matches(" drop\n").count(), 10);
    }
}

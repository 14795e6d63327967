//! Human-readable output: byte strings, hex input, and the `cluster status` tables.
//!
//! Keys and values are bytes. They print as text when they are valid UTF-8 without control
//! characters, and as `0x…` hex otherwise, so binary data never garbles a terminal.

use meridian_client::proto::{NodeInfo, ShardInfo, StatusResponse};
use meridian_client::Timestamp;
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// Longest key shown in a shard range before it is truncated.
const MAX_RANGE_KEY_CHARS: usize = 24;

/// Text if printable UTF-8, else `0x` + lowercase hex.
///
/// ```
/// use meridian_cli::display::format_bytes;
/// assert_eq!(format_bytes(b"hello"), "hello");
/// assert_eq!(format_bytes(&[0xff, 0x00]), "0xff00");
/// ```
pub fn format_bytes(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(text) if !text.chars().any(char::is_control) => text.to_string(),
        _ => {
            let mut out = String::with_capacity(2 + bytes.len() * 2);
            out.push_str("0x");
            for byte in bytes {
                let _ = write!(out, "{byte:02x}");
            }
            out
        }
    }
}

/// Decodes hex (an optional `0x` prefix is allowed) for `--hex` arguments.
pub fn parse_hex(text: &str) -> Result<Vec<u8>, String> {
    let digits = text.strip_prefix("0x").unwrap_or(text);
    if digits.len() % 2 == 1 {
        return Err(format!("{text:?}: odd number of hex digits"));
    }
    (0..digits.len())
        .step_by(2)
        .map(|i| {
            u8::from_str_radix(&digits[i..i + 2], 16)
                .map_err(|_| format!("{text:?}: not hexadecimal"))
        })
        .collect()
}

fn range_key(bytes: &[u8], open_end: &str) -> String {
    if bytes.is_empty() {
        return open_end.to_string();
    }
    let mut text = bytes.escape_ascii().to_string();
    if text.chars().count() > MAX_RANGE_KEY_CHARS {
        text = text.chars().take(MAX_RANGE_KEY_CHARS).collect::<String>() + "…";
    }
    format!("{text:?}")
}

/// `[start, end)` with `-inf`/`+inf` for open ends.
pub fn format_range(start: &[u8], end: &[u8]) -> String {
    format!("[{}, {})", range_key(start, "-inf"), range_key(end, "+inf"))
}

/// A left-aligned text table.
#[derive(Default)]
pub struct Table {
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new<I: IntoIterator<Item = S>, S: Into<String>>(header: I) -> Table {
        Table {
            rows: vec![header.into_iter().map(Into::into).collect()],
        }
    }

    pub fn row<I: IntoIterator<Item = S>, S: Into<String>>(&mut self, cells: I) {
        self.rows.push(cells.into_iter().map(Into::into).collect());
    }

    pub fn render(&self) -> String {
        let columns = self.rows.iter().map(Vec::len).max().unwrap_or(0);
        let widths: Vec<usize> = (0..columns)
            .map(|c| {
                self.rows
                    .iter()
                    .filter_map(|r| r.get(c))
                    .map(|s| s.chars().count())
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let mut out = String::new();
        for row in &self.rows {
            let mut line = String::from("  ");
            for (c, cell) in row.iter().enumerate() {
                let pad = widths[c].saturating_sub(cell.chars().count());
                line.push_str(cell);
                if c + 1 < row.len() {
                    line.push_str(&" ".repeat(pad + 2));
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

/// The cluster as seen by every node that answered: the node list from any of them, and for
/// each shard the row reported by its leader (which alone knows replica progress).
#[derive(Clone, Debug, Default)]
pub struct ClusterView {
    /// The answer used for the cluster id and node list.
    pub base: StatusResponse,
    /// Every answer, by answering node id.
    pub answers: BTreeMap<u64, StatusResponse>,
}

impl ClusterView {
    /// For each shard: the row of a node that answered as the shard's leader (the highest
    /// term if two claim it), else `base`'s row.
    pub fn shards(&self) -> Vec<ShardInfo> {
        let mut by_id: BTreeMap<u64, (bool, ShardInfo)> = BTreeMap::new();
        for shard in &self.base.shards {
            by_id.insert(shard.shard_id, (false, shard.clone()));
        }
        for (node_id, answer) in &self.answers {
            for shard in answer.shards.iter().filter(|s| s.leader_id == *node_id) {
                let replace = match by_id.get(&shard.shard_id) {
                    Some((true, current)) => shard.term > current.term,
                    _ => true,
                };
                if replace {
                    by_id.insert(shard.shard_id, (true, shard.clone()));
                }
            }
        }
        by_id.into_values().map(|(_, shard)| shard).collect()
    }

    /// The `cluster status` report.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "cluster {}  ({} of {} nodes answered)  shard map v{}",
            if self.base.cluster_id.is_empty() {
                "?"
            } else {
                &self.base.cluster_id
            },
            self.answers.len(),
            self.base.nodes.len(),
            self.base.shard_map_version
        );
        let _ = writeln!(out, "\nNODES");
        let mut nodes = Table::new([
            "ID",
            "REGION",
            "ZONE",
            "CLIENT ADDR",
            "PEER ADDR",
            "LIVE",
            "ANSWERS",
            "CLOCK OFFSET",
        ]);
        for node in &self.base.nodes {
            nodes.row([
                node.node_id.to_string(),
                node.region.clone(),
                node.zone.clone(),
                node.client_addr.clone(),
                node.peer_addr.clone(),
                yes_no(node.live).into(),
                yes_no(self.answers.contains_key(&node.node_id)).into(),
                format_offset(node, self.base.answering_node),
            ]);
        }
        out.push_str(&nodes.render());
        let _ = writeln!(out, "\nSHARDS");
        let mut shards = Table::new([
            "ID",
            "RANGE",
            "REPLICAS",
            "LEADER",
            "TERM",
            "APPLIED",
            "LAST LOG",
            "QUIESCED",
            "LAG (node:entries)",
            "CLOSED LAG (node:s)",
            "HOME",
            "CONSTRAINTS",
            "MOVES",
        ]);
        for shard in self.shards() {
            let range = if shard.shard_id == 0 {
                "(metadata)".to_string()
            } else {
                format_range(&shard.start, &shard.end)
            };
            shards.row([
                shard.shard_id.to_string(),
                range,
                shard
                    .replicas
                    .iter()
                    .map(u64::to_string)
                    .collect::<Vec<_>>()
                    .join(","),
                if shard.leader_id == 0 {
                    "none".into()
                } else {
                    shard.leader_id.to_string()
                },
                shard.term.to_string(),
                shard.applied_index.to_string(),
                shard.last_log_index.to_string(),
                yes_no(shard.quiesced).into(),
                format_lag(&shard),
                format_closed_lag(&shard, &self.answers),
                match (shard.home_region.as_str(), shard.survival.as_str()) {
                    ("", _) => "-".into(),
                    (home, "zone") => format!("{home} (zone)"),
                    (home, _) => home.to_string(),
                },
                format_constraints(&shard, &self.base.nodes),
                format_moves(&shard),
            ]);
        }
        out.push_str(&shards.render());
        let _ = writeln!(out, "\nLOG WRITERS (since each node started)");
        let mut writers = Table::new([
            "NODE",
            "WRITES",
            "ITEMS/WRITE",
            "AVG WRITE µs",
            "SYNCS",
            "APPENDS/SYNC",
            "AVG SYNC µs",
        ]);
        for (node_id, answer) in &self.answers {
            let Some(w) = &answer.log_writer else {
                continue;
            };
            let per = |a: u64, b: u64| {
                if b == 0 {
                    "-".to_string()
                } else {
                    format!("{:.1}", a as f64 / b as f64)
                }
            };
            writers.row([
                node_id.to_string(),
                w.writes.to_string(),
                per(w.items, w.writes),
                per(w.write_micros, w.writes),
                w.syncs.to_string(),
                per(w.flushes, w.syncs),
                per(w.sync_micros, w.syncs),
            ]);
        }
        out.push_str(&writers.render());
        out
    }
}

/// A node's clock offset as the answering node measured it: `+312±1 ms`, `self`, or `-`.
pub fn format_offset(node: &NodeInfo, answering: u64) -> String {
    if node.node_id == answering {
        "self".into()
    } else if node.clock_offset_ms == 0 && node.clock_offset_uncertainty_ms == 0 {
        "-".into()
    } else {
        format!(
            "{:+}±{} ms",
            node.clock_offset_ms, node.clock_offset_uncertainty_ms
        )
    }
}

fn yes_no(value: bool) -> &'static str {
    if value {
        "yes"
    } else {
        "no"
    }
}

/// A shard's constraints (`-` for none), and the replicas that break them: `-region=ap-south
/// (breaks: 3)`. A replica on a node the status does not list is not judged.
fn format_constraints(shard: &ShardInfo, nodes: &[NodeInfo]) -> String {
    if shard.constraints.is_empty() {
        return "-".into();
    }
    let Ok(parsed) = meridian_client::Constraints::parse(&shard.constraints) else {
        return format!("{} (unreadable)", shard.constraints);
    };
    let breaking: Vec<String> = shard
        .replicas
        .iter()
        .filter(|id| {
            nodes
                .iter()
                .any(|n| n.node_id == **id && !parsed.allows(&n.region, &n.zone))
        })
        .map(u64::to_string)
        .collect();
    match breaking.is_empty() {
        true => shard.constraints.clone(),
        false => format!("{} (breaks: {})", shard.constraints, breaking.join(",")),
    }
}

/// Replica moves in progress on `shard`, from its Raft membership against the shard map's
/// replica list (see `meridian-server`'s `membership`): `N learning` (added as a learner, not
/// yet voting), `N listed only` (in the map, not yet in the group: an add before its learner
/// step, or a removal after its Raft change), `N unlisted voter` (in the group, not in the
/// map), and `joint` while a voter change is half done; `-` when the two agree, `?` when the
/// answering node hosts no replica of the shard (no membership known).
pub fn format_moves(shard: &ShardInfo) -> String {
    if shard.voters.is_empty() && shard.learners.is_empty() {
        return "?".into();
    }
    let mut moves: BTreeMap<u64, &str> = BTreeMap::new();
    // Under zone survival the replicas outside the home region stay learners: not a move.
    let learner = match shard.survival.as_str() {
        "zone" => "learner",
        _ => "learning",
    };
    for node in &shard.learners {
        moves.insert(*node, learner);
    }
    for node in &shard.replicas {
        if !shard.voters.contains(node) && !shard.learners.contains(node) {
            moves.insert(*node, "listed only");
        }
    }
    for node in &shard.voters {
        if !shard.replicas.contains(node) {
            moves.insert(*node, "unlisted voter");
        }
    }
    let mut parts: Vec<String> = Vec::new();
    if shard.joint {
        parts.push("joint".into());
    }
    parts.extend(
        moves
            .into_iter()
            .map(|(node, what)| format!("{node} {what}")),
    );
    match parts.is_empty() {
        true => "-".into(),
        false => parts.join(", "),
    }
}

/// Lag per replica = leader's last log index − the replica's matched index; `?` when the
/// reporting node does not know (it is not the leader).
pub fn format_lag(shard: &ShardInfo) -> String {
    shard
        .replicas
        .iter()
        .map(|replica| {
            let lag = shard
                .replica_status
                .iter()
                .find(|r| r.node_id == *replica)
                .map(|r| {
                    shard
                        .last_log_index
                        .saturating_sub(r.matched_index)
                        .to_string()
                })
                .unwrap_or_else(|| "?".into());
            format!("{replica}:{lag}")
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Closed-timestamp lag per replica: how far the replica's closed timestamp (from its own
/// node's answer) is behind that node's clock, in seconds; `-` for none yet (or the metadata
/// shard, which closes nothing), `?` when the node did not answer.
pub fn format_closed_lag(shard: &ShardInfo, answers: &BTreeMap<u64, StatusResponse>) -> String {
    shard
        .replicas
        .iter()
        .map(|replica| {
            let lag = answers
                .get(replica)
                .and_then(|a| {
                    let own = a.shards.iter().find(|s| s.shard_id == shard.shard_id)?;
                    Some((a.hlc_now, own.closed_ts))
                })
                .map(|(now, closed)| match closed {
                    0 => "-".to_string(),
                    closed => {
                        let behind_ms = Timestamp(now)
                            .physical_ms()
                            .saturating_sub(Timestamp(closed).physical_ms());
                        format!("{:.1}s", behind_ms as f64 / 1_000.0)
                    }
                })
                .unwrap_or_else(|| "?".into());
            format!("{replica}:{lag}")
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use meridian_client::proto::{LogWriterStats, ReplicaStatus};

    /// Each replica's closed lag comes from its own node's answer; none yet is `-`, a node
    /// that did not answer `?`.
    #[test]
    fn closed_lag_per_replica() {
        let now = Timestamp::from_physical_ms(100_000).0;
        let answer = |node: u64, closed_ms: u64| StatusResponse {
            answering_node: node,
            hlc_now: now,
            shards: vec![ShardInfo {
                shard_id: 4,
                closed_ts: if closed_ms == 0 {
                    0
                } else {
                    Timestamp::from_physical_ms(closed_ms).0
                },
                ..Default::default()
            }],
            ..Default::default()
        };
        let answers: BTreeMap<u64, StatusResponse> = [
            (1, answer(1, 97_000)),
            (2, answer(2, 58_800)),
            (3, answer(3, 0)),
        ]
        .into_iter()
        .collect();
        let shard = ShardInfo {
            shard_id: 4,
            replicas: vec![1, 2, 3, 5],
            ..Default::default()
        };
        assert_eq!(
            format_closed_lag(&shard, &answers),
            "1:3.0s 2:41.2s 3:- 5:?"
        );
    }

    /// Printable text stays text; anything else becomes hex; hex parses back.
    #[test]
    fn bytes_round_trip_through_hex() {
        assert_eq!(format_bytes(b""), "");
        assert_eq!(format_bytes(b"a\tb"), "0x610962");
        assert_eq!(format_bytes("héllo".as_bytes()), "héllo");
        assert_eq!(parse_hex("0x610962").unwrap(), b"a\tb");
        assert_eq!(parse_hex("FF00").unwrap(), vec![0xff, 0]);
        assert!(parse_hex("abc").is_err());
        assert!(parse_hex("zz").is_err());
    }

    /// Open range ends print as infinities.
    #[test]
    fn ranges() {
        assert_eq!(format_range(b"", b"m"), "[-inf, \"m\")");
        assert_eq!(format_range(b"m", b""), "[\"m\", +inf)");
        assert_eq!(format_range(&[0x40], b""), "[\"@\", +inf)");
    }

    /// Lag is computed from the leader's replica progress; unknown replicas show `?`.
    #[test]
    fn lag_per_replica() {
        let shard = ShardInfo {
            shard_id: 1,
            replicas: vec![1, 2, 3],
            leader_id: 1,
            last_log_index: 100,
            replica_status: vec![
                ReplicaStatus {
                    node_id: 1,
                    matched_index: 100,
                },
                ReplicaStatus {
                    node_id: 2,
                    matched_index: 93,
                },
            ],
            ..Default::default()
        };
        assert_eq!(format_lag(&shard), "1:0 2:7 3:?");
    }

    /// Moves are the differences between the group and the map.
    #[test]
    fn moves_in_progress() {
        let shard = |replicas: Vec<u64>, voters: Vec<u64>, learners: Vec<u64>, joint| ShardInfo {
            shard_id: 1,
            replicas,
            voters,
            learners,
            joint,
            ..Default::default()
        };
        assert_eq!(
            format_moves(&shard(vec![1, 2, 3], vec![3, 1, 2], vec![], false)),
            "-"
        );
        assert_eq!(
            format_moves(&shard(vec![1, 2, 3], vec![], vec![], false)),
            "?"
        );
        assert_eq!(
            format_moves(&shard(vec![1, 2, 3, 4], vec![1, 2, 3], vec![], false)),
            "4 listed only"
        );
        assert_eq!(
            format_moves(&shard(vec![1, 2, 3, 4], vec![1, 2, 3], vec![4], false)),
            "4 learning"
        );
        assert_eq!(
            format_moves(&shard(vec![1, 2, 3, 4], vec![1, 2, 3, 4], vec![], true)),
            "joint"
        );
        assert_eq!(
            format_moves(&shard(vec![1, 2, 3], vec![2, 3, 5], vec![], false)),
            "1 listed only, 5 unlisted voter"
        );
    }

    /// The leader's own row wins over a follower's.
    #[test]
    fn view_prefers_leader_rows() {
        let follower_row = ShardInfo {
            shard_id: 1,
            leader_id: 2,
            term: 3,
            applied_index: 5,
            ..Default::default()
        };
        let leader_row = ShardInfo {
            shard_id: 1,
            leader_id: 2,
            term: 3,
            applied_index: 9,
            ..Default::default()
        };
        let base = StatusResponse {
            answering_node: 1,
            shards: vec![follower_row.clone()],
            ..Default::default()
        };
        let mut view = ClusterView {
            base: base.clone(),
            ..Default::default()
        };
        view.answers.insert(1, base);
        view.answers.insert(
            2,
            StatusResponse {
                answering_node: 2,
                shards: vec![leader_row],
                ..Default::default()
            },
        );
        assert_eq!(view.shards()[0].applied_index, 9);
        view.answers.get_mut(&2).unwrap().log_writer = Some(LogWriterStats {
            writes: 4,
            items: 10,
            syncs: 2,
            flushes: 8,
            write_micros: 100,
            sync_micros: 3_000,
        });
        let rendered = view.render();
        let line = rendered
            .lines()
            .find(|l| l.trim_start().starts_with("2  "))
            .unwrap_or_else(|| panic!("a log writer row for node 2:\n{rendered}"));
        let cells: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(
            cells,
            ["2", "4", "2.5", "25.0", "2", "4.0", "1500.0"],
            "{line}"
        );
        let table = Table::new(["A", "BB"]).render();
        assert_eq!(table, "  A  BB\n");
    }
}

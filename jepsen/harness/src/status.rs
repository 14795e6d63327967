//! Who leads what, according to the nodes themselves (`Cluster.Status`), for the nemesis:
//! picking a key's leader, and checking that a partition or a clock fault had the effect it
//! should. Views of several nodes are merged because a node that is not a replica of a shard
//! may report a stale leader for it.

use meridian_cli::LocalCluster;
use meridian_client::fetch_status;
use std::collections::BTreeMap;
use std::time::Duration;

/// Every shard (metadata included) as `(shard, leader, replicas)`, merging the views of
/// all `askers` that answer: per shard, the leader reported with the highest term (a
/// node's claim about itself wins a tie). `None` if nobody answers.
pub async fn shard_view(
    cluster: &LocalCluster,
    askers: &[u64],
) -> Option<Vec<(u64, u64, Vec<u64>)>> {
    // shard -> ((term, self-claim, leader), replicas)
    type Claim = (u64, bool, u64);
    let mut merged: BTreeMap<u64, (Claim, Vec<u64>)> = BTreeMap::new();
    let mut answered = false;
    for &asker in askers {
        let Ok(address) = cluster.client_addr(asker) else {
            continue;
        };
        let Ok(status) = fetch_status(&address, Duration::from_secs(1)).await else {
            continue;
        };
        answered = true;
        for s in &status.shards {
            let claim = (s.term, s.leader_id == asker, s.leader_id);
            let entry = merged
                .entry(s.shard_id)
                .or_insert(((0, false, 0), s.replicas.clone()));
            if s.leader_id != 0 && claim > entry.0 {
                entry.0 = claim;
            }
        }
    }
    answered.then(|| {
        merged
            .into_iter()
            .map(|(shard, ((_, _, leader), replicas))| (shard, leader, replicas))
            .collect()
    })
}

/// Shards that `leaders` lead, as seen by the first of `askers` that answers.
pub async fn shards_led_by(
    cluster: &LocalCluster,
    askers: &[u64],
    leaders: &[u64],
) -> Option<Vec<u64>> {
    let view = shard_view(cluster, askers).await?;
    Some(
        view.into_iter()
            .filter(|(_, leader, _)| leaders.contains(leader))
            .map(|(shard, _, _)| shard)
            .collect(),
    )
}

/// Shards the `minority` side leads, split into those whose replicas have a majority on the
/// other side (they must get a new leader) and those that do not (they must stay
/// leaderless: no quorum anywhere).
pub async fn shards_to_move(
    cluster: &LocalCluster,
    majority: &[u64],
    minority: &[u64],
) -> Option<(Vec<u64>, Vec<u64>)> {
    let everyone: Vec<u64> = majority.iter().chain(minority).copied().collect();
    let view = shard_view(cluster, &everyone).await?;
    let (mut movable, mut stuck) = (Vec::new(), Vec::new());
    for (shard, leader, replicas) in view {
        if !minority.contains(&leader) {
            continue;
        }
        let across = replicas.iter().filter(|r| majority.contains(r)).count();
        if across * 2 > replicas.len() {
            movable.push(shard);
        } else {
            stuck.push(shard);
        }
    }
    Some((movable, stuck))
}

/// `node`'s clock offset and its uncertainty in ms, as `asker` last measured it (its
/// `Cluster.Status`); `None` if `asker` does not answer or has no measurement.
pub async fn measured_offset(cluster: &LocalCluster, asker: u64, node: u64) -> Option<(i64, i64)> {
    let address = cluster.client_addr(asker).ok()?;
    let status = fetch_status(&address, Duration::from_secs(1)).await.ok()?;
    status
        .nodes
        .iter()
        .find(|n| {
            n.node_id == node && (n.clock_offset_ms != 0 || n.clock_offset_uncertainty_ms != 0)
        })
        .map(|n| (n.clock_offset_ms, n.clock_offset_uncertainty_ms as i64))
}

/// Bound on reading one node's `/metrics`.
const METRICS_TIMEOUT: Duration = Duration::from_secs(2);
/// Most bytes of one `/metrics` answer read.
const MAX_METRICS_BYTES: u64 = 4 << 20;

/// The sum of every sample of metric `name` (any labels) on the node whose metrics are served
/// at 127.0.0.1:`port`; `None` if it does not answer in time or does not export it. Counters
/// start at 0 when a node starts, so after a restart this counts since the restart.
pub async fn metric_sum(port: u16, name: &str) -> Option<u64> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let body = tokio::time::timeout(METRICS_TIMEOUT, async {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()?;
        stream
            .write_all(b"GET /metrics HTTP/1.1\r\nHost: meridian\r\nConnection: close\r\n\r\n")
            .await
            .ok()?;
        let mut text = String::new();
        stream
            .take(MAX_METRICS_BYTES)
            .read_to_string(&mut text)
            .await
            .ok()?;
        Some(text)
    })
    .await
    .ok()??;
    sum_samples(&body, name)
}

/// The sum of the samples of `name` in a Prometheus text exposition (`name value` or
/// `name{labels} value`); `None` if there is none.
pub fn sum_samples(text: &str, name: &str) -> Option<u64> {
    let mut sum = None;
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        let rest = match rest.chars().next() {
            Some('{') => match rest.find('}') {
                Some(end) => &rest[end + 1..],
                None => continue,
            },
            Some(' ') => rest,
            _ => continue, // another metric whose name starts with `name`
        };
        if let Ok(value) = rest.trim().parse::<f64>() {
            *sum.get_or_insert(0) += value as u64;
        }
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::sum_samples;

    /// Labelled and bare samples add up; comments and longer names do not count.
    #[test]
    fn samples_are_summed_by_exact_name() {
        let text = "# HELP m_total reads\n# TYPE m_total counter\nm_total{shard=\"1\"} 3\n\
                    m_total{shard=\"2\"} 4\nm_total_extra 100\nm_total 5\nother 9\n";
        assert_eq!(sum_samples(text, "m_total"), Some(12));
        assert_eq!(sum_samples(text, "absent"), None);
    }
}

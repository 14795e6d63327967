//! The list-append checker: strict serializability of transactions, Elle-style (Kingsbury & Alvaro,
//! 2020), written here from the paper's ideas.
//!
//! # The workload's shape
//! Each key holds a list of integers; a transaction is a list of micro-operations
//! `["append", key, v]` (add `v` to the end of `key`'s list) and `["r", key, list]` (the whole
//! list; `null` in the invocation). Every appended value is unique per key. The history has one
//! `txn` op per transaction: the invocation carries the micro-ops as planned, an `ok`
//! completion carries them with the lists read.
//!
//! # Why lists
//! A read of a list reveals the order of every append before it, so the checker can recover
//! each key's *version order* — the longest list read; every other read must be a prefix of it —
//! and from it the dependencies between transactions:
//! - `ww`: T1 appended the element just before T2's element in a key's version order;
//! - `wr`: T2 read a list whose last element T1 appended;
//! - `rw`: T1 read a list of length n and T2 appended the element at position n (T1 did not
//!   see T2's append, so T1 must come first).
//!
//! A serializable history has an acyclic dependency graph. Anomalies reported:
//! - `incompatible-order`: two reads of a key that are not prefixes of one another;
//! - `duplicate-elements`: a value twice in one read list;
//! - `garbage-read`: a value nobody tried to append;
//! - `aborted-read` (G1a): a value appended by a transaction that failed;
//! - `cycle` (G0: ww only; G1c: ww and wr; G2: with rw; real-time: with an `rt` edge): one
//!   cycle per strongly connected component, with its transactions' operations.
//!
//! # Real time
//! The graph also has `rt` edges: T1 → T2 when T1 completed (ok) before T2 was invoked. Only a
//! transitive reduction is added (each new transaction follows the completed transactions
//! that no later completion has followed), so the edges stay near transactions × concurrency.
//! Indeterminate transactions get incoming `rt` edges only (they may take effect any time
//! after their invocation); failed ones none. Two modes ([`RealTime`]):
//! - `Strict` ([`check_append`]): between all transactions — strict serializability, what
//!   Meridian promises while the nodes' clocks agree, or under skew within `max_offset` when
//!   every writing transaction commit-waits (`TxnOptions::linearizable`);
//! - `PerKey` ([`check_append_with`]): only between transactions that touch a common key —
//!   serializability with no stale read of any key, what Meridian promises under clock skew
//!   within `max_offset` (a *causal reverse* between writes to different keys in different
//!   shards is allowed, as in CockroachDB).
//!
//! # Not checked
//! Internal reads of a transaction's own appends beyond their being prefixes of the version
//! order.

use super::{Anomaly, CheckError, CheckResult};
use crate::history::{History, OpFn, OpKind};
use serde::Serialize;
use serde_json::Value;
use std::collections::{BTreeMap, HashMap, HashSet};

/// One micro-operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Micro {
    Append(String, u64),
    /// `None` in an invocation (not read yet).
    Read(String, Option<Vec<u64>>),
}

/// Parses a transaction's micro-operations from an op's value.
pub fn parse_txn(value: &Value) -> Option<Vec<Micro>> {
    let ops = value.as_array()?;
    ops.iter()
        .map(|op| {
            let op = op.as_array()?;
            let (f, key) = (op.first()?.as_str()?, op.get(1)?.as_str()?.to_string());
            match f {
                "append" => Some(Micro::Append(key, op.get(2)?.as_u64()?)),
                "r" => match op.get(2)? {
                    Value::Null => Some(Micro::Read(key, None)),
                    Value::Array(xs) => Some(Micro::Read(
                        key,
                        Some(xs.iter().map(Value::as_u64).collect::<Option<Vec<u64>>>()?),
                    )),
                    _ => None,
                },
                _ => None,
            }
        })
        .collect()
}

/// The micro-operations as JSON (the inverse of [`parse_txn`]).
pub fn txn_value(ops: &[Micro]) -> Value {
    Value::Array(
        ops.iter()
            .map(|m| match m {
                Micro::Append(k, v) => serde_json::json!(["append", k, v]),
                Micro::Read(k, list) => serde_json::json!(["r", k, list]),
            })
            .collect(),
    )
}

/// The checker's report.
#[derive(Debug, Clone, Default, Serialize)]
pub struct AppendReport {
    pub txns_ok: usize,
    pub txns_failed: usize,
    pub txns_indeterminate: usize,
    pub keys: usize,
    pub edges: usize,
    #[serde(skip)]
    pub anomalies: Vec<Anomaly>,
}

impl AppendReport {
    pub fn to_check_result(&self) -> CheckResult {
        super::counted_result(
            "append",
            self.anomalies.clone(),
            self.txns_ok,
            "no transaction succeeded: nothing was checked",
            serde_json::to_value(self).unwrap_or(Value::Null),
        )
    }
}

/// One transaction of the history.
struct Txn {
    outcome: OpKind,
    /// History indices of its invocation and completion.
    ops: Vec<usize>,
    micro: Vec<Micro>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Edge {
    Ww,
    Wr,
    Rw,
    /// Real time: the first transaction completed before the second was invoked.
    Rt,
}

/// Which real-time order a history must respect (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RealTime {
    /// Every transaction after every one that completed before it began.
    Strict,
    /// Only after those that completed before it began and touch a key it touches.
    PerKey,
}

/// Checks every `txn` op of `history` for strict serializability.
pub fn check_append(history: &History) -> Result<AppendReport, CheckError> {
    check_append_with(history, RealTime::Strict)
}

/// Checks every `txn` op of `history` with the given real-time order.
pub fn check_append_with(
    history: &History,
    real_time: RealTime,
) -> Result<AppendReport, CheckError> {
    let mut report = AppendReport::default();
    let mut txns = Vec::new();
    for pair in history.pairs()? {
        let invoke = &history.ops[pair.invoke];
        if invoke.f != OpFn::Txn {
            continue;
        }
        let source = match (pair.outcome, pair.completion) {
            (OpKind::Ok, Some(c)) => c,
            _ => pair.invoke,
        };
        let micro = parse_txn(&history.ops[source].value).ok_or_else(|| CheckError::Malformed {
            index: source,
            reason: "a txn value must be a list of [\"append\", key, n] / [\"r\", key, list]"
                .into(),
        })?;
        match pair.outcome {
            OpKind::Ok => report.txns_ok += 1,
            OpKind::Fail => report.txns_failed += 1,
            _ => report.txns_indeterminate += 1,
        }
        txns.push(Txn {
            outcome: pair.outcome,
            ops: [Some(pair.invoke), pair.completion]
                .into_iter()
                .flatten()
                .collect(),
            micro,
        });
    }

    // Who appended what.
    let mut appended_by: HashMap<(&str, u64), usize> = HashMap::new();
    for (t, txn) in txns.iter().enumerate() {
        for m in &txn.micro {
            if let Micro::Append(k, v) = m {
                if appended_by.insert((k.as_str(), *v), t).is_some() {
                    return Err(CheckError::Malformed {
                        index: txn.ops[0],
                        reason: format!("value {v} appended to {k} twice"),
                    });
                }
            }
        }
    }

    // Reads by ok transactions, and each key's version order (the longest read).
    let mut reads: Vec<(usize, &str, &Vec<u64>)> = Vec::new();
    for (t, txn) in txns
        .iter()
        .enumerate()
        .filter(|(_, t)| t.outcome == OpKind::Ok)
    {
        for m in &txn.micro {
            if let Micro::Read(k, Some(list)) = m {
                reads.push((t, k.as_str(), list));
            }
        }
    }
    let mut order: BTreeMap<&str, &Vec<u64>> = BTreeMap::new();
    for &(_, k, list) in &reads {
        let longest = order.entry(k).or_insert(list);
        if list.len() > longest.len() {
            *longest = list;
        }
    }
    report.keys = order.len();
    let anomaly = |kind: &str, key: Option<&str>, ops: Vec<usize>, message: String| Anomaly {
        kind: kind.into(),
        key: key.map(str::to_string),
        ops,
        message,
    };
    for &(t, k, list) in &reads {
        let longest = order[k];
        if !longest.starts_with(list) {
            report.anomalies.push(anomaly(
                "incompatible-order",
                Some(k),
                txns[t].ops.clone(),
                format!(
                    "read {} of {k} is not a prefix of {}",
                    shown(list),
                    shown(longest)
                ),
            ));
        }
        let mut seen = HashSet::new();
        for v in list {
            if !seen.insert(v) {
                report.anomalies.push(anomaly(
                    "duplicate-elements",
                    Some(k),
                    txns[t].ops.clone(),
                    format!("read {list:?} of {k} holds {v} twice"),
                ));
            }
            match appended_by.get(&(k, *v)) {
                None => report.anomalies.push(anomaly(
                    "garbage-read",
                    Some(k),
                    txns[t].ops.clone(),
                    format!("read {list:?} of {k} holds {v}, which nobody appended"),
                )),
                Some(&w) if txns[w].outcome == OpKind::Fail => report.anomalies.push(anomaly(
                    "aborted-read",
                    Some(k),
                    [txns[t].ops.clone(), txns[w].ops.clone()].concat(),
                    format!("read of {k} holds {v}, appended by a transaction that failed"),
                )),
                Some(_) => {}
            }
        }
    }
    if !report.anomalies.is_empty() {
        return Ok(report);
    }

    // The dependency graph over transactions.
    let mut graph: BTreeMap<usize, BTreeMap<usize, Edge>> = BTreeMap::new();
    let mut add = |from: usize, to: usize, edge: Edge| {
        if from != to {
            let slot = graph.entry(from).or_default().entry(to).or_insert(edge);
            *slot = (*slot).min(edge);
        }
    };
    for (&k, longest) in &order {
        for pair in longest.windows(2) {
            add(
                appended_by[&(k, pair[0])],
                appended_by[&(k, pair[1])],
                Edge::Ww,
            );
        }
    }
    for &(t, k, list) in &reads {
        if let Some(last) = list.last() {
            add(appended_by[&(k, *last)], t, Edge::Wr);
        }
        if let Some(next) = order[k].get(list.len()) {
            add(t, appended_by[&(k, *next)], Edge::Rw);
        }
    }
    let live = || {
        txns.iter()
            .enumerate()
            .filter(|(_, t)| t.outcome != OpKind::Fail)
    };
    match real_time {
        RealTime::Strict => real_time_edges(&txns, live().map(|(t, _)| t), &mut add),
        RealTime::PerKey => {
            let mut by_key: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
            for (t, txn) in live() {
                let keys: HashSet<&str> = txn
                    .micro
                    .iter()
                    .map(|m| match m {
                        Micro::Append(k, _) | Micro::Read(k, _) => k.as_str(),
                    })
                    .collect();
                for k in keys {
                    by_key.entry(k).or_default().push(t);
                }
            }
            for members in by_key.into_values() {
                real_time_edges(&txns, members.into_iter(), &mut add);
            }
        }
    }
    report.edges = graph.values().map(BTreeMap::len).sum();

    for cycle in cycles(&graph) {
        let kinds: Vec<Edge> = cycle
            .iter()
            .zip(cycle.iter().cycle().skip(1))
            .map(|(a, b)| graph[a][b])
            .collect();
        let class = if kinds.iter().all(|e| *e == Edge::Ww) {
            "G0"
        } else if kinds.contains(&Edge::Rt) {
            "real-time (not strictly serializable)"
        } else if kinds.contains(&Edge::Rw) {
            "G2"
        } else {
            "G1c"
        };
        let steps: Vec<String> = cycle
            .iter()
            .zip(&kinds)
            .map(|(t, e)| format!("op {} -{e:?}->", txns[*t].ops[0]))
            .collect();
        report.anomalies.push(anomaly(
            "cycle",
            None,
            cycle.iter().flat_map(|t| txns[*t].ops.clone()).collect(),
            format!("{class} cycle: {} back to the first", steps.join(" ")),
        ));
    }
    Ok(report)
}

/// Real-time order among `members`, transitively reduced: a transaction invoked after others
/// completed follows the "frontier" (completed transactions no later completion has followed).
fn real_time_edges(
    txns: &[Txn],
    members: impl Iterator<Item = usize>,
    add: &mut impl FnMut(usize, usize, Edge),
) {
    let mut events: Vec<(usize, usize, bool)> = Vec::new();
    for t in members {
        let txn = &txns[t];
        events.push((txn.ops[0], t, true));
        if txn.outcome == OpKind::Ok {
            events.push((txn.ops[1], t, false));
        }
    }
    events.sort_unstable();
    let mut frontier: Vec<usize> = Vec::new();
    let mut preceded_by: HashMap<usize, Vec<usize>> = HashMap::new();
    for (_, t, invoke) in events {
        if invoke {
            for &f in &frontier {
                add(f, t, Edge::Rt);
            }
            preceded_by.insert(t, frontier.clone());
        } else {
            let before = preceded_by.remove(&t).unwrap_or_default();
            frontier.retain(|f| !before.contains(f));
            frontier.push(t);
        }
    }
}

/// A list for a message: in full when short, else its first and last elements.
fn shown(list: &[u64]) -> String {
    const EDGE: usize = 8;
    if list.len() <= 2 * EDGE {
        return format!("{list:?}");
    }
    format!(
        "{:?} … {:?} ({} elements)",
        &list[..EDGE],
        &list[list.len() - EDGE..],
        list.len()
    )
}

/// One cycle in each strongly connected component with more than one node (Tarjan, iterative).
fn cycles(graph: &BTreeMap<usize, BTreeMap<usize, Edge>>) -> Vec<Vec<usize>> {
    let nodes: Vec<usize> = graph
        .keys()
        .copied()
        .chain(graph.values().flat_map(|m| m.keys().copied()))
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    let succ = |n: usize| -> Vec<usize> {
        graph
            .get(&n)
            .map_or(vec![], |m| m.keys().copied().collect())
    };
    let mut index: HashMap<usize, usize> = HashMap::new();
    let mut low: HashMap<usize, usize> = HashMap::new();
    let mut on_stack: HashSet<usize> = HashSet::new();
    let mut stack: Vec<usize> = Vec::new();
    let mut components: Vec<Vec<usize>> = Vec::new();
    let mut counter = 0;
    for &root in &nodes {
        if index.contains_key(&root) {
            continue;
        }
        // (node, its successors, next successor position)
        let mut work: Vec<(usize, Vec<usize>, usize)> = vec![(root, succ(root), 0)];
        index.insert(root, counter);
        low.insert(root, counter);
        counter += 1;
        stack.push(root);
        on_stack.insert(root);
        while let Some(top) = work.last_mut() {
            let node = top.0;
            let next = top.1.get(top.2).copied();
            if let Some(w) = next {
                top.2 += 1;
                if let std::collections::hash_map::Entry::Vacant(e) = index.entry(w) {
                    e.insert(counter);
                    low.insert(w, counter);
                    counter += 1;
                    stack.push(w);
                    on_stack.insert(w);
                    work.push((w, succ(w), 0));
                } else if on_stack.contains(&w) {
                    let l = low[&node].min(index[&w]);
                    low.insert(node, l);
                }
            } else {
                work.pop();
                if let Some((parent, _, _)) = work.last() {
                    let l = low[parent].min(low[&node]);
                    low.insert(*parent, l);
                }
                if low[&node] == index[&node] {
                    let mut component = Vec::new();
                    while let Some(w) = stack.pop() {
                        on_stack.remove(&w);
                        component.push(w);
                        if w == node {
                            break;
                        }
                    }
                    if component.len() > 1 {
                        components.push(component);
                    }
                }
            }
        }
    }
    components
        .into_iter()
        .map(|component| cycle_in(graph, &component))
        .collect()
}

/// A cycle through the first node of a strongly connected component (BFS inside it).
fn cycle_in(graph: &BTreeMap<usize, BTreeMap<usize, Edge>>, component: &[usize]) -> Vec<usize> {
    let members: HashSet<usize> = component.iter().copied().collect();
    let start = component[0];
    let mut parent: HashMap<usize, usize> = HashMap::new();
    let mut queue = std::collections::VecDeque::from([start]);
    while let Some(n) = queue.pop_front() {
        for &w in graph.get(&n).map(|m| m.keys()).into_iter().flatten() {
            if !members.contains(&w) {
                continue;
            }
            if w == start {
                let mut path = vec![n];
                let mut cur = n;
                while cur != start {
                    cur = parent[&cur];
                    path.push(cur);
                }
                path.reverse();
                return path;
            }
            if let std::collections::hash_map::Entry::Vacant(e) = parent.entry(w) {
                e.insert(n);
                queue.push_back(w);
            }
        }
    }
    component.to_vec()
}

#[cfg(test)]
#[path = "append_tests.rs"]
mod tests;

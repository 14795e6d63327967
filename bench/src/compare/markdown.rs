//! `results.md`: the comparison as markdown tables, for humans and for pasting into READMEs.
//!
//! ```text
//!   # title, one-paragraph summary of what ran
//!   ## Workload A … E      store | throughput | p50 / p99 per operation kind | errors
//!   ## Load                 the same for the load phases
//!   ## Closed economy       transactions: txn/s, p50 / p99, retries, validation (`economy`)
//!   ## Ratios               Meridian/etcd throughput and p99, Meridian/RocksDB throughput
//!   ## Configuration        counts, machine, load average, commit, store setup
//!   ## Durability           what an acknowledged write means per store
//! ```
//!
//! Operation columns appear only for kinds the workload issued. A phase that did not finish
//! shows its status instead of numbers, and every ratio involving it is `—`.

use std::fmt::Write as _;

use super::{Comparison, PhaseRecord, PhaseStatus, WorkloadId, RUN_ORDER};
use crate::client::Phase;

/// Operation kinds in the order their columns appear.
pub const OPERATION_COLUMNS: [&str; 5] = ["READ", "UPDATE", "INSERT", "SCAN", "READ-MODIFY-WRITE"];
/// Longest error text quoted in a table cell.
const MAX_CELL_ERROR_CHARS: usize = 120;

/// Renders `results.md`.
pub fn render(comparison: &Comparison) -> String {
    let context = &comparison.context;
    let mut out = String::new();
    let _ = writeln!(out, "# YCSB comparison: {}\n", context.stores.join(" vs "));
    let _ = writeln!(
        out,
        "{} records loaded, {} operations per workload, {} client threads for every store; \
         {} CPUs ({}); started {}. Latencies in microseconds; throughput in operations per \
         second (higher is better); p50 / p99 latency (lower is better).\n",
        thousands(context.records),
        thousands(context.operations),
        context.threads,
        context.nproc,
        context.cpu_model.as_deref().unwrap_or("unknown CPU"),
        context.started_at_utc
    );
    let _ = writeln!(
        out,
        "![throughput and p99 latency per workload](chart.svg)\n"
    );

    for workload in RUN_ORDER {
        let rows: Vec<&PhaseRecord> = comparison
            .phases
            .iter()
            .filter(|p| p.workload == workload.letter())
            .collect();
        if rows.is_empty() {
            continue;
        }
        let _ = writeln!(out, "## Workload {workload}: {}\n", workload.mix());
        phase_table(&mut out, &rows);
    }

    let loads: Vec<&PhaseRecord> = comparison.loads.iter().collect();
    if !loads.is_empty() {
        let _ = writeln!(
            out,
            "## Load: insert {} records\n\nData set 1 serves A, B, C, F, D; data set 2 is the \
             fresh reload for E.\n",
            thousands(context.records)
        );
        phase_table(&mut out, &loads);
    }

    if let Some(setup) = &comparison.economy_setup {
        super::economy::render(&mut out, setup, &comparison.economy);
    }
    ratios(&mut out, comparison);
    configuration(&mut out, comparison);
    out
}

/// A table of phases: one row per store.
fn phase_table(out: &mut String, rows: &[&PhaseRecord]) {
    let columns: Vec<&str> = OPERATION_COLUMNS
        .iter()
        .copied()
        .filter(|op| {
            rows.iter()
                .any(|row| row.operation(op).is_some_and(|o| o.operations > 0))
        })
        .collect();
    let with_data_set = rows.iter().any(|row| row.phase == Phase::Load);
    let _ = write!(out, "| store |");
    if with_data_set {
        let _ = write!(out, " data set |");
    }
    let _ = write!(out, " throughput (ops/s) |");
    for op in &columns {
        let _ = write!(out, " {op} p50 / p99 (µs) |");
    }
    let _ = writeln!(out, " errors |");
    let _ = write!(out, "|---|");
    if with_data_set {
        let _ = write!(out, "---:|");
    }
    let _ = write!(out, "---:|");
    for _ in &columns {
        let _ = write!(out, "---:|");
    }
    let _ = writeln!(out, "---:|");
    for row in rows {
        let _ = write!(out, "| {} |", row.store);
        if with_data_set {
            let _ = write!(out, " {} |", row.data_set);
        }
        match row.status {
            PhaseStatus::Ok => {
                let _ = write!(
                    out,
                    " {} |",
                    thousands_f(row.throughput_ops_per_sec.unwrap_or_default())
                );
                for op in &columns {
                    match row.operation(op) {
                        Some(summary) if summary.operations > 0 => {
                            let _ = write!(
                                out,
                                " {} / {} |",
                                opt_us(summary.p50_latency_us),
                                opt_us(summary.p99_latency_us)
                            );
                        }
                        _ => {
                            let _ = write!(out, " — |");
                        }
                    }
                }
                let mut errors = thousands(row.error_count);
                if row.not_found_count > 0 {
                    errors.push_str(&format!(" (+{} not found)", thousands(row.not_found_count)));
                }
                let _ = writeln!(out, " {errors} |");
            }
            PhaseStatus::Failed | PhaseStatus::Skipped => {
                let status = if row.status == PhaseStatus::Failed {
                    "**failed**"
                } else {
                    "skipped"
                };
                let reason = cell_text(row.error.as_deref().unwrap_or(""));
                let _ = write!(out, " {status}: {reason} |");
                for _ in &columns {
                    let _ = write!(out, " — |");
                }
                let _ = writeln!(out, " — |");
            }
        }
    }
    let _ = writeln!(out);
}

/// The ratio of Meridian's value to `other`'s, as `1.23×`.
fn ratio(meridian: Option<f64>, other: Option<f64>) -> String {
    match (meridian, other) {
        (Some(m), Some(o)) if o > 0.0 && m.is_finite() && o.is_finite() => {
            format!("{:.2}×", m / o)
        }
        _ => "—".to_string(),
    }
}

fn p99(record: Option<&PhaseRecord>, op: &str) -> Option<f64> {
    let record = record.filter(|r| r.status == PhaseStatus::Ok)?;
    record
        .operation(op)
        .filter(|summary| summary.operations > 0)
        .and_then(|summary| summary.p99_latency_us)
        .map(|us| us as f64)
}

fn throughput(record: Option<&PhaseRecord>) -> Option<f64> {
    record
        .filter(|r| r.status == PhaseStatus::Ok)
        .and_then(|r| r.throughput_ops_per_sec)
}

fn find<'a>(
    comparison: &'a Comparison,
    store: &str,
    workload: WorkloadId,
) -> Option<&'a PhaseRecord> {
    comparison
        .phases
        .iter()
        .find(|p| p.store == store && p.workload == workload.letter())
}

fn ratios(out: &mut String, comparison: &Comparison) {
    let stores = &comparison.context.stores;
    let has = |name: &str| stores.iter().any(|s| s == name);
    if !has("meridian") || !(has("etcd") || has("rocksdb")) {
        return;
    }
    let _ = writeln!(
        out,
        "## Ratios\n\nThroughput ratio above 1: Meridian is faster. p99 ratio below 1: Meridian's \
         tail latency is lower. \"read op\" is READ (SCAN for E); \"write op\" is UPDATE (A, B), \
         INSERT (D, E) or READ-MODIFY-WRITE (F).\n"
    );
    let mut header = String::from("| workload |");
    let mut rule = String::from("|---|");
    if has("etcd") {
        header.push_str(
            " Meridian/etcd throughput | Meridian/etcd p99 read op | Meridian/etcd p99 write op |",
        );
        rule.push_str("---:|---:|---:|");
    }
    if has("rocksdb") {
        header.push_str(" Meridian/RocksDB throughput |");
        rule.push_str("---:|");
    }
    let _ = writeln!(out, "{header}\n{rule}");
    for workload in RUN_ORDER {
        let meridian = find(comparison, "meridian", workload);
        if meridian.is_none() {
            continue;
        }
        let _ = write!(out, "| {workload} |");
        if has("etcd") {
            let etcd = find(comparison, "etcd", workload);
            let read_op = workload.main_read_op();
            let write = match workload.main_write_op() {
                Some(op) => format!("{} ({op})", ratio(p99(meridian, op), p99(etcd, op))),
                None => "—".to_string(),
            };
            let _ = write!(
                out,
                " {} | {} ({read_op}) | {write} |",
                ratio(throughput(meridian), throughput(etcd)),
                ratio(p99(meridian, read_op), p99(etcd, read_op)),
            );
        }
        if has("rocksdb") {
            let rocksdb = find(comparison, "rocksdb", workload);
            let _ = write!(
                out,
                " {} |",
                ratio(throughput(meridian), throughput(rocksdb))
            );
        }
        let _ = writeln!(out);
    }
    let _ = writeln!(out);
}

fn configuration(out: &mut String, comparison: &Comparison) {
    let context = &comparison.context;
    let _ = writeln!(out, "## Configuration\n");
    let _ = writeln!(
        out,
        "- Command: `bench/run-comparison.sh --records {} --operations {} --threads {} --stores {} \
         --workloads {}`",
        context.records,
        context.operations,
        context.threads,
        context.stores.join(","),
        context.workloads.join(",")
    );
    let _ = writeln!(
        out,
        "- Order: each store alone, one after the other; per store a fresh start, load, A, B, C, \
         F, D, stop; then a fresh start, reload, E, stop. Workload files: `bench/workloads/` \
         (10 fields × 100 bytes per record, zipfian keys except D's latest); per-call deadline \
         {} ms.",
        context.timeout_ms
    );
    let _ = writeln!(
        out,
        "- Machine: {} CPUs, {}, {} RAM, Linux {}",
        context.nproc,
        context.cpu_model.as_deref().unwrap_or("unknown CPU"),
        context
            .memory_total_kib
            .map(|kib| format!("{:.1} GiB", kib as f64 / 1024.0 / 1024.0))
            .unwrap_or_else(|| "unknown".to_string()),
        context.kernel.as_deref().unwrap_or("unknown")
    );
    let _ = writeln!(
        out,
        "- Load average (1/5/15 min): {} before, {} after. Clients and all servers share these \
         CPUs, so anything else running skews the numbers.",
        load_text(context.load_average_before),
        load_text(context.load_average_after)
    );
    let _ = writeln!(
        out,
        "- Time: {} to {} (UTC)",
        context.started_at_utc,
        context.finished_at_utc.as_deref().unwrap_or("unfinished")
    );
    let commit = match (&context.git_commit, context.git_dirty) {
        (Some(commit), Some(true)) => format!("`{commit}` (with uncommitted changes)"),
        (Some(commit), _) => format!("`{commit}`"),
        (None, _) => "unknown".to_string(),
    };
    let _ = writeln!(out, "- Commit: {commit}");
    if let Some(version) = &context.etcd_version {
        let _ = writeln!(out, "- etcd version: {version}");
    }
    let _ = writeln!(out, "- Stores:");
    for (store, setup) in &context.setup {
        let _ = writeln!(out, "  - {store}: {setup}");
    }
    if context.stores.iter().any(|s| s == "etcd") {
        let _ = writeln!(
            out,
            "- etcd and E: a range request with a limit still collects every key from its start \
             to its end in etcd's in-memory index before applying the limit (3.4's \
             `kvindex.Revisions` takes no limit), so each E scan, whose range runs to the end of \
             the table, costs time proportional to the records after its start key, not to the \
             1-100 it returns."
        );
    }
    let _ = writeln!(out, "\n## Durability\n");
    for (store, durability) in &context.durability {
        let _ = writeln!(out, "- **{store}**: {durability}.");
    }
    let _ = writeln!(
        out,
        "\nMeridian and etcd give the same guarantee: an acknowledged write is on disk on a \
         majority of three replicas, and reads are linearizable. Embedded RocksDB has neither \
         replication nor fsync and is the storage engine's upper bound on this machine, not a \
         competitor. Updates are read-modify-writes in every driver (etcd: get + compare-and-swap \
         transaction; Meridian: get + put under a per-key lock in the client; RocksDB: get + put \
         under a striped lock). The per-phase YCSB reports are the `*.txt` files next to this \
         one; `results.json` has every number."
    );
}

fn load_text(load: Option<[f64; 3]>) -> String {
    match load {
        Some([one, five, fifteen]) => format!("{one:.2} / {five:.2} / {fifteen:.2}"),
        None => "unknown".to_string(),
    }
}

fn opt_us(value: Option<u64>) -> String {
    value.map(thousands).unwrap_or_else(|| "—".to_string())
}

/// `1234567` → `1,234,567`.
pub fn thousands(value: u64) -> String {
    let digits = value.to_string();
    let groups: Vec<&str> = digits
        .as_bytes()
        .rchunks(3)
        .rev()
        .map(|group| std::str::from_utf8(group).expect("decimal digits are ASCII"))
        .collect();
    groups.join(",")
}

/// A rate rounded to a whole number, with separators.
pub fn thousands_f(value: f64) -> String {
    if !value.is_finite() || value < 0.0 {
        return format!("{value}");
    }
    thousands(value.round() as u64)
}

/// Error text fit for a table cell: one line, no pipes, bounded length.
pub(super) fn cell_text(text: &str) -> String {
    let one_line: String = text
        .chars()
        .map(|c| match c {
            '\n' | '\r' => ' ',
            '|' => '/',
            c => c,
        })
        .collect();
    if one_line.chars().count() > MAX_CELL_ERROR_CHARS {
        let cut: String = one_line.chars().take(MAX_CELL_ERROR_CHARS).collect();
        format!("{cut}…")
    } else {
        one_line
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Thousands separators and ratio formatting.
    #[test]
    fn number_formatting() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1_000), "1,000");
        assert_eq!(thousands(1_234_567), "1,234,567");
        assert_eq!(thousands_f(1234.6), "1,235");
        assert_eq!(ratio(Some(3.0), Some(2.0)), "1.50×");
        assert_eq!(ratio(Some(3.0), None), "—");
        assert_eq!(ratio(Some(3.0), Some(0.0)), "—");
    }

    /// Errors in cells lose newlines and pipes and are cut to length.
    #[test]
    fn cell_text_is_table_safe() {
        assert_eq!(cell_text("a|b\nc"), "a/b c");
        let long = "x".repeat(500);
        assert_eq!(cell_text(&long).chars().count(), MAX_CELL_ERROR_CHARS + 1);
    }
}

//! Latency measurements: one HdrHistogram (microseconds) per operation, as YCSB's
//! `OneMeasurementHdrHistogram` keeps, plus per-operation return-status counts.
//!
//! Layout: every client thread records into its own [`ThreadRecorder`] (a mutex that only the
//! status printer ever contends for), so recording costs an uncontended lock and a histogram
//! increment. The status printer takes each thread's *interval* histograms and resets them
//! ([`Measurements::interval_summary`]); the final report merges every thread's *total*
//! histograms ([`Measurements::report`]).
//!
//! Naming follows YCSB's `DBWrapper`: a successful operation is measured under its name
//! (`READ`), a failed one under `<name>-FAILED`, and its status (`OK`, `NOT_FOUND`, `ERROR`) is
//! counted under the plain name. Latency measured from the *intended* start time (the throttle's
//! schedule, to expose coordinated omission) goes under `Intended-<name>` when
//! `measurement.interval` is `intended` or `both`.
//!
//! Histograms auto-resize with 3 significant digits, as YCSB's. Not done: YCSB's other
//! measurement types (`histogram`, `timeseries`, `raw`) and HdrHistogram log files.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use hdrhistogram::Histogram;

use crate::report::{OperationReport, PercentileLatency, ReturnCount};

/// Significant digits the histograms keep (YCSB's HdrHistogram measurement uses 3).
pub const HISTOGRAM_SIGNIFICANT_DIGITS: u8 = 3;

/// Operations that get their own measurement, in report order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum OpKind {
    Read,
    Update,
    Insert,
    Scan,
    ReadModifyWrite,
    Delete,
    Cleanup,
}

impl OpKind {
    /// YCSB's measurement name.
    pub fn name(self) -> &'static str {
        match self {
            OpKind::Read => "READ",
            OpKind::Update => "UPDATE",
            OpKind::Insert => "INSERT",
            OpKind::Scan => "SCAN",
            OpKind::ReadModifyWrite => "READ-MODIFY-WRITE",
            OpKind::Delete => "DELETE",
            OpKind::Cleanup => "CLEANUP",
        }
    }
}

/// Which latencies are recorded (YCSB's `measurement.interval`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MeasurementInterval {
    /// From the actual start of each operation.
    Op,
    /// From the intended (scheduled) start.
    Intended,
    /// Both.
    Both,
}

impl MeasurementInterval {
    /// Parses `op`, `intended` or `both`.
    pub fn parse(text: &str) -> Option<Self> {
        match text.trim() {
            "op" => Some(Self::Op),
            "intended" => Some(Self::Intended),
            "both" => Some(Self::Both),
            _ => None,
        }
    }

    fn records_op(self) -> bool {
        matches!(self, Self::Op | Self::Both)
    }

    fn records_intended(self) -> bool {
        matches!(self, Self::Intended | Self::Both)
    }
}

/// Key of one histogram: operation, failed or not, intended-start or not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct SeriesKey {
    intended: bool,
    op: OpKind,
    failed: bool,
}

impl SeriesKey {
    fn name(self) -> String {
        let mut name = String::new();
        if self.intended {
            name.push_str("Intended-");
        }
        name.push_str(self.op.name());
        if self.failed {
            name.push_str("-FAILED");
        }
        name
    }
}

#[derive(Debug, Clone)]
struct Series {
    total: Histogram<u64>,
    interval: Histogram<u64>,
    statuses: BTreeMap<&'static str, u64>,
}

fn new_histogram() -> Histogram<u64> {
    Histogram::new(HISTOGRAM_SIGNIFICANT_DIGITS)
        .expect("3 significant digits is a valid histogram configuration")
}

/// Records a value, growing the histogram as needed. (`saturating_record` would NOT grow an
/// auto-resizing histogram: it clamps to the initial range, about 2 ms, and corrupts the tail.)
fn record_latency(histogram: &mut Histogram<u64>, value_us: u64) {
    if histogram.record(value_us).is_err() {
        // Only values beyond what a u64-indexed histogram can grow to get here.
        histogram.saturating_record(value_us);
    }
}

impl Series {
    fn new() -> Self {
        Self {
            total: new_histogram(),
            interval: new_histogram(),
            statuses: BTreeMap::new(),
        }
    }
}

#[derive(Debug, Default)]
struct ThreadSeries {
    series: BTreeMap<SeriesKey, Series>,
}

impl ThreadSeries {
    fn series(&mut self, key: SeriesKey) -> &mut Series {
        self.series.entry(key).or_insert_with(Series::new)
    }
}

/// One client thread's recorder.
#[derive(Debug, Clone)]
pub struct ThreadRecorder {
    inner: Arc<Mutex<ThreadSeries>>,
    interval: MeasurementInterval,
}

fn lock(series: &Mutex<ThreadSeries>) -> MutexGuard<'_, ThreadSeries> {
    // Histograms stay consistent even if a recording thread panicked mid-way.
    series
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl ThreadRecorder {
    /// Records one operation's latencies (actual and intended start) under its name or its
    /// `-FAILED` name.
    pub fn measure(&self, op: OpKind, failed: bool, latency_us: u64, intended_latency_us: u64) {
        let mut guard = lock(&self.inner);
        if self.interval.records_op() {
            let series = guard.series(SeriesKey {
                intended: false,
                op,
                failed,
            });
            record_latency(&mut series.total, latency_us);
            record_latency(&mut series.interval, latency_us);
        }
        if self.interval.records_intended() {
            let series = guard.series(SeriesKey {
                intended: true,
                op,
                failed,
            });
            record_latency(&mut series.total, intended_latency_us);
            record_latency(&mut series.interval, intended_latency_us);
        }
    }

    /// Counts a return status under the operation's plain name.
    pub fn report_status(&self, op: OpKind, status: &'static str) {
        let mut guard = lock(&self.inner);
        let series = guard.series(SeriesKey {
            intended: false,
            op,
            failed: false,
        });
        *series.statuses.entry(status).or_insert(0) += 1;
    }
}

/// All threads' measurements.
#[derive(Debug)]
pub struct Measurements {
    threads: Mutex<Vec<Arc<Mutex<ThreadSeries>>>>,
    interval: MeasurementInterval,
    percentiles: Vec<f64>,
}

impl Measurements {
    /// Measurements that record `interval` latencies and report `percentiles` (0..=100).
    pub fn new(interval: MeasurementInterval, percentiles: Vec<f64>) -> Self {
        Self {
            threads: Mutex::new(Vec::new()),
            interval,
            percentiles,
        }
    }

    /// A recorder for one more client thread.
    pub fn recorder(&self) -> ThreadRecorder {
        let inner = Arc::new(Mutex::new(ThreadSeries::default()));
        self.threads
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .push(Arc::clone(&inner));
        ThreadRecorder {
            inner,
            interval: self.interval,
        }
    }

    fn merged(&self, take_interval: bool) -> BTreeMap<SeriesKey, Series> {
        let threads = self
            .threads
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone();
        let mut merged: BTreeMap<SeriesKey, Series> = BTreeMap::new();
        for thread in threads {
            let mut guard = lock(&thread);
            for (key, series) in guard.series.iter_mut() {
                let target = merged.entry(*key).or_insert_with(Series::new);
                if take_interval {
                    // Histograms auto-resize, so adding cannot fail on range.
                    let _ = target.interval.add(&series.interval);
                    series.interval.reset();
                } else {
                    let _ = target.total.add(&series.total);
                    for (status, count) in &series.statuses {
                        *target.statuses.entry(status).or_insert(0) += count;
                    }
                }
            }
        }
        merged
    }

    /// The status-line summary of the interval since the last call, in YCSB's format
    /// (`[READ: Count=.., Max=.., Min=.., Avg=.., 90=.., 99=.., 99.9=.., 99.99=..]`), and resets
    /// the interval histograms.
    pub fn interval_summary(&self) -> String {
        let mut out = String::new();
        for (key, series) in self.merged(true) {
            let histogram = &series.interval;
            if histogram.is_empty() {
                continue;
            }
            out.push_str(&format!(
                "[{}: Count={}, Max={}, Min={}, Avg={}, 90={}, 99={}, 99.9={}, 99.99={}] ",
                key.name(),
                histogram.len(),
                histogram.max(),
                histogram.min(),
                decimal_2(histogram.mean()),
                histogram.value_at_percentile(90.0),
                histogram.value_at_percentile(99.0),
                histogram.value_at_percentile(99.9),
                histogram.value_at_percentile(99.99),
            ));
        }
        out.trim_end().to_string()
    }

    /// Per-measurement totals for the final report, in report order.
    pub fn report(&self) -> Vec<OperationReport> {
        self.merged(false)
            .into_iter()
            .map(|(key, series)| {
                let histogram = &series.total;
                let empty = histogram.is_empty();
                OperationReport {
                    name: key.name(),
                    operations: histogram.len(),
                    average_latency_us: if empty { 0.0 } else { histogram.mean() },
                    min_latency_us: if empty { 0 } else { histogram.min() },
                    max_latency_us: if empty { 0 } else { histogram.max() },
                    percentiles: self
                        .percentiles
                        .iter()
                        .map(|percentile| PercentileLatency {
                            percentile: *percentile,
                            latency_us: if empty {
                                0
                            } else {
                                histogram.value_at_percentile(*percentile)
                            },
                        })
                        .collect(),
                    return_counts: ordered_statuses(&series.statuses),
                }
            })
            .collect()
    }
}

/// `OK` first, then the other statuses by name.
fn ordered_statuses(statuses: &BTreeMap<&'static str, u64>) -> Vec<ReturnCount> {
    let mut out: Vec<ReturnCount> = statuses
        .iter()
        .map(|(status, count)| ReturnCount {
            status: (*status).to_string(),
            count: *count,
        })
        .collect();
    out.sort_by_key(|entry| (entry.status != "OK", entry.status.clone()));
    out
}

/// Java's `new DecimalFormat("#.##").format(x)`: at most two decimals, no trailing zeros.
pub fn decimal_2(value: f64) -> String {
    if !value.is_finite() {
        return value.to_string();
    }
    let text = format!("{value:.2}");
    let text = text.trim_end_matches('0').trim_end_matches('.');
    if text == "-0" {
        "0".to_string()
    } else {
        text.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Successes, failures, statuses and intended latencies land in the right series and merge
    /// across threads.
    #[test]
    fn records_and_merges_series() {
        let measurements = Measurements::new(MeasurementInterval::Both, vec![50.0, 99.0]);
        let first = measurements.recorder();
        let second = measurements.recorder();
        first.measure(OpKind::Read, false, 100, 150);
        first.report_status(OpKind::Read, "OK");
        second.measure(OpKind::Read, false, 300, 300);
        second.report_status(OpKind::Read, "OK");
        second.measure(OpKind::Read, true, 50, 50);
        second.report_status(OpKind::Read, "NOT_FOUND");
        let report = measurements.report();
        let names: Vec<&str> = report.iter().map(|entry| entry.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "READ",
                "READ-FAILED",
                "Intended-READ",
                "Intended-READ-FAILED"
            ]
        );
        assert_eq!(report[0].operations, 2);
        assert_eq!(report[0].min_latency_us, 100);
        assert_eq!(report[0].return_counts.len(), 2);
        assert_eq!(report[0].return_counts[0].status, "OK");
        assert_eq!(report[0].return_counts[0].count, 2);
        assert_eq!(report[0].return_counts[1].status, "NOT_FOUND");
        assert_eq!(report[2].min_latency_us, 150);
    }

    /// Interval summaries reset between calls while totals keep accumulating.
    #[test]
    fn interval_summary_resets() {
        let measurements = Measurements::new(MeasurementInterval::Op, vec![99.0]);
        let recorder = measurements.recorder();
        recorder.measure(OpKind::Update, false, 10, 10);
        let summary = measurements.interval_summary();
        assert!(
            summary.starts_with("[UPDATE: Count=1, Max=10, Min=10, Avg=10,"),
            "{summary}"
        );
        assert_eq!(measurements.interval_summary(), "");
        assert_eq!(measurements.report()[0].operations, 1);
    }

    /// Latencies far beyond the histogram's initial range are kept, not clamped.
    #[test]
    fn large_latencies_are_not_clamped() {
        let measurements = Measurements::new(MeasurementInterval::Op, vec![50.0, 99.0]);
        let recorder = measurements.recorder();
        for latency_us in [5_000, 250_000, 10_000_000] {
            recorder.measure(OpKind::Read, false, latency_us, latency_us);
        }
        let report = measurements.report();
        assert!((4_995..=5_000).contains(&report[0].min_latency_us));
        // 3 significant digits: within 0.1%.
        let max = report[0].max_latency_us as f64;
        assert!(
            (max - 10_000_000.0).abs() / 10_000_000.0 < 0.001,
            "max {max}"
        );
        let median = report[0].percentiles[0].latency_us as f64;
        assert!(
            (median - 250_000.0).abs() / 250_000.0 < 0.001,
            "median {median}"
        );
    }

    /// DecimalFormat("#.##") drops trailing zeros.
    #[test]
    fn decimal_format() {
        assert_eq!(decimal_2(12.0), "12");
        assert_eq!(decimal_2(12.345), "12.35");
        assert_eq!(decimal_2(0.1), "0.1");
    }
}

//! `chart.svg`: the comparison as two panels of grouped bars, written by hand (no plotting
//! dependency).
//!
//! ```text
//!   ┌ Throughput (ops/s, log scale) ───────────────┐   legend: one colour per store
//!   │  ▇▅▂   ▇▅▂   ▇▅▂   ...   one group per workload, one bar per store
//!   └───────────────────────────────────────────────┘
//!   ┌ p99 latency of the read op (µs, log scale) ───┐   READ, or SCAN for E
//!   └───────────────────────────────────────────────┘
//! ```
//!
//! Both axes are logarithmic with a grid line per decade, because embedded RocksDB is one to
//! two orders of magnitude faster than the replicated stores and a linear axis would flatten
//! them. Every bar carries its value; a phase that did not finish is marked `n/a`.

use std::fmt::Write as _;

use super::{Comparison, PhaseStatus, WorkloadId, RUN_ORDER};

/// Canvas width in pixels.
pub const WIDTH_PX: f64 = 960.0;
/// Height of one panel's plot area in pixels.
const PLOT_HEIGHT_PX: f64 = 230.0;
/// Left margin (axis labels).
const MARGIN_LEFT_PX: f64 = 80.0;
/// Right margin.
const MARGIN_RIGHT_PX: f64 = 20.0;
/// Top of the first panel's plot area.
const FIRST_PLOT_TOP_PX: f64 = 90.0;
/// Vertical distance between the two plot areas' tops.
const PANEL_STRIDE_PX: f64 = PLOT_HEIGHT_PX + 110.0;
/// Colours of the stores, in `--stores` order; known stores keep their colour.
const PALETTE: [&str; 4] = ["#2b6cb0", "#dd6b20", "#718096", "#38a169"];

fn store_colour(store: &str, index: usize) -> &'static str {
    match store {
        "meridian" => PALETTE[0],
        "etcd" => PALETTE[1],
        "rocksdb" => PALETTE[2],
        _ => PALETTE[index % PALETTE.len()],
    }
}

fn short_mix(workload: WorkloadId) -> &'static str {
    match workload {
        WorkloadId::A => "read/update 50/50",
        WorkloadId::B => "read/update 95/5",
        WorkloadId::C => "read only",
        WorkloadId::D => "read latest/insert",
        WorkloadId::E => "scan/insert 95/5",
        WorkloadId::F => "read/RMW 50/50",
    }
}

/// One panel's data: per workload, per store, a value if the phase finished.
struct Panel {
    title: String,
    values: Vec<(WorkloadId, Vec<Option<f64>>)>,
    format: fn(f64) -> String,
}

/// Renders `chart.svg`.
pub fn render(comparison: &Comparison) -> String {
    let stores = &comparison.context.stores;
    let workloads: Vec<WorkloadId> = RUN_ORDER
        .iter()
        .copied()
        .filter(|w| comparison.phases.iter().any(|p| p.workload == w.letter()))
        .collect();
    let value =
        |store: &str, workload: WorkloadId, pick: &dyn Fn(&super::PhaseRecord) -> Option<f64>| {
            comparison
                .phases
                .iter()
                .find(|p| p.store == store && p.workload == workload.letter())
                .filter(|p| p.status == PhaseStatus::Ok)
                .and_then(pick)
                .filter(|v| v.is_finite() && *v > 0.0)
        };
    let throughput = Panel {
        title: "Throughput (operations/s, log scale) — higher is better".to_string(),
        values: workloads
            .iter()
            .map(|w| {
                let row = stores
                    .iter()
                    .map(|s| value(s, *w, &|p| p.throughput_ops_per_sec))
                    .collect();
                (*w, row)
            })
            .collect(),
        format: format_rate,
    };
    let latency = Panel {
        title: "p99 latency of the read operation (READ; SCAN for E), log scale — lower is better"
            .to_string(),
        values: workloads
            .iter()
            .map(|w| {
                let op = w.main_read_op();
                let row = stores
                    .iter()
                    .map(|s| {
                        value(s, *w, &|p| {
                            p.operation(op)
                                .filter(|o| o.operations > 0)
                                .and_then(|o| o.p99_latency_us)
                                .map(|us| us as f64)
                        })
                    })
                    .collect();
                (*w, row)
            })
            .collect(),
        format: format_micros,
    };

    let height = FIRST_PLOT_TOP_PX + PANEL_STRIDE_PX + PLOT_HEIGHT_PX + 60.0;
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH_PX}" height="{height}" viewBox="0 0 {WIDTH_PX} {height}" font-family="Helvetica, Arial, sans-serif">"#
    );
    let _ = writeln!(
        svg,
        r##"<rect x="0" y="0" width="{WIDTH_PX}" height="{height}" fill="#ffffff"/>"##
    );
    let context = &comparison.context;
    let _ = writeln!(
        svg,
        r##"<text x="{MARGIN_LEFT_PX}" y="28" font-size="18" font-weight="bold" fill="#1a202c">{}</text>"##,
        escape(&format!("YCSB: {}", stores.join(" vs ")))
    );
    let _ = writeln!(
        svg,
        r##"<text x="{MARGIN_LEFT_PX}" y="48" font-size="12" fill="#4a5568">{}</text>"##,
        escape(&format!(
            "{} records, {} operations per workload, {} threads, {} CPUs, {}",
            context.records,
            context.operations,
            context.threads,
            context.nproc,
            context.started_at_utc
        ))
    );
    legend(&mut svg, stores);
    draw_panel(&mut svg, &throughput, stores, FIRST_PLOT_TOP_PX);
    draw_panel(
        &mut svg,
        &latency,
        stores,
        FIRST_PLOT_TOP_PX + PANEL_STRIDE_PX,
    );
    let _ = writeln!(svg, "</svg>");
    svg
}

fn legend(svg: &mut String, stores: &[String]) {
    let mut x = WIDTH_PX - MARGIN_RIGHT_PX - 110.0 * stores.len() as f64;
    for (index, store) in stores.iter().enumerate() {
        let _ = writeln!(
            svg,
            r##"<rect x="{x}" y="18" width="14" height="14" fill="{}"/><text x="{}" y="30" font-size="13" fill="#1a202c">{}</text>"##,
            store_colour(store, index),
            x + 20.0,
            escape(store)
        );
        x += 110.0;
    }
}

/// The decade range `[10^lo, 10^hi]` covering every value (at least one decade).
fn decades(values: impl Iterator<Item = f64>) -> (i32, i32) {
    let (mut min, mut max) = (f64::INFINITY, 0.0f64);
    for v in values {
        min = min.min(v);
        max = max.max(v);
    }
    if !min.is_finite() || max <= 0.0 {
        return (0, 1);
    }
    let lo = min.log10().floor() as i32;
    let mut hi = max.log10().ceil() as i32;
    if hi <= lo {
        hi = lo + 1;
    }
    (lo, hi)
}

fn draw_panel(svg: &mut String, panel: &Panel, stores: &[String], top: f64) {
    let left = MARGIN_LEFT_PX;
    let right = WIDTH_PX - MARGIN_RIGHT_PX;
    let bottom = top + PLOT_HEIGHT_PX;
    let (lo, hi) = decades(
        panel
            .values
            .iter()
            .flat_map(|(_, row)| row.iter().flatten().copied()),
    );
    let y_of = |v: f64| {
        let fraction = (v.log10() - f64::from(lo)) / f64::from(hi - lo);
        bottom - fraction.clamp(0.0, 1.0) * PLOT_HEIGHT_PX
    };
    let _ = writeln!(
        svg,
        r##"<text x="{left}" y="{}" font-size="14" font-weight="bold" fill="#1a202c">{}</text>"##,
        top - 14.0,
        escape(&panel.title)
    );
    for decade in lo..=hi {
        let v = 10f64.powi(decade);
        let y = y_of(v);
        let _ = writeln!(
            svg,
            r##"<line x1="{left}" y1="{y:.1}" x2="{right}" y2="{y:.1}" stroke="#e2e8f0" stroke-width="1"/><text x="{}" y="{:.1}" font-size="11" text-anchor="end" fill="#4a5568">{}</text>"##,
            left - 6.0,
            y + 4.0,
            escape(&(panel.format)(v))
        );
    }
    let _ = writeln!(
        svg,
        r##"<line x1="{left}" y1="{bottom}" x2="{right}" y2="{bottom}" stroke="#2d3748" stroke-width="1"/><line x1="{left}" y1="{top}" x2="{left}" y2="{bottom}" stroke="#2d3748" stroke-width="1"/>"##
    );
    let groups = panel.values.len().max(1) as f64;
    let group_width = (right - left) / groups;
    let bars = stores.len().max(1) as f64;
    let bar_width = (group_width * 0.8 / bars).min(60.0);
    for (group, (workload, row)) in panel.values.iter().enumerate() {
        let group_left = left + group_width * group as f64;
        let bars_left = group_left + (group_width - bar_width * bars) / 2.0;
        for (index, value) in row.iter().enumerate() {
            let x = bars_left + bar_width * index as f64;
            let centre = x + bar_width / 2.0;
            match value {
                Some(v) => {
                    let y = y_of(*v);
                    let _ = writeln!(
                        svg,
                        r##"<rect x="{:.1}" y="{y:.1}" width="{:.1}" height="{:.1}" fill="{}"><title>{}: {}</title></rect><text x="{centre:.1}" y="{:.1}" font-size="10" text-anchor="middle" fill="#1a202c">{}</text>"##,
                        x + 1.0,
                        bar_width - 2.0,
                        (bottom - y).max(0.5),
                        store_colour(&stores[index], index),
                        escape(&stores[index]),
                        escape(&(panel.format)(*v)),
                        y - 4.0,
                        escape(&(panel.format)(*v))
                    );
                }
                None => {
                    let _ = writeln!(
                        svg,
                        r##"<text x="{centre:.1}" y="{:.1}" font-size="10" text-anchor="middle" fill="#a0aec0">n/a</text>"##,
                        bottom - 4.0
                    );
                }
            }
        }
        let centre = group_left + group_width / 2.0;
        let _ = writeln!(
            svg,
            r##"<text x="{centre:.1}" y="{:.1}" font-size="13" font-weight="bold" text-anchor="middle" fill="#1a202c">Workload {workload}</text><text x="{centre:.1}" y="{:.1}" font-size="10" text-anchor="middle" fill="#4a5568">{}</text>"##,
            bottom + 18.0,
            bottom + 32.0,
            escape(short_mix(*workload))
        );
    }
}

/// `12345.6` → `12.3k`.
pub fn format_rate(value: f64) -> String {
    if value >= 1e6 {
        trim(format!("{:.1}", value / 1e6)) + "M"
    } else if value >= 1e3 {
        trim(format!("{:.1}", value / 1e3)) + "k"
    } else {
        format!("{value:.0}")
    }
}

/// Microseconds as `850µs`, `12.3ms` or `1.2s`.
pub fn format_micros(value: f64) -> String {
    if value >= 1e6 {
        trim(format!("{:.1}", value / 1e6)) + "s"
    } else if value >= 1e3 {
        trim(format!("{:.1}", value / 1e3)) + "ms"
    } else {
        format!("{value:.0}µs")
    }
}

fn trim(text: String) -> String {
    text.strip_suffix(".0").map(str::to_string).unwrap_or(text)
}

/// Escapes text for SVG (XML) content and attributes.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Axis labels are compact and the decade range covers every value.
    #[test]
    fn labels_and_decades() {
        assert_eq!(format_rate(950.0), "950");
        assert_eq!(format_rate(12_345.0), "12.3k");
        assert_eq!(format_rate(1_000.0), "1k");
        assert_eq!(format_rate(2_500_000.0), "2.5M");
        assert_eq!(format_micros(850.0), "850µs");
        assert_eq!(format_micros(12_300.0), "12.3ms");
        assert_eq!(format_micros(1_000_000.0), "1s");
        assert_eq!(decades([150.0, 42_000.0].into_iter()), (2, 5));
        assert_eq!(decades([100.0].into_iter()), (2, 3));
        assert_eq!(decades(std::iter::empty()), (0, 1));
        assert_eq!(escape("a<b & \"c\""), "a&lt;b &amp; &quot;c&quot;");
    }
}

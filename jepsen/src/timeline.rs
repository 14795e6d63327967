//! A history rendered as a self-contained SVG timeline.
//!
//! # What
//! [`render_svg`] draws one horizontal lane per client process and, in it, one bar per
//! operation from invoke to completion, coloured by outcome (ok green, fail red, info orange;
//! an op that never completed runs to the end of the chart with a dashed outline). Hovering a
//! bar shows its details through an SVG `<title>`: index, process, f, key, value, outcome,
//! latency, node and error. Nemesis activity (partitions, kills, clock skew...) is drawn as
//! shaded, labelled intervals behind the lanes. Below, a scatter plot shows each completed op's
//! latency against its invoke time, in the same colours and on the same time axis, so latency
//! spikes line up with the faults above them.
//!
//! # Why
//! A verdict says *that* something went wrong; the timeline shows *when* and *around what*. It
//! must open anywhere (a CI artifact, a browser on a laptop), so it has no scripts, no fonts
//! and no external references.
//!
//! # Invariants
//! - All text from the history is XML-escaped ([`escape_xml`]).
//! - Rendering never fails: malformed pairings (a completion without an invoke) are skipped,
//!   not reported; validating is the checkers' job.
//! - Output is deterministic for a given input.
//!
//! # Not done yet
//! No zooming or paging (a very long run becomes a dense picture), and no highlighting of a
//! checker's witness ops.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write;

use serde::{Deserialize, Serialize};

use crate::history::{History, Op, OpKind};

/// A period of fault injection to shade on the timeline.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NemesisInterval {
    /// Start, in the history's `time_ns` clock.
    pub start_ns: u64,
    /// End, in the history's `time_ns` clock.
    pub end_ns: u64,
    /// What the nemesis did (e.g. `"partition n1 | n2 n3"`).
    pub label: String,
}

impl From<(u64, u64, String)> for NemesisInterval {
    fn from((start_ns, end_ns, label): (u64, u64, String)) -> Self {
        NemesisInterval {
            start_ns,
            end_ns,
            label,
        }
    }
}

/// Layout knobs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TimelineOptions {
    /// Width of the plotting area in pixels (the SVG adds margins).
    pub width: u32,
    /// Height of one process lane.
    pub lane_height: u32,
    /// Height of the latency scatter.
    pub latency_height: u32,
    /// Title drawn at the top.
    pub title: Option<String>,
}

impl Default for TimelineOptions {
    fn default() -> Self {
        TimelineOptions {
            width: 1200,
            lane_height: 16,
            latency_height: 160,
            title: None,
        }
    }
}

/// Escapes `&`, `<`, `>`, `"` and `'` for XML text and attributes.
pub fn escape_xml(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
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

fn colour(kind: OpKind) -> &'static str {
    match kind {
        OpKind::Ok => "#2e9e44",
        OpKind::Fail => "#d03b3b",
        _ => "#f0a020",
    }
}

/// Invoke/completion pairs, leniently (see the module invariants).
fn lenient_pairs(history: &History) -> Vec<(&Op, Option<&Op>)> {
    let mut open: HashMap<u64, usize> = HashMap::new();
    let mut out: Vec<(&Op, Option<&Op>)> = Vec::new();
    for op in &history.ops {
        if op.kind == OpKind::Invoke {
            open.insert(op.process, out.len());
            out.push((op, None));
        } else if let Some(slot) = open.remove(&op.process) {
            out[slot].1 = Some(op);
        }
    }
    out
}

const LEFT: f64 = 70.0;
const TOP: f64 = 40.0;
const GAP: f64 = 50.0;

/// Renders `history` (with `nemesis` intervals shaded) as a standalone SVG document.
pub fn render_svg(
    history: &History,
    nemesis: &[NemesisInterval],
    opts: &TimelineOptions,
) -> String {
    let pairs = lenient_pairs(history);
    let t0 = history.ops.iter().map(|o| o.time_ns).min().unwrap_or(0);
    let t1 = history
        .ops
        .iter()
        .map(|o| o.time_ns)
        .chain(nemesis.iter().map(|n| n.end_ns))
        .max()
        .unwrap_or(0)
        .max(t0 + 1);
    let width = f64::from(opts.width.max(100));
    let lane_h = f64::from(opts.lane_height.max(4));
    let x = |t: u64| LEFT + (t.saturating_sub(t0) as f64 / (t1 - t0) as f64).min(1.0) * width;

    let mut lanes: BTreeMap<u64, usize> = BTreeMap::new();
    for (inv, _) in &pairs {
        lanes.insert(inv.process, 0);
    }
    for (i, lane) in lanes.values_mut().enumerate() {
        *lane = i;
    }
    let lanes_h = lane_h * lanes.len().max(1) as f64;
    let lat_top = TOP + lanes_h + GAP;
    let lat_h = f64::from(opts.latency_height.max(40));
    let total_w = LEFT + width + 20.0;
    let total_h = lat_top + lat_h + 40.0;

    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{total_w:.0}" height="{total_h:.0}" viewBox="0 0 {total_w:.0} {total_h:.0}" font-family="sans-serif" font-size="11">"#
    );
    s.push_str("<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n");
    if let Some(title) = &opts.title {
        let _ = writeln!(
            s,
            r#"<text x="{LEFT}" y="20" font-size="14">{}</text>"#,
            escape_xml(title)
        );
    }

    // Nemesis intervals behind everything else, across lanes and the scatter.
    for n in nemesis {
        let (a, b) = (x(n.start_ns), x(n.end_ns.max(n.start_ns)));
        let label = escape_xml(&n.label);
        let _ = writeln!(
            s,
            r##"<g><title>{label}</title><rect x="{a:.1}" y="{TOP}" width="{:.1}" height="{:.1}" fill="#7a5cc2" fill-opacity="0.15"/><text x="{:.1}" y="{:.1}" fill="#5a3ca2">{label}</text></g>"##,
            (b - a).max(1.0),
            lat_top + lat_h - TOP,
            a + 2.0,
            TOP - 4.0
        );
    }

    // Lanes and labels.
    for (p, &i) in &lanes {
        let y = TOP + i as f64 * lane_h;
        if i % 2 == 1 {
            let _ = writeln!(
                s,
                r##"<rect x="{LEFT}" y="{y:.1}" width="{width:.1}" height="{lane_h:.1}" fill="#000" fill-opacity="0.03"/>"##
            );
        }
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="end">p{p}</text>"#,
            LEFT - 6.0,
            y + lane_h * 0.75
        );
    }

    // One bar per op.
    for (inv, done) in &pairs {
        let y = TOP + lanes[&inv.process] as f64 * lane_h + 2.0;
        let kind = done.map_or(OpKind::Info, |d| d.kind);
        let end = done.map_or(t1, |d| d.time_ns);
        let (a, b) = (x(inv.time_ns), x(end));
        let dash = if done.is_none() {
            r##" stroke="#a06000" stroke-dasharray="3,2""##
        } else {
            ""
        };
        let _ = writeln!(
            s,
            r#"<rect x="{a:.1}" y="{y:.1}" width="{:.1}" height="{:.1}" fill="{}"{dash}><title>{}</title></rect>"#,
            (b - a).max(1.0),
            lane_h - 4.0,
            colour(kind),
            escape_xml(&describe(inv, *done))
        );
    }

    // Time axis under the lanes.
    let axis_y = TOP + lanes_h + 4.0;
    for i in 0..=5u64 {
        let t = t0 + (t1 - t0) * i / 5;
        let xi = x(t);
        let _ = writeln!(
            s,
            r##"<line x1="{xi:.1}" y1="{TOP}" x2="{xi:.1}" y2="{:.1}" stroke="#ccc"/><text x="{xi:.1}" y="{:.1}" text-anchor="middle">{:.3}s</text>"##,
            axis_y,
            axis_y + 12.0,
            (t - t0) as f64 / 1e9
        );
    }

    // Latency scatter.
    let lats: Vec<(u64, u64, OpKind)> = pairs
        .iter()
        .filter_map(|(inv, done)| {
            done.map(|d| (inv.time_ns, d.time_ns.saturating_sub(inv.time_ns), d.kind))
        })
        .collect();
    let max_lat = lats.iter().map(|l| l.1).max().unwrap_or(0).max(1);
    let _ = writeln!(
        s,
        r##"<rect x="{LEFT}" y="{lat_top:.1}" width="{width:.1}" height="{lat_h:.1}" fill="none" stroke="#999"/>"##
    );
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{:.1}ms</text><text x="{:.1}" y="{:.1}" text-anchor="end">0</text><text x="{LEFT}" y="{:.1}">latency by invoke time</text>"#,
        LEFT - 6.0,
        lat_top + 10.0,
        max_lat as f64 / 1e6,
        LEFT - 6.0,
        lat_top + lat_h,
        lat_top - 6.0
    );
    for (t, lat, kind) in lats {
        let cy = lat_top + lat_h - (lat as f64 / max_lat as f64) * (lat_h - 4.0) - 2.0;
        let _ = writeln!(
            s,
            r#"<circle cx="{:.1}" cy="{cy:.1}" r="1.6" fill="{}"/>"#,
            x(t),
            colour(kind)
        );
    }
    s.push_str("</svg>\n");
    s
}

/// The hover text of one op.
fn describe(inv: &Op, done: Option<&Op>) -> String {
    let mut d = format!("op {} p{} {}", inv.index, inv.process, inv.f);
    if let Some(k) = &inv.key {
        let _ = write!(d, " {k}");
    }
    if !inv.value.is_null() {
        let _ = write!(d, " {}", inv.value);
    }
    match done {
        None => d.push_str(" -> never completed (info)"),
        Some(c) => {
            let _ = write!(d, " -> {:?}", c.kind);
            if !c.value.is_null() {
                let _ = write!(d, " {}", c.value);
            }
            let _ = write!(
                d,
                " in {:.3}ms",
                c.time_ns.saturating_sub(inv.time_ns) as f64 / 1e6
            );
            if let Some(n) = &c.node {
                let _ = write!(d, " @{n}");
            }
            if let Some(e) = &c.error {
                let _ = write!(d, " ({e})");
            }
        }
    }
    d
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::OpFn;
    use crate::sim::{simulate_register, SimConfig};
    use serde_json::json;

    /// Special characters are escaped, including quotes for attributes.
    #[test]
    fn escapes_xml() {
        assert_eq!(
            escape_xml(r#"<a href="x">&'</a>"#),
            "&lt;a href=&quot;x&quot;&gt;&amp;&apos;&lt;/a&gt;"
        );
    }

    /// Each op becomes one bar in its outcome's colour, with an escaped hover title.
    #[test]
    fn renders_bars_titles_and_colours() {
        let mut h = History::new();
        h.invoke(0, OpFn::Write, Some("k<1>"), json!("a&b"));
        h.invoke(1, OpFn::Read, Some("k<1>"), serde_json::Value::Null);
        h.complete(0, OpKind::Ok, json!("a&b"));
        h.complete(1, OpKind::Fail, serde_json::Value::Null);
        h.invoke(1, OpFn::Read, Some("k<1>"), serde_json::Value::Null);
        let svg = render_svg(
            &h,
            &[],
            &TimelineOptions {
                title: Some("t & t".into()),
                ..Default::default()
            },
        );
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<title>op ").count(), 3);
        assert!(svg.contains("k&lt;1&gt;") && svg.contains("a&amp;b") && svg.contains("t &amp; t"));
        assert!(!svg.contains("k<1>") && !svg.contains("a&b"));
        assert!(svg.contains(colour(OpKind::Ok)) && svg.contains(colour(OpKind::Fail)));
        assert!(
            svg.contains("stroke-dasharray"),
            "never-completed op is dashed"
        );
        assert_eq!(
            svg.matches("<circle").count(),
            2,
            "one latency point per completed op"
        );
    }

    /// Nemesis intervals are shaded and labelled; tuples convert into intervals.
    #[test]
    fn renders_nemesis_intervals() {
        let h = simulate_register(&SimConfig::default(), 1);
        let end = h.ops.last().unwrap().time_ns;
        let n: Vec<NemesisInterval> = vec![(end / 4, end / 2, "partition <n1>".to_owned()).into()];
        let svg = render_svg(&h, &n, &TimelineOptions::default());
        assert!(svg.contains("<title>partition &lt;n1&gt;</title>"));
        assert!(svg.contains("fill-opacity=\"0.15\""));
        assert_eq!(
            svg,
            render_svg(&h, &n, &TimelineOptions::default()),
            "deterministic"
        );
    }

    /// An empty or malformed history still renders.
    #[test]
    fn tolerates_empty_and_malformed_histories() {
        assert!(render_svg(&History::new(), &[], &TimelineOptions::default()).contains("</svg>"));
        let mut h = History::new();
        h.complete(3, OpKind::Ok, json!(1));
        assert!(render_svg(&h, &[], &TimelineOptions::default()).contains("</svg>"));
    }
}

//! The final report: YCSB's text format, its parser, and the JSON form.
//!
//! Text, one measurement per line, exactly as YCSB's `TextMeasurementsExporter` writes it:
//!
//! ```text
//! [OVERALL], RunTime(ms), 10234
//! [OVERALL], Throughput(ops/sec), 9771.350400625366
//! [READ], Operations, 50123
//! [READ], AverageLatency(us), 412.87
//! [READ], MinLatency(us), 98
//! [READ], MaxLatency(us), 23455
//! [READ], 50thPercentileLatency(us), 377
//! [READ], 95thPercentileLatency(us), 702
//! [READ], 99thPercentileLatency(us), 1201
//! [READ], Return=OK, 50123
//! ```
//!
//! Integers print as Java longs, fractions as Java's `Double.toString` ([`java_double`]), and
//! percentile labels with YCSB's ordinal suffixes (`50th`, `99.9`). Java YCSB's JVM garbage
//! collector lines (`[TOTAL_GCS_...]`) have no equivalent here and are not written.
//!
//! [`parse_text`] reads this format back (also from Java YCSB output: lines it does not know are
//! skipped), so `render → parse` is the identity ([`Report`] equality).

use serde::{Deserialize, Serialize};

/// Errors parsing a text report.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ReportError {
    #[error("line {line}: {reason}")]
    BadLine { line: usize, reason: String },
    #[error("report has no [OVERALL], {0} line")]
    MissingOverall(&'static str),
}

/// Latency at one percentile.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PercentileLatency {
    pub percentile: f64,
    pub latency_us: u64,
}

/// Count of one return status (`OK`, `NOT_FOUND`, `ERROR`, ...).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReturnCount {
    pub status: String,
    pub count: u64,
}

/// One measurement (`READ`, `UPDATE-FAILED`, `Intended-READ`, ...).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OperationReport {
    pub name: String,
    pub operations: u64,
    pub average_latency_us: f64,
    pub min_latency_us: u64,
    pub max_latency_us: u64,
    pub percentiles: Vec<PercentileLatency>,
    pub return_counts: Vec<ReturnCount>,
}

/// A whole run's results.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub runtime_ms: u64,
    pub throughput_ops_per_sec: f64,
    pub operations: Vec<OperationReport>,
}

impl Report {
    /// The measurement called `name`.
    pub fn operation(&self, name: &str) -> Option<&OperationReport> {
        self.operations.iter().find(|entry| entry.name == name)
    }

    /// The number of operations that returned `status` under measurement `name`.
    pub fn return_count(&self, name: &str, status: &str) -> u64 {
        self.operation(name)
            .and_then(|entry| entry.return_counts.iter().find(|r| r.status == status))
            .map_or(0, |entry| entry.count)
    }

    /// Renders YCSB's text format.
    pub fn render_text(&self) -> String {
        let mut out = String::new();
        line(
            &mut out,
            "OVERALL",
            "RunTime(ms)",
            &self.runtime_ms.to_string(),
        );
        line(
            &mut out,
            "OVERALL",
            "Throughput(ops/sec)",
            &java_double(self.throughput_ops_per_sec),
        );
        for entry in &self.operations {
            let name = entry.name.as_str();
            line(&mut out, name, "Operations", &entry.operations.to_string());
            line(
                &mut out,
                name,
                "AverageLatency(us)",
                &java_double(entry.average_latency_us),
            );
            line(
                &mut out,
                name,
                "MinLatency(us)",
                &entry.min_latency_us.to_string(),
            );
            line(
                &mut out,
                name,
                "MaxLatency(us)",
                &entry.max_latency_us.to_string(),
            );
            for percentile in &entry.percentiles {
                line(
                    &mut out,
                    name,
                    &format!("{}PercentileLatency(us)", ordinal(percentile.percentile)),
                    &percentile.latency_us.to_string(),
                );
            }
            for status in &entry.return_counts {
                line(
                    &mut out,
                    name,
                    &format!("Return={}", status.status),
                    &status.count.to_string(),
                );
            }
        }
        out
    }
}

fn line(out: &mut String, metric: &str, measurement: &str, value: &str) {
    out.push('[');
    out.push_str(metric);
    out.push_str("], ");
    out.push_str(measurement);
    out.push_str(", ");
    out.push_str(value);
    out.push('\n');
}

/// YCSB's percentile label: `50th`, `95th`, `99th`, `1st`, `2nd`, `3rd`, `11th`, or the plain
/// number when it has a fraction (`99.9`).
pub fn ordinal(percentile: f64) -> String {
    if percentile.fract() != 0.0 {
        return java_double(percentile);
    }
    let whole = percentile as i64;
    let suffix = match whole % 100 {
        11..=13 => "th",
        _ => match whole % 10 {
            1 => "st",
            2 => "nd",
            3 => "rd",
            _ => "th",
        },
    };
    format!("{whole}{suffix}")
}

/// Java's `Double.toString`: the shortest decimal that round-trips, always with a fraction
/// (`412.0`), scientific (`1.0E7`) outside [10^-3, 10^7), and `NaN` / `Infinity`.
pub fn java_double(value: f64) -> String {
    if value.is_nan() {
        return "NaN".to_string();
    }
    if value.is_infinite() {
        return if value > 0.0 { "Infinity" } else { "-Infinity" }.to_string();
    }
    let magnitude = value.abs();
    if magnitude == 0.0 || (1e-3..1e7).contains(&magnitude) {
        let text = format!("{value}");
        if text.contains('.') {
            text
        } else {
            format!("{text}.0")
        }
    } else {
        // Rust: "1.2345e7" / "1e-5"; Java: "1.2345E7" / "1.0E-5".
        let text = format!("{value:e}");
        let (mantissa, exponent) = text.split_once('e').unwrap_or((&text, "0"));
        let mantissa = if mantissa.contains('.') {
            mantissa.to_string()
        } else {
            format!("{mantissa}.0")
        };
        format!("{mantissa}E{exponent}")
    }
}

/// Parses YCSB's text format. Lines that do not start with `[` (status output, logs) and
/// measurements this tool does not know are skipped.
pub fn parse_text(text: &str) -> Result<Report, ReportError> {
    let mut runtime_ms = None;
    let mut throughput = None;
    let mut operations: Vec<OperationReport> = Vec::new();
    for (index, raw) in text.lines().enumerate() {
        let line_number = index + 1;
        let raw = raw.trim();
        if !raw.starts_with('[') {
            continue;
        }
        let bad = |reason: &str| ReportError::BadLine {
            line: line_number,
            reason: reason.to_string(),
        };
        let close = raw
            .find("], ")
            .ok_or_else(|| bad("no '], ' after the name"))?;
        let metric = &raw[1..close];
        let rest = &raw[close + 3..];
        let (measurement, value) = rest
            .rsplit_once(", ")
            .ok_or_else(|| bad("no ', ' before the value"))?;
        let integer = || -> Result<u64, ReportError> {
            value
                .parse::<u64>()
                .map_err(|_| bad(&format!("{value:?} is not an integer")))
        };
        let float = || -> Result<f64, ReportError> {
            parse_java_double(value).ok_or_else(|| bad(&format!("{value:?} is not a number")))
        };
        if metric == "OVERALL" {
            match measurement {
                "RunTime(ms)" => runtime_ms = Some(integer()?),
                "Throughput(ops/sec)" => throughput = Some(float()?),
                _ => {}
            }
            continue;
        }
        let known = measurement == "Operations"
            || measurement == "AverageLatency(us)"
            || measurement == "MinLatency(us)"
            || measurement == "MaxLatency(us)"
            || measurement.ends_with("PercentileLatency(us)")
            || measurement.starts_with("Return=");
        if !known {
            continue;
        }
        let position = match operations.iter().position(|entry| entry.name == metric) {
            Some(position) => position,
            None => {
                operations.push(OperationReport {
                    name: metric.to_string(),
                    operations: 0,
                    average_latency_us: 0.0,
                    min_latency_us: 0,
                    max_latency_us: 0,
                    percentiles: Vec::new(),
                    return_counts: Vec::new(),
                });
                operations.len() - 1
            }
        };
        let entry = &mut operations[position];
        match measurement {
            "Operations" => entry.operations = integer()?,
            "AverageLatency(us)" => entry.average_latency_us = float()?,
            "MinLatency(us)" => entry.min_latency_us = integer()?,
            "MaxLatency(us)" => entry.max_latency_us = integer()?,
            _ => {
                if let Some(status) = measurement.strip_prefix("Return=") {
                    entry.return_counts.push(ReturnCount {
                        status: status.to_string(),
                        count: integer()?,
                    });
                } else {
                    let label = measurement.trim_end_matches("PercentileLatency(us)");
                    let number = ["th", "st", "nd", "rd"]
                        .iter()
                        .find_map(|suffix| label.strip_suffix(suffix))
                        .unwrap_or(label);
                    let percentile = parse_java_double(number)
                        .ok_or_else(|| bad(&format!("bad percentile label {label:?}")))?;
                    entry.percentiles.push(PercentileLatency {
                        percentile,
                        latency_us: integer()?,
                    });
                }
            }
        }
    }
    Ok(Report {
        runtime_ms: runtime_ms.ok_or(ReportError::MissingOverall("RunTime(ms)"))?,
        throughput_ops_per_sec: throughput
            .ok_or(ReportError::MissingOverall("Throughput(ops/sec)"))?,
        operations,
    })
}

fn parse_java_double(text: &str) -> Option<f64> {
    match text {
        "NaN" => Some(f64::NAN),
        "Infinity" => Some(f64::INFINITY),
        "-Infinity" => Some(f64::NEG_INFINITY),
        _ => text.replace('E', "e").parse().ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Report {
        Report {
            runtime_ms: 10_234,
            throughput_ops_per_sec: 9_771.350_400_625_366,
            operations: vec![
                OperationReport {
                    name: "READ".into(),
                    operations: 50_123,
                    average_latency_us: 412.871_234,
                    min_latency_us: 98,
                    max_latency_us: 23_455,
                    percentiles: vec![
                        PercentileLatency {
                            percentile: 50.0,
                            latency_us: 377,
                        },
                        PercentileLatency {
                            percentile: 95.0,
                            latency_us: 702,
                        },
                        PercentileLatency {
                            percentile: 99.0,
                            latency_us: 1_201,
                        },
                        PercentileLatency {
                            percentile: 99.9,
                            latency_us: 5_001,
                        },
                    ],
                    return_counts: vec![
                        ReturnCount {
                            status: "OK".into(),
                            count: 50_000,
                        },
                        ReturnCount {
                            status: "ERROR".into(),
                            count: 123,
                        },
                    ],
                },
                OperationReport {
                    name: "Intended-READ-MODIFY-WRITE".into(),
                    operations: 7,
                    average_latency_us: 1.0e7,
                    min_latency_us: 0,
                    max_latency_us: 1,
                    percentiles: vec![],
                    return_counts: vec![],
                },
            ],
        }
    }

    /// Rendering then parsing gives back the same report.
    #[test]
    fn render_parse_round_trip() {
        let report = sample();
        let text = report.render_text();
        assert_eq!(parse_text(&text).expect("parses"), report);
    }

    /// The rendered lines have YCSB's exact shape.
    #[test]
    fn renders_ycsb_lines() {
        let text = sample().render_text();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "[OVERALL], RunTime(ms), 10234");
        assert_eq!(
            lines[1],
            "[OVERALL], Throughput(ops/sec), 9771.350400625366"
        );
        assert_eq!(lines[2], "[READ], Operations, 50123");
        assert_eq!(lines[3], "[READ], AverageLatency(us), 412.871234");
        assert_eq!(lines[6], "[READ], 50thPercentileLatency(us), 377");
        assert_eq!(lines[9], "[READ], 99.9PercentileLatency(us), 5001");
        assert_eq!(lines[10], "[READ], Return=OK, 50000");
        assert_eq!(lines[11], "[READ], Return=ERROR, 123");
        assert!(text.contains("[Intended-READ-MODIFY-WRITE], AverageLatency(us), 1.0E7\n"));
    }

    /// Java YCSB output with GC lines and status lines around it still parses.
    #[test]
    fn parses_java_ycsb_output() {
        let text = "2024-01-01 00:00:10:000 10 sec: 1000 operations; 100 current ops/sec;\n\
                    [OVERALL], RunTime(ms), 1000\n\
                    [OVERALL], Throughput(ops/sec), 1000.0\n\
                    [TOTAL_GCS_PS_Scavenge], Count, 1\n\
                    [TOTAL_GC_TIME_%_PS_Scavenge], Time(%), 0.5\n\
                    [UPDATE], Operations, 1000\n\
                    [UPDATE], 99thPercentileLatency(us), 12\n";
        let report = parse_text(text).expect("parses");
        assert_eq!(report.runtime_ms, 1_000);
        assert_eq!(report.operations.len(), 1);
        assert_eq!(report.operations[0].percentiles[0].percentile, 99.0);
    }

    /// Java number formatting and ordinals.
    #[test]
    fn java_formatting() {
        assert_eq!(java_double(412.0), "412.0");
        assert_eq!(java_double(0.5), "0.5");
        assert_eq!(java_double(12_345_678.0), "1.2345678E7");
        assert_eq!(java_double(0.0001), "1.0E-4");
        assert_eq!(java_double(f64::INFINITY), "Infinity");
        assert_eq!(ordinal(1.0), "1st");
        assert_eq!(ordinal(2.0), "2nd");
        assert_eq!(ordinal(3.0), "3rd");
        assert_eq!(ordinal(11.0), "11th");
        assert_eq!(ordinal(95.0), "95th");
        assert_eq!(ordinal(99.99), "99.99");
        assert!(parse_text("[OVERALL], RunTime(ms), x\n").is_err());
    }
}

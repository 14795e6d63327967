//! The run directory: `<store>/<workload>-<nemesis>-<UTC time>/` with
//!
//! - `history.jsonl` — every invoke and completion, in real-time order (the *unmutated*
//!   history, also for negative-control runs; the mutation is described in results.json);
//! - `results.json` — verdict (`"valid": true | false | "unknown"`), anomalies with the history
//!   indices that prove them, checker stats, op counts, the planned nemesis schedule and the
//!   intervals as executed (with notes and errors), node exits, seed, arguments, timings;
//! - `timeline.svg` — one lane per process, nemesis intervals shaded, latency plot;
//! - `node<i>.log` — each node's stdout/stderr over the whole run (all restarts).
//!
//! The default store is `jepsen/store` in the source tree; the harness puts a `.gitignore`
//! (`*`) there so results never get committed by accident.

use anyhow::Context;
use meridian_jepsen::history::History;
use meridian_jepsen::timeline::{render_svg, NemesisInterval, TimelineOptions};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

/// `jepsen/store` next to this crate's sources.
pub fn default_store() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(|jepsen| jepsen.join("store"))
        .unwrap_or_else(|| PathBuf::from("jepsen/store"))
}

/// `YYYYMMDDTHHMMSSZ` for `secs` since the Unix epoch (UTC, proleptic Gregorian).
pub fn utc_stamp(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}{month:02}{day:02}T{:02}{:02}{:02}Z",
        rem / 3_600,
        rem % 3_600 / 60,
        rem % 60
    )
}

/// Creates a fresh run directory under `store` (a suffix avoids collisions).
pub fn create_run_dir(store: &Path, workload: &str, nemesis: &str) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(store).with_context(|| format!("creating {}", store.display()))?;
    let ignore = store.join(".gitignore");
    if store == default_store() && !ignore.exists() {
        let _ = std::fs::write(&ignore, "# meridian-jepsen run results\n*\n");
    }
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let base = format!("{workload}-{nemesis}-{}", utc_stamp(secs));
    for n in 0..100 {
        let name = if n == 0 {
            base.clone()
        } else {
            format!("{base}-{n}")
        };
        let dir = store.join(name);
        match std::fs::create_dir(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e).with_context(|| format!("creating {}", dir.display())),
        }
    }
    anyhow::bail!(
        "could not create a run directory named {base} in {}",
        store.display()
    )
}

/// Writes history.jsonl, timeline.svg and results.json into `dir`.
pub fn write_run(
    dir: &Path,
    history: &History,
    intervals: &[NemesisInterval],
    title: &str,
    results: &serde_json::Value,
) -> anyhow::Result<()> {
    history
        .write_jsonl(dir.join("history.jsonl"))
        .context("writing history.jsonl")?;
    let options = TimelineOptions {
        title: Some(title.to_string()),
        ..TimelineOptions::default()
    };
    std::fs::write(
        dir.join("timeline.svg"),
        render_svg(history, intervals, &options),
    )
    .context("writing timeline.svg")?;
    std::fs::write(
        dir.join("results.json"),
        serde_json::to_string_pretty(results)? + "\n",
    )
    .context("writing results.json")?;
    Ok(())
}

/// Copies each node's log into `dir`; returns the files that could not be copied.
pub fn copy_logs(dir: &Path, logs: &[(u64, PathBuf)]) -> Vec<String> {
    let mut failed = Vec::new();
    for (node, path) in logs {
        if let Err(e) = std::fs::copy(path, dir.join(format!("node{node}.log"))) {
            failed.push(format!("{}: {e}", path.display()));
        }
    }
    failed
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Known instants format as UTC.
    #[test]
    fn utc_stamps() {
        assert_eq!(utc_stamp(0), "19700101T000000Z");
        assert_eq!(utc_stamp(951_782_400), "20000229T000000Z");
        assert_eq!(utc_stamp(1_700_000_000), "20231114T221320Z");
        assert_eq!(utc_stamp(4_102_444_799), "20991231T235959Z");
    }

    /// Run directories are unique and the files land in them.
    #[test]
    fn run_dir_and_files() {
        let store = tempfile::tempdir().unwrap();
        let a = create_run_dir(store.path(), "set", "kill").unwrap();
        let b = create_run_dir(store.path(), "set", "kill").unwrap();
        assert_ne!(a, b);
        let name = a.file_name().unwrap().to_string_lossy().to_string();
        assert!(
            name.starts_with("set-kill-") && name.ends_with('Z'),
            "{name}"
        );
        let mut h = History::new();
        h.invoke(
            0,
            meridian_jepsen::history::OpFn::Add,
            Some("set"),
            1.into(),
        );
        let intervals = vec![NemesisInterval {
            start_ns: 0,
            end_ns: 5,
            label: "kill n1".into(),
        }];
        write_run(&a, &h, &intervals, "t", &serde_json::json!({"valid": true})).unwrap();
        for f in ["history.jsonl", "timeline.svg", "results.json"] {
            assert!(a.join(f).is_file(), "{f}");
        }
        assert!(std::fs::read_to_string(a.join("timeline.svg"))
            .unwrap()
            .contains("kill n1"));
        assert!(!store.path().join(".gitignore").exists());
    }
}

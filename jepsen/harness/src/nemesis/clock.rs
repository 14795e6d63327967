//! The clock faults of the nemesis: restarts with a clock offset, the clock chain, and wall-clock
//! jumps and strobes of running nodes (libfaketime, see `crate::clocks`).
//!
//! - **offset**: graceful stop, restart with `--clock-offset-ms <offset>` (every node runs with
//!   `--max-offset-ms 500`); heal = stop (if still running) and restart without it.
//! - **jump**: the node's offset file is rewritten, so its wall clock steps at once while it
//!   runs; heal = step back to real time (a jump of its own) and restart it if it stopped.
//! - **strobe**: the offset file flips between `+0` and the offset every period for the whole
//!   hold; heal = back to real time.
//!
//! Beyond max_offset (past the 400 ms fence threshold) the skewed node must stop itself within
//! a few seconds (exit status 5, recorded in `node_exits`); the notes say whether it did by the
//! end of the hold, and whether it still led any shard then (it must not). A node that ran ahead
//! may refuse to start until its persisted HLC ceiling has passed: the heal retries.

use super::{ns_since, IntervalRecord, Nemesis, NodeExit};
use crate::cluster::STOP_TIMEOUT;
use crate::plan::{Target, MAX_OFFSET_MS};
use crate::status;
use std::time::{Duration, Instant};

impl Nemesis {
    /// Steps the wall clock of running node `node` to `offset_ms` (libfaketime), noting it for
    /// the heal.
    pub(super) fn jump(&mut self, node: u64, offset_ms: i64, record: &mut IntervalRecord) {
        let Some(clocks) = self.clocks.clone() else {
            record
                .errors
                .push("clock jump without libfaketime offset files".into());
            return;
        };
        match clocks.set(node, offset_ms) {
            Ok(()) => {
                self.faults.jumped.insert(node, offset_ms);
            }
            Err(e) => record.errors.push(format!("clock jump n{node}: {e:#}")),
        }
    }

    /// Flips node `node`'s wall clock between real time and `offset_ms` every `period` until
    /// `hold_until`, ending at real time; notes how many flips it made.
    pub(super) async fn strobe(
        &mut self,
        node: u64,
        offset_ms: i64,
        period: Duration,
        hold_until: Instant,
        record: &mut IntervalRecord,
    ) {
        let mut flips = 0u64;
        let mut skewed = false;
        while Instant::now() + period < hold_until {
            skewed = !skewed;
            self.jump(node, if skewed { offset_ms } else { 0 }, record);
            if !record.errors.is_empty() {
                return;
            }
            flips += 1;
            tokio::time::sleep(period).await;
        }
        self.jump(node, 0, record);
        self.faults.jumped.remove(&node);
        record.notes.push(format!(
            "n{node}'s wall clock flipped {flips} times between +0 and {offset_ms:+} ms"
        ));
    }

    /// Evidence that a jump of `node` to `offset_ms` is real: polls another running node's
    /// measurement of `node`'s clock until it is within its uncertainty (+25 ms) of the jump,
    /// or `deadline`; notes what was measured.
    pub(super) async fn verify_offset(
        &mut self,
        node: u64,
        offset_ms: i64,
        deadline: Instant,
        record: &mut IntervalRecord,
    ) {
        let started = Instant::now();
        let mut last = None;
        while Instant::now() < deadline {
            let askers: Vec<u64> = self.running().into_iter().filter(|n| *n != node).collect();
            for asker in askers {
                if let Some((measured, uncertainty)) =
                    status::measured_offset(&self.cluster, asker, node).await
                {
                    last = Some((asker, measured, uncertainty));
                    if (measured - offset_ms).abs() <= uncertainty + 25 {
                        record.notes.push(format!(
                            "n{asker} measured n{node}'s clock at {measured:+} ± {uncertainty} ms \
                             {} ms after the jump",
                            started.elapsed().as_millis()
                        ));
                        return;
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        record.notes.push(match last {
            Some((asker, measured, uncertainty)) => format!(
                "WARNING: n{asker} still measured n{node}'s clock at {measured:+} ± {uncertainty} \
                 ms after {} ms, not the jump's {offset_ms:+} ms",
                started.elapsed().as_millis()
            ),
            None => format!("WARNING: no peer measured n{node}'s clock after the jump"),
        });
    }

    /// Heals a jump: real time again, and a restart if the node stopped meanwhile (the fence).
    pub(super) async fn heal_jump(&mut self, node: u64, offset_ms: i64, errors: &mut Vec<String>) {
        if let Some(clocks) = &self.clocks {
            if let Err(e) = clocks.set(node, 0) {
                errors.push(format!("reset clock of n{node}: {e:#}"));
            }
        }
        self.note_exits();
        if !self.cluster.is_running(node).unwrap_or(true) {
            self.restart_unskewed(node, offset_ms, errors).await;
        }
    }

    /// Restarts `node` with a clock offset (graceful stop first), noting it for the heal.
    pub(super) fn skew(&mut self, node: u64, offset_ms: i64, record: &mut IntervalRecord) {
        let restarted = self.cluster.stop(node, STOP_TIMEOUT).and_then(|_| {
            self.cluster
                .restart_with_args(node, &["--clock-offset-ms".into(), offset_ms.to_string()])
        });
        match restarted {
            Ok(()) => {
                self.faults.skewed.insert(node, offset_ms);
            }
            Err(e) => record.errors.push(format!("clock skew n{node}: {e:#}")),
        }
    }

    /// Notes whether `node`, skewed beyond max_offset, stopped itself (the clock fence) since
    /// the fault began, and whether it still leads a shard (it must not).
    pub(super) async fn note_fenced(
        &mut self,
        node: u64,
        offset_ms: i64,
        record: &mut IntervalRecord,
    ) {
        self.note_exits();
        let exit = self
            .log()
            .exits
            .iter()
            .rfind(|e| e.node == node && e.time_ns >= record.start_ns)
            .map(|e| (e.time_ns, e.status.clone()));
        record.notes.push(match exit {
            Some((at_ns, status)) => format!(
                "n{node} ({offset_ms:+} ms) stopped itself at {:.3} s ({status})",
                at_ns as f64 / 1e9
            ),
            None => format!("n{node} ({offset_ms:+} ms) still running: not fenced yet"),
        });
        let others: Vec<u64> = self.running().into_iter().filter(|n| *n != node).collect();
        let led = status::shards_led_by(&self.cluster, &others, &[node]).await;
        let note = match led {
            Some(led) if led.is_empty() => {
                format!("n{node} ({offset_ms:+} ms, beyond max_offset) leads no shard")
            }
            Some(led) => format!(
                "WARNING: n{node} ({offset_ms:+} ms, beyond max_offset) still leads shards {led:?}"
            ),
            None => "could not ask the other nodes who leads".into(),
        };
        record.notes.push(note);
    }

    /// The `clock-chain` step: skew `first`, hold (it stops itself meanwhile: the clock fence),
    /// restart it without the offset (no settle wait: it is typically still waiting for its
    /// HLC ceiling), `gap_ms` later skew `then`; returns when `then`'s hold ends. `first` is
    /// restarted again if it refused to start.
    pub(super) async fn clock_chain(
        &mut self,
        (first, first_hold_ms, gap_ms, then, offset_ms): (&Target, u64, u64, &Target, i64),
        hold_ms: u64,
        until: Instant,
        record: &mut IntervalRecord,
    ) -> Instant {
        let t = |start: Instant| start.elapsed().as_secs_f64();
        let (a, label_a) = self.resolve(first).await;
        record.nodes = vec![a];
        record.label = format!("clock-chain {label_a} {offset_ms:+} ms");
        self.skew(a, offset_ms, record);
        record.notes.push(format!(
            "{:.3} s: n{a} restarted at {offset_ms:+} ms",
            t(self.start)
        ));
        let first_until = (Instant::now() + Duration::from_millis(first_hold_ms)).min(until);
        self.sleep_until(first_until).await;
        if offset_ms.abs() > MAX_OFFSET_MS {
            self.note_fenced(a, offset_ms, record).await;
        }
        // Heal the first node: stop (if it has not stopped itself), restart without the
        // offset, and move on at once.
        self.faults.skewed.remove(&a);
        let stopped = if self.cluster.is_running(a).unwrap_or(false) {
            if let Err(e) = self.cluster.stop(a, STOP_TIMEOUT) {
                record.errors.push(format!("stop skewed n{a}: {e:#}"));
            }
            "stopped"
        } else {
            "was not running (stopped itself)"
        };
        let stopped_at = t(self.start);
        if let Err(e) = self.cluster.restart(a) {
            record
                .errors
                .push(format!("restart n{a} without clock offset: {e:#}"));
        }
        record.notes.push(format!(
            "{stopped_at:.3} s: n{a} {stopped}; {:.3} s: restarted without offset",
            t(self.start)
        ));
        if Instant::now() >= until {
            return Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(gap_ms)).await;
        let (b, label_b) = self.resolve(then).await;
        let b_at = t(self.start);
        record.label = format!("{}, then {label_b} {offset_ms:+} ms", record.label);
        record.nodes.push(b);
        if b == a {
            record.notes.push(format!(
                "n{a} was picked again: it leads the key's shard now"
            ));
        }
        self.skew(b, offset_ms, record);
        record.notes.push(format!(
            "{b_at:.3} s: stopping n{b}; {:.3} s: restarted at {offset_ms:+} ms",
            t(self.start)
        ));
        let hold_until = (Instant::now() + Duration::from_millis(hold_ms)).min(until);
        // The first node may have refused to start (its HLC ceiling was too far ahead): start
        // it again once the ceiling has passed, as `restart_unskewed` does.
        if b != a {
            self.note_exits();
            if !self.cluster.is_running(a).unwrap_or(true) {
                let mut errors = Vec::new();
                self.restart_unskewed(a, offset_ms, &mut errors).await;
                record.notes.push(format!(
                    "n{a} had exited after its restart (see node_exits); restarted again at {:.3} s",
                    t(self.start)
                ));
                record.errors.extend(errors);
            }
        }
        self.sleep_until(hold_until).await;
        if offset_ms.abs() > MAX_OFFSET_MS {
            self.note_fenced(b, offset_ms, record).await;
        }
        hold_until
    }

    /// Restarts a node that ran `offset_ms` ahead, without the offset, right away (as an
    /// operator would). A node that issued timestamps further ahead than max_offset refuses to
    /// start until its clock has caught up ("fix the clock (or wait N ms)") and exits: that is
    /// recorded as a node exit, and the restart is retried after the offset has passed.
    pub(super) async fn restart_unskewed(
        &mut self,
        node: u64,
        offset_ms: i64,
        errors: &mut Vec<String>,
    ) {
        for attempt in 0..3 {
            if let Err(e) = self.cluster.restart(node) {
                errors.push(format!("restart n{node} without clock offset: {e:#}"));
                return;
            }
            tokio::time::sleep(Duration::from_millis(1_000)).await;
            if self.cluster.is_running(node).unwrap_or(true) {
                return;
            }
            self.note_exits_now(node);
            if attempt < 2 {
                let wait = Duration::from_millis(offset_ms.max(0) as u64 + 500);
                eprintln!(
                    "nemesis: n{node} refused to start after running {offset_ms:+} ms ahead; \
                     retrying in {} ms",
                    wait.as_millis()
                );
                tokio::time::sleep(wait).await;
            }
        }
        errors.push(format!(
            "n{node} did not stay up after its clock offset was removed"
        ));
    }

    /// Records that `node` (already reaped by `is_running`) exited on its own.
    pub(super) fn note_exits_now(&mut self, node: u64) {
        let time_ns = ns_since(self.start);
        self.log().exits.push(NodeExit {
            node,
            time_ns,
            status: "exited on its own right after a restart (see its log)".into(),
        });
    }
}

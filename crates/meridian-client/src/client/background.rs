//! The client's work in the background: what a call leaves to do after it has answered (a
//! multi-shard commit's resolution of its other participants and its record's finish, an
//! aborted transaction's early-lock release).
//!
//! It runs as spawned tasks so the call returns at once, and it is counted so that a process
//! about to exit can wait for it ([`Client::settle_background`](super::Client::settle_background)).
//! A task that dies with its runtime is never lost work for correctness (readers recover a
//! transaction whose locks they meet, the nodes' sweeper settles what nobody reads, early locks
//! expire), but it costs the next reader of those keys a wait and a recovery: the CLI used to
//! exit with its two-shard commit's locks still in place.
//!
//! # Invariants
//! - The count is the number of spawned tasks not yet finished; a task's guard lowers it even
//!   when the task panics or is dropped with its runtime.
//! - At most [`MAX_BACKGROUND_TASKS`] run at once; past that the work is skipped, which is
//!   safe for the reasons above.

use std::future::Future;
use std::time::Duration;
use tokio::sync::watch;

/// Most background tasks one client runs at once.
pub const MAX_BACKGROUND_TASKS: usize = 4_096;

/// The count of a client's running background tasks (see the module docs).
pub(crate) struct Background {
    running: watch::Sender<usize>,
}

/// Lowers the count when its task ends, however it ends.
struct Running(watch::Sender<usize>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n -= 1);
    }
}

impl Default for Background {
    fn default() -> Self {
        Self {
            running: watch::Sender::new(0),
        }
    }
}

impl Background {
    /// Spawns `work` on the current runtime and counts it; skips it (false) when
    /// [`MAX_BACKGROUND_TASKS`] already run.
    pub(crate) fn spawn(
        &self,
        what: &'static str,
        work: impl Future<Output = ()> + Send + 'static,
    ) -> bool {
        let admitted = self.running.send_if_modified(|n| {
            let room = *n < MAX_BACKGROUND_TASKS;
            if room {
                *n += 1;
            }
            room
        });
        if !admitted {
            tracing::debug!(
                what,
                "too much background work; readers or the sweeper will do it"
            );
            return false;
        }
        let guard = Running(self.running.clone());
        tokio::spawn(async move {
            let _guard = guard;
            work.await;
        });
        true
    }

    /// How many tasks are running.
    pub(crate) fn running(&self) -> usize {
        *self.running.borrow()
    }

    /// Waits until no task runs, at most `timeout`; returns how many still run.
    pub(crate) async fn settle(&self, timeout: Duration) -> usize {
        let mut count = self.running.subscribe();
        let _ = tokio::time::timeout(timeout, count.wait_for(|n| *n == 0)).await;
        self.running()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use tokio::sync::Notify;

    #[tokio::test]
    async fn settle_waits_for_running_tasks_and_times_out_on_stuck_ones() {
        let background = Background::default();
        assert_eq!(background.settle(Duration::ZERO).await, 0);
        let go = Arc::new(Notify::new());
        let gate = go.clone();
        assert!(background.spawn("test", async move { gate.notified().await }));
        assert_eq!(background.running(), 1);
        assert_eq!(
            background.settle(Duration::from_millis(20)).await,
            1,
            "stuck"
        );
        go.notify_one();
        assert_eq!(background.settle(Duration::from_secs(10)).await, 0);
    }

    #[tokio::test]
    async fn a_panicking_task_is_no_longer_counted() {
        let background = Background::default();
        assert!(background.spawn("test", async { panic!("background panic") }));
        assert_eq!(background.settle(Duration::from_secs(10)).await, 0);
    }

    #[test]
    fn a_task_dropped_with_its_runtime_is_no_longer_counted() {
        let background = Background::default();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            assert!(background.spawn("test", std::future::pending()));
        });
        assert_eq!(background.running(), 1);
        drop(runtime);
        assert_eq!(background.running(), 0);
    }

    #[tokio::test]
    async fn work_past_the_limit_is_skipped() {
        let background = Background::default();
        for _ in 0..MAX_BACKGROUND_TASKS {
            assert!(background.spawn("test", std::future::pending()));
        }
        assert!(!background.spawn("test", async {}));
        assert_eq!(background.running(), MAX_BACKGROUND_TASKS);
    }
}

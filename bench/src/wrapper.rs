//! YCSB's `DBWrapper`: times every driver call and records latency and status.
//!
//! The workload never calls a driver directly; it calls a [`MeasuredDb`], which wraps one
//! thread's [`DbThread`]. Each call is timed from just before to just after the driver's future
//! completes; the intended start time (set by the throttle when `--target` is given, otherwise
//! the actual start) gives the coordinated-omission-corrected latency. Statuses: success is
//! `OK`, a missing record `NOT_FOUND`, other failures `ERROR`; failures are timed under
//! `<OP>-FAILED`, as in YCSB.

use std::time::Instant;

use crate::db::{DbError, DbThread};
use crate::measurements::{OpKind, ThreadRecorder};
use crate::record::Record;

/// Latency in whole microseconds between two instants (YCSB truncates nanoseconds / 1000).
pub fn micros_between(start: Instant, end: Instant) -> u64 {
    u64::try_from(end.saturating_duration_since(start).as_micros()).unwrap_or(u64::MAX)
}

/// A driver thread whose calls are measured.
pub struct MeasuredDb {
    db: Box<dyn DbThread>,
    recorder: ThreadRecorder,
    intended_start: Option<Instant>,
}

impl MeasuredDb {
    /// Wraps a driver thread.
    pub fn new(db: Box<dyn DbThread>, recorder: ThreadRecorder) -> Self {
        Self {
            db,
            recorder,
            intended_start: None,
        }
    }

    /// Sets the scheduled start of the next operation (the throttle's deadline).
    pub fn set_intended_start(&mut self, intended: Option<Instant>) {
        self.intended_start = intended;
    }

    /// The intended start of the current operation, or `now` when not throttled.
    pub fn intended_start_or(&self, now: Instant) -> Instant {
        self.intended_start.unwrap_or(now).min(now)
    }

    /// The thread's recorder (for composite measurements such as READ-MODIFY-WRITE).
    pub fn recorder(&self) -> &ThreadRecorder {
        &self.recorder
    }

    fn finish(&self, op: OpKind, status: Result<(), &DbError>, intended: Instant, start: Instant) {
        let end = Instant::now();
        let failed = status.is_err();
        self.recorder.measure(
            op,
            failed,
            micros_between(start, end),
            micros_between(intended, end),
        );
        self.recorder.report_status(
            op,
            match status {
                Ok(()) => "OK",
                Err(error) => error.status_name(),
            },
        );
    }

    /// Measured read; a missing record is reported as `NOT_FOUND` and returned as an error.
    pub async fn read(
        &mut self,
        table: &str,
        key: &str,
        fields: Option<&[String]>,
    ) -> Result<Record, DbError> {
        let start = Instant::now();
        let intended = self.intended_start_or(start);
        let result = match self.db.read(table, key, fields).await {
            Ok(Some(record)) => Ok(record),
            Ok(None) => Err(DbError::NotFound),
            Err(error) => Err(error),
        };
        self.finish(OpKind::Read, result.as_ref().map(|_| ()), intended, start);
        result
    }

    /// Measured scan.
    pub async fn scan(
        &mut self,
        table: &str,
        start_key: &str,
        count: usize,
        fields: Option<&[String]>,
    ) -> Result<Vec<Record>, DbError> {
        let start = Instant::now();
        let intended = self.intended_start_or(start);
        let result = self.db.scan(table, start_key, count, fields).await;
        self.finish(OpKind::Scan, result.as_ref().map(|_| ()), intended, start);
        result
    }

    /// Measured update.
    pub async fn update(&mut self, table: &str, key: &str, values: &Record) -> Result<(), DbError> {
        let start = Instant::now();
        let intended = self.intended_start_or(start);
        let result = self.db.update(table, key, values).await;
        self.finish(OpKind::Update, result.as_ref().copied(), intended, start);
        result
    }

    /// Measured insert.
    pub async fn insert(&mut self, table: &str, key: &str, values: &Record) -> Result<(), DbError> {
        let start = Instant::now();
        let intended = self.intended_start_or(start);
        let result = self.db.insert(table, key, values).await;
        self.finish(OpKind::Insert, result.as_ref().copied(), intended, start);
        result
    }

    /// Measured delete.
    pub async fn delete(&mut self, table: &str, key: &str) -> Result<(), DbError> {
        let start = Instant::now();
        let intended = self.intended_start_or(start);
        let result = self.db.delete(table, key).await;
        self.finish(OpKind::Delete, result.as_ref().copied(), intended, start);
        result
    }

    /// Measured cleanup (YCSB's `CLEANUP` measurement; no status is counted).
    pub async fn cleanup(&mut self) -> Result<(), DbError> {
        let start = Instant::now();
        let intended = self.intended_start_or(start);
        let result = self.db.cleanup().await;
        let end = Instant::now();
        self.recorder.measure(
            OpKind::Cleanup,
            false,
            micros_between(start, end),
            micros_between(intended, end),
        );
        result
    }
}

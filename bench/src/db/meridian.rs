//! Meridian driver slot.
//!
//! The Meridian driver talks to a cluster through the `meridian-client` crate. It is compiled
//! only with the cargo feature `meridian` (off by default), so the benchmark builds and runs
//! against etcd and RocksDB before the client crate exists. Until the driver is wired in,
//! `--db meridian` fails at open with a clear message instead of panicking.
//!
//! The driver that goes here must follow the contract in [`super`]: one record per key in the
//! [`crate::record`] encoding at [`super::storage_key`], updates as an atomic read-modify-write
//! (a single-key transaction), scans in key order, and a deadline on every call.

use std::sync::Arc;

use super::{Db, DbError, DriverOptions};

/// Message returned when the binary was built without the `meridian` feature.
pub const NOT_BUILT_IN: &str = "meridian driver not built in (enable feature `meridian`)";

/// Opens the Meridian driver.
#[cfg(not(feature = "meridian"))]
pub async fn open(_options: &DriverOptions) -> Result<Arc<dyn Db>, DbError> {
    Err(DbError::Backend(NOT_BUILT_IN.to_string()))
}

/// Opens the Meridian driver.
#[cfg(feature = "meridian")]
pub async fn open(_options: &DriverOptions) -> Result<Arc<dyn Db>, DbError> {
    Err(DbError::Backend(
        "meridian driver: the feature is on but no client is wired into bench/src/db/meridian.rs yet"
            .to_string(),
    ))
}

#[cfg(all(test, not(feature = "meridian")))]
mod tests {
    use super::*;

    /// Without the feature, opening the driver is a clear error, not a panic.
    #[tokio::test]
    async fn reports_not_built_in() {
        let options = DriverOptions {
            endpoints: vec![],
            data_dir: None,
            timeout: std::time::Duration::from_secs(1),
            sync_writes: false,
        };
        let error = open(&options).await.err().expect("must fail");
        assert_eq!(error.to_string(), NOT_BUILT_IN);
    }
}

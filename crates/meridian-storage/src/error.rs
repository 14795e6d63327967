//! The storage crate's single error type.
//!
//! Every variant is permanent from a client's point of view (the server maps all of them to
//! `ErrorCode::Internal`): a storage error means the disk, the data directory or this build is
//! wrong, and retrying the same request on the same node will not help. `Corrupt` names *what*
//! was being decoded so a log line is enough to find the bad keyspace.

/// The storage crate's result type.
pub type Result<T> = std::result::Result<T, Error>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// RocksDB returned an error (the message is RocksDB's status string).
    #[error("rocksdb: {0}")]
    Rocks(String),
    /// Bytes read from disk (or from a snapshot file) do not decode. `what` names the format.
    #[error("corrupt {what}: {detail}")]
    Corrupt { what: &'static str, detail: String },
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    /// The data directory was written by a build with another on-disk format.
    #[error("incompatible data dir: {0}")]
    Incompatible(String),
}

impl Error {
    /// Shorthand for [`Error::Corrupt`].
    pub fn corrupt(what: &'static str, detail: impl Into<String>) -> Error {
        Error::Corrupt {
            what,
            detail: detail.into(),
        }
    }

    /// Whether retrying the same operation could succeed. Storage errors never are.
    pub fn is_retryable(&self) -> bool {
        false
    }
}

impl From<rocksdb::Error> for Error {
    fn from(e: rocksdb::Error) -> Self {
        Error::Rocks(e.into_string())
    }
}

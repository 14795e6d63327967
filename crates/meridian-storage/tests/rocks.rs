//! RocksEngine-specific behaviour: persistence across reopen, the format marker, cluster id.

use meridian_storage::{keys, Cf, Engine, EngineOptions, Error, RocksEngine, WriteBatch};
use meridian_types::ShardId;

fn opts() -> EngineOptions {
    EngineOptions {
        block_cache_bytes: 8 << 20,
        write_buffer_bytes: 4 << 20,
        ..EngineOptions::default()
    }
}

/// Data written (synced and not) survives dropping and reopening the engine.
#[test]
fn reopen_keeps_data() {
    let dir = tempfile::tempdir().unwrap();
    {
        let e = RocksEngine::open(dir.path(), &opts()).unwrap();
        assert_eq!(e.path(), dir.path());
        let mut b = WriteBatch::new();
        b.put(Cf::Data, b"synced".to_vec(), b"1".to_vec());
        e.write(b, true).unwrap();
        let mut b = WriteBatch::new();
        b.put(
            Cf::RaftLog,
            keys::raft_log_key(ShardId(1), 5),
            b"entry".to_vec(),
        );
        e.write(b, false).unwrap();
        e.write_cluster_id("c1").unwrap();
    }
    let e = RocksEngine::open(dir.path(), &opts()).unwrap();
    assert_eq!(e.get(Cf::Data, b"synced").unwrap(), Some(b"1".to_vec()));
    // A clean drop closes the DB, which keeps the WAL, so non-synced writes survive too.
    assert_eq!(
        e.get(Cf::RaftLog, &keys::raft_log_key(ShardId(1), 5))
            .unwrap(),
        Some(b"entry".to_vec())
    );
    assert_eq!(e.read_cluster_id().unwrap().as_deref(), Some("c1"));
}

/// Data flushed to SST files (not only in the WAL) survives reopen.
#[test]
fn flush_then_reopen() {
    let dir = tempfile::tempdir().unwrap();
    {
        let e = RocksEngine::open(dir.path(), &opts()).unwrap();
        let mut b = WriteBatch::new();
        for i in 0..1000u32 {
            b.put(Cf::Data, i.to_be_bytes().to_vec(), vec![7u8; 100]);
        }
        e.write(b, false).unwrap();
        e.flush().unwrap();
    }
    let e = RocksEngine::open(dir.path(), &opts()).unwrap();
    assert_eq!(e.scan(Cf::Data, b"", None, false).count(), 1000);
}

/// A data dir written with another format version is refused with Error::Incompatible.
#[test]
fn wrong_format_version_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    {
        let e = RocksEngine::open(dir.path(), &opts()).unwrap();
        let mut b = WriteBatch::new();
        b.put(
            Cf::RaftMeta,
            keys::FORMAT_VERSION_KEY,
            99u32.to_be_bytes().to_vec(),
        );
        e.write(b, true).unwrap();
    }
    match RocksEngine::open(dir.path(), &opts()) {
        Err(Error::Incompatible(msg)) => {
            assert!(
                msg.contains("99")
                    && msg.contains(&meridian_storage::STORAGE_FORMAT_VERSION.to_string()),
                "{msg}"
            )
        }
        other => panic!("expected Incompatible, got {other:?}"),
    }
}

/// A data dir holding data but no format marker is refused, not silently adopted.
#[test]
fn data_without_format_marker_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    {
        let e = RocksEngine::open(dir.path(), &opts()).unwrap();
        let mut b = WriteBatch::new();
        b.delete(Cf::RaftMeta, keys::FORMAT_VERSION_KEY);
        b.put(Cf::Data, b"k".to_vec(), b"v".to_vec());
        e.write(b, true).unwrap();
    }
    assert!(matches!(
        RocksEngine::open(dir.path(), &opts()),
        Err(Error::Incompatible(_))
    ));
}

/// A corrupt format marker is reported as corruption.
#[test]
fn corrupt_format_marker_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    {
        let e = RocksEngine::open(dir.path(), &opts()).unwrap();
        let mut b = WriteBatch::new();
        b.put(Cf::RaftMeta, keys::FORMAT_VERSION_KEY, b"xy".to_vec());
        e.write(b, true).unwrap();
    }
    assert!(matches!(
        RocksEngine::open(dir.path(), &opts()),
        Err(Error::Corrupt { .. })
    ));
}

/// A second open of the same dir while the first is alive fails (RocksDB's LOCK file).
#[test]
fn double_open_fails() {
    let dir = tempfile::tempdir().unwrap();
    let _e = RocksEngine::open(dir.path(), &opts()).unwrap();
    assert!(matches!(
        RocksEngine::open(dir.path(), &opts()),
        Err(Error::Rocks(_))
    ));
}

/// The bytes of the live WAL files (`*.log`) in `dir`.
fn wal_bytes(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".log"))
        .map(|e| e.metadata().unwrap().len())
        .sum()
}

/// A lightly written family (Raft metadata, among busy data writes) must not pin the WAL:
/// RocksDB keeps every WAL file that holds an unflushed write of any family, and replays all
/// of them on open after a crash, so a pinned WAL makes restart time grow with the data written
/// since (1.9 GB of live WAL was seen after a bulk load of 4M records, and a 6 s restart at 10M). With the engine's defaults,
/// writing 400 MiB of data after one metadata write leaves at most 160 MiB of live WAL.
#[test]
fn a_rarely_written_family_does_not_pin_the_wal() {
    let dir = tempfile::tempdir().unwrap();
    let e = RocksEngine::open(dir.path(), &EngineOptions::default()).unwrap();
    let mut b = WriteBatch::new();
    b.put(Cf::RaftMeta, b"rare".to_vec(), b"1".to_vec());
    e.write(b, false).unwrap();
    let value = vec![0x5a; 16 << 10];
    for batch in 0..400u32 {
        let mut b = WriteBatch::new();
        for i in 0..64u32 {
            b.put(
                Cf::Data,
                format!("k{batch:05}-{i:03}").into_bytes(),
                value.clone(),
            );
        }
        e.write(b, false).unwrap();
    }
    let live = wal_bytes(dir.path());
    assert!(
        live <= 160 << 20,
        "{} MiB of live WAL after 400 MiB of data writes",
        live >> 20
    );
    // Nothing was lost to the flushes that bounded it.
    drop(e);
    let e = RocksEngine::open(dir.path(), &EngineOptions::default()).unwrap();
    assert_eq!(e.get(Cf::RaftMeta, b"rare").unwrap(), Some(b"1".to_vec()));
    assert_eq!(e.get(Cf::Data, b"k00399-063").unwrap(), Some(value));
}

/// `memory()` reports what RocksDB holds: memtables after writes, table readers once they are
/// flushed to SST files, block cache after reads of those files.
#[test]
fn memory_is_reported_by_kind() {
    let dir = tempfile::tempdir().unwrap();
    let e = RocksEngine::open(dir.path(), &opts()).unwrap();
    let empty = e.memory();
    let mut b = WriteBatch::new();
    for i in 0..2_000u32 {
        b.put(Cf::Data, format!("key{i:05}").into_bytes(), vec![7u8; 512]);
    }
    e.write(b, false).unwrap();
    let written = e.memory();
    assert!(
        written.memtables > empty.memtables + 1_000_000,
        "{empty:?} -> {written:?}"
    );
    e.flush().unwrap();
    for i in (0..2_000u32).step_by(7) {
        assert!(e
            .get(Cf::Data, format!("key{i:05}").as_bytes())
            .unwrap()
            .is_some());
    }
    let flushed = e.memory();
    assert!(flushed.table_readers > 0, "{flushed:?}");
    assert!(flushed.block_cache > 0, "{flushed:?}");
    assert!(
        flushed.memtables < written.memtables,
        "{written:?} -> {flushed:?}"
    );
}

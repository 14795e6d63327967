//! The benchmark harness's end-to-end tests (real Meridian clusters, RocksDB, and the etcd that
//! scripts/test.sh starts), one module each, in one test binary (each binary links RocksDB with
//! its line tables, ~485 MB; see crates/meridian-cli/tests/cluster/main.rs).

mod common;

mod bulk_load_e2e;
mod compare_e2e;
mod economy_e2e;
mod etcd_e2e;
mod geo_e2e;
mod rocksdb_e2e;

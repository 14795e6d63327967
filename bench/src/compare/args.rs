//! The flags of `meridian-ycsb compare` ([`CompareArgs`]) and the YCSB core workloads they name
//! ([`WorkloadId`], run in [`RUN_ORDER`]).

use std::fmt;
use std::path::PathBuf;

use crate::db::DriverKind;

/// Flags of `meridian-ycsb compare`.
#[derive(Debug, Clone, clap::Args)]
pub struct CompareArgs {
    /// Records loaded into each store (YCSB `recordcount`).
    #[arg(long, default_value_t = 100_000)]
    pub records: u64,
    /// Operations of each workload run (YCSB `operationcount`).
    #[arg(long, default_value_t = 100_000)]
    pub operations: u64,
    /// Client threads, the same for every store and phase.
    #[arg(long, default_value_t = 64)]
    pub threads: usize,
    /// Stores to compare, in this order.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "meridian,etcd,rocksdb"
    )]
    pub stores: Vec<DriverKind>,
    /// Workloads to run; they always run in YCSB's order A, B, C, F, D, then E on a reload.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "a,b,c,f,d,e")]
    pub workloads: Vec<WorkloadId>,
    /// Transactions of the closed-economy phase per store (YCSB+T, see `economy`; default:
    /// --operations; 0 skips it).
    #[arg(long)]
    pub economy_operations: Option<u64>,
    /// Output directory (default: bench/results/<UTC date> in the repository).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// The `meridian` binary (default: `meridian` next to this executable).
    #[arg(long)]
    pub meridian_bin: Option<PathBuf>,
    /// The `etcd` binary (default: `etcd` on PATH).
    #[arg(long)]
    pub etcd_bin: Option<PathBuf>,
    /// Meridian node i listens on base+i (clients) and base+100+i (Raft).
    #[arg(long, default_value_t = 27_000)]
    pub base_port: u16,
    /// etcd member i listens on base+i (clients) and base+10+i (peers) (default: --base-port
    /// + 200).
    #[arg(long)]
    pub etcd_base_port: Option<u16>,
    /// Where the stores keep their data (default: a fresh temporary directory).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Keep the stores' data and server logs after the comparison.
    #[arg(long)]
    pub keep_data: bool,
    /// Deadline of each database call in milliseconds (etcd, meridian).
    #[arg(long, default_value_t = 10_000)]
    pub timeout_ms: u64,
    /// How long a cluster may take to become ready, in seconds.
    #[arg(long, default_value_t = 120)]
    pub ready_timeout_secs: u64,
    /// Seconds between status lines during a run.
    #[arg(long, default_value_t = 10)]
    pub status_interval: u64,
}

/// A YCSB core workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, clap::ValueEnum)]
pub enum WorkloadId {
    A,
    B,
    C,
    D,
    E,
    F,
}

/// YCSB's recommended order on one data set; E follows on a fresh reload.
pub const RUN_ORDER: [WorkloadId; 6] = [
    WorkloadId::A,
    WorkloadId::B,
    WorkloadId::C,
    WorkloadId::F,
    WorkloadId::D,
    WorkloadId::E,
];

impl WorkloadId {
    /// The lower-case letter used in file names and JSON.
    pub fn letter(self) -> &'static str {
        match self {
            WorkloadId::A => "a",
            WorkloadId::B => "b",
            WorkloadId::C => "c",
            WorkloadId::D => "d",
            WorkloadId::E => "e",
            WorkloadId::F => "f",
        }
    }

    /// The workload file (`bench/workloads/workload<letter>`), compiled in so the comparison
    /// runs from any directory.
    pub fn properties_text(self) -> &'static str {
        match self {
            WorkloadId::A => include_str!("../../workloads/workloada"),
            WorkloadId::B => include_str!("../../workloads/workloadb"),
            WorkloadId::C => include_str!("../../workloads/workloadc"),
            WorkloadId::D => include_str!("../../workloads/workloadd"),
            WorkloadId::E => include_str!("../../workloads/workloade"),
            WorkloadId::F => include_str!("../../workloads/workloadf"),
        }
    }

    /// One line on what the workload does.
    pub fn mix(self) -> &'static str {
        match self {
            WorkloadId::A => "50% read, 50% update, zipfian",
            WorkloadId::B => "95% read, 5% update, zipfian",
            WorkloadId::C => "100% read, zipfian",
            WorkloadId::D => "95% read, 5% insert, latest",
            WorkloadId::E => "95% scan (1-100 records), 5% insert, zipfian",
            WorkloadId::F => "50% read, 50% read-modify-write, zipfian",
        }
    }

    /// The operation whose p99 the chart and ratio table quote as the read side.
    pub fn main_read_op(self) -> &'static str {
        match self {
            WorkloadId::E => "SCAN",
            _ => "READ",
        }
    }

    /// The write operation of the mix, if it has one.
    pub fn main_write_op(self) -> Option<&'static str> {
        match self {
            WorkloadId::A | WorkloadId::B => Some("UPDATE"),
            WorkloadId::C => None,
            WorkloadId::D | WorkloadId::E => Some("INSERT"),
            WorkloadId::F => Some("READ-MODIFY-WRITE"),
        }
    }
}

impl fmt::Display for WorkloadId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.letter().to_uppercase())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::properties::Properties;

    /// The compiled-in workload files parse and carry the expected mixes.
    #[test]
    fn built_in_workloads_parse() {
        for workload in RUN_ORDER {
            let properties = Properties::parse(workload.properties_text()).unwrap();
            assert_eq!(properties.get("recordcount"), Some("100000"), "{workload}");
        }
        let e = Properties::parse(WorkloadId::E.properties_text()).unwrap();
        assert_eq!(e.get("scanproportion"), Some("0.95"));
    }
}

//! The validated arguments of a comparison: the stores (deduplicated) and the data sets
//! (workloads in YCSB's order, E on a reload), checked against the limits and port ranges.

use std::path::PathBuf;

use anyhow::bail;

use super::{CompareArgs, WorkloadId, RUN_ORDER};
use super::{ETCD_PORT_SPAN, MAX_COUNT, MAX_THREADS, MERIDIAN_PORT_SPAN};
use crate::cli;
use crate::db::DriverKind;

/// One data set of one store: a fresh start, a load, the workloads, a stop.
#[derive(Debug, Clone)]
pub(super) struct DataSet {
    pub(super) index: u32,
    pub(super) workloads: Vec<WorkloadId>,
}

/// The validated arguments.
pub(super) struct Plan {
    pub(super) args: CompareArgs,
    pub(super) stores: Vec<DriverKind>,
    pub(super) data_sets: Vec<DataSet>,
    pub(super) etcd_base_port: u16,
    pub(super) meridian_bin: Option<PathBuf>,
    pub(super) etcd_bin: Option<PathBuf>,
    pub(super) out_dir: PathBuf,
    pub(super) work_dir: PathBuf,
}

impl Plan {
    pub(super) fn phase_count(&self) -> usize {
        self.stores.len()
            * self
                .data_sets
                .iter()
                .map(|set| set.workloads.len() + 1)
                .sum::<usize>()
    }
}

/// Checks counts and limits; returns the stores (deduplicated, in the given order) and the data
/// sets (workloads in YCSB's order, E on its own).
pub(super) fn validate(args: &CompareArgs) -> anyhow::Result<(Vec<DriverKind>, Vec<DataSet>)> {
    if args.records == 0 || args.records > MAX_COUNT {
        bail!("--records must be in 1..={MAX_COUNT}");
    }
    if args.operations == 0 || args.operations > MAX_COUNT {
        bail!("--operations must be in 1..={MAX_COUNT}");
    }
    if args.economy_operations.is_some_and(|n| n > MAX_COUNT) {
        bail!("--economy-operations must be in 0..={MAX_COUNT}");
    }
    if args.threads == 0 || args.threads > MAX_THREADS {
        bail!("--threads must be in 1..={MAX_THREADS}");
    }
    if args.timeout_ms == 0 || args.timeout_ms > cli::MAX_TIMEOUT_MS {
        bail!("--timeout-ms must be in 1..={}", cli::MAX_TIMEOUT_MS);
    }
    if args.ready_timeout_secs == 0 {
        bail!("--ready-timeout-secs must be at least 1");
    }
    let mut stores = Vec::new();
    for store in &args.stores {
        if !stores.contains(store) {
            stores.push(*store);
        }
    }
    if stores.is_empty() {
        bail!("--stores is empty");
    }
    let mut data_sets = Vec::new();
    let first: Vec<WorkloadId> = RUN_ORDER
        .iter()
        .copied()
        .filter(|w| *w != WorkloadId::E && args.workloads.contains(w))
        .collect();
    if !first.is_empty() {
        data_sets.push(DataSet {
            index: 1,
            workloads: first,
        });
    }
    if args.workloads.contains(&WorkloadId::E) {
        data_sets.push(DataSet {
            index: 2,
            workloads: vec![WorkloadId::E],
        });
    }
    if data_sets.is_empty() {
        bail!("--workloads is empty");
    }
    Ok((stores, data_sets))
}

/// The two port ranges must fit in u16 and not overlap.
pub(super) fn check_port_ranges(
    meridian_base: u16,
    etcd_base: u16,
    stores: &[DriverKind],
) -> anyhow::Result<()> {
    let meridian_end = u32::from(meridian_base) + u32::from(MERIDIAN_PORT_SPAN);
    let etcd_end = u32::from(etcd_base) + u32::from(ETCD_PORT_SPAN);
    if stores.contains(&DriverKind::Meridian) && meridian_end > u32::from(u16::MAX) {
        bail!("--base-port {meridian_base} leaves no room for Meridian's ports");
    }
    if stores.contains(&DriverKind::Etcd) && etcd_end > u32::from(u16::MAX) {
        bail!("--etcd-base-port {etcd_base} leaves no room for etcd's ports");
    }
    let overlap = u32::from(meridian_base) < etcd_end && u32::from(etcd_base) < meridian_end;
    if overlap && stores.contains(&DriverKind::Meridian) && stores.contains(&DriverKind::Etcd) {
        bail!(
            "Meridian's ports {meridian_base}..{meridian_end} and etcd's {etcd_base}..{etcd_end} \
             overlap; pick another --etcd-base-port"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn parse(extra: &[&str]) -> CompareArgs {
        #[derive(Parser)]
        struct Wrapper {
            #[command(flatten)]
            args: CompareArgs,
        }
        let mut argv = vec!["compare"];
        argv.extend_from_slice(extra);
        Wrapper::try_parse_from(argv).expect("parses").args
    }

    /// Defaults: all stores, A B C F D on one data set and E on a reload.
    #[test]
    fn default_plan() {
        let args = parse(&[]);
        assert_eq!(
            (args.records, args.operations, args.threads),
            (100_000, 100_000, 64)
        );
        let (stores, sets) = validate(&args).unwrap();
        assert_eq!(
            stores,
            vec![DriverKind::Meridian, DriverKind::Etcd, DriverKind::Rocksdb]
        );
        assert_eq!(sets.len(), 2);
        assert_eq!(
            sets[0].workloads,
            vec![
                WorkloadId::A,
                WorkloadId::B,
                WorkloadId::C,
                WorkloadId::F,
                WorkloadId::D
            ]
        );
        assert_eq!(sets[1].workloads, vec![WorkloadId::E]);
    }

    /// Any order given runs in YCSB's order; duplicates collapse; no E means no reload.
    #[test]
    fn workloads_are_reordered() {
        let args = parse(&["--workloads", "d,a,d", "--stores", "rocksdb,rocksdb"]);
        let (stores, sets) = validate(&args).unwrap();
        assert_eq!(stores, vec![DriverKind::Rocksdb]);
        assert_eq!(sets.len(), 1);
        assert_eq!(sets[0].workloads, vec![WorkloadId::A, WorkloadId::D]);
        let only_e = parse(&["--workloads", "e"]);
        let (_, sets) = validate(&only_e).unwrap();
        assert_eq!(sets.len(), 1);
        assert_eq!(sets[0].index, 2);
    }

    /// Zero counts and overlapping port ranges are refused with a clear message.
    #[test]
    fn bad_arguments() {
        assert!(validate(&parse(&["--records", "0"])).is_err());
        assert!(validate(&parse(&["--threads", "0"])).is_err());
        let both = [DriverKind::Meridian, DriverKind::Etcd];
        let error = check_port_ranges(27_000, 27_050, &both).unwrap_err();
        assert!(error.to_string().contains("overlap"), "{error}");
        assert!(check_port_ranges(27_000, 27_200, &both).is_ok());
        assert!(check_port_ranges(27_000, 27_050, &[DriverKind::Etcd]).is_ok());
        assert!(check_port_ranges(65_500, 20_000, &both).is_err());
    }
}

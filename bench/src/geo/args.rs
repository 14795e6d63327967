//! `meridian-ycsb geo`'s flags and their checks.

use anyhow::bail;
use std::path::PathBuf;

/// Most operations one region runs in one phase.
pub const MAX_OPS: usize = 100_000;
/// Most concurrent workers per region.
pub const MAX_CONCURRENCY: usize = 64;
/// Largest latency-matrix scale.
pub const MAX_SCALE: f64 = 10.0;
/// Ports above `--base-port` the run uses (nodes, Raft, WAN links; see `topology`).
pub const PORT_SPAN: u16 = 340;
/// Most nodes per region.
pub const MAX_NODES_PER_REGION: usize = 3;

#[derive(Debug, Clone, clap::Args)]
pub struct GeoArgs {
    /// Operations each region's client group runs per phase.
    #[arg(long, default_value_t = 200)]
    pub ops: usize,
    /// Concurrent workers per region.
    #[arg(long, default_value_t = 4)]
    pub concurrency: usize,
    /// Multiplies every round trip of the latency matrix (us-east↔eu-west 80 ms,
    /// eu-west↔ap-south 130 ms, us-east↔ap-south 200 ms at 1).
    #[arg(long, default_value_t = 1.0)]
    pub scale: f64,
    /// Nodes: clients P+1..9, Raft P+101..109; WAN links P+200..P+339.
    #[arg(long, default_value_t = 30_000)]
    pub base_port: u16,
    /// Nodes in each region (1 to 3; a region's nodes sit in zones a, b, c).
    #[arg(long, default_value_t = 1)]
    pub nodes_per_region: usize,
    /// The data shards' survival goal: `region` (every replica votes; one per region) or
    /// `zone` (three voters in the home region, learners elsewhere; needs
    /// --nodes-per-region 3).
    #[arg(long, default_value = "region", value_parser = ["region", "zone"])]
    pub survive: String,
    /// Output directory (default: bench/results/<UTC date>/geo in the repository).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// The `meridian` binary (default: next to meridian-ycsb).
    #[arg(long)]
    pub meridian_bin: Option<PathBuf>,
    /// Node data and logs (default: a fresh temporary directory).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Keep node data and logs afterwards.
    #[arg(long)]
    pub keep_data: bool,
    /// Deadline for the cluster to elect every leader, and for leaders to reach home.
    #[arg(long, default_value_t = 180)]
    pub ready_timeout_secs: u64,
    /// Seed of the key choices (default: from the clock).
    #[arg(long)]
    pub seed: Option<u64>,
}

impl GeoArgs {
    pub fn validate(&self) -> anyhow::Result<()> {
        if !(1..=MAX_OPS).contains(&self.ops) {
            bail!("--ops must be in 1..={MAX_OPS}");
        }
        if !(1..=MAX_CONCURRENCY).contains(&self.concurrency) {
            bail!("--concurrency must be in 1..={MAX_CONCURRENCY}");
        }
        if !(self.scale > 0.0 && self.scale <= MAX_SCALE) {
            bail!("--scale must be in (0, {MAX_SCALE}]");
        }
        if self.base_port < 1024 || self.base_port > u16::MAX - PORT_SPAN {
            bail!(
                "--base-port must be in 1024..={} (the run uses P+1..P+{PORT_SPAN})",
                u16::MAX - PORT_SPAN
            );
        }
        if !(1..=MAX_NODES_PER_REGION).contains(&self.nodes_per_region) {
            bail!("--nodes-per-region must be in 1..={MAX_NODES_PER_REGION}");
        }
        if self.survive == "zone" && self.nodes_per_region < 3 {
            bail!("--survive zone needs --nodes-per-region 3 (three voters in each home region)");
        }
        if self.ready_timeout_secs == 0 {
            bail!("--ready-timeout-secs must be > 0");
        }
        Ok(())
    }
}

//! The `meridian` binary: argument parsing and wiring only (see the `meridian_cli` library).

use clap::{Parser, Subcommand};
use meridian_cli::commands::{CasMismatch, ClusterCommand, KvCommand};
use meridian_cli::demo::DemoArgs;
use meridian_server::StartArgs;
use std::io::IsTerminal;
use std::process::ExitCode;
use tracing_subscriber::EnvFilter;

/// Rust's allocations go to jemalloc (RocksDB's C++ ones stay on glibc, which `meridian start`
/// tunes and trims; see `meridian_cli::heap` for the measurements behind both).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Meridian: a sharded, Raft-replicated key-value store built for multiple regions.
#[derive(Debug, Parser)]
#[command(
    name = "meridian",
    version,
    about = "Meridian: a sharded, Raft-replicated key-value store built for multiple regions.",
    long_about = None
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a node until SIGTERM or Ctrl-C. Exit status 5: the node stopped itself because its
    /// clock was out of step with a majority of the cluster (see --max-offset-ms).
    Start(Box<StartArgs>),
    /// Read and write keys.
    Kv(KvCommand),
    /// Inspect the cluster.
    Cluster(ClusterCommand),
    /// Start a local 3-region cluster, load sample data, run a workload and report latencies.
    Demo(DemoArgs),
}

/// Logs go to stderr. A node logs at `info` by default; client commands only warn, so their
/// stdout stays clean. `RUST_LOG` overrides both.
fn init_tracing(default_level: &str) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_level));
    // try_init: the server may have installed a subscriber of its own already (tests).
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Escape codes only for a terminal: node logs usually go to files.
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
}

/// Exit status of a `kv` write whose outcome is unknown (see `meridian_client::Error::Ambiguous`).
const EXIT_OUTCOME_UNKNOWN: u8 = 3;
/// Exit status of a `kv cas` whose condition did not hold (nothing was written).
const EXIT_CAS_MISMATCH: u8 = 4;

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing(match cli.command {
        // openraft logs every election step at info; keep node logs about Meridian itself.
        // uhlc warns on every rejected timestamp; Meridian logs rejections itself, rate-limited.
        Command::Start(_) => "info,openraft=warn,uhlc=error",
        _ => "warn",
    });
    if let Command::Start(_) = cli.command {
        // Before the runtime starts any thread (see `meridian_cli::heap`).
        if let Some(arenas) = meridian_cli::heap::limit_glibc_arenas() {
            tracing::info!(arenas, "glibc malloc arenas capped (RocksDB's allocations)");
        }
        if let Some(bytes) = meridian_cli::heap::pin_glibc_mmap_threshold() {
            tracing::info!(bytes, "glibc mmap threshold pinned (RocksDB's allocations)");
        }
        if let Err(error) = meridian_cli::heap::spawn_glibc_trimmer(meridian_cli::heap::TRIM_PERIOD)
        {
            tracing::warn!(%error, "cannot start the malloc_trim thread");
        }
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async move {
        match cli.command {
            Command::Start(args) => {
                meridian_server::metrics::set_heap_stats(meridian_cli::heap::stats);
                meridian_server::run_start(*args).await
            }
            Command::Kv(command) => command.run().await,
            Command::Cluster(command) => command.run().await,
            Command::Demo(args) => meridian_cli::demo::run(args).await,
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) if error.downcast_ref::<CasMismatch>().is_some() => {
            eprintln!("{error}");
            ExitCode::from(EXIT_CAS_MISMATCH)
        }
        Err(error) => {
            eprintln!("error: {error:#}");
            let ambiguous = error.chain().any(|cause| {
                matches!(
                    cause.downcast_ref::<meridian_client::Error>(),
                    Some(meridian_client::Error::Ambiguous { .. })
                )
            });
            if ambiguous {
                // A distinct status: scripts must not treat "maybe written" as "not written".
                eprintln!(
                    "note: the write may or may not have been applied; read the key to find out"
                );
                ExitCode::from(EXIT_OUTCOME_UNKNOWN)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

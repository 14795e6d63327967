//! `meridian-wan`: wires flags, the topology file, the links and the control server together.

use std::io::{IsTerminal as _, Write as _};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context as _;
use clap::Parser as _;
use tokio::net::TcpListener;
use tracing::info;
use tracing_subscriber::EnvFilter;

use meridian_wan::args::Args;
use meridian_wan::config::{load_plan, WanPlan};
use meridian_wan::control::run_control;
use meridian_wan::matrix::format_dial_map;
use meridian_wan::Wan;

fn main() -> ExitCode {
    let args = Args::parse();
    match run_main(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            // `{:#}` prints the cause chain on one line; no backtrace for a configuration error.
            eprintln!("meridian-wan: error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn run_main(args: Args) -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();

    let plan = match &args.config {
        Some(path) => load_plan(path)?,
        None => WanPlan::default(),
    };
    if args.print_dial_map {
        print_dial_maps(&plan)?;
        return Ok(());
    }
    let mut specs = plan.links;
    specs.extend(args.links.iter().cloned());

    // Two worker threads: the proxy is I/O-bound and shares the machine with the nodes it serves.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    runtime.block_on(run(args, specs))
}

async fn run(args: Args, specs: Vec<meridian_wan::LinkSpec>) -> anyhow::Result<()> {
    let wan = Arc::new(Wan::start(specs, &args.link_options()).await?);
    // Machine-readable lines for launchers, printed in one go once everything is bound.
    let mut announce = String::new();
    for link in wan.links() {
        let (name, target) = (link.name(), link.spec().target);
        announce.push_str(&format!("link {name} {} {target}\n", link.local_addr()));
    }
    let control_task = match args.control {
        Some(addr) => {
            let listener = TcpListener::bind(addr)
                .await
                .with_context(|| format!("control: cannot listen on {addr}"))?;
            let bound = listener.local_addr()?;
            announce.push_str(&format!("control {bound}\n"));
            info!(addr = %bound, "control listening");
            Some(tokio::spawn(run_control(listener, Arc::clone(&wan))))
        }
        None => None,
    };
    announce.push_str("ready\n");
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(announce.as_bytes())?;
    stdout.flush()?;
    drop(stdout);
    info!(links = wan.links().count(), "meridian-wan ready");

    wait_for_signal().await?;
    info!("stopping");
    if let Some(task) = control_task {
        task.abort();
    }
    wan.shutdown();
    Ok(())
}

async fn wait_for_signal() -> anyhow::Result<()> {
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
    tokio::select! {
        result = tokio::signal::ctrl_c() => result.context("waiting for Ctrl-C")?,
        _ = terminate.recv() => {}
    }
    Ok(())
}

fn print_dial_maps(plan: &WanPlan) -> anyhow::Result<()> {
    let mut stdout = std::io::stdout().lock();
    for (node, map) in &plan.peer_dial_maps {
        writeln!(stdout, "node {node} {}", format_dial_map(map))?;
    }
    for (region, map) in &plan.client_dial_maps {
        writeln!(stdout, "client {region} {}", format_dial_map(map))?;
    }
    Ok(())
}

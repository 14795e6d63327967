//! `meridian-lazyfs`: wiring only — parse flags, block the shutdown signals, mount, print
//! `mounted <M>`, wait for a signal or the end of the session, shut down cleanly.
//!
//! SIGKILL (the power loss) is not handled: it cannot be, and that is the point.

use anyhow::Context;
use clap::Parser;
use meridian_lazyfs::args::Args;
use meridian_lazyfs::mount::mount;
use nix::sys::signal::{kill, SigSet, Signal};
use nix::unistd::getpid;
use std::io::Write;
use std::time::Duration;

/// How long a clean shutdown waits for the session to end after the unmount.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(10);

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let args = Args::parse();

    // Block the shutdown signals before any thread starts (threads inherit the mask), then
    // take them synchronously below. SIGUSR1 is how the session thread says it ended.
    let mut signals = SigSet::empty();
    for signal in [
        Signal::SIGTERM,
        Signal::SIGINT,
        Signal::SIGHUP,
        Signal::SIGUSR1,
    ] {
        signals.add(signal);
    }
    signals.thread_block().context("blocking signals")?;

    let mounted = mount(&args.mount_config(), || {
        let _ = kill(getpid(), Signal::SIGUSR1);
    })
    .with_context(|| {
        format!(
            "mounting {} over {}",
            args.mount.display(),
            args.backing.display()
        )
    })?;
    {
        let mut stdout = std::io::stdout().lock();
        writeln!(stdout, "mounted {}", args.mount.display())?;
        stdout.flush()?;
    }
    tracing::info!(
        backing = %args.backing.display(),
        mount = %args.mount.display(),
        max_pending_bytes = args.max_pending_bytes,
        page_cache = args.page_cache,
        "mounted"
    );

    let signal = signals.wait().context("waiting for a signal")?;
    let state = mounted.state();
    let synced = if signal == Signal::SIGUSR1 {
        tracing::info!("unmounted from outside; flushing");
        mounted.flush_all()?
    } else {
        tracing::info!(?signal, "clean shutdown: flushing and unmounting");
        mounted.shutdown(SHUTDOWN_TIMEOUT)?
    };
    let stats = state.lock().map(|s| s.stats()).unwrap_or_default();
    tracing::info!(files_synced_at_shutdown = synced, ?stats, "stopped");
    Ok(())
}

//! The accept loop of one link, driven by the link's fault state.
//!
//! - `Normal`: accept, enforce the connection limit, spawn one task per connection.
//! - `Dropped`: stop calling `accept`. The kernel still completes handshakes into the listen
//!   backlog, so clients see a connect that succeeds and then silence, as behind a cut cable
//!   (a SYN would time out instead; the difference is the price of a user-space proxy). They are
//!   served after heal.
//! - `Reset`: close the listening socket, so connects get `ECONNREFUSED`; rebind on heal.
//! - `Shutdown` or the link dropped: return.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::{watch, Semaphore};
use tracing::{info, warn};

use crate::link::{LinkState, Mode, Shared};
use crate::pipe;

/// Listen backlog; the kernel caps it at `net.core.somaxconn`.
const LISTEN_BACKLOG: u32 = 1024;
/// Pause before retrying a failed accept (EMFILE) or a failed rebind after `reset`.
const RETRY_PAUSE: Duration = Duration::from_millis(100);

pub(crate) fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    // Lets `heal` rebind the address right after `reset` closed it.
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// Accepts while the link is normal; parks (kernel backlog keeps the handshakes) while it is
/// dropped; closes the listening socket while it is reset, so connects are refused.
pub(crate) async fn run_listener(
    listener: TcpListener,
    local_addr: SocketAddr,
    shared: Arc<Shared>,
    mut state: watch::Receiver<LinkState>,
) {
    let name = shared.spec.name.clone();
    let mut listener = Some(listener);
    let connection_slots = Arc::new(Semaphore::new(shared.options.max_connections));
    let mut connection_seq: u64 = 0;
    loop {
        let mode = state.borrow_and_update().mode;
        match mode {
            Mode::Shutdown => return,
            Mode::Reset => {
                if listener.take().is_some() {
                    info!(link = %name, listen = %local_addr, "listener closed: connects are refused");
                }
                if state.changed().await.is_err() {
                    return;
                }
                continue;
            }
            Mode::Dropped | Mode::Normal => {}
        }
        let Some(active) = listener.as_ref() else {
            match bind(local_addr) {
                Ok(rebound) => {
                    info!(link = %name, listen = %local_addr, "listener reopened");
                    listener = Some(rebound);
                }
                Err(error) => {
                    warn!(link = %name, listen = %local_addr, %error, "rebind failed; retrying");
                    tokio::time::sleep(RETRY_PAUSE).await;
                }
            }
            continue;
        };
        if mode == Mode::Dropped {
            if state.changed().await.is_err() {
                return;
            }
            continue;
        }
        tokio::select! {
            changed = state.changed() => if changed.is_err() { return },
            accepted = active.accept() => match accepted {
                Ok((stream, peer)) => {
                    shared.stats.connections_accepted.fetch_add(1, Ordering::Relaxed);
                    let Ok(slot) = Arc::clone(&connection_slots).try_acquire_owned() else {
                        shared.stats.connections_over_limit.fetch_add(1, Ordering::Relaxed);
                        warn!(link = %name, %peer, max = shared.options.max_connections,
                            "connection limit reached; closing the new connection");
                        continue;
                    };
                    connection_seq += 1;
                    let start = *state.borrow();
                    tokio::spawn(pipe::serve_connection(
                        stream, peer, connection_seq, Arc::clone(&shared), state.clone(), start,
                        slot,
                    ));
                }
                Err(error) => {
                    warn!(link = %name, %error, "accept failed; pausing");
                    tokio::time::sleep(RETRY_PAUSE).await;
                }
            },
        }
    }
}

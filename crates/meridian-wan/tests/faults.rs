//! Run-time faults: drop (black hole), reset (refuse), heal, and the per-link limits.

mod common;

use std::io::ErrorKind;
use std::time::{Duration, Instant};

use common::*;
use meridian_wan::{HealPolicy, LinkOptions, Mode};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// Long enough that a working link would certainly have answered on loopback.
const SILENCE: Duration = Duration::from_millis(400);

/// Drop makes requests time out (no reset, no EOF); heal closes the black-holed connection
/// and new connections work, including one that was opened during the drop.
#[tokio::test]
async fn drop_black_holes_and_heal_restores_service() {
    let echo = echo_server().await;
    let link = start_link(echo, 0, 0).await;
    let mut before = connect(link.local_addr()).await;
    round_trip(&mut before, b"hello").await;

    link.black_hole();
    assert_eq!(link.state().mode, Mode::Dropped);
    before.write_all(b"ping").await.expect("write during drop");
    assert_eq!(
        read_within(&mut before, SILENCE).await,
        ReadOutcome::TimedOut
    );
    // The kernel still completes the handshake (listen backlog), but nothing passes.
    let mut during = connect(link.local_addr()).await;
    during
        .write_all(b"queued")
        .await
        .expect("write during drop");
    assert_eq!(
        read_within(&mut during, SILENCE).await,
        ReadOutcome::TimedOut
    );

    link.heal();
    let outcome = read_within(&mut before, Duration::from_secs(2)).await;
    assert!(
        matches!(outcome, ReadOutcome::Closed | ReadOutcome::Failed(_)),
        "a connection black-holed by drop must be closed on heal, got {outcome:?}"
    );
    assert_eq!(
        read_within(&mut during, Duration::from_secs(2)).await,
        ReadOutcome::Data(6)
    );
    let mut after = connect(link.local_addr()).await;
    round_trip(&mut after, b"world").await;
}

/// Under the resume policy, heal lets a black-holed connection carry on with its bytes.
#[tokio::test]
async fn heal_with_resume_keeps_black_holed_connections() {
    let echo = echo_server().await;
    let options = LinkOptions {
        heal_policy: HealPolicy::Resume,
        ..LinkOptions::default()
    };
    let link = start_link_with(echo, 0, 0, options).await;
    let mut stream = connect(link.local_addr()).await;
    round_trip(&mut stream, b"hello").await;
    link.black_hole();
    stream.write_all(b"ping").await.expect("write during drop");
    assert_eq!(
        read_within(&mut stream, SILENCE).await,
        ReadOutcome::TimedOut
    );
    link.heal();
    assert_eq!(
        read_within(&mut stream, Duration::from_secs(2)).await,
        ReadOutcome::Data(4)
    );
}

/// Reset closes open connections and refuses new ones; heal reopens the same address.
#[tokio::test]
async fn reset_refuses_connections_until_heal() {
    let echo = echo_server().await;
    let link = start_link(echo, 0, 0).await;
    let addr = link.local_addr();
    let mut open = connect(addr).await;
    round_trip(&mut open, b"hello").await;

    link.reset();
    let outcome = read_within(&mut open, Duration::from_secs(2)).await;
    assert!(
        matches!(outcome, ReadOutcome::Closed | ReadOutcome::Failed(_)),
        "reset must close open connections, got {outcome:?}"
    );
    let refused = wait_until(Duration::from_secs(2), || async {
        matches!(TcpStream::connect(addr).await, Err(e) if e.kind() == ErrorKind::ConnectionRefused)
    })
    .await;
    assert!(refused, "connects to a reset link must be refused");

    link.heal();
    let reopened = wait_until(Duration::from_secs(2), || async {
        TcpStream::connect(addr).await.is_ok()
    })
    .await;
    assert!(reopened, "heal must reopen the listener on {addr}");
    let mut fresh = connect(addr).await;
    round_trip(&mut fresh, b"again").await;
}

/// Connections beyond the per-link limit are closed at once and counted.
#[tokio::test]
async fn connection_limit_closes_the_excess() {
    let echo = echo_server().await;
    let options = LinkOptions {
        max_connections: 2,
        ..LinkOptions::default()
    };
    let link = start_link_with(echo, 0, 0, options).await;
    let mut first = connect(link.local_addr()).await;
    let mut second = connect(link.local_addr()).await;
    round_trip(&mut first, b"1").await;
    round_trip(&mut second, b"2").await;
    let mut third = connect(link.local_addr()).await;
    let _ = third.write_all(b"3").await;
    let outcome = read_within(&mut third, Duration::from_secs(2)).await;
    assert!(
        matches!(outcome, ReadOutcome::Closed | ReadOutcome::Failed(_)),
        "the third connection must be closed, got {outcome:?}"
    );
    assert_eq!(link.stats().connections_over_limit, 1);
    assert_eq!(link.stats().connections_active, 2);
    round_trip(&mut first, b"still fine").await;
    drop(second);
    let mut replacement = wait_for_slot(&link).await;
    round_trip(&mut replacement, b"4").await;
}

/// The connect to the target has a deadline: an unreachable target does not hang the client.
#[tokio::test]
async fn connect_to_target_has_a_deadline() {
    let options = LinkOptions {
        connect_timeout: Duration::from_millis(200),
        ..LinkOptions::default()
    };
    // TEST-NET-1 (RFC 5737): never routed; SYNs vanish or fail at once, both end the wait.
    let unreachable = "192.0.2.1:9".parse().expect("literal");
    let link = start_link_with(unreachable, 0, 0, options).await;
    let started = Instant::now();
    let mut stream = connect(link.local_addr()).await;
    let outcome = read_within(&mut stream, Duration::from_secs(3)).await;
    assert!(
        matches!(outcome, ReadOutcome::Closed | ReadOutcome::Failed(_)),
        "client must be closed after the connect deadline, got {outcome:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "took {:?}",
        started.elapsed()
    );
    assert_eq!(link.stats().connect_failures, 1);
}

/// Retries `probe` every 20 ms until it holds or `limit` passes.
async fn wait_until<F, Fut>(limit: Duration, mut probe: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if probe().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

/// A connection freed by a closing client is reused once the proxy notices the close.
async fn wait_for_slot(link: &meridian_wan::Link) -> TcpStream {
    let freed = wait_until(Duration::from_secs(2), || async {
        link.stats().connections_active < 2
    })
    .await;
    assert!(freed, "closing a client must free its connection slot");
    connect(link.local_addr()).await
}

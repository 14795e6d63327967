//! Helpers shared by the integration tests: loopback servers on port 0 and timing utilities.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use meridian_wan::{Link, LinkOptions, LinkSpec};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Upper bound on any single wait in these tests, so a bug fails a test instead of hanging it.
pub const TEST_DEADLINE: Duration = Duration::from_secs(10);

pub fn loopback_any_port() -> SocketAddr {
    "127.0.0.1:0".parse().expect("valid literal")
}

/// An echo server on an ephemeral port; every connection gets its bytes back.
pub async fn echo_server() -> SocketAddr {
    let listener = TcpListener::bind(loopback_any_port())
        .await
        .expect("bind echo");
    let addr = listener.local_addr().expect("echo addr");
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut reader, mut writer) = stream.split();
                let _ = tokio::io::copy(&mut reader, &mut writer).await;
            });
        }
    });
    addr
}

pub fn spec(name: &str, target: SocketAddr, one_way_ms: u64, jitter_ms: u64) -> LinkSpec {
    LinkSpec {
        name: name.to_string(),
        listen: loopback_any_port(),
        target,
        one_way_delay: Duration::from_millis(one_way_ms),
        jitter: Duration::from_millis(jitter_ms),
        regions: None,
    }
}

pub async fn start_link(target: SocketAddr, one_way_ms: u64, jitter_ms: u64) -> Link {
    start_link_with(target, one_way_ms, jitter_ms, LinkOptions::default()).await
}

pub async fn start_link_with(
    target: SocketAddr,
    one_way_ms: u64,
    jitter_ms: u64,
    options: LinkOptions,
) -> Link {
    Link::start(spec("test", target, one_way_ms, jitter_ms), options)
        .await
        .expect("start link")
}

pub async fn connect(addr: SocketAddr) -> TcpStream {
    let stream = tokio::time::timeout(TEST_DEADLINE, TcpStream::connect(addr))
        .await
        .expect("connect deadline")
        .expect("connect");
    stream.set_nodelay(true).expect("nodelay");
    stream
}

/// Sends `payload` and waits for the same number of bytes back; returns the elapsed time.
pub async fn round_trip(stream: &mut TcpStream, payload: &[u8]) -> Duration {
    let started = Instant::now();
    stream.write_all(payload).await.expect("write");
    let mut back = vec![0u8; payload.len()];
    tokio::time::timeout(TEST_DEADLINE, stream.read_exact(&mut back))
        .await
        .expect("echo deadline")
        .expect("echo read");
    assert_eq!(back, payload, "echo returned different bytes");
    started.elapsed()
}

/// What a read within `wait` saw: data, a clean close, an error, or nothing at all.
#[derive(Debug, PartialEq, Eq)]
pub enum ReadOutcome {
    Data(usize),
    Closed,
    Failed(std::io::ErrorKind),
    TimedOut,
}

pub async fn read_within(stream: &mut TcpStream, wait: Duration) -> ReadOutcome {
    let mut buffer = [0u8; 1024];
    match tokio::time::timeout(wait, stream.read(&mut buffer)).await {
        Err(_) => ReadOutcome::TimedOut,
        Ok(Ok(0)) => ReadOutcome::Closed,
        Ok(Ok(read)) => ReadOutcome::Data(read),
        Ok(Err(error)) => ReadOutcome::Failed(error.kind()),
    }
}

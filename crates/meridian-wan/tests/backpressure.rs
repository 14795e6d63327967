//! Back-pressure: a reader that stalls does not make the proxy queue more than its bound.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use meridian_wan::LinkOptions;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpSocket;

const BOUND_BYTES: usize = 256 * 1024;
/// Far more than the kernel buffers on the path can hold, so the proxy's queue must fill.
const TOTAL_BYTES: usize = 32 * 1024 * 1024;

fn pattern_byte(position: usize) -> u8 {
    (position % 251) as u8
}

/// While the target does not read, the queue fills to the bound and stops there; the sender is
/// held back; once the target reads, every byte arrives in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_reader_keeps_the_queue_within_the_bound() {
    // A small receive buffer on the target keeps the kernel from absorbing the stream.
    let socket = TcpSocket::new_v4().expect("socket");
    socket.set_recv_buffer_size(4096).expect("rcvbuf");
    socket.bind(loopback_any_port()).expect("bind");
    let target = socket.listen(16).expect("listen");
    let target_addr = target.local_addr().expect("addr");
    let (release_tx, release_rx) = tokio::sync::oneshot::channel::<()>();
    let reader = tokio::spawn(async move {
        let (mut stream, _) = target.accept().await.expect("accept");
        release_rx.await.expect("release signal");
        let mut buffer = vec![0u8; 64 * 1024];
        let mut position = 0usize;
        loop {
            let read = stream.read(&mut buffer).await.expect("target read");
            if read == 0 {
                return position;
            }
            for (offset, byte) in buffer[..read].iter().enumerate() {
                assert_eq!(
                    *byte,
                    pattern_byte(position + offset),
                    "corrupt at {}",
                    position + offset
                );
            }
            position += read;
        }
    });

    let options = LinkOptions {
        max_in_flight_bytes: BOUND_BYTES,
        ..LinkOptions::default()
    };
    let link = start_link_with(target_addr, 0, 0, options).await;
    let mut client = connect(link.local_addr()).await;
    let written = Arc::new(AtomicUsize::new(0));
    let written_by_writer = Arc::clone(&written);
    let writer = tokio::spawn(async move {
        let mut position = 0usize;
        while position < TOTAL_BYTES {
            let block: Vec<u8> = (position..position + 64 * 1024).map(pattern_byte).collect();
            client.write_all(&block).await.expect("client write");
            position += block.len();
            written_by_writer.store(position, Ordering::Relaxed);
        }
        client.shutdown().await.expect("client shutdown");
    });

    tokio::time::sleep(Duration::from_secs(1)).await;
    let stalled = link.stats();
    let sent = written.load(Ordering::Relaxed);
    println!(
        "stalled: queued={} peak={} sent={sent}",
        stalled.queued_bytes, stalled.queued_bytes_peak_per_direction
    );
    assert!(
        stalled.queued_bytes_peak_per_direction <= BOUND_BYTES as u64,
        "{stalled:?}"
    );
    assert!(stalled.queued_bytes <= BOUND_BYTES as u64, "{stalled:?}");
    // The test would be vacuous if kernel buffers had absorbed everything.
    assert!(
        stalled.queued_bytes >= BOUND_BYTES as u64 / 2,
        "queue never filled: {stalled:?}"
    );
    assert!(sent < TOTAL_BYTES, "the sender was never held back");

    release_tx.send(()).expect("release");
    let received = tokio::time::timeout(Duration::from_secs(60), reader)
        .await
        .expect("drain deadline")
        .expect("reader task");
    writer.await.expect("writer task");
    assert_eq!(received, TOTAL_BYTES);
    let drained = link.stats();
    assert!(
        drained.queued_bytes_peak_per_direction <= BOUND_BYTES as u64,
        "{drained:?}"
    );
    assert_eq!(drained.bytes_forwarded, TOTAL_BYTES as u64);
}

//! Delay, ordering and throughput through one link, measured on loopback in real time.

mod common;

use std::time::{Duration, Instant};

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// Scheduling slack allowed above the emulated round trip on a busy 2-core machine.
const SLACK: Duration = Duration::from_millis(30);

/// A round trip through a link with one-way delay D takes at least 2D and not much more.
#[tokio::test]
async fn round_trip_pays_twice_the_one_way_delay() {
    let echo = echo_server().await;
    let link = start_link(echo, 40, 0).await;
    let mut stream = connect(link.local_addr()).await;
    let mut samples = Vec::new();
    for round in 0..6u8 {
        samples.push(round_trip(&mut stream, &[round; 16]).await);
    }
    let two_delays = Duration::from_millis(80);
    for sample in &samples {
        assert!(
            *sample >= two_delays,
            "round trip {sample:?} shorter than 2 x 40 ms"
        );
    }
    let fastest = *samples.iter().min().expect("samples");
    assert!(
        fastest < two_delays + SLACK,
        "fastest round trip {fastest:?} is too slow"
    );
    println!("rtt through a 40 ms one-way link: {samples:?}");
}

/// An undelayed link adds no delay of its own beyond scheduling noise.
#[tokio::test]
async fn zero_delay_link_adds_little() {
    let echo = echo_server().await;
    let link = start_link(echo, 0, 0).await;
    let mut stream = connect(link.local_addr()).await;
    let mut best = Duration::MAX;
    for round in 0..5u8 {
        best = best.min(round_trip(&mut stream, &[round; 8]).await);
    }
    println!("best undelayed round trip: {best:?}");
    assert!(best < SLACK, "undelayed round trip {best:?}");
}

/// Jitter of 30 ms on chunks sent 1 ms apart must not reorder a numbered stream.
#[tokio::test]
async fn order_is_preserved_under_jitter() {
    const BATCHES: u32 = 150;
    const PER_BATCH: u32 = 50;
    let echo = echo_server().await;
    let link = start_link(echo, 2, 30).await;
    let stream = connect(link.local_addr()).await;
    let (mut reader, mut writer) = stream.into_split();
    let sender = tokio::spawn(async move {
        for batch in 0..BATCHES {
            let numbers: Vec<u8> = (batch * PER_BATCH..(batch + 1) * PER_BATCH)
                .flat_map(u32::to_be_bytes)
                .collect();
            writer.write_all(&numbers).await.expect("write batch");
            // Separate reads at the proxy, so each batch gets its own jitter sample.
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        writer
    });
    let mut received = vec![0u8; (BATCHES * PER_BATCH * 4) as usize];
    tokio::time::timeout(TEST_DEADLINE, reader.read_exact(&mut received))
        .await
        .expect("stream deadline")
        .expect("read stream");
    let _writer = sender.await.expect("sender");
    for (expected, word) in received.chunks_exact(4).enumerate() {
        let number = u32::from_be_bytes(word.try_into().expect("four bytes"));
        assert_eq!(
            number, expected as u32,
            "stream reordered at position {expected}"
        );
    }
    assert!(link.stats().bytes_forwarded >= 2 * received.len() as u64);
}

/// Changing the delay at run time changes the round trip of an open connection.
#[tokio::test]
async fn delay_changes_at_run_time() {
    let echo = echo_server().await;
    let link = start_link(echo, 0, 0).await;
    let mut stream = connect(link.local_addr()).await;
    assert!(round_trip(&mut stream, b"a").await < Duration::from_millis(60));
    link.set_delay(Duration::from_millis(30), Duration::ZERO)
        .expect("set delay");
    let slow = round_trip(&mut stream, b"b").await;
    assert!(
        slow >= Duration::from_millis(60),
        "round trip {slow:?} after delay 30 ms"
    );
    link.set_delay(Duration::ZERO, Duration::ZERO)
        .expect("set delay");
    let mut best = Duration::MAX;
    for _ in 0..3 {
        best = best.min(round_trip(&mut stream, b"c").await);
    }
    assert!(
        best < Duration::from_millis(60),
        "round trip {best:?} after delay 0"
    );
}

/// Throughput of an undelayed link: a sink counts 64 MiB; prints MB/s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undelayed_link_throughput() {
    const TOTAL_BYTES: usize = 64 * 1024 * 1024;
    let sink = TcpListener::bind(loopback_any_port())
        .await
        .expect("bind sink");
    let sink_addr = sink.local_addr().expect("sink addr");
    let counter = tokio::spawn(async move {
        let (mut stream, _) = sink.accept().await.expect("accept");
        let mut buffer = vec![0u8; 256 * 1024];
        let mut total = 0usize;
        loop {
            let read = stream.read(&mut buffer).await.expect("sink read");
            if read == 0 {
                return total;
            }
            total += read;
        }
    });
    let link = start_link(sink_addr, 0, 0).await;
    let mut stream = connect(link.local_addr()).await;
    let block = vec![0x5au8; 256 * 1024];
    let started = Instant::now();
    for _ in 0..TOTAL_BYTES / block.len() {
        stream.write_all(&block).await.expect("write");
    }
    stream.shutdown().await.expect("shutdown");
    let received = tokio::time::timeout(Duration::from_secs(60), counter)
        .await
        .expect("sink deadline")
        .expect("sink task");
    let elapsed = started.elapsed();
    assert_eq!(received, TOTAL_BYTES);
    let megabytes_per_second = TOTAL_BYTES as f64 / 1e6 / elapsed.as_secs_f64();
    println!("undelayed link throughput: {megabytes_per_second:.0} MB/s ({elapsed:?} for 64 MiB)");
    assert!(megabytes_per_second > 5.0, "{megabytes_per_second:.1} MB/s");
}

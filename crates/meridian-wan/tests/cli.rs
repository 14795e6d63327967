//! The `meridian-wan` binary: flag errors, dial-map printing, and a live proxy with control.

mod common;

use std::io::Write as _;
use std::process::Stdio;
use std::time::Duration;

use common::*;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::Command;

const BINARY: &str = env!("CARGO_BIN_EXE_meridian-wan");

const TOPOLOGY: &str = r#"
peer_base_port = 24600
client_base_port = 24700
client_regions = ["eu-west"]

[[node]]
id = 1
region = "us-east"
peer_addr = "127.0.0.1:7101"
client_addr = "127.0.0.1:7001"

[[node]]
id = 2
region = "eu-west"
peer_addr = "127.0.0.1:7102"
client_addr = "127.0.0.1:7002"

[[node]]
id = 3
region = "ap-south"
peer_addr = "127.0.0.1:7103"
client_addr = "127.0.0.1:7003"
"#;

/// `--print-dial-map` prints one `node ID MAP` line per node and one line per client region.
#[tokio::test]
async fn print_dial_map_lists_every_node() {
    let mut file = tempfile::NamedTempFile::new().expect("temp file");
    file.write_all(TOPOLOGY.as_bytes()).expect("write config");
    let output = Command::new(BINARY)
        .arg("--config")
        .arg(file.path())
        .arg("--print-dial-map")
        .output()
        .await
        .expect("run binary");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8(output.stdout).expect("utf-8");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines,
        [
            "node 1 2=127.0.0.1:24600,3=127.0.0.1:24601",
            "node 2 1=127.0.0.1:24602,3=127.0.0.1:24603",
            "node 3 1=127.0.0.1:24604,2=127.0.0.1:24605",
            "client eu-west 1=127.0.0.1:24700,2=127.0.0.1:24701,3=127.0.0.1:24702",
        ]
    );
}

/// Bad flags exit non-zero with a message naming the problem.
#[tokio::test]
async fn bad_flags_fail_clearly() {
    let run = |args: &'static [&'static str]| async move {
        let output = Command::new(BINARY)
            .args(args)
            .output()
            .await
            .expect("run binary");
        assert!(!output.status.success(), "{args:?} should fail");
        String::from_utf8_lossy(&output.stderr).to_string()
    };
    let stderr = run(&["--link", "127.0.0.1:1"]).await;
    assert!(stderr.contains("expected LISTEN=TARGET first"), "{stderr}");
    let stderr = run(&["--link", "127.0.0.1:0=127.0.0.1:1,delay_ms=soon"]).await;
    assert!(stderr.contains("not a whole number"), "{stderr}");
    let stderr = run(&[]).await;
    assert!(stderr.contains("required"), "{stderr}");
    let stderr = run(&["--config", "/nonexistent/wan.toml"]).await;
    assert!(stderr.contains("config /nonexistent/wan.toml"), "{stderr}");
}

/// The binary proxies with the requested delay and answers its control port.
#[tokio::test]
async fn binary_proxies_and_obeys_control() {
    let echo = echo_server().await;
    let mut child = Command::new(BINARY)
        .arg("--link")
        .arg(format!("127.0.0.1:0={echo},delay_ms=20,name=a"))
        .args(["--control", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn binary");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let (mut link_addr, mut control_addr) = (None, None);
    loop {
        let line = tokio::time::timeout(TEST_DEADLINE, lines.next_line())
            .await
            .expect("startup deadline")
            .expect("stdout")
            .expect("binary exited before ready");
        let words: Vec<&str> = line.split(' ').collect();
        match words.as_slice() {
            ["link", "a", listen, _target] => link_addr = Some(listen.parse().expect("addr")),
            ["control", addr] => control_addr = Some(addr.parse().expect("addr")),
            ["ready"] => break,
            other => panic!("unexpected line {other:?}"),
        }
    }
    let mut stream = connect(link_addr.expect("link line")).await;
    let rtt = round_trip(&mut stream, b"through the binary").await;
    assert!(rtt >= Duration::from_millis(40), "rtt {rtt:?}");

    let control = connect(control_addr.expect("control line")).await;
    let (reader, mut writer) = control.into_split();
    let mut replies = BufReader::new(reader).lines();
    writer.write_all(b"drop a\nbogus\n").await.expect("send");
    for expected in ["ok dropped a", "error unknown command 'bogus'"] {
        let reply = tokio::time::timeout(TEST_DEADLINE, replies.next_line())
            .await
            .expect("reply deadline")
            .expect("reply")
            .expect("reply line");
        assert!(reply.starts_with(expected), "{reply}");
    }
    assert_eq!(
        read_within(&mut stream, Duration::from_millis(100)).await,
        ReadOutcome::TimedOut
    );
    child
        .kill()
        .await
        .expect("kill the binary this test started");
}

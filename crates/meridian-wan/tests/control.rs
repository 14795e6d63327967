//! The control protocol over TCP, against a running set of links.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use meridian_wan::control::{run_control, MAX_LINE_BYTES};
use meridian_wan::{LinkOptions, Mode, Wan};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};

struct Session {
    reader: BufReader<OwnedReadHalf>,
    writer: OwnedWriteHalf,
}

impl Session {
    async fn open(addr: std::net::SocketAddr) -> Session {
        let (reader, writer) = TcpStream::connect(addr)
            .await
            .expect("control connect")
            .into_split();
        Session {
            reader: BufReader::new(reader),
            writer,
        }
    }

    async fn ask(&mut self, line: &[u8]) -> String {
        self.writer.write_all(line).await.expect("send");
        self.writer.write_all(b"\n").await.expect("send");
        let mut reply = String::new();
        tokio::time::timeout(TEST_DEADLINE, self.reader.read_line(&mut reply))
            .await
            .expect("reply deadline")
            .expect("reply");
        reply.trim_end().to_string()
    }
}

async fn wan_with_regions() -> (Arc<Wan>, std::net::SocketAddr) {
    let echo = echo_server().await;
    let mut east_to_west = spec("east-west", echo, 0, 0);
    east_to_west.regions = Some(("us-east".into(), "eu-west".into()));
    let mut west_to_east = spec("west-east", echo, 0, 0);
    west_to_east.regions = Some(("eu-west".into(), "us-east".into()));
    let plain = spec("plain", echo, 0, 0);
    let wan = Wan::start(
        vec![east_to_west, west_to_east, plain],
        &LinkOptions::default(),
    )
    .await
    .expect("start wan");
    let wan = Arc::new(wan);
    let listener = TcpListener::bind(loopback_any_port())
        .await
        .expect("bind control");
    let addr = listener.local_addr().expect("control addr");
    tokio::spawn(run_control(listener, Arc::clone(&wan)));
    (wan, addr)
}

/// Every command answers one `ok` line and changes the link it names.
#[tokio::test]
async fn commands_change_link_state() {
    let (wan, addr) = wan_with_regions().await;
    let mut session = Session::open(addr).await;
    let status = session.ask(b"status").await;
    assert!(status.starts_with("ok name=east-west "), "{status}");
    assert_eq!(status.matches("state=normal").count(), 3, "{status}");

    assert_eq!(session.ask(b"drop plain").await, "ok dropped plain");
    assert_eq!(wan.link("plain").expect("link").state().mode, Mode::Dropped);
    assert_eq!(session.ask(b"heal plain").await, "ok healed plain");
    assert_eq!(session.ask(b"reset plain").await, "ok reset plain");
    assert_eq!(wan.link("plain").expect("link").state().mode, Mode::Reset);
    session.ask(b"heal plain").await;

    let reply = session.ask(b"drop-region eu-west us-east").await;
    assert_eq!(reply, "ok dropped 2 links between eu-west and us-east");
    for name in ["east-west", "west-east"] {
        assert_eq!(wan.link(name).expect("link").state().mode, Mode::Dropped);
    }
    assert_eq!(wan.link("plain").expect("link").state().mode, Mode::Normal);
    session.ask(b"heal-region us-east eu-west").await;
    assert_eq!(
        wan.link("west-east").expect("link").state().mode,
        Mode::Normal
    );

    assert_eq!(
        session.ask(b"delay plain 40 5").await,
        "ok delay plain one_way_ms=40 jitter_ms=5"
    );
    assert_eq!(
        session.ask(b"delay plain 20").await,
        "ok delay plain one_way_ms=20 jitter_ms=5"
    );
    let state = wan.link("plain").expect("link").state();
    assert_eq!(state.one_way_delay, Duration::from_millis(20));
    assert_eq!(state.jitter, Duration::from_millis(5));
    assert!(session
        .ask(b"status")
        .await
        .contains("one_way_ms=20 jitter_ms=5"));
}

/// Bad input answers `error ...` and the session stays usable; an overlong line ends it.
#[tokio::test]
async fn bad_input_is_answered_with_errors() {
    let (_wan, addr) = wan_with_regions().await;
    let mut session = Session::open(addr).await;
    assert_eq!(
        session.ask(b"drop nosuch").await,
        "error no link named 'nosuch'"
    );
    assert!(session
        .ask(b"fly plain")
        .await
        .starts_with("error unknown command 'fly'"));
    assert!(session
        .ask(b"delay plain soon")
        .await
        .starts_with("error 'soon' is not"));
    assert!(session.ask(b"").await.starts_with("error empty command"));
    assert_eq!(
        session.ask(b"drop-region us-east mars").await,
        "error no link between regions 'us-east' and 'mars'"
    );
    assert_eq!(
        session.ask(b"drop \xff\xfe").await,
        "error line is not UTF-8"
    );
    assert!(session.ask(b"help").await.starts_with("ok commands:"));
    let overlong = vec![b'a'; MAX_LINE_BYTES + 10];
    assert!(session
        .ask(&overlong)
        .await
        .starts_with("error line longer than"));
    let mut rest = String::new();
    let read = session.reader.read_line(&mut rest).await.unwrap_or(0);
    assert_eq!(read, 0, "the session must end after an overlong line");
}

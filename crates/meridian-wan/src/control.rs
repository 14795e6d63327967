//! The line-based control protocol, for scripts and test harnesses (`nc` is enough).
//!
//! One command per line, one answer line per command, starting with `ok` or `error`:
//!
//! ```text
//!   status                      ok <link status>; <link status>; ...
//!   drop NAME                   black-hole link NAME (both directions, nothing is closed)
//!   reset NAME                  close NAME's connections with RST, refuse new ones
//!   heal NAME                   end a drop or reset
//!   delay NAME MS [JITTER_MS]   one-way delay for new bytes; jitter unchanged when omitted
//!   drop-region A B             drop every link between regions A and B, both ways
//!   heal-region A B             heal every link between regions A and B
//!   help                        the command list
//! ```
//!
//! Limits: lines longer than [`MAX_LINE_BYTES`] end the session, at most
//! [`MAX_CONTROL_SESSIONS`] sessions at once, and an idle session is closed after
//! [`CONTROL_IDLE_TIMEOUT`].

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tracing::{debug, info, warn};

use crate::link::{Link, MAX_ONE_WAY_DELAY};
use crate::wan::Wan;

pub const MAX_LINE_BYTES: usize = 1024;
pub const MAX_CONTROL_SESSIONS: usize = 16;
pub const CONTROL_IDLE_TIMEOUT: Duration = Duration::from_secs(600);

const HELP: &str = "commands: status | drop NAME | reset NAME | heal NAME | \
                    delay NAME MS [JITTER_MS] | drop-region A B | heal-region A B | help";

/// A parsed control command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    Status,
    Help,
    Drop(String),
    Reset(String),
    Heal(String),
    Delay {
        name: String,
        one_way: Duration,
        jitter: Option<Duration>,
    },
    DropRegion(String, String),
    HealRegion(String, String),
}

/// Parses one line (without its line ending). The error is the text after `error `.
pub fn parse_command(line: &str) -> Result<Command, String> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let Some((&verb, args)) = words.split_first() else {
        return Err("empty command (try help)".to_string());
    };
    fn usage<T>(form: &str) -> Result<T, String> {
        Err(format!("usage: {form}"))
    }
    let one_name = |form: &str| match args {
        [name] => Ok(name.to_string()),
        _ => usage(form),
    };
    let two_regions = |form: &str| match args {
        [a, b] => Ok((a.to_string(), b.to_string())),
        _ => usage(form),
    };
    match verb {
        "status" if args.is_empty() => Ok(Command::Status),
        "status" => usage("status"),
        "help" => Ok(Command::Help),
        "drop" => one_name("drop NAME").map(Command::Drop),
        "reset" => one_name("reset NAME").map(Command::Reset),
        "heal" => one_name("heal NAME").map(Command::Heal),
        "delay" => match args {
            [name, one_way] => Ok(Command::Delay {
                name: name.to_string(),
                one_way: parse_ms(one_way)?,
                jitter: None,
            }),
            [name, one_way, jitter] => Ok(Command::Delay {
                name: name.to_string(),
                one_way: parse_ms(one_way)?,
                jitter: Some(parse_ms(jitter)?),
            }),
            _ => usage("delay NAME MS [JITTER_MS]"),
        },
        "drop-region" => two_regions("drop-region A B").map(|(a, b)| Command::DropRegion(a, b)),
        "heal-region" => two_regions("heal-region A B").map(|(a, b)| Command::HealRegion(a, b)),
        other => Err(format!("unknown command '{other}' (try help)")),
    }
}

fn parse_ms(text: &str) -> Result<Duration, String> {
    let ms: u64 = text
        .parse()
        .map_err(|_| format!("'{text}' is not a whole number of milliseconds"))?;
    let max_ms = MAX_ONE_WAY_DELAY.as_millis() as u64;
    if ms > max_ms {
        return Err(format!("{ms} ms is above the maximum of {max_ms} ms"));
    }
    Ok(Duration::from_millis(ms))
}

/// Applies a command; the answer line without its `ok `/`error ` prefix.
pub fn execute(wan: &Wan, command: &Command) -> Result<String, String> {
    let named = |name: &str| -> Result<&Link, String> {
        wan.link(name)
            .ok_or_else(|| format!("no link named '{name}'"))
    };
    let between = |a: &str, b: &str| -> Result<Vec<&Link>, String> {
        let links = wan.links_between_regions(a, b);
        if links.is_empty() {
            Err(format!("no link between regions '{a}' and '{b}'"))
        } else {
            Ok(links)
        }
    };
    match command {
        Command::Status => Ok(wan.status_lines().join("; ")),
        Command::Help => Ok(HELP.to_string()),
        Command::Drop(name) => named(name).map(|link| {
            link.black_hole();
            format!("dropped {name}")
        }),
        Command::Reset(name) => named(name).map(|link| {
            link.reset();
            format!("reset {name}")
        }),
        Command::Heal(name) => named(name).map(|link| {
            link.heal();
            format!("healed {name}")
        }),
        Command::Delay {
            name,
            one_way,
            jitter,
        } => {
            let link = named(name)?;
            let jitter = jitter.unwrap_or(link.state().jitter);
            link.set_delay(*one_way, jitter)
                .map_err(|error| error.to_string())?;
            Ok(format!(
                "delay {name} one_way_ms={} jitter_ms={}",
                one_way.as_millis(),
                jitter.as_millis()
            ))
        }
        Command::DropRegion(a, b) => between(a, b).map(|links| {
            links.iter().for_each(|link| link.black_hole());
            format!("dropped {} links between {a} and {b}", links.len())
        }),
        Command::HealRegion(a, b) => between(a, b).map(|links| {
            links.iter().for_each(|link| link.heal());
            format!("healed {} links between {a} and {b}", links.len())
        }),
    }
}

/// Parses and applies one line, returning the full answer line (without newline).
pub fn answer(wan: &Wan, line: &str) -> String {
    match parse_command(line).and_then(|command| execute(wan, &command)) {
        Ok(text) if text.is_empty() => "ok".to_string(),
        Ok(text) => format!("ok {text}"),
        Err(text) => format!("error {text}"),
    }
}

/// Serves control sessions until the task is aborted.
pub async fn run_control(listener: TcpListener, wan: Arc<Wan>) {
    let sessions = Arc::new(Semaphore::new(MAX_CONTROL_SESSIONS));
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                warn!(%error, "control accept failed; pausing");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(slot) = Arc::clone(&sessions).try_acquire_owned() else {
            warn!(%peer, max = MAX_CONTROL_SESSIONS, "too many control sessions; closing");
            continue;
        };
        let wan = Arc::clone(&wan);
        tokio::spawn(async move {
            debug!(%peer, "control session open");
            if let Err(error) = serve_session(stream, &wan).await {
                debug!(%peer, %error, "control session ended");
            }
            drop(slot);
        });
    }
}

async fn serve_session(stream: TcpStream, wan: &Wan) -> std::io::Result<()> {
    let (read_half, mut write_half) = stream.into_split();
    let mut reader = BufReader::new(read_half);
    let mut line = Vec::with_capacity(MAX_LINE_BYTES);
    loop {
        line.clear();
        let read = tokio::time::timeout(
            CONTROL_IDLE_TIMEOUT,
            (&mut reader)
                .take(MAX_LINE_BYTES as u64 + 1)
                .read_until(b'\n', &mut line),
        )
        .await
        .map_err(|_| std::io::Error::other("idle timeout"))??;
        if read == 0 {
            return Ok(());
        }
        if line.last() != Some(&b'\n') && line.len() > MAX_LINE_BYTES {
            let reply = format!("error line longer than {MAX_LINE_BYTES} bytes\n");
            write_half.write_all(reply.as_bytes()).await?;
            return Ok(());
        }
        let reply = match std::str::from_utf8(&line) {
            Ok(text) => {
                let text = text.trim_end_matches(['\n', '\r']);
                let reply = answer(wan, text);
                info!(command = text, reply = %reply, "control");
                reply
            }
            Err(_) => "error line is not UTF-8".to_string(),
        };
        write_half.write_all(reply.as_bytes()).await?;
        write_half.write_all(b"\n").await?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Well-formed commands parse to the right variant.
    #[test]
    fn parses_every_command() {
        assert_eq!(parse_command("status"), Ok(Command::Status));
        assert_eq!(parse_command("  drop   a  "), Ok(Command::Drop("a".into())));
        assert_eq!(parse_command("reset a"), Ok(Command::Reset("a".into())));
        assert_eq!(parse_command("heal a"), Ok(Command::Heal("a".into())));
        assert_eq!(
            parse_command("delay a 40"),
            Ok(Command::Delay {
                name: "a".into(),
                one_way: Duration::from_millis(40),
                jitter: None
            })
        );
        assert_eq!(
            parse_command("delay a 40 5"),
            Ok(Command::Delay {
                name: "a".into(),
                one_way: Duration::from_millis(40),
                jitter: Some(Duration::from_millis(5))
            })
        );
        assert_eq!(
            parse_command("drop-region us-east eu-west"),
            Ok(Command::DropRegion("us-east".into(), "eu-west".into()))
        );
        assert_eq!(
            parse_command("heal-region a b"),
            Ok(Command::HealRegion("a".into(), "b".into()))
        );
    }

    /// Bad input gets a reason, never a panic or a silent default.
    #[test]
    fn rejects_bad_input_with_a_reason() {
        let error = |line: &str| parse_command(line).unwrap_err();
        assert!(error("").contains("empty"));
        assert!(error("fly a").contains("unknown command 'fly'"));
        assert!(error("drop").contains("usage: drop NAME"));
        assert!(error("drop a b").contains("usage"));
        assert!(error("status now").contains("usage"));
        assert!(error("delay a").contains("usage"));
        assert!(error("delay a -5").contains("whole number"));
        assert!(error("delay a 4.5").contains("whole number"));
        assert!(error("delay a 40 x").contains("'x'"));
        assert!(error("delay a 999999").contains("maximum"));
        assert!(error("drop-region a").contains("usage"));
        assert!(error("DROP a").contains("unknown command"));
    }
}

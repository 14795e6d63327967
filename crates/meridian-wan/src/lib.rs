//! Meridian's WAN emulator: a delaying TCP proxy that puts regions "far apart" on one machine.
//!
//! # Why
//!
//! Meridian's point is geo-distribution: Raft groups span regions and every commit pays a
//! cross-region round trip. Testing that on loopback hides the very costs the design is about.
//! The usual tool, `tc qdisc ... netem`, needs a kernel module this machine's kernel does not
//! have (and root), so the latency is added in user space instead: every node-to-node and
//! client-to-node path goes through a proxy link that holds bytes for the path's one-way delay.
//!
//! # What
//!
//! ```text
//!   node 1 ──► link peer-1-to-2 (listen :24000, 40 ms each way) ──► node 2 (:7102)
//!        ◄───────────────────── replies, also 40 ms ◄────────────────────┘
//!
//!   per connection, per direction:
//!   read chunk ─► stamp release = max(prev release, now + delay + jitter) ─► queue ─► write
//! ```
//!
//! A [`Link`] listens on one address and forwards every accepted connection to one target; a
//! [`Wan`] is the set of running links, addressed by name or region pair. The [`matrix`] module
//! turns regions, one-way delays and a node list into one link per ordered node pair plus the
//! dial map each node should use; [`control`] is a line protocol that injects faults at run time
//! (`drop`, `reset`, `heal`, `delay`, per link or per region pair).
//!
//! # Invariants
//!
//! - **Order**: bytes of one connection leave in the order they arrived, whatever the jitter
//!   (release times are non-decreasing and one writer drains the queue in order).
//! - **Delay**: no byte leaves before `arrival + one-way delay`; a round trip takes at least
//!   twice the delay plus the real network time. Tokio's timer rounds up to whole milliseconds,
//!   so each delayed direction overshoots by up to ~1 ms (82.5 ms measured for 2 x 40 ms).
//! - **Bounded memory**: at most `max_in_flight_bytes` queued per direction per connection
//!   (the reader stops reading, so TCP back-pressure reaches the sender) and at most
//!   `max_connections` connections per link; the control protocol bounds line length and
//!   sessions. Like a TCP window, the bound caps one connection's throughput at
//!   `max_in_flight_bytes / one-way delay` (8 MiB / 40 ms ≈ 210 MB/s; 179 MB/s measured).
//! - **Deadlines**: the connect to a target has a deadline; control sessions have an idle timeout.
//! - **Faults**: `drop` is a black hole (nothing passes, nothing is closed: peers time out);
//!   `reset` closes connections with RST and closes the listener so connects are refused; `heal`
//!   ends either, and by default closes connections that lived through a drop (see
//!   [`HealPolicy`]).
//!
//! # Not done yet
//!
//! - Packet-level behaviour: no loss, duplication or corruption, no bandwidth limit or queueing
//!   delay under load; a link adds latency, nothing else. A per-link token bucket would be the
//!   next step.
//! - The TCP handshake costs no emulated round trip: the proxy accepts locally, so `connect`
//!   returns at once and only data pays the delay (a new connection is ~1 RTT cheaper than on a
//!   real WAN).
//! - During `drop`, connections already closed by an application stay open inside the proxy
//!   until heal (nothing is read, so their FIN is not seen); with many reconnects in a long
//!   partition a link can hit `max_connections`. New connects during `drop` wait in the kernel's
//!   listen backlog and are served after heal.
//! - A failed connect to the target closes the accepted connection (the client sees EOF, not
//!   `ECONNREFUSED`).
//! - UDP is not proxied; IPv6 works for addresses but is not tested.
//!
//! # Layout
//!
//! - [`link`]: one link — spec, options, fault state machine, listener task, counters.
//! - `listener`: a link's accept loop and what each fault does to it.
//! - `pipe`: one proxied connection — connect deadline, the delayed pumps, fault reactions.
//! - [`wan`]: the set of links; status lines.
//! - [`matrix`]: regions, latencies, link and dial-map planning.
//! - [`config`]: the TOML topology file.
//! - [`control`]: the control protocol (parsing, execution, server).
//! - [`args`]: the binary's flags and the `--link` syntax.

pub mod args;
pub mod config;
pub mod control;
pub mod error;
pub mod link;
mod listener;
pub mod matrix;
mod pipe;
pub mod wan;

pub use error::WanError;
pub use link::{HealPolicy, Link, LinkOptions, LinkSpec, LinkState, LinkStatsSnapshot, Mode};
pub use matrix::{LatencyMatrix, NodeEndpoint};
pub use pipe::{MAX_CHUNK_BYTES, MAX_QUEUED_CHUNKS};
pub use wan::Wan;

//! Admission: how much client work one node holds at once.
//!
//! Every `Kv` request takes a permit before it does anything. There are two budgets per node:
//! - **count**: at most `MAX_INFLIGHT_PROPOSALS_PER_SHARD × shards` requests in flight;
//! - **bytes**: at most [`MAX_INFLIGHT_REQUEST_BYTES_PER_NODE`] bytes of request messages in
//!   flight (their encoded size).
//!
//! A request that finds either budget spent fails at once with `UNAVAILABLE`, which the client
//! retries with backoff, rather than queueing without bound. Memory held by requests waiting on
//! Raft is thus capped, whether they are many small ones or a few batches near
//! `MAX_MESSAGE_BYTES`. Both permits are released when the handler returns, or, for a write,
//! when its proposal settles (a request dropped while its proposal runs keeps its permits).
//!
//!
//! Per connection (keyed by the client's address), requests are bounded by count by HTTP/2's
//! `MAX_CONCURRENT_STREAMS`, and by bytes by [`MAX_INFLIGHT_REQUEST_BYTES_PER_CONNECTION`] (a
//! quarter of the node's): one client connection cannot take the node's whole byte budget.
//!
//! # What this does not bound
//! - Bytes still arriving, before a message is decoded. HTTP/2 flow control, tonic's
//!   per-message limit (`MAX_MESSAGE_BYTES`) and `MAX_CONCURRENT_STREAMS` per connection bound
//!   that.
//! - Many connections from one client: each has its own per-connection budget, all share the
//!   node's.
//!
//! [`MAX_INFLIGHT_REQUEST_BYTES_PER_CONNECTION`]: meridian_types::limits::MAX_INFLIGHT_REQUEST_BYTES_PER_CONNECTION
//!
//! [`MAX_INFLIGHT_REQUEST_BYTES_PER_NODE`]: meridian_types::limits::MAX_INFLIGHT_REQUEST_BYTES_PER_NODE

use crate::error::{Result, ServerError};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The permits of one admitted request; dropping it releases them.
#[derive(Debug)]
pub struct Admitted {
    _count: OwnedSemaphorePermit,
    _bytes: Option<OwnedSemaphorePermit>,
    _connection: Option<ConnectionPermit>,
}

/// The byte budgets of the connections with requests in flight: each entry's semaphore and
/// how many admitted requests hold it (the entry goes when the last one is dropped, so the map
/// holds only connections with work in flight).
type Connections = Mutex<HashMap<SocketAddr, (Arc<Semaphore>, usize)>>;

/// One request's share of its connection's byte budget.
#[derive(Debug)]
struct ConnectionPermit {
    connections: Arc<Connections>,
    peer: SocketAddr,
    permit: Option<OwnedSemaphorePermit>,
}

impl Drop for ConnectionPermit {
    fn drop(&mut self) {
        drop(self.permit.take());
        let mut map = self.connections.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(entry) = map.get_mut(&self.peer) {
            entry.1 -= 1;
            if entry.1 == 0 {
                map.remove(&self.peer);
            }
        }
    }
}

/// A node's budgets.
#[derive(Debug, Clone)]
pub struct Admission {
    count: Arc<Semaphore>,
    max_requests: usize,
    bytes: Arc<Semaphore>,
    max_bytes: usize,
    connections: Arc<Connections>,
    max_connection_bytes: usize,
}

impl Admission {
    /// Budgets of `max_requests` and `max_bytes` per node, `max_connection_bytes` per
    /// connection.
    pub fn new(max_requests: usize, max_bytes: usize, max_connection_bytes: usize) -> Admission {
        let max_bytes = max_bytes.min(u32::MAX as usize);
        Admission {
            count: Arc::new(Semaphore::new(max_requests)),
            max_requests,
            bytes: Arc::new(Semaphore::new(max_bytes)),
            max_bytes,
            connections: Arc::default(),
            max_connection_bytes: max_connection_bytes.clamp(1, max_bytes.max(1)),
        }
    }

    /// Takes `bytes` of `peer`'s connection budget, or says it is spent.
    fn admit_connection(&self, peer: SocketAddr, bytes: usize) -> Result<ConnectionPermit> {
        let mut map = self.connections.lock().unwrap_or_else(|e| e.into_inner());
        let entry = map
            .entry(peer)
            .or_insert_with(|| (Arc::new(Semaphore::new(self.max_connection_bytes)), 0));
        let n = u32::try_from(bytes.min(self.max_connection_bytes)).unwrap_or(u32::MAX);
        let permit = match n {
            0 => None,
            n => match entry.0.clone().try_acquire_many_owned(n) {
                Ok(permit) => Some(permit),
                Err(_) => {
                    if entry.1 == 0 {
                        map.remove(&peer);
                    }
                    return Err(ServerError::Unavailable(format!(
                        "connection overloaded: over {} bytes of its requests in flight",
                        self.max_connection_bytes
                    )));
                }
            },
        };
        entry.1 += 1;
        Ok(ConnectionPermit {
            connections: self.connections.clone(),
            peer,
            permit,
        })
    }

    /// Requests admitted and not finished, and their encoded bytes.
    pub fn in_flight(&self) -> (usize, usize) {
        (
            self.max_requests
                .saturating_sub(self.count.available_permits()),
            self.max_bytes
                .saturating_sub(self.bytes.available_permits()),
        )
    }

    /// The node's budgets: requests, bytes.
    pub fn limits(&self) -> (usize, usize) {
        (self.max_requests, self.max_bytes)
    }

    /// Connections with requests in flight.
    pub fn connections_in_flight(&self) -> usize {
        self.connections
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len()
    }

    /// Admits a request of `bytes` encoded bytes from `peer` (if known), or says which budget
    /// is spent.
    pub fn try_admit(&self, bytes: usize, peer: Option<SocketAddr>) -> Result<Admitted> {
        let connection = peer
            .map(|peer| self.admit_connection(peer, bytes))
            .transpose()?;
        let count = self.count.clone().try_acquire_owned().map_err(|_| {
            ServerError::Unavailable("node overloaded: too many requests in flight".into())
        })?;
        let bytes = match bytes {
            0 => None,
            n => {
                let n = u32::try_from(n.min(self.max_bytes)).unwrap_or(u32::MAX);
                Some(self.bytes.clone().try_acquire_many_owned(n).map_err(|_| {
                    ServerError::Unavailable(format!(
                        "node overloaded: over {} bytes of requests in flight",
                        self.max_bytes
                    ))
                })?)
            }
        };
        Ok(Admitted {
            _count: count,
            _bytes: bytes,
            _connection: connection,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl Admission {
        fn try_admit_local(&self, bytes: usize) -> Result<Admitted> {
            self.try_admit(bytes, None)
        }
    }

    #[test]
    fn one_connection_cannot_take_the_whole_byte_budget() {
        let admission = Admission::new(100, 1_000, 300);
        let (a, b): (SocketAddr, SocketAddr) = (
            "127.0.0.1:5000".parse().unwrap(),
            "127.0.0.1:5001".parse().unwrap(),
        );
        let held = admission.try_admit(200, Some(a)).unwrap();
        let e = admission.try_admit(200, Some(a)).unwrap_err();
        assert!(e.to_string().contains("connection overloaded"), "{e}");
        let other = admission
            .try_admit(300, Some(b))
            .expect("another connection's budget");
        assert_eq!(admission.connections_in_flight(), 2);
        let small = admission
            .try_admit(100, Some(a))
            .expect("what is left of a's budget");
        drop((held, small));
        assert_eq!(
            admission.connections_in_flight(),
            1,
            "a's entry goes with its last request"
        );
        let _again = admission.try_admit(300, Some(a)).unwrap();
        drop(other);
        // The node's budget still binds across connections.
        let c: SocketAddr = "127.0.0.1:5002".parse().unwrap();
        let _c1 = admission.try_admit(300, Some(c)).unwrap();
        let d: SocketAddr = "127.0.0.1:5003".parse().unwrap();
        let _d1 = admission.try_admit(300, Some(d)).unwrap();
        let e = admission.try_admit(200, Some("127.0.0.1:5004".parse().unwrap()));
        assert!(e.unwrap_err().to_string().contains("node overloaded"));
        assert_eq!(
            admission.connections_in_flight(),
            3,
            "a refused request leaves no entry"
        );
    }

    #[test]
    fn each_budget_refuses_when_spent_and_is_returned_on_drop() {
        let admission = Admission::new(3, 100, 100);
        let a = admission.try_admit_local(60).unwrap();
        let e = admission.try_admit_local(50).unwrap_err();
        assert!(e.to_string().contains("bytes"), "{e}");
        let b = admission.try_admit_local(40).unwrap();
        let c = admission.try_admit_local(0).unwrap();
        let e = admission.try_admit_local(0).unwrap_err();
        assert!(e.to_string().contains("too many requests"), "{e}");
        drop((a, b, c));
        let _all = admission.try_admit_local(100).unwrap();
    }

    #[test]
    fn a_refused_byte_budget_returns_the_count_permit() {
        let admission = Admission::new(1, 10, 10);
        assert!(
            admission.try_admit_local(11).is_ok(),
            "a request over the whole budget takes all of it"
        );
        let held = admission.try_admit_local(5).unwrap();
        drop(held);
        let _held = admission.try_admit_local(10).unwrap();
        assert!(admission.try_admit_local(1).is_err());
    }
}

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
//! `MAX_MESSAGE_BYTES`. Both permits are released when the handler returns.
//!
//! # What this does not bound
//! - Bytes still arriving, before a message is decoded. HTTP/2 flow control, tonic's
//!   per-message limit (`MAX_MESSAGE_BYTES`) and `MAX_CONCURRENT_STREAMS` per connection bound
//!   that.
//! - Requests per connection. Every connection draws on the node's budgets.
//!
//! [`MAX_INFLIGHT_REQUEST_BYTES_PER_NODE`]: meridian_types::limits::MAX_INFLIGHT_REQUEST_BYTES_PER_NODE

use crate::error::{Result, ServerError};
use std::sync::Arc;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Both permits of one admitted request; dropping it releases them.
#[derive(Debug)]
pub struct Admitted {
    _count: OwnedSemaphorePermit,
    _bytes: Option<OwnedSemaphorePermit>,
}

/// A node's budgets.
#[derive(Debug, Clone)]
pub struct Admission {
    count: Arc<Semaphore>,
    bytes: Arc<Semaphore>,
    max_bytes: usize,
}

impl Admission {
    pub fn new(max_requests: usize, max_bytes: usize) -> Admission {
        let max_bytes = max_bytes.min(u32::MAX as usize);
        Admission {
            count: Arc::new(Semaphore::new(max_requests)),
            bytes: Arc::new(Semaphore::new(max_bytes)),
            max_bytes,
        }
    }

    /// Admits a request of `bytes` encoded bytes, or says which budget is spent.
    pub fn try_admit(&self, bytes: usize) -> Result<Admitted> {
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
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_budget_refuses_when_spent_and_is_returned_on_drop() {
        let admission = Admission::new(3, 100);
        let a = admission.try_admit(60).unwrap();
        let e = admission.try_admit(50).unwrap_err();
        assert!(e.to_string().contains("bytes"), "{e}");
        let b = admission.try_admit(40).unwrap();
        let c = admission.try_admit(0).unwrap();
        let e = admission.try_admit(0).unwrap_err();
        assert!(e.to_string().contains("too many requests"), "{e}");
        drop((a, b, c));
        let _all = admission.try_admit(100).unwrap();
    }

    #[test]
    fn a_refused_byte_budget_returns_the_count_permit() {
        let admission = Admission::new(1, 10);
        assert!(
            admission.try_admit(11).is_ok(),
            "a request over the whole budget takes all of it"
        );
        let held = admission.try_admit(5).unwrap();
        drop(held);
        let _held = admission.try_admit(10).unwrap();
        assert!(admission.try_admit(1).is_err());
    }
}

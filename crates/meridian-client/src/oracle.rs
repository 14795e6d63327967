//! Test-only: timestamps from a central oracle ([`crate::ClientConfig::timestamp_oracle`]).
//!
//! # Why it exists
//! Meridian has no timestamp oracle: a transaction's read timestamp is the clock of the first
//! node it reads, and commit timestamps come from the shards it writes, so a transaction
//! touches only the nodes that hold its data. Designs with an oracle (TiDB's PD, Percolator)
//! fetch timestamps from one place, and every transaction far from it pays a round trip. The
//! geo benchmark (`bench/geo`) measures that difference side by side, and this mode is its
//! "other side": the client fetches every attempt's read timestamp from the metadata shard's
//! leader (`Cluster.Timestamp`), so the oracle lives where the metadata leader is and moves
//! with it, as PD's does.
//!
//! # What it does and does not emulate
//! - One fetch per transaction attempt, before its first read: the attempt then reads at that
//!   timestamp on every shard (a snapshot read at a given `read_ts`, as later reads of any
//!   attempt are).
//! - A TSO design fetches a second timestamp to commit a writing transaction; Meridian's
//!   shards pick commit timestamps themselves, so this mode does not, and understates an
//!   oracle's cost for writes by that round trip.
//! - The timestamp is the leader's hybrid-logical clock, not a persisted, strictly increasing
//!   oracle sequence: correctness still rests on Meridian's own rules (any node's clock may
//!   pick a read timestamp), so this mode neither weakens nor strengthens a guarantee.
//!
//! The address that answered is cached; `NOT_LEADER` answers carry the leader's address,
//! which is followed at once; other retryable failures back off and try the seeds in turn.

use crate::client::{cluster_client, request, Client, ATTEMPT_GRACE};
use crate::error::{Error, Result};
use meridian_proto::kv::TimestampRequest;
use meridian_types::Timestamp;

impl Client {
    /// A timestamp from the metadata shard's leader (oracle mode only).
    pub(crate) async fn oracle_timestamp(&self) -> Result<Timestamp> {
        let deadline = self.deadline();
        let mut backoff = self.backoff();
        let seeds = &self.config().seeds;
        let mut attempts = 0u32;
        let cached = self.inner_oracle().clone();
        let mut address = cached.unwrap_or_else(|| seeds[0].clone());
        let mut last: Option<Error> = None;
        loop {
            attempts += 1;
            if attempts > self.config().max_attempts.max(1) {
                return Err(deadline.exceeded(attempts - 1, last));
            }
            let timeout = self.config().rpc_timeout.min(deadline.remaining());
            let call = async {
                let mut cluster = cluster_client(self.channel(&address)?);
                cluster
                    .timestamp(request(TimestampRequest {}, timeout))
                    .await
                    .map_err(|status| Error::from_status(&status, &address))
            };
            let error = match tokio::time::timeout(timeout + ATTEMPT_GRACE, call).await {
                Ok(Ok(reply)) if reply.get_ref().ts != 0 => {
                    *self.inner_oracle() = Some(address);
                    return Ok(Timestamp(reply.into_inner().ts));
                }
                Ok(Ok(_)) => Error::internal("the oracle answered timestamp 0"),
                Ok(Err(error)) => error,
                Err(_) => Error::Transport {
                    address: address.clone(),
                    message: format!("no answer within {} ms", timeout.as_millis()),
                },
            };
            if !error.is_retryable() {
                return Err(error);
            }
            if let Error::NotLeader {
                leader: Some(hint), ..
            } = &error
            {
                if hint.address != address {
                    address = hint.address.clone();
                    last = Some(error);
                    continue;
                }
            }
            // No usable hint: the next seed, after a backoff.
            let next = seeds
                .iter()
                .position(|s| *s == address)
                .map_or(0, |i| (i + 1) % seeds.len());
            address = seeds[next].clone();
            last = Some(error);
            self.back_off(&mut backoff, &deadline, attempts, &mut last)
                .await?;
        }
    }
}

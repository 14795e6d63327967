//! Compare-and-swap on one key: [`Client::compare_and_swap`].
//!
//! The server evaluates the condition inside the shard's state machine, at the write's place
//! in the Raft log, so the check and the write are one linearizable step — no lock held by a
//! client, no window between a read and a write. Typical use is optimistic read-modify-write:
//! read the key with [`Client::get_versioned`], compute the new value, and swap it in only if
//! the version is still the one read ([`Expect::Version`]); on [`CasOutcome::Mismatch`] start
//! over from the state the mismatch returns.
//!
//! Retries follow the write rules (see `write_retry`): one write id for every attempt, so a
//! swap that applied is never applied twice, and a call that ends without knowing the outcome
//! returns [`Error::Ambiguous`](crate::Error::Ambiguous).

use crate::client::{kv_client, request, Route};
use crate::error::Result;
use crate::routing::Routed;
use crate::{validate, Client, Versioned};
use bytes::Bytes;
use meridian_proto::kv::{self as proto, cas_request};
use meridian_types::Timestamp;

/// The condition of a compare-and-swap, on the key's newest version.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Expect {
    /// The key has no live value (never written, or deleted).
    Absent,
    /// The key's live value has exactly this version timestamp (from
    /// [`Client::get_versioned`] or an earlier swap's commit timestamp).
    Version(Timestamp),
    /// The key's live value equals these bytes.
    Value(Bytes),
}

/// What a compare-and-swap did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CasOutcome {
    /// The condition held and the write applied at `commit_ts`.
    Swapped { commit_ts: Timestamp },
    /// The condition did not hold; nothing was written. `current` is the key's newest version
    /// the condition was checked against (`None`: absent or deleted).
    Mismatch { current: Option<Versioned> },
}

impl CasOutcome {
    pub fn swapped(&self) -> bool {
        matches!(self, CasOutcome::Swapped { .. })
    }
}

impl Client {
    /// Writes `new` under `key` (`None` = delete) only if the key's newest version matches
    /// `expect`, as one atomic, linearizable step (see the [module docs](crate::cas)).
    pub async fn compare_and_swap(
        &self,
        key: impl Into<Bytes>,
        expect: Expect,
        new: Option<Bytes>,
    ) -> Result<CasOutcome> {
        let key: Bytes = key.into();
        validate::key(&key)?;
        let expect = match expect {
            Expect::Absent => cas_request::Expect::ExpectAbsent(true),
            Expect::Version(ts) => cas_request::Expect::ExpectVersionTs(ts.0),
            Expect::Value(v) => {
                validate::value(&v)?;
                cas_request::Expect::ExpectValue(v)
            }
        };
        let action = match new {
            Some(v) => {
                validate::value(&v)?;
                cas_request::Action::PutValue(v)
            }
            None => cas_request::Action::Delete(true),
        };
        let deadline = self.deadline();
        let message = proto::CasRequest {
            key: key.clone(),
            expect: Some(expect),
            action: Some(action),
            write_id: Some(self.next_write_id()),
            route: None,
        };
        let response = self
            .write_call(Route::Key(&key), &deadline, |channel, timeout, route| {
                let message = message.routed(route);
                async move {
                    kv_client(channel)
                        .cas(request(message, timeout))
                        .await
                        .map(|r| r.into_inner())
                }
            })
            .await?;
        Ok(outcome(response))
    }
}

fn outcome(response: proto::CasResponse) -> CasOutcome {
    if response.succeeded {
        CasOutcome::Swapped {
            commit_ts: Timestamp(response.commit_ts),
        }
    } else {
        CasOutcome::Mismatch {
            current: response.found.then(|| Versioned {
                value: response.current_value,
                version_ts: Timestamp(response.current_version_ts),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn responses_map_to_outcomes() {
        let swapped = outcome(proto::CasResponse {
            succeeded: true,
            commit_ts: 42,
            ..Default::default()
        });
        assert_eq!(
            swapped,
            CasOutcome::Swapped {
                commit_ts: Timestamp(42)
            }
        );
        let absent = outcome(proto::CasResponse::default());
        assert_eq!(absent, CasOutcome::Mismatch { current: None });
        let other = outcome(proto::CasResponse {
            found: true,
            current_value: Bytes::from_static(b"x"),
            current_version_ts: 7,
            ..Default::default()
        });
        assert_eq!(
            other,
            CasOutcome::Mismatch {
                current: Some(Versioned {
                    value: Bytes::from_static(b"x"),
                    version_ts: Timestamp(7)
                })
            }
        );
    }
}

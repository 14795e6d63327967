//! Request validation for the `Kv` service: every limit is checked before anything is
//! proposed or read, and a bad request is `INVALID_ARGUMENT` with the limit's name.

use crate::error::ServerError;
use crate::error::{invalid, Result};
use crate::kv::request_id;
use crate::shard_map::ShardDescriptor;
use meridian_proto::kv::{cas_request, CasRequest, Route, ScanRequest};
use meridian_raft::{Command, Expect};
use meridian_types::limits::*;

/// `WRONG_SHARD` unless the client's `route`, if it sent one, names the shard this node's map
/// gives the request (`desc`) at that shard's current generation: a client whose cached map is
/// stale (a split or merge since, or another cluster's map) must refresh it rather than have
/// its keys served by a shard it did not mean.
pub fn check_route(desc: &ShardDescriptor, route: Option<&Route>) -> Result<()> {
    match route {
        Some(r) if r.shard_id != desc.id.0 || r.generation != desc.generation => {
            Err(ServerError::WrongShard(format!(
                "the request was routed to shard {} generation {}, but this node's shard map \
                 gives it to shard {} generation {}; refresh the shard map",
                r.shard_id, r.generation, desc.id, desc.generation
            )))
        }
        _ => Ok(()),
    }
}

pub fn check_key(key: &[u8], what: &str) -> Result<()> {
    if key.is_empty() {
        return Err(invalid(format!("{what} is empty")));
    }
    if key.len() > MAX_KEY_BYTES {
        return Err(invalid(format!(
            "{what} is {} bytes, over MAX_KEY_BYTES ({MAX_KEY_BYTES})",
            key.len()
        )));
    }
    Ok(())
}

pub fn check_value(value: &[u8]) -> Result<()> {
    if value.len() > MAX_VALUE_BYTES {
        return Err(invalid(format!(
            "value is {} bytes, over MAX_VALUE_BYTES ({MAX_VALUE_BYTES})",
            value.len()
        )));
    }
    Ok(())
}

pub fn check_scan(req: &ScanRequest) -> Result<()> {
    if req.limit == 0 || req.limit > MAX_SCAN_LIMIT {
        return Err(invalid(format!(
            "scan limit {} is outside 1..={MAX_SCAN_LIMIT}",
            req.limit
        )));
    }
    if req.start.len() > MAX_KEY_BYTES || req.end.len() > MAX_KEY_BYTES {
        return Err(invalid(format!(
            "scan bound over MAX_KEY_BYTES ({MAX_KEY_BYTES})"
        )));
    }
    if !req.end.is_empty() && req.start >= req.end {
        return Err(invalid(format!(
            "scan range is inverted or empty: start {:?} >= end {:?}",
            String::from_utf8_lossy(&req.start),
            String::from_utf8_lossy(&req.end)
        )));
    }
    Ok(())
}

/// The replicated command of a valid CAS request, proposed at `ts`.
pub fn cas_command(req: CasRequest, ts: u64) -> Result<Command> {
    check_key(&req.key, "key")?;
    let expect = match req.expect {
        Some(cas_request::Expect::ExpectAbsent(true)) => Expect::Absent,
        Some(cas_request::Expect::ExpectAbsent(false)) | None => {
            return Err(invalid(
                "cas needs a condition: expect_absent, expect_version_ts or expect_value",
            ))
        }
        Some(cas_request::Expect::ExpectVersionTs(ts)) => Expect::Version(ts),
        Some(cas_request::Expect::ExpectValue(v)) => {
            check_value(&v)?;
            Expect::Value(v)
        }
    };
    let value = match req.action {
        Some(cas_request::Action::PutValue(v)) => {
            check_value(&v)?;
            Some(v)
        }
        Some(cas_request::Action::Delete(true)) => None,
        Some(cas_request::Action::Delete(false)) | None => {
            return Err(invalid("cas needs an action: put_value or delete"))
        }
    };
    Ok(Command::Cas {
        ts,
        key: req.key,
        expect,
        value,
        request: request_id(req.write_id),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn req(expect: Option<cas_request::Expect>, action: Option<cas_request::Action>) -> CasRequest {
        CasRequest {
            key: Bytes::from_static(b"k"),
            expect,
            action,
            write_id: None,
            route: None,
        }
    }

    #[test]
    fn a_cas_needs_a_condition_and_an_action() {
        use cas_request::{Action, Expect as E};
        let put = Some(Action::PutValue(Bytes::from_static(b"v")));
        let e = cas_command(req(None, put.clone()), 1).unwrap_err();
        assert!(e.to_string().contains("condition"), "{e}");
        assert!(cas_command(req(Some(E::ExpectAbsent(false)), put.clone()), 1).is_err());
        let e = cas_command(req(Some(E::ExpectAbsent(true)), None), 1).unwrap_err();
        assert!(e.to_string().contains("action"), "{e}");
        assert!(cas_command(
            req(Some(E::ExpectAbsent(true)), Some(Action::Delete(false))),
            1
        )
        .is_err());
        let ok = cas_command(
            req(Some(E::ExpectVersionTs(7)), Some(Action::Delete(true))),
            9,
        )
        .unwrap();
        assert!(matches!(
            ok,
            Command::Cas {
                ts: 9,
                expect: Expect::Version(7),
                value: None,
                ..
            }
        ));
    }

    #[test]
    fn a_cas_respects_the_key_and_value_limits() {
        use cas_request::{Action, Expect as E};
        let big = Bytes::from(vec![0u8; MAX_VALUE_BYTES + 1]);
        let put = Some(Action::PutValue(Bytes::from_static(b"v")));
        assert!(cas_command(req(Some(E::ExpectValue(big.clone())), put.clone()), 1).is_err());
        assert!(cas_command(
            req(Some(E::ExpectAbsent(true)), Some(Action::PutValue(big))),
            1
        )
        .is_err());
        let mut empty_key = req(Some(E::ExpectAbsent(true)), put);
        empty_key.key = Bytes::new();
        assert!(cas_command(empty_key, 1).is_err());
    }
}

//! The single-key calls: [`Client::get`], [`Client::get_versioned`], [`Client::put`],
//! [`Client::delete`] (each one routed and retried by `retry`), and their result types.

use super::{kv_client, request, Client, Route};
use crate::error::Result;
use crate::routing::Routed;
use crate::validate;
use bytes::Bytes;
use meridian_proto::kv as proto;
use meridian_types::Timestamp;

/// A value and the HLC timestamp of the version it came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Versioned {
    pub value: Bytes,
    pub version_ts: Timestamp,
}

/// One row of a scan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyValue {
    pub key: Bytes,
    pub value: Bytes,
    pub version_ts: Timestamp,
}

impl Client {
    /// Reads `key`'s latest value (linearizable by default). `None` if absent or deleted.
    pub async fn get(&self, key: impl Into<Bytes>) -> Result<Option<Bytes>> {
        Ok(self.get_versioned(key).await?.map(|v| v.value))
    }

    /// Like [`Client::get`], with the version's HLC timestamp.
    pub async fn get_versioned(&self, key: impl Into<Bytes>) -> Result<Option<Versioned>> {
        let consistency = self.inner.config.read_consistency;
        let response = self.get_call(key.into(), consistency).await?;
        Ok(response.found.then(|| Versioned {
            value: response.value,
            version_ts: Timestamp(response.version_ts),
        }))
    }

    /// One `Kv.Get` of `key` with `consistency`, routed (and retried) by `read_call`.
    pub(crate) async fn get_call(
        &self,
        key: Bytes,
        consistency: crate::ReadConsistency,
    ) -> Result<proto::GetResponse> {
        validate::key(&key)?;
        let deadline = self.deadline();
        let message = proto::GetRequest {
            key: key.clone(),
            consistency: consistency.to_proto(),
            route: None,
            staleness: consistency.staleness(),
        };
        self.read_call(
            Route::Key(&key),
            &deadline,
            consistency,
            |channel, timeout, route| {
                let message = message.routed(route);
                async move {
                    kv_client(channel)
                        .get(request(message, timeout))
                        .await
                        .map(|r| r.into_inner())
                }
            },
        )
        .await
    }

    /// Writes `value` under `key`; returns the new version's commit timestamp.
    pub async fn put(&self, key: impl Into<Bytes>, value: impl Into<Bytes>) -> Result<Timestamp> {
        let key: Bytes = key.into();
        let value: Bytes = value.into();
        validate::key(&key)?;
        validate::value(&value)?;
        let deadline = self.deadline();
        let message = proto::PutRequest {
            key: key.clone(),
            value,
            write_id: Some(self.inner.write_ids.next()),
            route: None,
        };
        let response = self
            .write_call(Route::Key(&key), &deadline, |channel, timeout, route| {
                let message = message.routed(route);
                async move {
                    kv_client(channel)
                        .put(request(message, timeout))
                        .await
                        .map(|r| r.into_inner())
                }
            })
            .await?;
        Ok(Timestamp(response.commit_ts))
    }

    /// Deletes `key` (writes a tombstone); returns the tombstone's commit timestamp.
    pub async fn delete(&self, key: impl Into<Bytes>) -> Result<Timestamp> {
        let key: Bytes = key.into();
        validate::key(&key)?;
        let deadline = self.deadline();
        let message = proto::DeleteRequest {
            key: key.clone(),
            write_id: Some(self.inner.write_ids.next()),
            route: None,
        };
        let response = self
            .write_call(Route::Key(&key), &deadline, |channel, timeout, route| {
                let message = message.routed(route);
                async move {
                    kv_client(channel)
                        .delete(request(message, timeout))
                        .await
                        .map(|r| r.into_inner())
                }
            })
            .await?;
        Ok(Timestamp(response.commit_ts))
    }
}

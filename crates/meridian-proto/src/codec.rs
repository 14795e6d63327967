//! The protobuf codec of every generated service: prost's, except that a body that is not a
//! valid message is the *sender's* mistake.
//!
//! tonic-prost maps a protobuf decode failure to `INTERNAL` (following the gRPC status code
//! guide), so a client that sent garbage saw a server fault. Meridian answers
//! `INVALID_ARGUMENT` with `meridian-code: INVALID_ARGUMENT`, the code its own validation uses,
//! so every client can tell its mistakes from server faults. (The same codec decodes responses
//! in the Rust client, where a malformed response also surfaces as `INVALID_ARGUMENT`: the
//! protocol was broken either way, and nothing retries it.)

use std::marker::PhantomData;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic::Status;
use tonic_prost::{ProstCodec, ProstDecoder, ProstEncoder};

/// Metadata key and value of Meridian's error code (mirrors `meridian_types::error`, which this
/// crate does not depend on).
const ERROR_CODE_HEADER: &str = "meridian-code";
const INVALID_ARGUMENT: &str = "INVALID_ARGUMENT";

/// A [`Codec`] for prost messages that reports undecodable bodies as `INVALID_ARGUMENT`.
pub struct CheckedCodec<T, U> {
    inner: ProstCodec<T, U>,
}

impl<T, U> Default for CheckedCodec<T, U> {
    fn default() -> Self {
        CheckedCodec {
            inner: ProstCodec::default(),
        }
    }
}

impl<T, U> Codec for CheckedCodec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = CheckedDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        self.inner.encoder()
    }

    fn decoder(&mut self) -> Self::Decoder {
        CheckedDecoder {
            inner: self.inner.decoder(),
            _pd: PhantomData,
        }
    }
}

/// Decodes like prost and turns a decode failure into `INVALID_ARGUMENT`.
pub struct CheckedDecoder<U> {
    inner: ProstDecoder<U>,
    _pd: PhantomData<U>,
}

impl<U: prost::Message + Default> Decoder for CheckedDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        self.inner.decode(buf).map_err(malformed)
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.inner.buffer_settings()
    }
}

fn malformed(status: Status) -> Status {
    if status.code() != tonic::Code::Internal {
        return status;
    }
    let mut out = Status::invalid_argument(format!(
        "the message is not a valid protobuf encoding of the request type: {}",
        status.message()
    ));
    if let Ok(value) = INVALID_ARGUMENT.parse() {
        out.metadata_mut().insert(ERROR_CODE_HEADER, value);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_failures_become_invalid_argument_with_the_meridian_code() {
        let status = malformed(Status::internal("invalid wire type"));
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert_eq!(
            status.metadata().get(ERROR_CODE_HEADER).unwrap(),
            INVALID_ARGUMENT
        );
        // Other statuses (e.g. size limits) pass through unchanged.
        let limit = malformed(Status::out_of_range("too big"));
        assert_eq!(limit.code(), tonic::Code::OutOfRange);
    }
}

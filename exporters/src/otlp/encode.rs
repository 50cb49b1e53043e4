//! A payload → its gRPC frame (the message, gzip-compressed at the configured level, with the
//! 5-byte prefix), built once per payload.

use super::send::GrpcSender;
use crate::common;
use inferwatch_core::pdata::{Payload, Signal};
use tonic::Status;

impl GrpcSender {
    /// The gRPC message of `data`, framed by hand so that encoded payloads go out without a
    /// decode / re-encode and gzip runs at the configured level (tonic's codec fixes level 6).
    pub(super) fn frame(&self, data: &Payload) -> Result<GrpcRequest, Status> {
        let chunks = data.to_chunks();
        let (flag, msg) = match self.gzip {
            Some(level) => (1u8, common::gzip_chunks(&chunks, level).map_err(|e| Status::internal(e.to_string()))?),
            None => (0u8, chunks.iter().flat_map(|c| c.iter().copied()).collect()),
        };
        let len = u32::try_from(msg.len()).map_err(|_| Status::resource_exhausted("request larger than 4 GiB"))?;
        let mut frame = bytes::BytesMut::with_capacity(5 + msg.len());
        frame.extend_from_slice(&[flag]);
        frame.extend_from_slice(&len.to_be_bytes());
        frame.extend_from_slice(&msg);
        Ok(GrpcRequest { signal: data.signal(), frame: frame.freeze() })
    }
}

/// One export request: the signal and its gRPC frame (the message, compressed, with its
/// 5-byte prefix), built once and sent on every attempt.
#[derive(Debug, Clone, PartialEq)]
pub struct GrpcRequest {
    /// The signal, which chooses the Export method.
    pub signal: Signal,
    /// The length-prefixed message.
    pub frame: bytes::Bytes,
}

//! A payload → its OTLP/HTTP body (protobuf passed through or OTLP/JSON, gzip-compressed at
//! the configured level), built once per payload.

use super::config::Encoding;
use super::send::HttpSender;
use crate::common;
use inferwatch_core::exporterhelper::SendError;
use inferwatch_core::pdata::Payload;

impl HttpSender {
    /// The body of `data`: encoded as configured, then gzip-compressed (once per payload).
    pub(super) fn body(&self, data: &Payload) -> Result<bytes::Bytes, SendError> {
        let chunks = chunks(data, self.encoding)?;
        match self.gzip {
            Some(level) => common::gzip_chunks(&chunks, level)
                .map(bytes::Bytes::from)
                .map_err(|e| SendError::Permanent(format!("gzip failed: {e}"))),
            None if chunks.len() == 1 => Ok(chunks[0].clone()),
            None => Ok(chunks.iter().flat_map(|c| c.iter().copied()).collect::<Vec<u8>>().into()),
        }
    }
}

/// The body as chunks: protobuf is passed through without copying; JSON needs the decoded form.
pub(super) fn chunks(data: &Payload, encoding: Encoding) -> Result<Vec<bytes::Bytes>, SendError> {
    match encoding {
        Encoding::Proto => Ok(data.to_chunks()),
        Encoding::Json => {
            let decoded =
                data.decoded().map_err(|e| SendError::Permanent(format!("cannot decode the payload: {e}")))?;
            match decoded.as_ref() {
                Payload::Traces(r) => serde_json::to_vec(r),
                Payload::Metrics(r) => serde_json::to_vec(r),
                Payload::Logs(r) => serde_json::to_vec(r),
                Payload::Encoded(_) => Ok(Vec::new()),
            }
            .map(|v| vec![bytes::Bytes::from(v)])
            .map_err(|e| SendError::Permanent(format!("cannot encode OTLP/JSON: {e}")))
        }
    }
}

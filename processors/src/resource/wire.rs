//! Rewriting the resources of an encoded OTLP export request without decoding its items.
//!
//! An export request is a repeated field 1 (`ResourceSpans` / `ResourceMetrics` /
//! `ResourceLogs`), each holding its `Resource` in field 1. Only that `Resource` message is
//! decoded, changed and re-encoded; the scopes, spans, points and records are copied as bytes.

use bytes::{Buf, BufMut};
use opentelemetry_proto::tonic::resource::v1::Resource;
use prost::Message;
use prost::encoding::{decode_varint, encode_varint};

/// Why a buffer could not be walked (the caller then decodes it whole).
#[derive(Debug, thiserror::Error)]
pub enum RewriteError {
    /// Truncated or malformed protobuf.
    #[error("malformed protobuf: {0}")]
    Malformed(&'static str),
    /// The resource message did not decode.
    #[error("resource: {0}")]
    Decode(#[from] prost::DecodeError),
}

const LEN: u64 = 2;

/// Reads one field's key and returns (field number, wire type, the field's value bytes).
fn field<'a>(buf: &mut &'a [u8]) -> Result<(u64, u64, &'a [u8]), RewriteError> {
    let key = decode_varint(buf).map_err(|_| RewriteError::Malformed("key"))?;
    let wire = key & 7;
    let start = *buf;
    let len = match wire {
        0 => {
            decode_varint(buf).map_err(|_| RewriteError::Malformed("varint"))?;
            return Ok((key >> 3, wire, &start[..start.len() - buf.len()]));
        }
        1 => 8,
        5 => 4,
        2 => usize::try_from(decode_varint(buf).map_err(|_| RewriteError::Malformed("length"))?)
            .map_err(|_| RewriteError::Malformed("length"))?,
        _ => return Err(RewriteError::Malformed("wire type")),
    };
    if buf.len() < len {
        return Err(RewriteError::Malformed("truncated"));
    }
    let value = &buf[..len];
    buf.advance(len);
    Ok((key >> 3, wire, value))
}

fn put_len_field(out: &mut Vec<u8>, number: u64, body: &[u8]) {
    encode_varint(number << 3 | LEN, out);
    encode_varint(body.len() as u64, out);
    out.put_slice(body);
}

/// Rewrites one `Resource*` entry; `None` when `f` changed nothing.
fn entry(body: &[u8], f: &mut dyn FnMut(&mut Resource) -> bool) -> Result<Option<Vec<u8>>, RewriteError> {
    let mut rest = body;
    let mut resource = Resource::default();
    let mut others: Vec<(usize, usize)> = Vec::new();
    while !rest.is_empty() {
        let at = body.len() - rest.len();
        let (number, wire, value) = field(&mut rest)?;
        if number == 1 && wire == LEN {
            // Repeated occurrences of a message field merge, as in prost.
            resource.merge(value)?;
        } else {
            others.push((at, body.len() - rest.len()));
        }
    }
    if !f(&mut resource) {
        return Ok(None);
    }
    let encoded = resource.encode_to_vec();
    let mut out = Vec::with_capacity(body.len() + encoded.len());
    put_len_field(&mut out, 1, &encoded);
    for (a, b) in others {
        out.put_slice(&body[a..b]);
    }
    Ok(Some(out))
}

/// Applies `f` to the resource of every entry of the export request `buf`; `None` when nothing
/// changed (the caller keeps its bytes).
pub fn rewrite(buf: &[u8], f: &mut dyn FnMut(&mut Resource) -> bool) -> Result<Option<Vec<u8>>, RewriteError> {
    let mut rest = buf;
    let mut out: Option<Vec<u8>> = None;
    while !rest.is_empty() {
        let at = buf.len() - rest.len();
        let (number, wire, value) = field(&mut rest)?;
        let end = buf.len() - rest.len();
        let new = if number == 1 && wire == LEN { entry(value, f)? } else { None };
        match (new, &mut out) {
            (Some(body), Some(o)) => put_len_field(o, 1, &body),
            (Some(body), None) => {
                let mut o = Vec::with_capacity(buf.len() + 64);
                o.put_slice(&buf[..at]);
                put_len_field(&mut o, 1, &body);
                out = Some(o);
            }
            (None, Some(o)) => o.put_slice(&buf[at..end]),
            (None, None) => {}
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value::Value};
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};

    fn kv(k: &str, v: &str) -> KeyValue {
        KeyValue { key: k.into(), value: Some(AnyValue { value: Some(Value::StringValue(v.into())) }), key_strindex: 0 }
    }

    fn req() -> ExportTraceServiceRequest {
        let rs = |svc: Option<&str>, n: u8| ResourceSpans {
            resource: svc.map(|s| Resource { attributes: vec![kv("service.name", s)], ..Default::default() }),
            scope_spans: vec![ScopeSpans {
                spans: vec![Span { name: format!("s{n}"), span_id: vec![n; 8], ..Default::default() }],
                ..Default::default()
            }],
            schema_url: "https://opentelemetry.io/schemas/1.26.0".into(),
        };
        ExportTraceServiceRequest { resource_spans: vec![rs(Some("a"), 1), rs(None, 2), rs(Some("c"), 3)] }
    }

    #[test]
    fn rewrites_only_resources_and_keeps_items() {
        let r = req();
        let buf = r.encode_to_vec();
        let out = rewrite(&buf, &mut |res| {
            res.attributes.push(kv("k8s.pod.name", "p"));
            true
        })
        .unwrap()
        .unwrap();
        let got = ExportTraceServiceRequest::decode(out.as_slice()).unwrap();
        let mut want = r.clone();
        for rs in &mut want.resource_spans {
            rs.resource.get_or_insert_with(Default::default).attributes.push(kv("k8s.pod.name", "p"));
        }
        assert_eq!(got, want);
    }

    #[test]
    fn unchanged_is_none_and_partial_changes_keep_order() {
        let r = req();
        let buf = r.encode_to_vec();
        assert!(rewrite(&buf, &mut |_| false).unwrap().is_none());
        // Change only the second entry (no resource): the others are copied as bytes.
        let mut i = 0;
        let out = rewrite(&buf, &mut |res| {
            i += 1;
            if i == 2 {
                res.attributes.push(kv("x", "y"));
            }
            i == 2
        })
        .unwrap()
        .unwrap();
        let got = ExportTraceServiceRequest::decode(out.as_slice()).unwrap();
        assert_eq!(got.resource_spans[0], r.resource_spans[0]);
        assert_eq!(got.resource_spans[1].resource.as_ref().unwrap().attributes, vec![kv("x", "y")]);
        assert_eq!(got.resource_spans[1].scope_spans, r.resource_spans[1].scope_spans);
        assert_eq!(got.resource_spans[2], r.resource_spans[2]);
    }

    #[test]
    fn truncated_is_an_error() {
        let buf = req().encode_to_vec();
        for cut in [1, 5, buf.len() - 1] {
            assert!(rewrite(&buf[..cut], &mut |_| true).is_err(), "cut at {cut}");
        }
    }
}

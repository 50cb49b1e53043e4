//! A zero-allocation walk over an encoded `ExportTraceServiceRequest` that counts spans and
//! reads each span's `blast.seq` attribute, so that the sink spends its time receiving, not
//! building prost structs. Fields it does not need are skipped by wire type; any order of
//! fields and attributes is accepted, as protobuf allows.

use crate::template::SEQ_KEY;

/// Why a message could not be walked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScanError {
    /// The message ended inside a field.
    Truncated,
    /// A varint longer than 10 bytes.
    BadVarint,
    /// A wire type protobuf does not define (or the deprecated groups).
    BadWireType,
}

impl std::fmt::Display for ScanError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ScanError::Truncated => "truncated protobuf",
            ScanError::BadVarint => "malformed varint",
            ScanError::BadWireType => "unsupported wire type",
        })
    }
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    fn done(&self) -> bool {
        self.pos >= self.buf.len()
    }

    fn varint(&mut self) -> Result<u64, ScanError> {
        let mut v = 0u64;
        for i in 0..10 {
            let b = *self.buf.get(self.pos).ok_or(ScanError::Truncated)?;
            self.pos += 1;
            v |= u64::from(b & 0x7F) << (7 * i);
            if b < 0x80 {
                return Ok(v);
            }
        }
        Err(ScanError::BadVarint)
    }

    /// (field number, wire type)
    fn key(&mut self) -> Result<(u64, u8), ScanError> {
        let k = self.varint()?;
        Ok((k >> 3, (k & 7) as u8))
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], ScanError> {
        let end = self.pos.checked_add(n).ok_or(ScanError::Truncated)?;
        let s = self.buf.get(self.pos..end).ok_or(ScanError::Truncated)?;
        self.pos = end;
        Ok(s)
    }

    fn bytes(&mut self) -> Result<&'a [u8], ScanError> {
        let n = self.varint()?;
        self.take(usize::try_from(n).map_err(|_| ScanError::Truncated)?)
    }

    fn skip(&mut self, wire: u8) -> Result<(), ScanError> {
        match wire {
            0 => self.varint().map(drop),
            1 => self.take(8).map(drop),
            2 => self.bytes().map(drop),
            5 => self.take(4).map(drop),
            _ => Err(ScanError::BadWireType),
        }
    }

    /// Calls `f` with the contents of every length-delimited field `field`; skips the rest.
    fn each(&mut self, field: u64, mut f: impl FnMut(&'a [u8]) -> Result<(), ScanError>) -> Result<(), ScanError> {
        while !self.done() {
            let (num, wire) = self.key()?;
            if num == field && wire == 2 {
                f(self.bytes()?)?;
            } else {
                self.skip(wire)?;
            }
        }
        Ok(())
    }
}

/// The `int_value` of an `AnyValue`, if it holds one.
fn any_int(buf: &[u8]) -> Result<Option<i64>, ScanError> {
    let mut r = Reader::new(buf);
    let mut out = None;
    while !r.done() {
        let (num, wire) = r.key()?;
        if num == 3 && wire == 0 {
            out = Some(r.varint()? as i64);
        } else {
            r.skip(wire)?;
        }
    }
    Ok(out)
}

/// The `blast.seq` of a span, if the span has one as an int.
fn span_seq(span: &[u8]) -> Result<Option<u64>, ScanError> {
    let mut seq = None;
    Reader::new(span).each(9, |kv| {
        let mut r = Reader::new(kv);
        let (mut is_seq, mut value) = (false, None);
        while !r.done() {
            let (num, wire) = r.key()?;
            match (num, wire) {
                (1, 2) => is_seq = r.bytes()? == SEQ_KEY.as_bytes(),
                (2, 2) => value = Some(r.bytes()?),
                _ => r.skip(wire)?,
            }
        }
        if is_seq && let Some(v) = value {
            seq = any_int(v)?.map(|v| v as u64);
        }
        Ok(())
    })?;
    Ok(seq)
}

/// Walks an encoded `ExportTraceServiceRequest`, calling `on_span` with each span's
/// `blast.seq` (or `None`), and returns the number of spans.
pub fn scan_traces(req: &[u8], mut on_span: impl FnMut(Option<u64>)) -> Result<u64, ScanError> {
    let mut spans = 0u64;
    Reader::new(req).each(1, |rs| {
        Reader::new(rs).each(2, |ss| {
            Reader::new(ss).each(2, |span| {
                spans += 1;
                on_span(span_seq(span)?);
                Ok(())
            })
        })
    })?;
    Ok(spans)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::template::Template;
    use bytes::BytesMut;
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value::Value};
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
    use prost::Message;

    #[test]
    fn reads_every_seq_of_a_template_request() {
        let t = Template::new(2, 9, 9);
        let mut b = BytesMut::new();
        t.encode(1, 300, 512, 1, &mut b);
        let mut seqs = vec![];
        let n = scan_traces(&b, |s| seqs.push(s)).unwrap();
        assert_eq!(n, 512);
        assert_eq!(seqs, (300..812).map(Some).collect::<Vec<_>>());
    }

    #[test]
    fn handles_reordered_and_regrouped_spans() {
        // A collector re-batches: several resources, attributes in another order, spans without seq.
        let t = Template::new(1, 9, 9);
        let mut a = t.span_message(7, 1);
        a.attributes.reverse();
        let mut b = t.span_message(8, 1);
        b.attributes.retain(|kv| kv.key != SEQ_KEY);
        let c = Span {
            attributes: vec![KeyValue {
                key: SEQ_KEY.into(),
                value: Some(AnyValue { value: Some(Value::StringValue("x".into())) }),
                ..Default::default()
            }],
            ..Default::default()
        };
        let req = ExportTraceServiceRequest {
            resource_spans: vec![
                ResourceSpans {
                    scope_spans: vec![ScopeSpans { spans: vec![a], ..Default::default() }, ScopeSpans::default()],
                    ..Default::default()
                },
                ResourceSpans {
                    scope_spans: vec![ScopeSpans {
                        spans: vec![b, c, t.span_message(u64::MAX >> 1, 1)],
                        ..Default::default()
                    }],
                    ..Default::default()
                },
            ],
        };
        let mut seqs = vec![];
        assert_eq!(scan_traces(&req.encode_to_vec(), |s| seqs.push(s)).unwrap(), 4);
        assert_eq!(seqs, vec![Some(7), None, None, Some(u64::MAX >> 1)]);
    }

    #[test]
    fn rejects_malformed_input() {
        let t = Template::new(1, 9, 9);
        let mut b = BytesMut::new();
        t.encode(0, 0, 4, 1, &mut b);
        for cut in [1, 2, 10, b.len() / 2, b.len() - 1] {
            assert!(scan_traces(&b[..cut], |_| {}).is_err(), "cut {cut}");
        }
        assert_eq!(scan_traces(&[0x0B], |_| {}), Err(ScanError::BadWireType));
        assert_eq!(
            scan_traces(&[0x08, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x01], |_| {}),
            Err(ScanError::BadVarint)
        );
        assert_eq!(scan_traces(&[], |_| {}), Ok(0));
    }
}

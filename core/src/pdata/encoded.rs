//! Validated OTLP protobuf carried undecoded: a list of chunks, each a complete export request.

use super::wire::{self, WireError};
use super::{Payload, Signal};
use bytes::Bytes;
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use prost::Message;

/// OTLP export requests of one signal as validated bytes. The concatenation of the chunks
/// is itself one valid request (OTLP requests are a repeated top-level field).
#[derive(Debug, Clone, PartialEq)]
pub struct Encoded {
    signal: Signal,
    /// Each chunk with its item count.
    chunks: Vec<(Bytes, usize)>,
    items: usize,
}

impl Encoded {
    /// Validates `bytes` as an export request of `signal`.
    pub fn new(signal: Signal, bytes: Bytes) -> Result<Encoded, WireError> {
        let items = wire::validate(signal, &bytes)?;
        Ok(Encoded { signal, chunks: vec![(bytes, items)], items })
    }

    /// Encodes a decoded payload.
    pub fn from_decoded(p: &Payload) -> Encoded {
        let items = p.item_count();
        let bytes = Bytes::from(p.encode_to_vec());
        Encoded { signal: p.signal(), chunks: vec![(bytes, items)], items }
    }

    /// The signal.
    pub fn signal(&self) -> Signal {
        self.signal
    }

    /// Items (spans, data points, log records).
    pub fn item_count(&self) -> usize {
        self.items
    }

    /// Total bytes.
    pub fn byte_len(&self) -> usize {
        self.chunks.iter().map(|(b, _)| b.len()).sum()
    }

    /// The chunks, in order.
    pub fn chunks(&self) -> Vec<Bytes> {
        self.chunks.iter().map(|(b, _)| b.clone()).collect()
    }

    /// All bytes in one buffer.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.byte_len());
        for (b, _) in &self.chunks {
            v.extend_from_slice(b);
        }
        v
    }

    /// Appends another request of the same signal (no copy).
    pub fn extend(&mut self, other: Encoded) {
        self.items += other.items;
        self.chunks.extend(other.chunks.into_iter().filter(|(b, _)| !b.is_empty()));
    }

    /// Decodes into the typed payload.
    pub fn decode(&self) -> Result<Payload, prost::DecodeError> {
        let buf = self.to_vec();
        Ok(match self.signal {
            Signal::Traces => Payload::Traces(ExportTraceServiceRequest::decode(buf.as_slice())?),
            Signal::Metrics => Payload::Metrics(ExportMetricsServiceRequest::decode(buf.as_slice())?),
            Signal::Logs => Payload::Logs(ExportLogsServiceRequest::decode(buf.as_slice())?),
        })
    }

    /// Moves whole chunks, then whole resource entries, holding at most `n` items to a new
    /// value. Returns `None` when the first resource entry alone holds more than `n` items
    /// (the caller then splits decoded).
    pub fn split_off_front(&mut self, n: usize) -> Option<Encoded> {
        let mut front = Encoded { signal: self.signal, chunks: Vec::new(), items: 0 };
        while let Some((bytes, items)) = self.chunks.first().cloned() {
            if front.items + items <= n {
                front.items += items;
                front.chunks.push((bytes, items));
                self.chunks.remove(0);
                continue;
            }
            // Split this chunk at resource entries.
            let Ok(entries) = wire::resource_entries(self.signal, &bytes) else { break };
            let mut cut = 0;
            let mut taken = 0;
            for (range, k) in &entries {
                if front.items + taken + k > n {
                    break;
                }
                taken += k;
                cut = range.end;
            }
            if cut > 0 {
                front.chunks.push((bytes.slice(..cut), taken));
                front.items += taken;
                self.chunks[0] = (bytes.slice(cut..), items - taken);
            }
            break;
        }
        self.items -= front.items;
        if front.items == 0 && n > 0 && self.items > 0 {
            return None;
        }
        Some(front)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value::Value};
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};

    fn req(resources: &[usize], start: usize) -> ExportTraceServiceRequest {
        let mut n = start;
        ExportTraceServiceRequest {
            resource_spans: resources
                .iter()
                .map(|&k| ResourceSpans {
                    scope_spans: vec![ScopeSpans {
                        spans: (0..k)
                            .map(|_| {
                                n += 1;
                                Span {
                                    trace_id: vec![1; 16],
                                    span_id: vec![2; 8],
                                    name: format!("s{n}"),
                                    attributes: vec![KeyValue {
                                        key: "k".into(),
                                        value: Some(AnyValue { value: Some(Value::IntValue(n as i64)) }),
                                        key_strindex: 0,
                                    }],
                                    ..Default::default()
                                }
                            })
                            .collect(),
                        ..Default::default()
                    }],
                    ..Default::default()
                })
                .collect(),
        }
    }

    fn names(p: &Payload) -> Vec<String> {
        let Ok(Payload::Traces(r)) = p.clone().into_decoded() else { return vec![] };
        r.resource_spans.iter().flat_map(|r| &r.scope_spans).flat_map(|s| &s.spans).map(|s| s.name.clone()).collect()
    }

    #[test]
    fn concatenation_is_a_valid_request() {
        let a = Encoded::new(Signal::Traces, Bytes::from(req(&[2, 3], 0).encode_to_vec())).unwrap();
        let b = Encoded::new(Signal::Traces, Bytes::from(req(&[4], 5).encode_to_vec())).unwrap();
        assert_eq!(a.item_count(), 5);
        let mut p = Payload::Encoded(a);
        p.append(Payload::Encoded(b)).unwrap();
        p.append(Payload::Traces(req(&[1], 9))).unwrap();
        assert_eq!(p.item_count(), 10);
        assert_eq!(names(&p), (1..=10).map(|i| format!("s{i}")).collect::<Vec<_>>());
    }

    #[test]
    fn split_at_resource_entries_and_fallback() {
        let mut p =
            Payload::Encoded(Encoded::new(Signal::Traces, Bytes::from(req(&[2, 3, 4], 0).encode_to_vec())).unwrap());
        let f = p.split_off_front(6);
        assert!(matches!(f, Payload::Encoded(_)));
        assert_eq!(f.item_count(), 5);
        assert_eq!(p.item_count(), 4);
        // The first entry (4 spans) is larger than 3: split decoded.
        let g = p.split_off_front(3);
        assert_eq!(g.item_count(), 3);
        assert_eq!(p.item_count(), 1);
        let mut all = names(&f);
        all.extend(names(&g));
        all.extend(names(&p));
        assert_eq!(all, (1..=9).map(|i| format!("s{i}")).collect::<Vec<_>>());
    }

    #[test]
    fn validator_agrees_with_prost_on_every_truncation() {
        let full = req(&[2, 1], 0).encode_to_vec();
        for cut in 0..full.len() {
            let part = &full[..cut];
            let prost_ok = ExportTraceServiceRequest::decode(part).is_ok();
            let ours = wire::validate(Signal::Traces, part);
            assert_eq!(ours.is_ok(), prost_ok, "cut at {cut}: ours {ours:?}");
        }
        assert_eq!(wire::validate(Signal::Traces, &full), Ok(3));
    }

    #[test]
    fn bad_ids_ask_for_decode_and_garbage_is_malformed() {
        let mut r = req(&[1], 0);
        r.resource_spans[0].scope_spans[0].spans[0].trace_id = vec![1; 5];
        assert_eq!(wire::validate(Signal::Traces, &r.encode_to_vec()), Err(WireError::NeedsDecode));
        assert!(matches!(wire::validate(Signal::Traces, b"\x0a\xff\xff\xff\xff\x0f"), Err(WireError::Malformed(_))));
        assert!(matches!(wire::validate(Signal::Logs, b"not protobuf at all"), Err(WireError::Malformed(_))));
    }
}

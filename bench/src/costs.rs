//! `otlp-load costs`: what each step of an OTLP pass-through costs per span, measured in one
//! process on the generator's own 512-span requests (decode, encode, gzip at two levels).

use crate::template::Template;
use bytes::BytesMut;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use prost::Message;
use std::io::Write;
use std::time::Instant;

fn time_per_span(iters: usize, spans: usize, mut f: impl FnMut()) -> f64 {
    f();
    let t = Instant::now();
    for _ in 0..iters {
        f();
    }
    t.elapsed().as_secs_f64() * 1e6 / (iters * spans) as f64
}

fn gzip(data: &[u8], level: u32) -> usize {
    let mut e = flate2::write::GzEncoder::new(Vec::with_capacity(data.len() / 4), flate2::Compression::new(level));
    let _ = e.write_all(data);
    e.finish().map(|v| v.len()).unwrap_or(0)
}

/// Runs the measurements and returns them as JSON (µs per span for each step).
pub fn run(batch: usize, iters: usize) -> serde_json::Value {
    let t = Template::new(1, 1, 0);
    let mut buf = BytesMut::new();
    t.encode(0, 0, batch, 1_700_000_000_000_000_000, &mut buf);
    let raw = buf.freeze();
    let decoded = ExportTraceServiceRequest::decode(raw.clone()).unwrap_or_default();
    let decode = time_per_span(iters, batch, || {
        let _ = std::hint::black_box(ExportTraceServiceRequest::decode(raw.clone()));
    });
    let encode = time_per_span(iters, batch, || {
        let _ = std::hint::black_box(decoded.encode_to_vec());
    });
    let gz6 = time_per_span(iters, batch, || {
        std::hint::black_box(gzip(&raw, 6));
    });
    let gz1 = time_per_span(iters, batch, || {
        std::hint::black_box(gzip(&raw, 1));
    });
    serde_json::json!({
        "batch_spans": batch,
        "request_bytes": raw.len(),
        "gzip6_bytes": gzip(&raw, 6),
        "gzip1_bytes": gzip(&raw, 1),
        "us_per_span": { "decode": decode, "encode": encode, "gzip6": gz6, "gzip1": gz1 },
    })
}

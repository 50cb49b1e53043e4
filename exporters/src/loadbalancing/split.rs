//! A payload split by routing key into one payload per backend.
//!
//! An encoded payload is split on the wire for every key: the walk reads only the key's fields
//! (resource and scope attributes, a span's or log record's trace id or attributes, a metric's
//! name, a data point's attributes) and builds each backend's request from verbatim byte ranges
//! of the input, re-framing only the length prefixes of the messages it splits. A decoded
//! payload is split by moving its messages. Either way the split is at resource, scope or item
//! level (a data point for metrics), keeping the resource and scope of every item with it: a
//! resource entry, scope or metric whose items all go to one backend moves whole (an encoded
//! resource entry without a copy). Both forms of the same data route identically, and item
//! counts are kept exactly.

use super::config::RoutingKey;
use bytes::Bytes;
use inferwatch_core::pdata::Encoded;
use inferwatch_core::pdata::{Payload, Signal};
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::logs::v1::{ResourceLogs, ScopeLogs};
use opentelemetry_proto::tonic::metrics::v1::{Metric, ResourceMetrics, ScopeMetrics, metric::Data};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans};
use prost::Message;
use std::borrow::Cow;
use xxhash_rust::xxh3::Xxh3;

/// The resource attribute of the `service` key.
pub const SERVICE_NAME: &str = "service.name";

/// Why a payload could not be split.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SplitError {
    /// No backend can take a key (the ring is empty, or every member is excluded).
    #[error("no backend to route to")]
    NoBackend,
    /// The payload does not decode.
    #[error("the payload does not decode: {0}")]
    Decode(String),
}

/// Splits payloads by one routing key.
#[derive(Debug, Clone)]
pub struct Splitter {
    /// The key.
    pub key: RoutingKey,
    /// `routing_attributes`.
    pub attributes: Vec<String>,
}

/// Feeds one attribute value to a hasher (strings as their bytes, others as protobuf).
fn feed_value(h: &mut Xxh3, v: Option<&AnyValue>) {
    feed_any(h, v);
    h.update(&[0xff]);
}

/// [`feed_value`] without the terminator.
fn feed_any(h: &mut Xxh3, v: Option<&AnyValue>) {
    match v.and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => h.update(s.as_bytes()),
        Some(other) => h.update(&AnyValue { value: Some(other.clone()) }.encode_to_vec()),
        None => {}
    }
}

fn find<'a>(attrs: &'a [KeyValue], key: &str) -> Option<&'a KeyValue> {
    attrs.iter().find(|kv| kv.key == key)
}

/// The hash of the `service` key of a resource.
pub fn service_hash(r: Option<&Resource>) -> u64 {
    let mut h = Xxh3::new();
    let v = r.and_then(|r| find(&r.attributes, SERVICE_NAME)).and_then(|kv| kv.value.as_ref());
    feed_value(&mut h, v);
    h.digest()
}

/// The hash of the `resource` key: all attributes, sorted by key.
pub fn resource_hash(r: Option<&Resource>) -> u64 {
    let mut h = Xxh3::new();
    if let Some(r) = r {
        let mut kvs: Vec<&KeyValue> = r.attributes.iter().collect();
        kvs.sort_by(|a, b| a.key.cmp(&b.key));
        for kv in kvs {
            h.update(kv.key.as_bytes());
            h.update(&[0]);
            feed_value(&mut h, kv.value.as_ref());
        }
    }
    h.digest()
}

/// Per-backend accumulators.
struct Groups<T>(Vec<Option<T>>);

impl<T> Groups<T> {
    fn new() -> Self {
        Groups(Vec::new())
    }
    fn slot(&mut self, i: usize, make: impl FnOnce() -> T) -> &mut T {
        if self.0.len() <= i {
            self.0.resize_with(i + 1, || None);
        }
        self.0[i].get_or_insert_with(make)
    }
    fn drain(&mut self) -> impl Iterator<Item = (usize, T)> + '_ {
        self.0.iter_mut().enumerate().filter_map(|(i, t)| t.take().map(|t| (i, t)))
    }
}

/// The values of `names` looked up in `levels` in order (the first level that has a name wins);
/// `None` when some name is in none of them.
fn attrs_hash(names: &[String], levels: &[&[KeyValue]]) -> Option<u64> {
    let mut h = Xxh3::new();
    for n in names {
        let kv = levels.iter().find_map(|l| find(l, n))?;
        feed_value(&mut h, kv.value.as_ref());
    }
    Some(h.digest())
}

/// [`attrs_hash`] with missing names as empty values (the item level, the last resort).
fn attrs_hash_all(names: &[String], levels: &[&[KeyValue]]) -> u64 {
    let mut h = Xxh3::new();
    for n in names {
        let kv = levels.iter().find_map(|l| find(l, n));
        feed_value(&mut h, kv.and_then(|kv| kv.value.as_ref()));
    }
    h.digest()
}

fn scope_attrs(s: Option<&InstrumentationScope>) -> &[KeyValue] {
    s.map(|s| s.attributes.as_slice()).unwrap_or(&[])
}

fn res_attrs(r: Option<&Resource>) -> &[KeyValue] {
    r.map(|r| r.attributes.as_slice()).unwrap_or(&[])
}

type Pick<'a> = &'a dyn Fn(u64) -> Option<usize>;

impl Splitter {
    fn resource_key(&self, r: Option<&Resource>) -> u64 {
        match self.key {
            RoutingKey::Resource => resource_hash(r),
            _ => service_hash(r),
        }
    }

    /// Splits `data` into one payload per backend index that `pick` (hash → backend) returns.
    pub fn split(&self, data: Payload, pick: Pick<'_>) -> Result<Vec<(usize, Payload)>, SplitError> {
        if data.item_count() == 0 {
            return Ok(Vec::new());
        }
        if let Payload::Encoded(e) = &data
            && let Some(parts) = self.split_wire(e, pick)?
        {
            return Ok(parts);
        }
        let signal = data.signal();
        let decoded = data.into_decoded().map_err(|e| SplitError::Decode(e.to_string()))?;
        Ok(match decoded {
            Payload::Traces(r) => self.traces(r, pick)?.into_iter().map(|(i, r)| (i, Payload::Traces(r))).collect(),
            Payload::Metrics(r) => self.metrics(r, pick)?.into_iter().map(|(i, r)| (i, Payload::Metrics(r))).collect(),
            Payload::Logs(r) => self.logs(r, pick)?.into_iter().map(|(i, r)| (i, Payload::Logs(r))).collect(),
            Payload::Encoded(_) => return Err(SplitError::Decode(format!("{signal} payload still encoded"))),
        })
    }

    fn traces(
        &self,
        r: ExportTraceServiceRequest,
        pick: Pick<'_>,
    ) -> Result<Vec<(usize, ExportTraceServiceRequest)>, SplitError> {
        let mut out: Groups<ExportTraceServiceRequest> = Groups::new();
        for rs in r.resource_spans {
            if let Some(h) = self.entry_hash(rs.resource.as_ref()) {
                let b = pick(h).ok_or(SplitError::NoBackend)?;
                out.slot(b, Default::default).resource_spans.push(rs);
                continue;
            }
            let ResourceSpans { resource, scope_spans, schema_url } = rs;
            let mut per: Groups<ResourceSpans> = Groups::new();
            let header = || ResourceSpans {
                resource: resource.clone(),
                scope_spans: Vec::new(),
                schema_url: schema_url.clone(),
            };
            for ss in scope_spans {
                let ra = res_attrs(resource.as_ref());
                let sa = scope_attrs(ss.scope.as_ref());
                if self.key == RoutingKey::Attributes
                    && let Some(h) = attrs_hash(&self.attributes, &[ra, sa])
                {
                    let b = pick(h).ok_or(SplitError::NoBackend)?;
                    per.slot(b, header).scope_spans.push(ss);
                    continue;
                }
                let ScopeSpans { scope, spans, schema_url: s_url } = ss;
                let mut sp: Groups<ScopeSpans> = Groups::new();
                let sheader = || ScopeSpans { scope: scope.clone(), spans: Vec::new(), schema_url: s_url.clone() };
                for span in spans {
                    let h = match self.key {
                        RoutingKey::TraceId => super::ring::hash_key(&span.trace_id),
                        _ => attrs_hash_all(&self.attributes, &[ra, scope_attrs(scope.as_ref()), &span.attributes]),
                    };
                    let b = pick(h).ok_or(SplitError::NoBackend)?;
                    sp.slot(b, sheader).spans.push(span);
                }
                for (b, s) in sp.drain() {
                    per.slot(b, header).scope_spans.push(s);
                }
            }
            for (b, rs) in per.drain() {
                out.slot(b, Default::default).resource_spans.push(rs);
            }
        }
        Ok(out.drain().collect())
    }

    fn logs(
        &self,
        r: ExportLogsServiceRequest,
        pick: Pick<'_>,
    ) -> Result<Vec<(usize, ExportLogsServiceRequest)>, SplitError> {
        let mut out: Groups<ExportLogsServiceRequest> = Groups::new();
        for rl in r.resource_logs {
            if let Some(h) = self.entry_hash(rl.resource.as_ref()) {
                let b = pick(h).ok_or(SplitError::NoBackend)?;
                out.slot(b, Default::default).resource_logs.push(rl);
                continue;
            }
            let ResourceLogs { resource, scope_logs, schema_url } = rl;
            let mut per: Groups<ResourceLogs> = Groups::new();
            let header =
                || ResourceLogs { resource: resource.clone(), scope_logs: Vec::new(), schema_url: schema_url.clone() };
            for sl in scope_logs {
                let ra = res_attrs(resource.as_ref());
                let sa = scope_attrs(sl.scope.as_ref());
                if self.key == RoutingKey::Attributes
                    && let Some(h) = attrs_hash(&self.attributes, &[ra, sa])
                {
                    let b = pick(h).ok_or(SplitError::NoBackend)?;
                    per.slot(b, header).scope_logs.push(sl);
                    continue;
                }
                let ScopeLogs { scope, log_records, schema_url: s_url } = sl;
                let mut sp: Groups<ScopeLogs> = Groups::new();
                let sheader = || ScopeLogs { scope: scope.clone(), log_records: Vec::new(), schema_url: s_url.clone() };
                for rec in log_records {
                    let h = match self.key {
                        RoutingKey::TraceId => super::ring::hash_key(&rec.trace_id),
                        _ => attrs_hash_all(&self.attributes, &[ra, scope_attrs(scope.as_ref()), &rec.attributes]),
                    };
                    let b = pick(h).ok_or(SplitError::NoBackend)?;
                    sp.slot(b, sheader).log_records.push(rec);
                }
                for (b, s) in sp.drain() {
                    per.slot(b, header).scope_logs.push(s);
                }
            }
            for (b, rl) in per.drain() {
                out.slot(b, Default::default).resource_logs.push(rl);
            }
        }
        Ok(out.drain().collect())
    }

    /// The hash of a resource entry when the key is decided by the resource alone.
    fn entry_hash(&self, r: Option<&Resource>) -> Option<u64> {
        match self.key {
            RoutingKey::Service | RoutingKey::Resource => Some(self.resource_key(r)),
            RoutingKey::Attributes => attrs_hash(&self.attributes, &[res_attrs(r)]),
            _ => None,
        }
    }

    fn metrics(
        &self,
        r: ExportMetricsServiceRequest,
        pick: Pick<'_>,
    ) -> Result<Vec<(usize, ExportMetricsServiceRequest)>, SplitError> {
        let mut out: Groups<ExportMetricsServiceRequest> = Groups::new();
        for rm in r.resource_metrics {
            if let Some(h) = self.entry_hash(rm.resource.as_ref()) {
                let b = pick(h).ok_or(SplitError::NoBackend)?;
                out.slot(b, Default::default).resource_metrics.push(rm);
                continue;
            }
            let ResourceMetrics { resource, scope_metrics, schema_url } = rm;
            let ra = res_attrs(resource.as_ref());
            let rhash = resource_hash(resource.as_ref());
            let mut per: Groups<ResourceMetrics> = Groups::new();
            let header = || ResourceMetrics {
                resource: resource.clone(),
                scope_metrics: Vec::new(),
                schema_url: schema_url.clone(),
            };
            for sm in scope_metrics {
                let sa = scope_attrs(sm.scope.as_ref());
                if self.key == RoutingKey::Attributes
                    && let Some(h) = attrs_hash(&self.attributes, &[ra, sa])
                {
                    let b = pick(h).ok_or(SplitError::NoBackend)?;
                    per.slot(b, header).scope_metrics.push(sm);
                    continue;
                }
                let ScopeMetrics { scope, metrics, schema_url: s_url } = sm;
                let shash = {
                    let mut h = Xxh3::new();
                    h.update(&rhash.to_le_bytes());
                    if let Some(s) = &scope {
                        h.update(s.name.as_bytes());
                        h.update(&[0]);
                        h.update(s.version.as_bytes());
                    }
                    h.digest()
                };
                let mut sp: Groups<ScopeMetrics> = Groups::new();
                let sheader = || ScopeMetrics { scope: scope.clone(), metrics: Vec::new(), schema_url: s_url.clone() };
                for m in metrics {
                    match self.key {
                        RoutingKey::Metric => {
                            let b = pick(super::ring::hash_key(m.name.as_bytes())).ok_or(SplitError::NoBackend)?;
                            sp.slot(b, sheader).metrics.push(m);
                        }
                        _ => {
                            let sa = scope_attrs(scope.as_ref());
                            let mut err = None;
                            let parts = split_points(m, |m, attrs| {
                                let h = if self.key == RoutingKey::StreamId {
                                    stream_hash(shash, m, attrs)
                                } else {
                                    attrs_hash_all(&self.attributes, &[ra, sa, attrs])
                                };
                                pick(h).unwrap_or_else(|| {
                                    err = Some(SplitError::NoBackend);
                                    0
                                })
                            });
                            if let Some(e) = err {
                                return Err(e);
                            }
                            for (b, m) in parts {
                                sp.slot(b, sheader).metrics.push(m);
                            }
                        }
                    }
                }
                for (b, s) in sp.drain() {
                    per.slot(b, header).scope_metrics.push(s);
                }
            }
            for (b, rm) in per.drain() {
                out.slot(b, Default::default).resource_metrics.push(rm);
            }
        }
        Ok(out.drain().collect())
    }
}

/// The stream identity of a data point: resource and scope (`scope_hash`), metric name, type,
/// and the point's attributes (sorted).
fn stream_hash(scope_hash: u64, m: &MetricHead, attrs: &[KeyValue]) -> u64 {
    let mut h = Xxh3::new();
    h.update(&scope_hash.to_le_bytes());
    h.update(m.name.as_bytes());
    h.update(&[0, m.kind]);
    let mut kvs: Vec<&KeyValue> = attrs.iter().collect();
    kvs.sort_by(|a, b| a.key.cmp(&b.key));
    for kv in kvs {
        h.update(kv.key.as_bytes());
        h.update(&[0]);
        feed_value(&mut h, kv.value.as_ref());
    }
    h.digest()
}

/// What a point's key may read of its metric.
pub struct MetricHead {
    /// The metric's name.
    pub name: String,
    /// The data type (1 gauge, 2 sum, 3 histogram, 4 exponential histogram, 5 summary).
    pub kind: u8,
}

/// A metric's points split by `backend_of(metric, point attributes)`, each part a copy of the
/// metric's header with its points (the whole metric when all go to one backend).
fn split_points(m: Metric, mut backend_of: impl FnMut(&MetricHead, &[KeyValue]) -> usize) -> Vec<(usize, Metric)> {
    let kind = match &m.data {
        Some(Data::Gauge(_)) => 1,
        Some(Data::Sum(_)) => 2,
        Some(Data::Histogram(_)) => 3,
        Some(Data::ExponentialHistogram(_)) => 4,
        Some(Data::Summary(_)) => 5,
        None => 0,
    };
    let head = MetricHead { name: m.name.clone(), kind };
    macro_rules! by_points {
        ($m:ident, $variant:ident, $d:ident) => {{
            let Metric { name, description, unit, metadata, data: _ } = $m;
            let points = std::mem::take(&mut $d.data_points);
            let bs: Vec<usize> = points.iter().map(|p| backend_of(&head, &p.attributes)).collect();
            if bs.windows(2).all(|w| w[0] == w[1]) {
                $d.data_points = points;
                let b = bs.first().copied().unwrap_or_else(|| backend_of(&head, &[]));
                return vec![(b, Metric { name, description, unit, metadata, data: Some(Data::$variant($d)) })];
            }
            let mut groups: Groups<Metric> = Groups::new();
            for (p, b) in points.into_iter().zip(bs) {
                let g = groups.slot(b, || {
                    let mut d = $d.clone();
                    d.data_points.clear();
                    Metric {
                        name: name.clone(),
                        description: description.clone(),
                        unit: unit.clone(),
                        metadata: metadata.clone(),
                        data: Some(Data::$variant(d)),
                    }
                });
                if let Some(Data::$variant(d)) = &mut g.data {
                    d.data_points.push(p);
                }
            }
            groups.drain().collect()
        }};
    }
    let mut m = m;
    match m.data.take() {
        Some(Data::Gauge(mut d)) => by_points!(m, Gauge, d),
        Some(Data::Sum(mut d)) => by_points!(m, Sum, d),
        Some(Data::Histogram(mut d)) => by_points!(m, Histogram, d),
        Some(Data::ExponentialHistogram(mut d)) => by_points!(m, ExponentialHistogram, d),
        Some(Data::Summary(mut d)) => by_points!(m, Summary, d),
        None => {
            let b = backend_of(&head, &[]);
            vec![(b, m)]
        }
    }
}

/// Item count of one backend's part (for the per-backend counters).
pub fn items(p: &Payload) -> u64 {
    p.item_count() as u64
}

/// The signal of a split (all parts share it).
pub fn signal_of(parts: &[(usize, Payload)]) -> Option<Signal> {
    parts.first().map(|(_, p)| p.signal())
}

// ---- the wire split ----------------------------------------------------------------------
//
// An `Encoded` payload is validated OTLP, so it is walked without checks beyond bounds: any
// surprise ends the walk (`Bad`) and the caller decodes instead. Only the key's fields are read:
// resource and scope attributes, a span's or log record's trace id or attributes, a metric's
// name and a data point's attributes. Values follow prost's merge rules (the last occurrence of
// a scalar wins, repeated message fields merge), so that the hashes equal the decoded path's.

/// Why the wire walk stopped.
#[derive(Debug)]
enum Stop {
    /// Unexpected bytes: split decoded instead.
    Bad,
    /// No backend for a key.
    NoBackend,
}

type W<T> = Result<T, Stop>;

/// Reads a varint at `*pos`.
fn varint(buf: &[u8], pos: &mut usize) -> W<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let b = *buf.get(*pos).ok_or(Stop::Bad)?;
        *pos += 1;
        v |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err(Stop::Bad)
}

/// One field of a message: its number, whether it is length-delimited, its bytes (key
/// included) as `start..end` of the message, and the body of a length-delimited one.
struct Field<'a> {
    num: u64,
    len: bool,
    start: usize,
    end: usize,
    body: &'a [u8],
}

impl Field<'_> {
    fn is(&self, num: u64) -> bool {
        self.len && self.num == num
    }
}

/// The fields of a message, in order.
struct Fields<'a> {
    buf: &'a [u8],
    pos: usize,
}

fn fields(buf: &[u8]) -> Fields<'_> {
    Fields { buf, pos: 0 }
}

impl<'a> Fields<'a> {
    fn skip(&mut self, n: usize) -> W<()> {
        let end = self.pos.checked_add(n).ok_or(Stop::Bad)?;
        if end > self.buf.len() {
            return Err(Stop::Bad);
        }
        self.pos = end;
        Ok(())
    }

    fn read(&mut self) -> W<Field<'a>> {
        let buf = self.buf;
        let start = self.pos;
        let key = varint(buf, &mut self.pos)?;
        let mut body: &'a [u8] = &[];
        match key & 7 {
            0 => {
                varint(buf, &mut self.pos)?;
            }
            1 => self.skip(8)?,
            5 => self.skip(4)?,
            2 => {
                let n = usize::try_from(varint(buf, &mut self.pos)?).map_err(|_| Stop::Bad)?;
                let s = self.pos;
                self.skip(n)?;
                body = &buf[s..self.pos];
            }
            _ => return Err(Stop::Bad),
        }
        Ok(Field { num: key >> 3, len: key & 7 == 2, start, end: self.pos, body })
    }
}

impl<'a> Iterator for Fields<'a> {
    type Item = W<Field<'a>>;
    fn next(&mut self) -> Option<Self::Item> {
        if self.pos >= self.buf.len() {
            return None;
        }
        let r = self.read();
        if r.is_err() {
            self.pos = self.buf.len();
        }
        Some(r)
    }
}

/// Appends field `num` (length-delimited) holding `body`.
fn put_field(out: &mut Vec<u8>, num: u64, body: &[u8]) {
    prost::encoding::encode_varint(num << 3 | 2, out);
    prost::encoding::encode_varint(body.len() as u64, out);
    out.extend_from_slice(body);
}

/// The fields of `body` other than the length-delimited ones numbered in `skip`, verbatim.
fn head(body: &[u8], skip: &[u64]) -> W<Vec<u8>> {
    let mut out = Vec::with_capacity(64);
    for f in fields(body) {
        let f = f?;
        if !(f.len && skip.contains(&f.num)) {
            out.extend_from_slice(&body[f.start..f.end]);
        }
    }
    Ok(out)
}

/// An encoded `AnyValue`: the bodies of every occurrence of a `KeyValue`'s value, merged.
type Val<'a> = Option<Cow<'a, [u8]>>;

/// The key and the value of an encoded `KeyValue`.
fn key_value(b: &[u8]) -> W<(&[u8], Val<'_>)> {
    let (mut key, mut val): (&[u8], Val<'_>) = (&[], None);
    for f in fields(b) {
        let f = f?;
        if f.is(1) {
            key = f.body;
        } else if f.is(2) {
            match &mut val {
                None => val = Some(Cow::Borrowed(f.body)),
                Some(v) => v.to_mut().extend_from_slice(f.body),
            }
        }
    }
    Ok((key, val))
}

/// [`feed_value`] of an encoded value: a string as its bytes without decoding, another kind
/// decoded and hashed as the decoded path does.
fn feed_wire(h: &mut Xxh3, v: Option<&[u8]>) -> W<()> {
    if let Some(v) = v {
        // The oneof's value is its last member on the wire.
        let mut last: Option<(u64, &[u8])> = None;
        for f in fields(v) {
            let f = f?;
            if (1..=8).contains(&f.num) {
                last = Some((f.num, f.body));
            }
        }
        match last {
            Some((1, s)) => h.update(s),
            Some(_) => feed_any(h, Some(&AnyValue::decode(v).map_err(|_| Stop::Bad)?)),
            None => {}
        }
    }
    h.update(&[0xff]);
    Ok(())
}

/// The value of the first attribute named `name` in an encoded `KeyValue` list.
fn find_wire<'a>(list: &[&'a [u8]], name: &str) -> W<Option<Val<'a>>> {
    for kv in list {
        let (k, v) = key_value(kv)?;
        if k == name.as_bytes() {
            return Ok(Some(v));
        }
    }
    Ok(None)
}

/// An encoded `KeyValue` list hashed as [`resource_hash`] and [`stream_hash`] do: sorted by key.
fn feed_sorted(h: &mut Xxh3, list: &[&[u8]]) -> W<()> {
    if let [one] = list {
        let (k, v) = key_value(one)?;
        h.update(k);
        h.update(&[0]);
        return feed_wire(h, v.as_deref());
    }
    let mut kvs = list.iter().map(|kv| key_value(kv)).collect::<W<Vec<_>>>()?;
    kvs.sort_by(|a, b| a.0.cmp(b.0));
    for (k, v) in &kvs {
        h.update(k);
        h.update(&[0]);
        feed_wire(h, v.as_deref())?;
    }
    Ok(())
}

/// [`attrs_hash`] (`all`: [`attrs_hash_all`]) of encoded lists.
fn attrs_hash_wire(names: &[String], levels: &[&[&[u8]]], all: bool) -> W<Option<u64>> {
    let mut h = Xxh3::new();
    for n in names {
        let mut found = None;
        for l in levels {
            if let Some(v) = find_wire(l, n)? {
                found = Some(v);
                break;
            }
        }
        match found {
            Some(v) => feed_wire(&mut h, v.as_deref())?,
            None if all => feed_wire(&mut h, None)?,
            None => return Ok(None),
        }
    }
    Ok(Some(h.digest()))
}

/// The bodies of the length-delimited fields `num` of `body`.
fn collect<'a>(body: &'a [u8], num: u64, out: &mut Vec<&'a [u8]>) -> W<()> {
    for f in fields(body) {
        let f = f?;
        if f.is(num) {
            out.push(f.body);
        }
    }
    Ok(())
}

/// Where a message's items go: nowhere (it holds none), all to one backend (with their
/// count), or split (per backend: the message rebuilt with its share, and its count).
enum Route {
    Empty,
    Whole(usize, usize),
    Split(Vec<(usize, Vec<u8>, usize)>),
}

/// The route of a message (`body`) from the routes of its children (fields `child`, given
/// as their verbatim bytes with their routes): whole when they all go to one backend, else
/// per backend the message's other fields followed by its children there.
fn combine(body: &[u8], child: u64, children: Vec<(&[u8], Route)>) -> W<Route> {
    let (mut one, mut uniform, mut total) = (None, true, 0);
    for (_, r) in &children {
        match r {
            Route::Empty => {}
            Route::Whole(b, n) => {
                total += n;
                uniform &= one.is_none_or(|o| o == *b);
                one = Some(*b);
            }
            Route::Split(_) => uniform = false,
        }
    }
    if uniform {
        return Ok(one.map_or(Route::Empty, |b| Route::Whole(b, total)));
    }
    let h = head(body, &[child])?;
    let mut groups: Groups<(Vec<u8>, usize)> = Groups::new();
    for (bytes, r) in children {
        match r {
            Route::Empty => {}
            Route::Whole(b, n) => {
                let g = groups.slot(b, || (h.clone(), 0));
                g.0.extend_from_slice(bytes);
                g.1 += n;
            }
            Route::Split(parts) => {
                for (b, part, n) in parts {
                    let g = groups.slot(b, || (h.clone(), 0));
                    put_field(&mut g.0, child, &part);
                    g.1 += n;
                }
            }
        }
    }
    Ok(Route::Split(groups.drain().map(|(b, (v, n))| (b, v, n)).collect()))
}

/// The data fields of a `Metric` (a oneof): gauge, sum, histogram, exponential histogram,
/// summary, with the type number [`MetricHead::kind`] and the attribute field of their points.
const DATA_FIELDS: [(u64, u8, u64); 5] = [(5, 1, 7), (7, 2, 7), (9, 3, 9), (10, 4, 1), (11, 5, 7)];

/// A metric's data as prost decodes it: the field of the last data member, and the bodies of
/// its occurrences since the last different member (those merge; an earlier one is replaced).
fn metric_data(body: &[u8]) -> W<MetricData<'_>> {
    let (mut name, mut field, mut occ): (&[u8], u64, Vec<&[u8]>) = (&[], 0, Vec::new());
    for f in fields(body) {
        let f = f?;
        if f.is(1) {
            name = f.body;
        } else if f.len && DATA_FIELDS.iter().any(|d| d.0 == f.num) {
            if f.num != field {
                occ.clear();
                field = f.num;
            }
            occ.push(f.body);
        }
    }
    Ok(MetricData { name, field, occ })
}

/// What [`metric_data`] reads of an encoded metric.
struct MetricData<'a> {
    name: &'a [u8],
    field: u64,
    occ: Vec<&'a [u8]>,
}

/// Items of an encoded scope entry.
fn scope_items(signal: Signal, body: &[u8]) -> W<usize> {
    let mut n = 0;
    for f in fields(body) {
        let f = f?;
        if !f.is(2) {
            continue;
        }
        if signal != Signal::Metrics {
            n += 1;
            continue;
        }
        for d in metric_data(f.body)?.occ {
            for p in fields(d) {
                n += usize::from(p?.is(1));
            }
        }
    }
    Ok(n)
}

/// Items of an encoded resource entry.
fn resource_items(signal: Signal, body: &[u8]) -> W<usize> {
    let mut n = 0;
    for f in fields(body) {
        let f = f?;
        if f.is(2) {
            n += scope_items(signal, f.body)?;
        }
    }
    Ok(n)
}

/// One backend's part of a wire split: whole resource entries as slices of the input
/// (adjacent ones merged), rebuilt ones copied, in input order.
#[derive(Default)]
struct Out {
    pieces: Vec<Bytes>,
    run: Option<std::ops::Range<usize>>,
    built: Vec<u8>,
    items: usize,
}

impl Out {
    fn flush_run(&mut self, chunk: &Bytes) {
        if let Some(r) = self.run.take() {
            self.pieces.push(chunk.slice(r));
        }
    }
    fn flush_built(&mut self) {
        if !self.built.is_empty() {
            self.pieces.push(Bytes::from(std::mem::take(&mut self.built)));
        }
    }
    fn whole(&mut self, chunk: &Bytes, r: std::ops::Range<usize>, n: usize) {
        self.flush_built();
        self.items += n;
        match &mut self.run {
            Some(run) if run.end == r.start => run.end = r.end,
            _ => {
                self.flush_run(chunk);
                self.run = Some(r);
            }
        }
    }
    fn rebuilt(&mut self, chunk: &Bytes, body: &[u8], n: usize) {
        self.flush_run(chunk);
        self.items += n;
        put_field(&mut self.built, 1, body);
    }
}

/// The walk of one payload.
struct Wire<'s> {
    sp: &'s Splitter,
    pick: Pick<'s>,
    signal: Signal,
}

impl Wire<'_> {
    fn pick(&self, h: u64) -> W<usize> {
        (self.pick)(h).ok_or(Stop::NoBackend)
    }

    fn resource(&self, body: &[u8]) -> W<Route> {
        let mut ra: Vec<&[u8]> = Vec::new();
        for f in fields(body) {
            let f = f?;
            if f.is(1) {
                collect(f.body, 1, &mut ra)?;
            }
        }
        let h = match self.sp.key {
            RoutingKey::Service => {
                let mut h = Xxh3::new();
                feed_wire(&mut h, find_wire(&ra, SERVICE_NAME)?.flatten().as_deref())?;
                Some(h.digest())
            }
            RoutingKey::Resource => {
                let mut h = Xxh3::new();
                feed_sorted(&mut h, &ra)?;
                Some(h.digest())
            }
            RoutingKey::Attributes => attrs_hash_wire(&self.sp.attributes, &[&ra], false)?,
            _ => None,
        };
        if let Some(h) = h {
            return Ok(Route::Whole(self.pick(h)?, resource_items(self.signal, body)?));
        }
        let rhash = if self.sp.key == RoutingKey::StreamId {
            let mut h = Xxh3::new();
            feed_sorted(&mut h, &ra)?;
            h.digest()
        } else {
            0
        };
        let mut children = Vec::new();
        for f in fields(body) {
            let f = f?;
            if f.is(2) {
                children.push((&body[f.start..f.end], self.scope(f.body, &ra, rhash)?));
            }
        }
        combine(body, 2, children)
    }

    fn scope(&self, body: &[u8], ra: &[&[u8]], rhash: u64) -> W<Route> {
        let mut sa: Vec<&[u8]> = Vec::new();
        let (mut has_scope, mut name, mut version): (bool, &[u8], &[u8]) = (false, &[], &[]);
        for f in fields(body) {
            let f = f?;
            if f.is(1) {
                has_scope = true;
                for g in fields(f.body) {
                    let g = g?;
                    match (g.num, g.len) {
                        (1, true) => name = g.body,
                        (2, true) => version = g.body,
                        (3, true) => sa.push(g.body),
                        _ => {}
                    }
                }
            }
        }
        if self.sp.key == RoutingKey::Attributes
            && let Some(h) = attrs_hash_wire(&self.sp.attributes, &[ra, &sa], false)?
        {
            return Ok(Route::Whole(self.pick(h)?, scope_items(self.signal, body)?));
        }
        let shash = {
            let mut h = Xxh3::new();
            h.update(&rhash.to_le_bytes());
            if has_scope {
                h.update(name);
                h.update(&[0]);
                h.update(version);
            }
            h.digest()
        };
        let (trace_field, attr_field) = if self.signal == Signal::Traces { (1, 9) } else { (9, 6) };
        let mut children = Vec::new();
        let mut ia: Vec<&[u8]> = Vec::new();
        for f in fields(body) {
            let f = f?;
            if !f.is(2) {
                continue;
            }
            let route = if self.signal == Signal::Metrics {
                self.metric(f.body, ra, &sa, shash)?
            } else {
                let h = if self.sp.key == RoutingKey::TraceId {
                    let mut id: &[u8] = &[];
                    for g in fields(f.body) {
                        let g = g?;
                        if g.is(trace_field) {
                            id = g.body;
                        }
                    }
                    super::ring::hash_key(id)
                } else {
                    ia.clear();
                    collect(f.body, attr_field, &mut ia)?;
                    attrs_hash_wire(&self.sp.attributes, &[ra, &sa, &ia], true)?.unwrap_or_default()
                };
                Route::Whole(self.pick(h)?, 1)
            };
            children.push((&body[f.start..f.end], route));
        }
        combine(body, 2, children)
    }

    fn metric<'a>(&self, body: &'a [u8], ra: &[&[u8]], sa: &[&[u8]], shash: u64) -> W<Route> {
        let MetricData { name, field, occ } = metric_data(body)?;
        if self.sp.key == RoutingKey::Metric {
            let b = self.pick(super::ring::hash_key(name))?;
            let mut n = 0;
            for d in &occ {
                for p in fields(d) {
                    n += usize::from(p?.is(1));
                }
            }
            return Ok(Route::Whole(b, n));
        }
        let (kind, attr_field) = DATA_FIELDS.iter().find(|d| d.0 == field).map_or((0, 0), |d| (d.1, d.2));
        let mut pa: Vec<&'a [u8]> = Vec::new();
        let mut backend_of = |point: &'a [u8]| -> W<usize> {
            pa.clear();
            collect(point, attr_field, &mut pa)?;
            let h = if self.sp.key == RoutingKey::StreamId {
                let mut h = Xxh3::new();
                h.update(&shash.to_le_bytes());
                h.update(name);
                h.update(&[0, kind]);
                feed_sorted(&mut h, &pa)?;
                h.digest()
            } else {
                attrs_hash_wire(&self.sp.attributes, &[ra, sa, &pa], true)?.unwrap_or_default()
            };
            self.pick(h)
        };
        // Per point: its occurrence, its bytes there, its backend.
        let mut points: Vec<(usize, std::ops::Range<usize>, usize)> = Vec::new();
        for (i, d) in occ.iter().enumerate() {
            for p in fields(d) {
                let p = p?;
                if p.is(1) {
                    points.push((i, p.start..p.end, backend_of(p.body)?));
                }
            }
        }
        let Some(&(_, _, first)) = points.first() else { return Ok(Route::Whole(backend_of(&[])?, 0)) };
        if points.iter().all(|p| p.2 == first) {
            return Ok(Route::Whole(first, points.len()));
        }
        let mhead = head(body, &DATA_FIELDS.map(|d| d.0))?;
        let mut dhead = Vec::new();
        for d in &occ {
            dhead.extend(head(d, &[1])?);
        }
        let mut groups: Groups<(Vec<u8>, usize)> = Groups::new();
        for (i, r, b) in points {
            let g = groups.slot(b, || (dhead.clone(), 0));
            g.0.extend_from_slice(&occ[i][r]);
            g.1 += 1;
        }
        Ok(Route::Split(
            groups
                .drain()
                .map(|(b, (data, n))| {
                    let mut m = mhead.clone();
                    put_field(&mut m, field, &data);
                    (b, m, n)
                })
                .collect(),
        ))
    }
}

impl Splitter {
    /// Splits an encoded payload on the wire. `None`: its bytes were not as expected (the
    /// caller decodes instead).
    fn split_wire(&self, e: &Encoded, pick: Pick<'_>) -> Result<Option<Vec<(usize, Payload)>>, SplitError> {
        let signal = e.signal();
        let w = Wire { sp: self, pick, signal };
        let mut outs: Groups<Out> = Groups::new();
        for chunk in e.chunks() {
            for f in fields(&chunk) {
                let route = match f.and_then(|f| {
                    if f.is(1) { w.resource(f.body).map(|r| (f.start..f.end, r)) } else { Ok((0..0, Route::Empty)) }
                }) {
                    Ok(r) => r,
                    Err(Stop::Bad) => return Ok(None),
                    Err(Stop::NoBackend) => return Err(SplitError::NoBackend),
                };
                match route {
                    (_, Route::Empty) => {}
                    (r, Route::Whole(b, n)) => outs.slot(b, Out::default).whole(&chunk, r, n),
                    (_, Route::Split(parts)) => {
                        for (b, body, n) in parts {
                            outs.slot(b, Out::default).rebuilt(&chunk, &body, n);
                        }
                    }
                }
            }
            for o in outs.0.iter_mut().flatten() {
                o.flush_run(&chunk);
            }
        }
        let mut parts = Vec::new();
        for (b, mut o) in outs.drain() {
            o.flush_built();
            let mut acc: Option<Encoded> = None;
            for p in o.pieces {
                let Ok(piece) = Encoded::new(signal, p) else { return Ok(None) };
                match &mut acc {
                    Some(a) => a.extend(piece),
                    None => acc = Some(piece),
                }
            }
            if let Some(a) = acc {
                debug_assert_eq!(a.item_count(), o.items, "wire split counts");
                parts.push((b, Payload::Encoded(a)));
            }
        }
        Ok(Some(parts))
    }
}

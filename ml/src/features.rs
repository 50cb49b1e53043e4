//! The feature windows of the shared `lstm_ae` contract (docs/lstm-ae.md), built incrementally
//! per group as buckets close, and in one go by [`windows_from_batches`].
//!
//! Rows are number points of the card's signals. Group = (instance, version, model), each looked
//! up in the point attributes, then the resource; a point with an empty model is shared by every
//! group of its instance and version with a model (else it belongs to the model-"" group), which
//! is decided when its bucket closes. Bucket b = ⌊t / step⌋ keeps, per signal, the point with the
//! greatest time (ties: the later row). Closing bucket b: a signal without a point carries its
//! last value at most `max_fill_steps` buckets; values are standardised and clipped; a bucket
//! without rows is a gap and resets the run; a window of the last T rows ends at every bucket
//! whose run is at least T.
//!
//! The groups live in the detector kit's [`OrderedSeriesMap`] (least-recently-seen eviction at
//! `max_series`, idle expiry, the checkpoint envelope); every accepted point takes the map's next
//! sequence, a pooled one too, and a pooled point counts for its groups at its own sequence when
//! it is handed to them.

use crate::card::{Card, STD_FLOOR};
use arrow_array::{Array, Float64Array, MapArray, RecordBatch, StringArray, StructArray, UInt8Array};
use inferwatch_core::arrow::{ConvError, schema, time_column};
use inferwatch_processors::detect::rows::{column, opt_column};
use inferwatch_processors::detect::series::{OrderedSeriesMap, RestoreError};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap, VecDeque};

/// Version of the checkpoint format of [`Features`] (2: the groups in the detector kit's series
/// map; version 1 snapshots are refused).
pub const STATE_VERSION: u32 = 2;

/// The group of a window: (service.instance.id, service.version, gen_ai.request.model), in that
/// order (the checkpoint form and the order of windows depend on it).
pub use inferwatch_processors::detect::group::GroupKey;

/// One feature window: T rows of k standardised signals, with the mask of present cells.
#[derive(Debug, Clone, PartialEq)]
pub struct Window {
    /// Its group.
    pub group: GroupKey,
    /// The bucket it ends at.
    pub end_bucket: u64,
    /// End time of that bucket, ns: (end_bucket + 1)·step − 1.
    pub end_ns: u64,
    /// Values, row-major [T, k]; missing cells are 0.
    pub x: Vec<f32>,
    /// 1 where the cell is present, 0 where missing; row-major [T, k].
    pub mask: Vec<f32>,
}

impl Window {
    /// Number of missing cells.
    pub fn missing(&self) -> usize {
        self.mask.iter().filter(|m| **m == 0.0).count()
    }
}

/// A row's value for one signal in one bucket: the greatest (time, arrival) wins.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
struct Cell {
    time: u64,
    seq: u64,
    value: f64,
}

type Cells = Vec<Option<Cell>>;

fn merge(cells: &mut Cells, j: usize, c: Cell) {
    if let Some(slot) = cells.get_mut(j) {
        match slot {
            Some(old) if (old.time, old.seq) > (c.time, c.seq) => {}
            _ => *slot = Some(c),
        }
    }
}

/// Per-group state between buckets.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Group {
    /// Rows of buckets not closed yet.
    pending: BTreeMap<u64, Cells>,
    /// Last raw value per signal and its bucket.
    last: Vec<Option<(u64, f64)>>,
    /// The last (up to T) closed non-gap rows: values and mask.
    rows: VecDeque<(Vec<f32>, Vec<f32>)>,
    /// Consecutive non-gap buckets ending at `last_bucket`.
    run: usize,
    /// The last closed non-gap bucket.
    last_bucket: Option<u64>,
}

impl Group {
    fn new(k: usize) -> Self {
        Group { pending: BTreeMap::new(), last: vec![None; k], rows: VecDeque::new(), run: 0, last_bucket: None }
    }
}

/// What the window builder takes from the card.
#[derive(Debug, Clone)]
struct Params {
    k: usize,
    t: usize,
    step_ns: u64,
    fill: u64,
    mean: Vec<f64>,
    std: Vec<f64>,
    clip: f64,
    source: Option<String>,
    signals: HashMap<String, usize>,
}

impl Params {
    fn from_card(card: &Card) -> Self {
        Params {
            k: card.k(),
            t: card.t,
            step_ns: card.step_ns(),
            fill: card.max_fill_steps,
            mean: card.mean.clone(),
            std: card.std.iter().map(|s| s.max(STD_FLOOR)).collect(),
            clip: card.clip,
            source: card.source.clone(),
            signals: card.signals.iter().enumerate().map(|(i, s)| (s.clone(), i)).collect(),
        }
    }
}

/// Limits of the per-group state.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Most groups held; beyond it the least recently seen 10 % are evicted.
    pub max_series: usize,
    /// Event time without a row after which a group is forgotten (ns).
    pub idle_ns: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { max_series: usize::MAX, idle_ns: u64::MAX }
    }
}

/// Counts of what the builder dropped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Dropped {
    /// Rows of a bucket already closed.
    pub late: u64,
    /// Groups evicted at `max_series`.
    pub evicted_max: u64,
    /// Groups forgotten after `idle_timeout`.
    pub evicted_idle: u64,
}

/// The incremental window builder of one card.
#[derive(Debug, Clone)]
pub struct Features {
    p: Params,
    limits: Limits,
    /// The groups; its sequence numbers every accepted point (cells carry it).
    groups: OrderedSeriesMap<GroupKey, Group>,
    /// Points without a model, per (instance, version), by bucket, until their bucket closes.
    shared: Pools,
    /// Buckets below this are closed.
    closed_before: u64,
    /// Rows of closed buckets skipped.
    late: u64,
}

/// Points without a model, per (instance, version), by bucket.
type Pools = BTreeMap<(String, String), BTreeMap<u64, Cells>>;

impl Features {
    /// An empty builder for `card` (validated) with `limits`.
    pub fn new(card: &Card, limits: Limits) -> Self {
        Features {
            p: Params::from_card(card),
            limits,
            groups: OrderedSeriesMap::new(limits.max_series, limits.idle_ns),
            shared: BTreeMap::new(),
            closed_before: 0,
            late: 0,
        }
    }

    /// Number of groups held.
    pub fn group_count(&self) -> usize {
        self.groups.len()
    }

    /// What was dropped since the start.
    pub fn dropped(&self) -> Dropped {
        let e = self.groups.evictions();
        Dropped { late: self.late, evicted_max: e.max_series, evicted_idle: e.idle }
    }

    /// The index of a signal name, if the card lists it.
    pub fn signal_index(&self, metric: &str) -> Option<usize> {
        self.p.signals.get(metric).copied()
    }

    /// Takes one value of signal `j` for `group` at `time_ns` (non-finite values and unknown
    /// signals are ignored; a value in a closed bucket is counted as late).
    pub fn push(&mut self, group: &GroupKey, j: usize, time_ns: u64, value: f64) {
        if j >= self.p.k || !value.is_finite() {
            return;
        }
        let bucket = time_ns / self.p.step_ns;
        if bucket < self.closed_before {
            self.late += 1;
            return;
        }
        let k = self.p.k;
        if group.model.is_empty() {
            let cell = Cell { time: time_ns, seq: self.groups.bump_seq(), value };
            let pool = self.shared.entry((group.instance.clone(), group.version.clone())).or_default();
            merge(pool.entry(bucket).or_insert_with(|| vec![None; k]), j, cell);
            return;
        }
        // The touch takes the map's next sequence.
        let cell = Cell { time: time_ns, seq: self.groups.seq() + 1, value };
        let max_series = self.limits.max_series;
        let Some(t) = self.groups.touch(group, time_ns, || Group::new(k), |_, _| {}) else { return };
        log_evicted(t.evicted, max_series);
        merge(t.state.pending.entry(bucket).or_insert_with(|| vec![None; k]), j, cell);
    }

    /// Takes the rows of one metrics-schema batch (the card's signals, number points, accepted source).
    pub fn push_batch(&mut self, batch: &RecordBatch) -> Result<(), ConvError> {
        let cols = Columns::new(batch)?;
        for row in 0..batch.num_rows() {
            let Some(j) = cols.names.is_valid(row).then(|| self.signal_index(cols.names.value(row))).flatten() else {
                continue;
            };
            let kind = cols.kinds.value(row);
            if (kind != schema::kind::GAUGE && kind != schema::kind::SUM) || cols.values.is_null(row) {
                continue;
            }
            let value = cols.values.value(row);
            if !value.is_finite() {
                continue;
            }
            if let Some(want) = &self.p.source
                && let Some(src) = cols.lookup(row, "source", None)
                && src != want
            {
                continue;
            }
            let key = GroupKey {
                instance: cols.lookup(row, schema::SERVICE_INSTANCE_ID, cols.instance).unwrap_or_default().to_string(),
                version: cols.lookup(row, schema::SERVICE_VERSION, cols.version).unwrap_or_default().to_string(),
                model: cols.lookup(row, "gen_ai.request.model", None).unwrap_or_default().to_string(),
            };
            // The column holds the OTLP fixed64 bit pattern.
            let time = cols.times.value(row) as u64;
            self.push(&key, j, time, value);
        }
        Ok(())
    }

    /// Closes every bucket that ends at or before `watermark_ns` and returns the windows that
    /// end at them (by group, then bucket).
    pub fn advance(&mut self, watermark_ns: u64) -> Vec<Window> {
        let limit = if watermark_ns == u64::MAX {
            u64::MAX
        } else {
            ((u128::from(watermark_ns) + 1) / u128::from(self.p.step_ns)) as u64
        };
        self.close_before(limit)
    }

    /// Closes every bucket (the end of input).
    pub fn finish(&mut self) -> Vec<Window> {
        self.close_before(u64::MAX)
    }

    fn close_before(&mut self, limit: u64) -> Vec<Window> {
        let mut out = Vec::new();
        if limit <= self.closed_before
            && self.shared.is_empty()
            && self.groups.iter().all(|(_, g)| g.state.pending.is_empty())
        {
            return out;
        }
        self.distribute_shared(limit);
        let p = &self.p;
        for (key, g) in self.groups.iter_mut() {
            if g.pending.first_key_value().is_none_or(|(b, _)| *b >= limit) {
                continue;
            }
            let rest = if limit == u64::MAX { BTreeMap::new() } else { g.pending.split_off(&limit) };
            let closing = std::mem::replace(&mut g.pending, rest);
            for (b, cells) in closing {
                if let Some(w) = close_bucket(p, key, g, b, &cells) {
                    out.push(w);
                }
            }
        }
        self.closed_before = self.closed_before.max(limit);
        out
    }

    /// Hands the model-less points of closing buckets to their groups.
    fn distribute_shared(&mut self, limit: u64) {
        let pools = std::mem::take(&mut self.shared);
        for ((instance, version), mut pool) in pools {
            let rest = if limit == u64::MAX { BTreeMap::new() } else { pool.split_off(&limit) };
            if !rest.is_empty() {
                self.shared.insert((instance.clone(), version.clone()), rest);
            }
            if pool.is_empty() {
                continue;
            }
            // The group counts the pool's points: its largest time, its latest arrival.
            let (time, seq) = pool.values().flatten().flatten().fold((0, 0), |(t, s), c| (t.max(c.time), s.max(c.seq)));
            let lo = GroupKey::new(instance.clone(), version.clone(), "");
            let mut targets: Vec<GroupKey> = self
                .groups
                .range(lo.clone()..)
                .take_while(|(k, _)| k.instance == instance && k.version == version)
                .filter(|(k, _)| !k.model.is_empty())
                .map(|(k, _)| k.clone())
                .collect();
            if targets.is_empty() {
                targets.push(lo);
            }
            let (k, max_series) = (self.p.k, self.limits.max_series);
            for key in targets {
                let Some(t) = self.groups.touch_at(&key, time, seq, || Group::new(k), |_, _| {}) else { continue };
                log_evicted(t.evicted, max_series);
                for (b, cells) in &pool {
                    let dst = t.state.pending.entry(*b).or_insert_with(|| vec![None; k]);
                    for (j, c) in cells.iter().enumerate() {
                        if let Some(c) = c {
                            merge(dst, j, *c);
                        }
                    }
                }
            }
        }
    }

    /// Forgets groups with no row for `idle_ns` before `watermark_ns` (and nothing pending).
    pub fn evict_idle(&mut self, watermark_ns: u64) -> usize {
        // A group with pending rows is kept; when they close is not known here (0).
        self.groups.expire_idle(watermark_ns, |g| (!g.pending.is_empty()).then_some(0), |_, _| {})
    }

    /// Serializes the state (deterministic: groups in key order).
    pub fn snapshot(&self) -> Result<Vec<u8>, postcard::Error> {
        self.groups.snapshot(STATE_VERSION, &(&self.shared, self.closed_before), |_, g| g)
    }

    /// Replaces the state with a snapshot of the same card; unchanged on error.
    pub fn restore(&mut self, bytes: &[u8]) -> Result<(), RestoreError> {
        let (k, t) = (self.p.k, self.p.t);
        let ((shared, closed_before), groups): ((Pools, u64), _) =
            self.groups.restore(STATE_VERSION, bytes, |key, g: Group| {
                let bad_cells = g.pending.values().any(|c| c.len() != k);
                let bad_rows = g.rows.len() > t || g.rows.iter().any(|(x, m)| x.len() != k || m.len() != k);
                if g.last.len() != k || bad_cells || bad_rows {
                    return Err(RestoreError::part(
                        "group",
                        format!("{key:?} does not match the card (k = {k}, T = {t})"),
                    ));
                }
                Ok(g)
            })?;
        if shared.values().any(|pool| pool.values().any(|c| c.len() != k)) {
            return Err(RestoreError::part("shared points", format!("do not match the card (k = {k})")));
        }
        self.groups = groups;
        self.shared = shared;
        self.closed_before = closed_before;
        Ok(())
    }
}

/// Logs groups evicted at `max_series`.
fn log_evicted(n: usize, max_series: usize) {
    if n > 0 {
        tracing::debug!(evicted = n, max_series, "window groups evicted at max_series");
    }
}

/// Closes bucket `b` of group `g` (which has rows in it); a window when the run reaches T.
fn close_bucket(p: &Params, key: &GroupKey, g: &mut Group, b: u64, cells: &Cells) -> Option<Window> {
    let consecutive = g.last_bucket.is_some_and(|l| l.checked_add(1) == Some(b));
    if !consecutive {
        g.run = 0;
        g.rows.clear();
    }
    let mut x = vec![0f32; p.k];
    let mut mask = vec![0f32; p.k];
    for j in 0..p.k {
        if let Some(Some(c)) = cells.get(j) {
            g.last[j] = Some((b, c.value));
        }
        let raw = g.last[j].filter(|(lb, _)| b - lb <= p.fill).map(|(_, v)| v);
        if let Some(v) = raw {
            x[j] = ((v - p.mean[j]) / p.std[j]).clamp(-p.clip, p.clip) as f32;
            mask[j] = 1.0;
        }
    }
    // A bucket whose signals are all missing after fill is a gap (only possible when its every row was dropped).
    if mask.iter().all(|m| *m == 0.0) {
        g.run = 0;
        g.rows.clear();
        g.last_bucket = None;
        return None;
    }
    g.rows.push_back((x, mask));
    while g.rows.len() > p.t {
        g.rows.pop_front();
    }
    g.run += 1;
    g.last_bucket = Some(b);
    if g.run < p.t {
        return None;
    }
    let mut w = Window {
        group: key.clone(),
        end_bucket: b,
        end_ns: b.saturating_add(1).saturating_mul(p.step_ns).saturating_sub(1),
        x: Vec::with_capacity(p.t * p.k),
        mask: Vec::with_capacity(p.t * p.k),
    };
    for (x, m) in &g.rows {
        w.x.extend_from_slice(x);
        w.mask.extend_from_slice(m);
    }
    Some(w)
}

/// The columns the builder reads, downcast once per batch.
struct Columns<'a> {
    names: &'a StringArray,
    kinds: &'a UInt8Array,
    values: &'a Float64Array,
    times: &'a arrow_array::TimestampNanosecondArray,
    instance: Option<&'a StringArray>,
    version: Option<&'a StringArray>,
    attrs: Option<MapStr<'a>>,
    resource: Option<MapStr<'a>>,
}

impl<'a> Columns<'a> {
    fn new(batch: &'a RecordBatch) -> Result<Self, ConvError> {
        Ok(Columns {
            names: column(batch, schema::METRIC_NAME)?,
            kinds: column(batch, schema::KIND)?,
            values: column(batch, schema::VALUE)?,
            times: time_column(batch)?,
            instance: opt_column(batch, schema::SERVICE_INSTANCE_ID),
            version: opt_column(batch, schema::SERVICE_VERSION),
            attrs: opt_column::<MapArray>(batch, schema::ATTRIBUTES).and_then(MapStr::new),
            resource: opt_column::<MapArray>(batch, schema::RESOURCE_ATTRIBUTES).and_then(MapStr::new),
        })
    }

    /// A string attribute: point attributes, then the promoted resource column, then resource attributes.
    fn lookup(&self, row: usize, key: &str, promoted: Option<&'a StringArray>) -> Option<&'a str> {
        if let Some(v) = self.attrs.as_ref().and_then(|m| m.get(row, key)) {
            return Some(v);
        }
        if let Some(c) = promoted
            && c.is_valid(row)
        {
            return Some(c.value(row));
        }
        self.resource.as_ref().and_then(|m| m.get(row, key))
    }
}

/// A map column of attribute values, read for string values.
struct MapStr<'a> {
    map: &'a MapArray,
    keys: &'a StringArray,
    strs: &'a StringArray,
}

impl<'a> MapStr<'a> {
    fn new(map: &'a MapArray) -> Option<Self> {
        let keys = map.keys().as_any().downcast_ref::<StringArray>()?;
        let values = map.values().as_any().downcast_ref::<StructArray>()?;
        let strs = values.column_by_name("str")?.as_any().downcast_ref::<StringArray>()?;
        Some(MapStr { map, keys, strs })
    }

    fn get(&self, row: usize, key: &str) -> Option<&'a str> {
        if self.map.is_null(row) {
            return None;
        }
        let offsets = self.map.value_offsets();
        let (start, end) = (*offsets.get(row)? as usize, *offsets.get(row + 1)? as usize);
        (start..end)
            .find(|&i| self.keys.value(i) == key)
            .and_then(|i| self.strs.is_valid(i).then(|| self.strs.value(i)))
    }
}

/// Every window of `batches` (rows in input order), with all buckets closed at the end; sorted
/// by group, then end bucket.
pub fn windows_from_batches(batches: &[RecordBatch], card: &Card) -> Result<Vec<Window>, ConvError> {
    let mut f = Features::new(card, Limits::default());
    for b in batches {
        f.push_batch(b)?;
    }
    let mut w = f.finish();
    w.sort_by(|a, b| (&a.group, a.end_bucket).cmp(&(&b.group, b.end_bucket)));
    Ok(w)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn card(t: usize, fill: u64) -> Card {
        serde_json::from_value(serde_json::json!({
            "format": 1, "name": "t", "detector": "lstm_ae", "signals": ["a", "b", "gpu"], "source": "scrape",
            "T": t, "step_s": 1, "max_fill_steps": fill, "mean": [0.0, 10.0, 0.0], "std": [1.0, 2.0, 0.0],
            "clip": 3.0,
            "calibration": {"quantiles": [[0.99, 0.4]], "warning_error": 0.6, "critical_error": 1.2}
        }))
        .unwrap()
    }

    const S: u64 = 1_000_000_000;

    #[test]
    fn fill_limit_gap_reset_and_clip() {
        let c = card(3, 1);
        let mut f = Features::new(&c, Limits::default());
        let g = GroupKey::new("i", "v", "m");
        // Buckets 0..=3 have rows; signal b only at bucket 0 (carried to bucket 1, missing after).
        for b in 0..4u64 {
            f.push(&g, 0, b * S + 10, b as f64);
        }
        f.push(&g, 1, 5, 20.0); // (20 − 10) / 2 = 5 → clipped to 3
        // Bucket 4 has no rows (gap); buckets 5..=7 have rows.
        for b in 5..8u64 {
            f.push(&g, 0, b * S, 1.0);
        }
        let w = f.finish();
        assert_eq!(w.iter().map(|w| w.end_bucket).collect::<Vec<_>>(), vec![2, 3, 7]);
        assert_eq!(w[0].x, vec![0.0, 3.0, 0.0, 1.0, 3.0, 0.0, 2.0, 0.0, 0.0]);
        assert_eq!(w[0].mask, vec![1.0, 1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0]);
        assert_eq!(w[0].missing(), 4);
        assert_eq!(w[0].end_ns, 3 * S - 1);
        assert_eq!(w[2].x, vec![1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0]);
    }

    #[test]
    fn duplicates_keep_the_latest_time_then_the_later_row() {
        let c = card(1, 0);
        let mut f = Features::new(&c, Limits::default());
        let g = GroupKey::new("i", "v", "m");
        f.push(&g, 0, 500, 1.0);
        f.push(&g, 0, 900, 2.0);
        f.push(&g, 0, 100, 3.0);
        f.push(&g, 1, 700, 12.0);
        f.push(&g, 1, 700, 14.0);
        let w = f.finish();
        assert_eq!(w.len(), 1);
        assert_eq!(&w[0].x[..2], &[2.0, 2.0]);
    }

    #[test]
    fn shared_gpu_points_go_to_every_model_of_the_instance_or_to_model_empty() {
        let c = card(1, 0);
        let mut f = Features::new(&c, Limits::default());
        let (m1, m2) = (GroupKey::new("i", "v", "m1"), GroupKey::new("i", "v", "m2"));
        f.push(&m1, 0, 10, 1.0);
        f.push(&m2, 0, 20, 2.0);
        f.push(&GroupKey::new("i", "v", ""), 2, 30, 0.5);
        f.push(&GroupKey::new("j", "v", ""), 2, 30, 0.25);
        let w = f.finish();
        let groups: Vec<&str> = w.iter().map(|w| w.group.model.as_str()).collect();
        assert_eq!(groups, vec!["m1", "m2", ""]);
        assert_eq!(w[2].group.instance, "j");
        // std 0 is floored at 1e-6: 0.5 / 1e-6 clipped to 3.
        assert_eq!(w[0].x, vec![1.0, 0.0, 3.0]);
        assert_eq!(w[1].x, vec![2.0, 0.0, 3.0]);
        assert_eq!(w[2].x, vec![0.0, 0.0, 3.0]);
        assert_eq!(w[2].mask, vec![0.0, 0.0, 1.0]);
    }

    #[test]
    fn watermark_closes_only_ended_buckets_and_late_rows_are_counted() {
        let c = card(2, 0);
        let mut f = Features::new(&c, Limits::default());
        let g = GroupKey::new("i", "v", "m");
        f.push(&g, 0, 0, 1.0);
        f.push(&g, 0, S, 2.0);
        assert!(f.advance(2 * S - 2).is_empty());
        let w = f.advance(2 * S - 1);
        assert_eq!(w.len(), 1);
        assert_eq!(w[0].end_ns, 2 * S - 1);
        f.push(&g, 0, S + 5, 9.0);
        assert_eq!(f.dropped().late, 1);
        // Snapshot and restore continue identically.
        f.push(&g, 0, 2 * S, 3.0);
        let mut r = Features::new(&c, Limits::default());
        r.restore(&f.snapshot().unwrap()).unwrap();
        for h in [&mut f, &mut r] {
            h.push(&g, 1, 2 * S + 1, 11.0);
        }
        assert_eq!(f.finish(), r.finish());
    }

    #[test]
    fn batches_filter_the_source_and_look_up_keys_in_point_then_resource() {
        use inferwatch_processors::detect::kv_str;
        use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
        use opentelemetry_proto::tonic::metrics::v1::{
            Gauge, Metric, NumberDataPoint, ResourceMetrics, ScopeMetrics, metric, number_data_point,
        };
        use opentelemetry_proto::tonic::resource::v1::Resource;
        let point = |t: u64, v: f64, attrs: Vec<_>| NumberDataPoint {
            attributes: attrs,
            time_unix_nano: t,
            value: Some(number_data_point::Value::AsDouble(v)),
            ..Default::default()
        };
        let pts = vec![
            point(10, 1.0, vec![kv_str("gen_ai.request.model", "m"), kv_str("source", "scrape")]),
            // Skipped: another source (later in time, so it would win the bucket).
            point(20, 2.0, vec![kv_str("gen_ai.request.model", "m"), kv_str("source", "spans")]),
            // The point's own version wins over the resource's.
            point(30, 3.0, vec![kv_str("gen_ai.request.model", "m"), kv_str("service.version", "own")]),
            point(40, f64::NAN, vec![kv_str("gen_ai.request.model", "m")]),
        ];
        let req = ExportMetricsServiceRequest {
            resource_metrics: vec![ResourceMetrics {
                resource: Some(Resource {
                    attributes: vec![kv_str("service.instance.id", "i"), kv_str("service.version", "v")],
                    ..Default::default()
                }),
                scope_metrics: vec![ScopeMetrics {
                    metrics: vec![Metric {
                        name: "a".into(),
                        data: Some(metric::Data::Gauge(Gauge { data_points: pts })),
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
                ..Default::default()
            }],
        };
        let batch = inferwatch_core::arrow::metrics::to_batch(&req).unwrap();
        let w = windows_from_batches(&[batch], &card(1, 0)).unwrap();
        let got: Vec<(GroupKey, f32)> = w.iter().map(|w| (w.group.clone(), w.x[0])).collect();
        assert_eq!(got, vec![(GroupKey::new("i", "own", "m"), 3.0), (GroupKey::new("i", "v", "m"), 1.0)]);
    }

    #[test]
    fn idle_and_max_series_eviction() {
        let c = card(1, 0);
        let mut f = Features::new(&c, Limits { max_series: 2, idle_ns: 10 * S });
        for (i, m) in ["a", "b", "c"].iter().enumerate() {
            f.push(&GroupKey::new("i", "v", *m), 0, i as u64 * S, 1.0);
        }
        assert_eq!(f.group_count(), 2);
        assert_eq!(f.dropped().evicted_max, 1);
        let _ = f.advance(5 * S);
        assert_eq!(f.evict_idle(5 * S), 0);
        assert_eq!(f.evict_idle(12 * S), 2);
    }

    #[test]
    fn pooled_points_count_for_their_groups_at_their_own_arrival() {
        let c = card(1, 0);
        let lim = Limits { max_series: 2, idle_ns: u64::MAX };
        let (i1, j2) = (GroupKey::new("i", "v", "m1"), GroupKey::new("j", "v", "m2"));
        // i's pooled point arrives after j's row: handed to i's group at close, it makes i the
        // more recent, so the next new group evicts j.
        let mut f = Features::new(&c, lim);
        f.push(&i1, 0, 0, 1.0);
        f.push(&j2, 0, 0, 1.0);
        f.push(&GroupKey::new("i", "v", ""), 2, 0, 1.0);
        assert_eq!(f.advance(S - 1).len(), 2);
        f.push(&GroupKey::new("k", "v", "m"), 0, S, 1.0);
        assert_eq!(f.dropped().evicted_max, 1);
        assert!(f.groups.contains_key(&i1) && !f.groups.contains_key(&j2));
        // It arrived before j's row: handing it over is not a new arrival, so i is evicted.
        let mut f = Features::new(&c, lim);
        f.push(&i1, 0, 0, 1.0);
        f.push(&GroupKey::new("i", "v", ""), 2, 0, 1.0);
        f.push(&j2, 0, 0, 1.0);
        assert_eq!(f.advance(S - 1).len(), 2);
        assert_eq!(f.groups.seq(), 3, "three points, three sequence numbers");
        f.push(&GroupKey::new("k", "v", "m"), 0, S, 1.0);
        assert!(!f.groups.contains_key(&i1) && f.groups.contains_key(&j2));
    }

    #[test]
    fn a_group_made_by_pooled_points_idles_from_their_time_and_pending_rows_keep_groups() {
        let c = card(1, 0);
        let mut f = Features::new(&c, Limits { max_series: 10, idle_ns: 10 * S });
        f.push(&GroupKey::new("i", "v", ""), 2, 5 * S, 1.0);
        assert_eq!(f.advance(6 * S - 1).len(), 1, "the model-\"\" group");
        assert_eq!(f.evict_idle(15 * S - 1), 0);
        assert_eq!(f.evict_idle(15 * S), 1, "idle 10 s after the pooled point");
        let g = GroupKey::new("i", "v", "m");
        f.push(&g, 0, 20 * S, 1.0);
        assert_eq!(f.evict_idle(100 * S), 0, "its row is pending");
        let _ = f.advance(100 * S);
        assert_eq!(f.evict_idle(100 * S), 1);
        assert_eq!(f.dropped(), Dropped { late: 0, evicted_max: 0, evicted_idle: 2 });
    }

    #[test]
    fn restore_refuses_other_versions_and_other_cards_and_keeps_the_state() {
        let c = card(2, 0);
        let g = GroupKey::new("i", "v", "m");
        let mut f = Features::new(&c, Limits::default());
        f.push(&g, 0, 0, 1.0);
        f.push(&GroupKey::new("i", "v", ""), 2, S, 1.0);
        let bytes = f.snapshot().unwrap();
        let mut r = Features::new(&c, Limits::default());
        r.restore(&bytes).unwrap();
        assert_eq!(r.snapshot().unwrap(), bytes);
        let v1 = f.groups.snapshot(1, &(&f.shared, f.closed_before), |_, g| g).unwrap();
        let e = r.restore(&v1).unwrap_err();
        assert_eq!(e.to_string(), "state version 1, this build reads 2");
        // Another card (k = 2): refused, the state unchanged.
        let mut other: Card = card(2, 0);
        other.signals.truncate(2);
        other.mean.truncate(2);
        other.std.truncate(2);
        let mut o = Features::new(&other, Limits::default());
        let e = o.restore(&bytes).unwrap_err();
        assert!(e.to_string().starts_with("group: "), "{e}");
        assert_eq!(o.group_count(), 0);
        assert!(r.restore(&bytes[..bytes.len() - 1]).is_err());
        assert_eq!(r.snapshot().unwrap(), bytes);
    }
}

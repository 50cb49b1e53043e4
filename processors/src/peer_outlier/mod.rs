//! Processor `peer_outlier`: each replica of a fleet against its peers (docs/detectors/peer_outlier.md).
//!
//! Reads gauge series of golden signals per replica (by default `llm_signals`' TTFT and TPOT
//! p95), keyed by metric, group (`group_by`, default the model) and replica
//! (`replica_attribute`, default `service.instance.id`, else `replica_fallback`). Per event-time
//! tumbling window, each replica's value (the mean of its points in the window, or the last) is
//! compared with the median and the MAD of the **other** replicas of its group that have a
//! value in the same window: robust z = (x − median) / scale, the scale the larger of the
//! window's 1.4826·MAD and the peers' smoothed relative spread (by default their bad-side tail,
//! `scale_spread`), floored so that z reaches `threshold` only when the replica is also
//! `min_relative_deviation` away from the median. A replica worse than `threshold` in `for_windows` consecutive windows, with at least
//! `min_peers` peers, is flagged. A fleet that moves together moves its median too: nothing is
//! flagged. Output at each window's end, per replica: `llm.anomaly.score` (robust z, positive
//! when worse) and `llm.anomaly.level`, with the peer baseline as evidence.

pub mod state;
pub mod stats;

use crate::detect::adapter::Adapter;
use crate::detect::config::nanos;
use crate::detect::group;
use crate::detect::limits::{self, SeriesLimits, with_series_limits};
use crate::detect::rows::{self, Rows};
use crate::detect::series::SeriesMeta;
use crate::detect::{Output, kv_f64, kv_i64, kv_str};
use arrow_array::RecordBatch;
use inferwatch_core::arrow::{ArrowProcessor, ArrowProcessorFactory, ConvError, Needs, schema};
use inferwatch_core::component::{ComponentError, CreateContext, FieldError, PathSeg, parse_config};
use inferwatch_core::pdata::Signal;
use inferwatch_core::settings::GoDuration;
use inferwatch_core::state::StateError;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use serde::de::{MapAccess, Visitor};
use serde::{Deserialize, Deserializer};
use state::{Aggregate, Key, Replica, State};
use stats::{Persistence, Rule, Spread, Worse};
use std::collections::HashMap;
use std::time::Duration;

/// Version of the checkpoint format written by [`PeerOutlier`].
/// 2: a series' smoothed relative scale follows `scale_spread` (the peers' bad-side tail by
/// default; 1 held the 1.4826·MAD / |median| only).
/// 3: a replica's status carries the CUSUM evidence (`persistence: cusum`).
pub const STATE_VERSION: u32 = 3;
/// The `detector` attribute of the output.
pub const DETECTOR: &str = "peer_outlier";
/// The metrics read by default: `llm_signals`' latency p95s.
pub const DEFAULT_METRICS: &[&str] = &["llm.ttft.p95", "llm.tpot.p95"];
/// Metrics of `llm_signals` for which lower is worse when named without `worse`.
pub const LOWER_IS_WORSE: &[&str] = &["llm.tokens.output.rate", "llm.tokens.input.rate", "llm.prefix_cache.hit_rate"];

/// One metric read, and which side of the peers is worse.
#[derive(Debug, Clone, PartialEq)]
pub struct MetricSpec {
    /// Exact metric name.
    pub name: String,
    /// Which side is worse (default: `lower` for the names in [`LOWER_IS_WORSE`], else `higher`).
    pub worse: Worse,
}

impl MetricSpec {
    /// The metric `name` with its default direction.
    pub fn named(name: &str) -> Self {
        let worse = if LOWER_IS_WORSE.contains(&name) { Worse::Lower } else { Worse::Higher };
        MetricSpec { name: name.to_string(), worse }
    }
}

/// The map form of a metric: `{name, worse}`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MetricMap {
    name: String,
    worse: Option<Worse>,
}

impl<'de> Deserialize<'de> for MetricSpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = MetricSpec;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a metric name or a map {name, worse}")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<MetricSpec, E> {
                Ok(MetricSpec::named(v))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<MetricSpec, A::Error> {
                let m = MetricMap::deserialize(serde::de::value::MapAccessDeserializer::new(map))?;
                let named = MetricSpec::named(&m.name);
                Ok(MetricSpec { worse: m.worse.unwrap_or(named.worse), name: m.name })
            }
        }
        d.deserialize_any(V)
    }
}

/// Settings of `peer_outlier`.
#[derive(Debug, Clone, Deserialize)]
#[serde(remote = "Self", deny_unknown_fields, default)]
pub struct PeerOutlierConfig {
    /// Metrics compared across replicas: names or `{name, worse: higher|lower|both}` (default
    /// `llm.ttft.p95`, `llm.tpot.p95`, higher is worse).
    pub metrics: Vec<MetricSpec>,
    /// Attributes whose values form a group of peers: point attribute, else resource attribute
    /// (default `gen_ai.request.model`; may be empty: the whole input is one fleet).
    pub group_by: Vec<String>,
    /// Attribute naming the replica: point attribute, else resource attribute (default
    /// `service.instance.id`).
    pub replica_attribute: String,
    /// Attributes tried in order when `replica_attribute` is missing or empty (default `k8s.pod.name`).
    pub replica_fallback: Vec<String>,
    /// Window length (default 1m; > 0); tumbling, epoch-aligned, event time.
    pub window: GoDuration,
    /// A replica's value in a window: `mean` of its points (default) or `last`.
    pub aggregate: Aggregate,
    /// Robust z at or above which a replica is worse than its peers in a window (default 2.5; > 0).
    pub threshold: f64,
    /// Consecutive windows worse before a replica is flagged (default 4; 1..=1000): with the
    /// tail spread, 3 still named a healthy replica in the simulator's fleet_traffic_peak.
    pub for_windows: u32,
    /// Fewest peers (other replicas of the group with a value in the window) for a judgement (default 3; ≥ 1).
    pub min_peers: usize,
    /// Smallest deviation from the peer median, relative to it, that can reach `threshold` (default 0.1; ≥ 0).
    pub min_relative_deviation: f64,
    /// Smallest absolute deviation, in the metric's unit, that can reach `threshold` (default 0; ≥ 0).
    pub min_deviation: f64,
    /// Weight of the newest window in each replica's smoothed peer scale, the relative spread
    /// below which the scale does not fall (default 0.1; in (0, 1]; 1: the window's own only).
    pub scale_smoothing: f64,
    /// The spread the smoothed peer scale follows: `tail` (default), the peers' bad-side tail,
    /// 2 × 1.2533 × mean(max(x − median, 0)) / |median| for higher-is-worse (the lower tail for
    /// lower-is-worse, 1.2533 × mean|x − median| for both); `mad`, 1.4826·MAD / |median| (the
    /// behaviour before, blind to a heavy right tail).
    pub scale_spread: Spread,
    /// How a replica's windows make a flag: `consecutive` (`for_windows` windows in a row with z
    /// ≥ `threshold`) or `cusum` (the window scores accumulated, see `cusum_slack`).
    pub persistence: Persistence,
    /// `cusum`: subtracted from each window's z before it is accumulated (≥ 0); a replica whose
    /// scores stay below it accumulates nothing.
    pub cusum_slack: f64,
    /// `cusum`: the accumulated evidence at which a replica is flagged (> 0).
    pub cusum_limit: f64,
    /// `max_series` (default 10000 replica series: metric × group × replica), `idle_timeout`
    /// (default 15m; > 0) and `allowed_lateness` (default 0s), top-level keys.
    #[serde(skip)]
    pub limits: SeriesLimits,
}

impl Default for PeerOutlierConfig {
    fn default() -> Self {
        PeerOutlierConfig {
            metrics: DEFAULT_METRICS.iter().map(|m| MetricSpec::named(m)).collect(),
            group_by: vec![group::MODEL.into()],
            replica_attribute: schema::SERVICE_INSTANCE_ID.into(),
            replica_fallback: vec!["k8s.pod.name".into()],
            window: GoDuration(Duration::from_secs(60)),
            aggregate: Aggregate::Mean,
            threshold: 2.5,
            for_windows: 4,
            min_peers: 3,
            min_relative_deviation: 0.1,
            min_deviation: 0.0,
            scale_smoothing: 0.1,
            scale_spread: Spread::Tail,
            persistence: Persistence::Consecutive,
            cusum_slack: 1.0,
            cusum_limit: 6.0,
            limits: SeriesLimits {
                max_series: 10_000,
                idle_timeout: GoDuration(Duration::from_secs(900)),
                allowed_lateness: GoDuration(Duration::ZERO),
            },
        }
    }
}

with_series_limits!(PeerOutlierConfig, limits::ALL);

/// Most `for_windows`.
pub const MAX_FOR_WINDOWS: u32 = 1000;

/// A checked configuration.
#[derive(Debug, Clone)]
struct Checked {
    metrics: HashMap<String, Worse>,
    group_by: Vec<String>,
    replica_attributes: Vec<String>,
    window_ns: u64,
    aggregate: Aggregate,
    rule: Rule,
    max_series: usize,
    idle_ns: u64,
    lateness_ns: u64,
}

fn indexed(key: &str, i: usize, message: &str) -> FieldError {
    FieldError { path: vec![PathSeg::Key(key.into()), PathSeg::Index(i)], message: message.into() }
}

impl PeerOutlierConfig {
    fn check(&self) -> Result<Checked, FieldError> {
        if self.metrics.is_empty() {
            return Err(FieldError::at("metrics", "must name at least one metric"));
        }
        let mut metrics = HashMap::new();
        for (i, m) in self.metrics.iter().enumerate() {
            if m.name.is_empty() {
                return Err(indexed("metrics", i, "metric names must not be empty"));
            }
            if metrics.insert(m.name.clone(), m.worse).is_some() {
                return Err(indexed("metrics", i, &format!("{} is listed twice", m.name)));
            }
        }
        if let Some(i) = self.group_by.iter().position(String::is_empty) {
            return Err(indexed("group_by", i, "attribute names must not be empty"));
        }
        if self.replica_attribute.is_empty() {
            return Err(FieldError::at("replica_attribute", "is required"));
        }
        if let Some(i) = self.replica_fallback.iter().position(String::is_empty) {
            return Err(indexed("replica_fallback", i, "attribute names must not be empty"));
        }
        let window_ns = nanos("window", &self.window)?;
        if window_ns == 0 {
            return Err(FieldError::at("window", "must be greater than 0"));
        }
        if !(self.threshold.is_finite() && self.threshold > 0.0) {
            return Err(FieldError::at("threshold", format!("must be a finite number > 0, got {}", self.threshold)));
        }
        if !(1..=MAX_FOR_WINDOWS).contains(&self.for_windows) {
            return Err(FieldError::at("for_windows", format!("must be between 1 and {MAX_FOR_WINDOWS}")));
        }
        if self.min_peers == 0 {
            return Err(FieldError::at("min_peers", "must be at least 1"));
        }
        for (key, v) in [("min_relative_deviation", self.min_relative_deviation), ("min_deviation", self.min_deviation)]
        {
            if !(v.is_finite() && v >= 0.0) {
                return Err(FieldError::at(key, format!("must be a finite number ≥ 0, got {v}")));
            }
        }
        let a = self.scale_smoothing;
        if !(a.is_finite() && a > 0.0 && a <= 1.0) {
            return Err(FieldError::at("scale_smoothing", format!("must be in (0, 1], got {a}")));
        }
        if !(self.cusum_slack.is_finite() && self.cusum_slack >= 0.0) {
            return Err(FieldError::at(
                "cusum_slack",
                format!("must be a finite number ≥ 0, got {}", self.cusum_slack),
            ));
        }
        if !(self.cusum_limit.is_finite() && self.cusum_limit > 0.0) {
            return Err(FieldError::at(
                "cusum_limit",
                format!("must be a finite number > 0, got {}", self.cusum_limit),
            ));
        }
        let l = self.limits.check()?;
        if l.idle_ns == 0 {
            return Err(FieldError::at("idle_timeout", "must be greater than 0"));
        }
        let mut replica_attributes = vec![self.replica_attribute.clone()];
        replica_attributes.extend(self.replica_fallback.iter().cloned());
        Ok(Checked {
            metrics,
            group_by: self.group_by.clone(),
            replica_attributes,
            window_ns,
            aggregate: self.aggregate,
            rule: Rule {
                threshold: self.threshold,
                for_windows: self.for_windows,
                min_peers: self.min_peers,
                min_relative_deviation: self.min_relative_deviation,
                min_deviation: self.min_deviation,
                smoothing: self.scale_smoothing,
                spread: self.scale_spread,
                persistence: self.persistence,
                cusum_slack: self.cusum_slack,
                cusum_limit: self.cusum_limit,
            },
            max_series: l.max_series,
            idle_ns: l.idle_ns,
            lateness_ns: l.lateness_ns,
        })
    }
}

/// Factory of `peer_outlier`.
pub struct PeerOutlierFactory;

inferwatch_core::arrow_processor_factory!(PeerOutlierFactory, DETECTOR, &[Signal::Metrics]);

impl ArrowProcessorFactory for PeerOutlierFactory {
    fn parse_arrow(&self, cfg: &serde_json::Value) -> Result<inferwatch_core::component::Parsed, FieldError> {
        Ok(std::sync::Arc::new(parse_config::<PeerOutlierConfig>(cfg)?.check()?))
    }
    fn build_arrow(
        &self,
        ctx: CreateContext,
        parsed: &inferwatch_core::component::Parsed,
        signal: Signal,
    ) -> Result<Box<dyn ArrowProcessor>, ComponentError> {
        crate::detect::config::metrics_only(DETECTOR, signal)?;
        let checked = inferwatch_core::component::typed::<Checked>(parsed)?.clone();
        Ok(Box::new(PeerOutlier::from_checked(&ctx, checked)))
    }
}

/// The running processor.
pub struct PeerOutlier {
    cfg: Checked,
    state: State,
    kit: Adapter,
}

impl PeerOutlier {
    /// A processor with the settings `cfg` (as `create_arrow` builds it; public for benchmarks).
    pub fn new(ctx: &CreateContext, cfg: &serde_json::Value) -> Result<Self, ComponentError> {
        Ok(Self::from_checked(ctx, parse_config::<PeerOutlierConfig>(cfg)?.check()?))
    }

    fn from_checked(ctx: &CreateContext, cfg: Checked) -> Self {
        PeerOutlier {
            state: State::new(cfg.window_ns, cfg.max_series, cfg.idle_ns),
            cfg,
            kit: Adapter::new(ctx, DETECTOR),
        }
    }

    /// Bytes of state held, estimated.
    pub fn approx_state_bytes(&self) -> usize {
        self.state.approx_bytes()
    }
}

/// The replica of `row`: the first of `names` present and not empty (point attribute, else
/// resource attribute), with the attribute's name.
fn replica_of<'n>(
    names: &'n [String],
    rows: &mut Rows<'_>,
    row: usize,
    attrs: &[KeyValue],
) -> Result<Option<(&'n str, String)>, ConvError> {
    for n in names {
        if let Some(v) = rows::lookup(rows, row, attrs, n)?.filter(|v| !v.is_empty()) {
            return Ok(Some((n.as_str(), v)));
        }
    }
    Ok(None)
}

impl ArrowProcessor for PeerOutlier {
    fn needs(&self) -> Needs {
        Needs { signal: Signal::Metrics, columns: rows::COLUMNS.to_vec() }
    }

    fn allowed_lateness_ns(&self) -> u64 {
        self.cfg.lateness_ns
    }

    fn process(&mut self, batch: &RecordBatch, _out: &mut Vec<RecordBatch>) -> Result<(), ConvError> {
        let mut rows = Rows::new(batch)?;
        let cfg = &self.cfg;
        let (mut evicted, mut late, mut anonymous) = (0usize, 0usize, 0usize);
        for row in 0..rows.len() {
            let Some(p) = rows.number(row) else { continue };
            if !cfg.metrics.contains_key(p.name) {
                continue;
            }
            let attrs = rows.attributes(row)?;
            let Some((replica_attribute, replica)) = replica_of(&cfg.replica_attributes, &mut rows, row, &attrs)?
            else {
                anonymous += 1;
                continue;
            };
            let group = group::values(&cfg.group_by, &mut rows, row, &attrs, false)?;
            let key = Key { metric: p.name.to_string(), group, replica };
            let added = self.state.add(&key, p.time, p.value, || {
                let meta = SeriesMeta {
                    metric: p.name.to_string(),
                    resource: rows.resource(row)?.clone(),
                    scope: rows.scope(row)?.clone(),
                    ..Default::default()
                };
                Ok::<_, ConvError>(Some(Replica {
                    meta,
                    replica_attribute: replica_attribute.to_string(),
                    windows: Vec::new(),
                    status: stats::Status::default(),
                    last_end: 0,
                    rel_scale: f64::NAN,
                }))
            })?;
            match added {
                Ok(n) => evicted += n,
                Err(state::Skip::Late) => late += 1,
                Err(state::Skip::NotMade) => {}
            }
        }
        self.kit.evicted_max(evicted);
        if late > 0 || anonymous > 0 {
            tracing::debug!(processor = %self.kit.name(), late, anonymous, "peer_outlier: points skipped");
        }
        Ok(())
    }

    fn advance(&mut self, watermark_ns: u64, out: &mut Vec<RecordBatch>) -> Result<(), ConvError> {
        let cfg = &self.cfg;
        let rule = cfg.rule;
        let window_s = cfg.window_ns as f64 / 1e9;
        let mut output = Output::new();
        let idle = self.state.close_until(watermark_ns, cfg.aggregate, |(end, metric, group), members| {
            let worse = cfg.metrics.get(metric).copied().unwrap_or(Worse::Higher);
            let values: Vec<f64> = members.iter().map(|m| m.2).collect();
            let baselines = stats::leave_one_out(&values);
            let peers = members.len().saturating_sub(1);
            let start = end.saturating_sub(cfg.window_ns);
            let mut streaks = Vec::with_capacity(members.len());
            for (i, (key, r, x)) in members.iter().enumerate() {
                let previous = if r.last_end == start { r.status } else { stats::Status::default() };
                let Some(b) = baselines.get(i).copied() else {
                    // Alone in its group this window: nothing to compare with.
                    streaks.push((stats::Status::default(), r.rel_scale));
                    continue;
                };
                let rel_scale = rule.smooth(r.rel_scale, b, worse);
                let j = rule.judge(*x, b, worse, rel_scale);
                let status = rule.step(previous, j.z, peers);
                streaks.push((status, rel_scale));
                let mut attrs: Vec<KeyValue> = Vec::with_capacity(cfg.group_by.len() + 1);
                for (k, v) in cfg.group_by.iter().zip(group) {
                    attrs.push(kv_str(k, v.clone()));
                }
                if !cfg.group_by.contains(&r.replica_attribute) {
                    attrs.push(kv_str(&r.replica_attribute, key.replica.clone()));
                }
                let count = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
                let evidence = [
                    kv_f64("peer_outlier.value", *x),
                    kv_f64("peer_outlier.peer_median", b.median),
                    kv_f64("peer_outlier.peer_mad", b.mad),
                    kv_f64("peer_outlier.scale", j.scale),
                    kv_f64("peer_outlier.peer_tail_sigma", b.tail_sigma(worse)),
                    kv_f64("peer_outlier.smoothed_relative_scale", rel_scale),
                    kv_str("peer_outlier.scale_spread", rule.spread.as_str()),
                    kv_f64("peer_outlier.deviation", j.deviation),
                    kv_f64("peer_outlier.relative_deviation", j.relative_deviation),
                    kv_f64("peer_outlier.bound", j.bound),
                    kv_i64("peer_outlier.peers", count(peers as u64)),
                    kv_i64("peer_outlier.streak", i64::from(status.streak)),
                    kv_f64("peer_outlier.evidence", status.evidence),
                    kv_str("peer_outlier.persistence", rule.persistence.as_str()),
                    kv_str("peer_outlier.flagged", if status.flagged { "true" } else { "false" }),
                    kv_i64("peer_outlier.for_windows", i64::from(rule.for_windows)),
                    kv_f64("peer_outlier.threshold", rule.threshold),
                    kv_str("peer_outlier.worse", worse.as_str()),
                    kv_f64("peer_outlier.window_s", window_s),
                ];
                let level = rule.level(status, j.z);
                let m = &r.meta;
                output.score(&m.resource, &m.scope, &attrs, *end, DETECTOR, metric, j.z, level, &evidence);
            }
            streaks
        });
        self.kit.evicted_idle(idle);
        output.emit(out)
    }

    fn state_version(&self) -> u32 {
        STATE_VERSION
    }

    fn snapshot(&self) -> Result<Vec<u8>, StateError> {
        self.kit.snapshot(self.state.snapshot())
    }

    fn restore(&mut self, bytes: &[u8]) -> Result<(), StateError> {
        let fresh = State::new(self.cfg.window_ns, self.cfg.max_series, self.cfg.idle_ns);
        self.state = self.kit.restore(fresh, bytes, State::restore)?;
        Ok(())
    }

    fn series_count(&self) -> usize {
        self.state.series_count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(v: serde_json::Value) -> Result<Checked, FieldError> {
        parse_config::<PeerOutlierConfig>(&v)?.check()
    }

    #[test]
    fn defaults() {
        let c = parse(json!({})).unwrap();
        assert_eq!(c.metrics.get("llm.ttft.p95"), Some(&Worse::Higher));
        assert_eq!(c.metrics.len(), 2);
        assert_eq!(c.group_by, vec!["gen_ai.request.model"]);
        assert_eq!(c.replica_attributes, vec!["service.instance.id", "k8s.pod.name"]);
        assert_eq!((c.window_ns, c.aggregate, c.lateness_ns), (60_000_000_000, Aggregate::Mean, 0));
        assert_eq!((c.rule.threshold, c.rule.for_windows, c.rule.min_peers), (2.5, 4, 3));
        assert_eq!(c.rule.min_relative_deviation, 0.1);
        assert_eq!(c.rule.spread, Spread::Tail);
        assert_eq!(parse(json!({"scale_spread": "mad"})).unwrap().rule.spread, Spread::Mad);
    }

    #[test]
    fn metric_forms_and_directions() {
        let c = parse(json!({"metrics": [
            "llm.e2e.p99",
            "llm.tokens.output.rate",
            {"name": "llm.kv_cache.usage", "worse": "both"},
            {"name": "llm.prefix_cache.hit_rate"}
        ]}))
        .unwrap();
        assert_eq!(c.metrics.get("llm.e2e.p99"), Some(&Worse::Higher));
        assert_eq!(c.metrics.get("llm.tokens.output.rate"), Some(&Worse::Lower));
        assert_eq!(c.metrics.get("llm.kv_cache.usage"), Some(&Worse::Both));
        assert_eq!(c.metrics.get("llm.prefix_cache.hit_rate"), Some(&Worse::Lower));
    }

    #[test]
    fn bad_settings_name_their_field() {
        let key = |k: &str| PathSeg::Key(k.into());
        for (cfg, path) in [
            (json!({"metrics": []}), vec![key("metrics")]),
            (json!({"metrics": ["a", ""]}), vec![key("metrics"), PathSeg::Index(1)]),
            (json!({"metrics": ["a", "a"]}), vec![key("metrics"), PathSeg::Index(1)]),
            (json!({"metrics": [{"name": "a", "worse": "up"}]}), vec![key("metrics"), PathSeg::Index(0), key("worse")]),
            (json!({"group_by": ["", "x"]}), vec![key("group_by"), PathSeg::Index(0)]),
            (json!({"replica_attribute": ""}), vec![key("replica_attribute")]),
            (json!({"replica_fallback": [""]}), vec![key("replica_fallback"), PathSeg::Index(0)]),
            (json!({"window": "0s"}), vec![key("window")]),
            (json!({"aggregate": "median"}), vec![key("aggregate")]),
            (json!({"threshold": 0.0}), vec![key("threshold")]),
            (json!({"for_windows": 0}), vec![key("for_windows")]),
            (json!({"min_peers": 0}), vec![key("min_peers")]),
            (json!({"min_relative_deviation": -0.1}), vec![key("min_relative_deviation")]),
            (json!({"min_deviation": -1.0}), vec![key("min_deviation")]),
            (json!({"idle_timeout": "0s"}), vec![key("idle_timeout")]),
            (json!({"scale_smoothing": 0.0}), vec![key("scale_smoothing")]),
            (json!({"scale_smoothing": 1.5}), vec![key("scale_smoothing")]),
            (json!({"scale_spread": "iqr"}), vec![key("scale_spread")]),
            (json!({"max_series": 0}), vec![key("max_series")]),
            (json!({"treshold": 1}), vec![key("treshold")]),
        ] {
            let e = parse(cfg.clone()).unwrap_err();
            assert_eq!(e.path, path, "{cfg}: {}", e.message);
        }
    }
}

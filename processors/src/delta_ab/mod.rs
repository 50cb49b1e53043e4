//! Processor `delta_ab`: the Delta-Metric between a baseline and a candidate version (docs/detectors/delta_ab.md).
//!
//! Reads the number points of one metric, splits them by version (point attribute
//! `version_attribute`, else the resource attribute) and by group (`group_by`), and per
//! event-time tumbling window compares a statistic of the candidate against the baseline (the
//! configured pair, or with `baseline` and `candidate` left empty the pair chosen per group from
//! the versions live at the window end: the newest against the most-seen older one): Δ
//! (ms for latency, relative otherwise), sample sizes, a deterministic bootstrap confidence
//! interval, and a verdict (steady / inconclusive / regression). With `lookback` longer than
//! `window`, each window's end judges the points of the last `lookback` together (canary-style
//! accumulation). When points carry a request id on both versions (mirrored traffic) the
//! comparison is paired. Output at each window's end: `llm.anomaly.score` = Δ and
//! `llm.anomaly.level`. Semantics: docs/detectors/delta_ab.md.

pub mod state;
pub mod stats;
pub mod verdict;

use crate::detect::config::nanos;
use crate::detect::group;
use crate::detect::limits::SeriesLimits;
use crate::detect::rows::{self, Rows};
use crate::detect::{Output, kv_f64, kv_i64, kv_str};
use arrow_array::RecordBatch;
use inferwatch_core::arrow::{ArrowProcessor, ArrowProcessorFactory, ConvError, Needs, schema};
use inferwatch_core::component::{ComponentError, CreateContext, FieldError, parse_config};
use inferwatch_core::pdata::Signal;
use inferwatch_core::settings::GoDuration;
use inferwatch_core::state::StateError;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use prometheus_client::metrics::counter::Counter;
use serde::Deserialize;
use state::{Eval, Evicted, Lookback, Meta, Pairing, Params, State};
use stats::{Bootstrap, Estimate, Kind, Sample, Statistic, window_seed};
use std::collections::HashMap;
use std::time::Duration;
use verdict::{Rule, Verdict};

/// Version of the checkpoint format written by [`DeltaAb`].
/// 5: each window's values of a version carry its distinct replicas and its warm-up count, and
/// a group the first point of each (version, replica).
pub const STATE_VERSION: u32 = 5;
/// The `detector` attribute of the output.
pub const DETECTOR: &str = "delta_ab";

/// Thresholds on Δ, one per kind (docs/detectors/delta_ab.md).
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Thresholds {
    /// Latency: Δ of the statistic in ms beyond which B is worse (default 5; ≥ 0).
    pub latency_ms: f64,
    /// Throughput: relative Δ below which B is worse (default −0.08; ≤ 0).
    pub throughput_rel: f64,
    /// Quality: relative Δ below which B is worse (default −0.003; ≤ 0).
    pub quality_rel: f64,
}

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds { latency_ms: 5.0, throughput_rel: -0.08, quality_rel: -0.003 }
    }
}

/// Settings of `delta_ab`.
#[derive(Debug, Clone, Deserialize)]
#[serde(remote = "Self", deny_unknown_fields, default)]
pub struct DeltaAbConfig {
    /// Metric compared (exact name; required).
    pub metric: String,
    /// Attribute naming the version: the point attribute, else the resource attribute (default service.version).
    pub version_attribute: String,
    /// Baseline version A (with `candidate`; both empty: automatic pairing per group).
    pub baseline: String,
    /// Candidate version B (with `baseline`, not equal to it; both empty: automatic pairing).
    pub candidate: String,
    /// Automatic pairing: a version is live at a window end when it had a point within this span
    /// before it (default: the longer of `lookback` and 2 × `window`; ≥ `window`).
    pub live_within: Option<GoDuration>,
    /// Automatic pairing: most versions tracked per group (default 8; ≥ 2); beyond, the least
    /// recently seen one outside the compared pair is evicted.
    pub max_versions: Option<usize>,
    /// Statistic compared: p50, p95, p99 or mean (default p95).
    pub statistic: Statistic,
    /// What the metric is: latency (seconds; Δ in ms), throughput or quality (default latency).
    pub kind: Kind,
    /// Window length (default 10m; > 0); tumbling, epoch-aligned, event time.
    pub window: GoDuration,
    /// Span judged at each window's end (default: `window`; a multiple of it, at most 7 days).
    pub lookback: Option<GoDuration>,
    /// Most values kept per version over the look-back (default 200000; ≥ `max_samples`); beyond
    /// it the oldest windows leave the look-back.
    pub max_points: usize,
    /// Fewest samples (pairs when paired) per version for a verdict other than inconclusive (default 30; ≥ 2).
    pub min_samples: usize,
    /// Confidence level of the interval (default 0.95; in (0, 1)).
    pub confidence: f64,
    /// Bootstrap resamples (default 500; 10..=100000).
    pub resamples: usize,
    /// Thresholds on Δ per kind.
    pub thresholds: Thresholds,
    /// Attributes whose values form a group (point attribute, else resource attribute; default gen_ai.request.model).
    pub group_by: Vec<String>,
    /// Point attribute pairing the two versions' points (mirrored traffic; default gen_ai.request.id; "" = never pair).
    pub request_id_attribute: String,
    /// A warning (level 0.6) also needs the interval to exclude "no change" on the bad side (default true).
    pub warning_needs_significance: bool,
    /// Most values kept per version and window; beyond, a uniform reservoir (default 10000; ≥ min_samples).
    pub max_samples: usize,
    /// Attribute naming the replica a point comes from: point attribute, else resource attribute
    /// (default service.instance.id; "" = none). Replicas per version are reported, and the
    /// warm-up is per replica.
    pub instance_attribute: String,
    /// A replica's points of a version within this span after its first point of that version
    /// are left out: the cold start after a deploy (default 0s: none; at most `lookback`).
    pub warmup: GoDuration,
    /// Compared by window (unpaired), the baseline's values come only from the windows in which
    /// the candidate has values too, so that both sides cover the same time (default false; the
    /// fleet's setting: a partial rollout is compared with the replicas at the same time only).
    pub concurrent: bool,
    /// `allowed_lateness` (default 0s), `max_series` (default 1000; groups held, beyond it the
    /// least recently seen 10 % are evicted) and `idle_timeout` (default 1h; event time without a
    /// point after which a group is forgotten), top-level keys.
    #[serde(skip)]
    pub limits: SeriesLimits,
}

crate::detect::limits::with_series_limits!(DeltaAbConfig, crate::detect::limits::ALL);

impl Default for DeltaAbConfig {
    fn default() -> Self {
        DeltaAbConfig {
            metric: String::new(),
            version_attribute: schema::SERVICE_VERSION.into(),
            baseline: String::new(),
            candidate: String::new(),
            live_within: None,
            max_versions: None,
            statistic: Statistic::P95,
            kind: Kind::Latency,
            window: GoDuration(Duration::from_secs(600)),
            lookback: None,
            max_points: 200_000,
            min_samples: 30,
            confidence: 0.95,
            resamples: 500,
            thresholds: Thresholds::default(),
            group_by: vec!["gen_ai.request.model".into()],
            request_id_attribute: "gen_ai.request.id".into(),
            warning_needs_significance: true,
            max_samples: 10_000,
            instance_attribute: schema::SERVICE_INSTANCE_ID.into(),
            warmup: GoDuration(Duration::ZERO),
            concurrent: false,
            limits: SeriesLimits {
                max_series: 1000,
                idle_timeout: GoDuration(Duration::from_secs(3600)),
                allowed_lateness: GoDuration(Duration::ZERO),
            },
        }
    }
}

/// Default `max_versions`.
pub const DEFAULT_MAX_VERSIONS: usize = 8;

/// The `delta_ab.verdict` of a level-0 point that ends a pair no longer compared.
pub const VERDICT_ENDED: &str = "ended";

/// The longest `lookback`: 7 days.
pub const MAX_LOOKBACK: Duration = Duration::from_secs(7 * 24 * 3600);

/// A checked configuration in the units the processor uses.
#[derive(Debug, Clone)]
struct Checked {
    params: Params,
    lateness_ns: u64,
    metric: String,
    version_attribute: String,
    pairing: Pairing,
    group_by: Vec<String>,
    request_id_attribute: String,
    instance_attribute: String,
    concurrent: bool,
    min_samples: usize,
    boot: Bootstrap,
    rule: Rule,
}

impl DeltaAbConfig {
    fn check(&self) -> Result<Checked, FieldError> {
        for (key, v) in [("metric", &self.metric), ("version_attribute", &self.version_attribute)] {
            if v.is_empty() {
                return Err(FieldError::at(key, "is required"));
            }
        }
        let auto = self.baseline.is_empty() && self.candidate.is_empty();
        if !auto {
            for (key, v, other) in
                [("baseline", &self.baseline, "candidate"), ("candidate", &self.candidate, "baseline")]
            {
                if v.is_empty() {
                    return Err(FieldError::at(
                        key,
                        format!("is required with {other} (leave both empty to pair the live versions automatically)"),
                    ));
                }
            }
            if self.candidate == self.baseline {
                return Err(FieldError::at("candidate", "must differ from baseline"));
            }
            for (key, set) in
                [("live_within", self.live_within.is_some()), ("max_versions", self.max_versions.is_some())]
            {
                if set {
                    return Err(FieldError::at(
                        key,
                        "applies to automatic pairing only (baseline and candidate left empty)",
                    ));
                }
            }
        }
        let window_ns = nanos("window", &self.window)?;
        if window_ns == 0 {
            return Err(FieldError::at("window", "must be greater than 0"));
        }
        if self.min_samples < 2 {
            return Err(FieldError::at("min_samples", "must be at least 2"));
        }
        if !(self.confidence.is_finite() && self.confidence > 0.0 && self.confidence < 1.0) {
            return Err(FieldError::at("confidence", format!("must be in (0, 1), got {}", self.confidence)));
        }
        if !(10..=100_000).contains(&self.resamples) {
            return Err(FieldError::at("resamples", "must be between 10 and 100000"));
        }
        let t = &self.thresholds;
        if !(t.latency_ms.is_finite() && t.latency_ms >= 0.0) {
            return Err(FieldError::at("thresholds.latency_ms", "must be a finite number ≥ 0"));
        }
        if !(t.throughput_rel.is_finite() && t.throughput_rel <= 0.0) {
            return Err(FieldError::at("thresholds.throughput_rel", "must be a finite number ≤ 0"));
        }
        if !(t.quality_rel.is_finite() && t.quality_rel <= 0.0) {
            return Err(FieldError::at("thresholds.quality_rel", "must be a finite number ≤ 0"));
        }
        if let Some(i) = self.group_by.iter().position(String::is_empty) {
            return Err(FieldError {
                path: vec![
                    inferwatch_core::component::PathSeg::Key("group_by".into()),
                    inferwatch_core::component::PathSeg::Index(i),
                ],
                message: "attribute names must not be empty".into(),
            });
        }
        if self.max_samples < self.min_samples {
            return Err(FieldError::at("max_samples", "must be at least min_samples"));
        }
        let limits = self.limits.check()?;
        let lookback_ns = match &self.lookback {
            None => window_ns,
            Some(d) => {
                if d.0 > MAX_LOOKBACK {
                    return Err(FieldError::at("lookback", format!("{d} is longer than 7 days")));
                }
                let ns = nanos("lookback", d)?;
                if ns == 0 || !ns.is_multiple_of(window_ns) {
                    return Err(FieldError::at("lookback", format!("{d} is not a positive multiple of window")));
                }
                ns
            }
        };
        if self.max_points < self.max_samples {
            return Err(FieldError::at("max_points", "must be at least max_samples"));
        }
        let warmup_ns = nanos("warmup", &self.warmup)?;
        if warmup_ns > lookback_ns {
            return Err(FieldError::at("warmup", format!("{} is longer than lookback", self.warmup)));
        }
        let pairing = if auto {
            let live_ns = match &self.live_within {
                None => lookback_ns.max(window_ns.saturating_mul(2)),
                Some(d) => {
                    let ns = nanos("live_within", d)?;
                    if ns < window_ns {
                        return Err(FieldError::at("live_within", format!("{d} is shorter than window")));
                    }
                    ns
                }
            };
            let max_versions = self.max_versions.unwrap_or(DEFAULT_MAX_VERSIONS);
            if max_versions < 2 {
                return Err(FieldError::at("max_versions", "must be at least 2"));
            }
            Pairing::Auto { live_ns, max_versions }
        } else {
            Pairing::Explicit { baseline: self.baseline.clone(), candidate: self.candidate.clone() }
        };
        let threshold = match self.kind {
            Kind::Latency => t.latency_ms,
            Kind::Throughput => t.throughput_rel,
            Kind::Quality => t.quality_rel,
        };
        Ok(Checked {
            params: Params {
                window_ns,
                idle_ns: limits.idle_ns,
                max_series: limits.max_series,
                max_samples: self.max_samples,
                lookback_ns,
                max_points: self.max_points,
                warmup_ns,
            },
            lateness_ns: limits.lateness_ns,
            metric: self.metric.clone(),
            version_attribute: self.version_attribute.clone(),
            pairing,
            group_by: self.group_by.clone(),
            request_id_attribute: self.request_id_attribute.clone(),
            instance_attribute: self.instance_attribute.clone(),
            concurrent: self.concurrent,
            min_samples: self.min_samples,
            boot: Bootstrap {
                statistic: self.statistic,
                kind: self.kind,
                resamples: self.resamples,
                confidence: self.confidence,
            },
            rule: Rule {
                threshold,
                higher_is_worse: self.kind.higher_is_worse(),
                warning_needs_significance: self.warning_needs_significance,
            },
        })
    }
}

/// Factory of `delta_ab`.
pub struct DeltaAbFactory;

inferwatch_core::arrow_processor_factory!(DeltaAbFactory, "delta_ab", &[Signal::Metrics]);

impl ArrowProcessorFactory for DeltaAbFactory {
    fn parse_arrow(&self, cfg: &serde_json::Value) -> Result<inferwatch_core::component::Parsed, FieldError> {
        Ok(std::sync::Arc::new(parse_config::<DeltaAbConfig>(cfg)?.check()?))
    }
    fn build_arrow(
        &self,
        ctx: CreateContext,
        parsed: &inferwatch_core::component::Parsed,
        signal: Signal,
    ) -> Result<Box<dyn ArrowProcessor>, ComponentError> {
        crate::detect::config::metrics_only(DETECTOR, signal)?;
        let checked = inferwatch_core::component::typed::<Checked>(parsed)?.clone();
        Ok(Box::new(DeltaAb::new(checked, &ctx)))
    }
}

/// The running processor.
pub struct DeltaAb {
    cfg: Checked,
    state: State,
    name: String,
    evicted_idle: Counter,
    evicted_max: Counter,
    evicted_versions: Counter,
}

/// The comparison of one closed window's look-back of one group.
#[derive(Debug, Clone, PartialEq)]
pub struct Comparison {
    /// Points of the baseline in the look-back.
    pub n_baseline: u64,
    /// Points of the candidate in the look-back.
    pub n_candidate: u64,
    /// Pairs compared (0 when compared by window).
    pub n_pairs: usize,
    /// Δ with its interval (none when a side is empty).
    pub estimate: Option<Estimate>,
    /// The verdict.
    pub verdict: Verdict,
    /// The anomaly level in [0, 1].
    pub level: f64,
    /// Seconds from the start of the oldest window compared to the end of the current one.
    pub lookback_s: f64,
    /// Distinct replicas of the baseline with values compared.
    pub replicas_baseline: usize,
    /// Distinct replicas of the candidate with values compared.
    pub replicas_candidate: usize,
    /// Points left out as warm-up in the look-back (baseline, candidate).
    pub warmup: (u64, u64),
    /// Whether the baseline was restricted to the candidate's windows.
    pub concurrent: bool,
}

/// The points of one version over a look-back: its windows' values and ids concatenated, oldest
/// window first, and the points seen.
#[derive(Debug, Default)]
struct Pooled {
    values: Vec<f64>,
    ids: Vec<u64>,
    seen: u64,
}

impl Pooled {
    fn of<'a>(sides: impl Iterator<Item = &'a state::Side>) -> Self {
        let mut p = Pooled::default();
        for s in sides {
            p.values.extend_from_slice(&s.values);
            p.ids.extend_from_slice(&s.ids);
            p.seen = p.seen.saturating_add(s.seen);
        }
        p
    }
}

/// Pairs of (baseline, candidate) values sharing a request id, sorted by id (first occurrence on
/// each side; points without an id are not paired).
fn pairs(a: &Pooled, b: &Pooled) -> (Vec<f64>, Vec<f64>) {
    let mut a_by_id: HashMap<u64, f64> = HashMap::with_capacity(a.ids.len());
    for (&id, &v) in a.ids.iter().zip(&a.values) {
        if id != 0 {
            a_by_id.entry(id).or_insert(v);
        }
    }
    let mut matched: Vec<(u64, f64, f64)> = Vec::new();
    for (&id, &v) in b.ids.iter().zip(&b.values) {
        if id != 0
            && let Some(a) = a_by_id.remove(&id)
        {
            matched.push((id, a, v));
        }
    }
    matched.sort_unstable_by_key(|x| x.0);
    matched.into_iter().map(|(_, a, b)| (a, b)).unzip()
}

fn sorted(values: &[f64]) -> Vec<f64> {
    let mut v = values.to_vec();
    v.sort_unstable_by(f64::total_cmp);
    v
}

impl Checked {
    /// Compares `candidate` against `baseline` over the look-back `l` of group `key`: the points
    /// of its windows pooled, paired across window boundaries, the bootstrap seeded from the
    /// current window's start.
    fn compare(&self, key: &[String], l: Lookback<'_>, baseline: &str, candidate: &str) -> Comparison {
        let seed = window_seed(key, l.current.start);
        let pa_all = Pooled::of(l.windows().filter_map(|w| w.side(baseline)));
        let pb_all = Pooled::of(l.windows().filter_map(|w| w.side(candidate)));
        let (pa, pb) =
            if self.request_id_attribute.is_empty() { (Vec::new(), Vec::new()) } else { pairs(&pa_all, &pb_all) };
        let paired = pa.len() >= self.min_samples;
        // Compared by window, the baseline by default covers only the candidate's windows.
        let concurrent = !paired && self.concurrent;
        let baseline_window = |w: &state::Window| !concurrent || w.side(candidate).is_some_and(|s| s.seen > 0);
        let (estimate, enough, n_baseline) = if paired {
            (self.boot.estimate(Sample::Paired { a: &pa, b: &pb }, seed), true, pa_all.seen)
        } else {
            let pa_used = Pooled::of(l.windows().filter(|w| baseline_window(w)).filter_map(|w| w.side(baseline)));
            // Sorted, so that the result does not depend on the order the points arrived in.
            let (a, b) = (sorted(&pa_used.values), sorted(&pb_all.values));
            let enough = pa_used.seen >= self.min_samples as u64 && pb_all.seen >= self.min_samples as u64;
            (self.boot.estimate(Sample::Unpaired { a: &a, b: &b }, seed), enough, pa_used.seen)
        };
        let (verdict, level) = match &estimate {
            Some(e) => self.rule.assess(enough, e.delta, e.ci_low, e.ci_high),
            None => (Verdict::Inconclusive, 0.0),
        };
        Comparison {
            n_baseline,
            n_candidate: pb_all.seen,
            n_pairs: if paired { pa.len() } else { 0 },
            estimate,
            verdict,
            level,
            lookback_s: l.current.end.saturating_sub(l.start()) as f64 / 1e9,
            replicas_baseline: l.replicas(baseline, baseline_window),
            replicas_candidate: l.replicas(candidate, |_| true),
            warmup: (l.warmup(baseline), l.warmup(candidate)),
            concurrent,
        }
    }

    /// The evidence attributes of a comparison (`live`: versions live, automatic pairing only).
    fn evidence(&self, c: &Comparison, baseline: &str, candidate: &str, live: Option<usize>) -> Vec<KeyValue> {
        let count = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        let mut ev = vec![
            kv_str("delta_ab.baseline", baseline),
            kv_str("delta_ab.candidate", candidate),
            kv_i64("delta_ab.n_baseline", count(c.n_baseline)),
            kv_i64("delta_ab.n_candidate", count(c.n_candidate)),
            kv_i64("delta_ab.n_pairs", count(c.n_pairs as u64)),
            kv_i64("delta_ab.replicas_baseline", count(c.replicas_baseline as u64)),
            kv_i64("delta_ab.replicas_candidate", count(c.replicas_candidate as u64)),
            kv_i64("delta_ab.warmup_baseline", count(c.warmup.0)),
            kv_i64("delta_ab.warmup_candidate", count(c.warmup.1)),
            kv_str("delta_ab.concurrent", if c.concurrent { "true" } else { "false" }),
            kv_str("delta_ab.mode", if c.n_pairs > 0 { "paired" } else { "window" }),
            kv_str("delta_ab.statistic", self.boot.statistic.name()),
            kv_str("delta_ab.kind", self.boot.kind.name()),
        ];
        if let Some(e) = &c.estimate {
            ev.extend([
                kv_f64("delta_ab.value_baseline", e.a),
                kv_f64("delta_ab.value_candidate", e.b),
                kv_f64("delta_ab.delta_rel", e.delta_rel),
                kv_f64("delta_ab.ci_low", e.ci_low),
                kv_f64("delta_ab.ci_high", e.ci_high),
            ]);
        }
        ev.extend([
            kv_f64("delta_ab.confidence", self.boot.confidence),
            kv_str("delta_ab.verdict", c.verdict.as_str()),
            kv_f64("delta_ab.threshold", self.rule.threshold),
            kv_f64("delta_ab.window_s", self.params.window_ns as f64 / 1e9),
            kv_f64("delta_ab.lookback_s", c.lookback_s),
        ]);
        if let Some(n) = live {
            ev.push(kv_i64("delta_ab.live_versions", count(n as u64)));
        }
        ev
    }

    /// The evidence attributes of the level-0 point of a pair that ended.
    fn ended_evidence(&self, baseline: &str, candidate: &str, live: usize) -> Vec<KeyValue> {
        vec![
            kv_str("delta_ab.baseline", baseline),
            kv_str("delta_ab.candidate", candidate),
            kv_str("delta_ab.statistic", self.boot.statistic.name()),
            kv_str("delta_ab.kind", self.boot.kind.name()),
            kv_str("delta_ab.verdict", VERDICT_ENDED),
            kv_f64("delta_ab.threshold", self.rule.threshold),
            kv_f64("delta_ab.window_s", self.params.window_ns as f64 / 1e9),
            kv_i64("delta_ab.live_versions", i64::try_from(live).unwrap_or(i64::MAX)),
        ]
    }
}

impl DeltaAb {
    fn new(cfg: Checked, ctx: &CreateContext) -> Self {
        DeltaAb {
            state: State::new(cfg.params, cfg.pairing.clone()),
            cfg,
            name: ctx.id.to_string(),
            evicted_idle: ctx.telemetry.series_evicted(&ctx.id, "idle"),
            evicted_max: ctx.telemetry.series_evicted(&ctx.id, "max_series"),
            evicted_versions: ctx.telemetry.series_evicted(&ctx.id, "max_versions"),
        }
    }

    fn corrupt(&self, message: impl std::fmt::Display) -> StateError {
        StateError::Corrupt { key: self.name.clone(), message: message.to_string() }
    }
}

/// A request id as a non-zero 64-bit hash.
fn id_hash(id: &str) -> u64 {
    stats::splitmix64(stats::fnv1a(stats::FNV_OFFSET, id.as_bytes())).max(1)
}

impl ArrowProcessor for DeltaAb {
    fn needs(&self) -> Needs {
        Needs { signal: Signal::Metrics, columns: rows::COLUMNS.to_vec() }
    }

    fn allowed_lateness_ns(&self) -> u64 {
        self.cfg.lateness_ns
    }

    fn process(&mut self, batch: &RecordBatch, _out: &mut Vec<RecordBatch>) -> Result<(), ConvError> {
        let mut rows = Rows::new(batch)?;
        let cfg = &self.cfg;
        let mut evicted = Evicted::default();
        for row in 0..rows.len() {
            let Some(p) = rows.number(row) else { continue };
            if p.name != cfg.metric {
                continue;
            }
            let attrs = rows.attributes(row)?;
            let Some(version) = rows::lookup(&mut rows, row, &attrs, &cfg.version_attribute)? else { continue };
            let wanted = match &cfg.pairing {
                Pairing::Explicit { baseline, candidate } => version == *baseline || version == *candidate,
                Pairing::Auto { .. } => !version.is_empty(),
            };
            if !wanted {
                continue;
            }
            let key = group::values(&cfg.group_by, &mut rows, row, &attrs, false)?;
            let id = if cfg.request_id_attribute.is_empty() {
                0
            } else {
                rows::point_string(&attrs, &cfg.request_id_attribute)
                    .filter(|s| !s.is_empty())
                    .map_or(0, |s| id_hash(&s))
            };
            let replica = if cfg.instance_attribute.is_empty() {
                0
            } else {
                rows::lookup(&mut rows, row, &attrs, &cfg.instance_attribute)?
                    .filter(|s| !s.is_empty())
                    .map_or(0, |s| id_hash(&s))
            };
            let added = self.state.add_from(key, p.time, p.value, &version, id, replica, || {
                let resource = rows.resource(row)?.clone();
                let scope = rows.scope(row)?.clone();
                Ok::<_, ConvError>((resource, scope))
            })?;
            if let Ok(n) = added {
                evicted.groups += n.groups;
                evicted.versions += n.versions;
            }
        }
        if evicted.groups > 0 {
            self.evicted_max.inc_by(evicted.groups as u64);
            tracing::debug!(processor = %self.name, evicted = evicted.groups, "delta_ab: groups evicted at max_series");
        }
        if evicted.versions > 0 {
            self.evicted_versions.inc_by(evicted.versions as u64);
            tracing::debug!(
                processor = %self.name,
                evicted = evicted.versions,
                "delta_ab: versions evicted at max_versions"
            );
        }
        Ok(())
    }

    fn advance(&mut self, watermark_ns: u64, out: &mut Vec<RecordBatch>) -> Result<(), ConvError> {
        let cfg = &self.cfg;
        let mut output = Output::new();
        let idle = self.state.close_until(watermark_ns, |key, ev: Eval<'_>| {
            let attrs: Vec<KeyValue> = cfg.group_by.iter().zip(key).map(|(k, v)| kv_str(k, v.clone())).collect();
            let (meta, time, score, level, evidence): (&Meta, u64, f64, f64, Vec<KeyValue>) = match ev {
                Eval::Compare { baseline, candidate, meta, live, lookback } => {
                    let c = cfg.compare(key, lookback, baseline, candidate);
                    let score = c.estimate.as_ref().map_or(0.0, |e| e.delta);
                    (meta, lookback.current.end, score, c.level, cfg.evidence(&c, baseline, candidate, live))
                }
                Eval::Ended { baseline, candidate, meta, live, end } => {
                    (meta, end, 0.0, 0.0, cfg.ended_evidence(baseline, candidate, live))
                }
            };
            output.score(&meta.resource, &meta.scope, &attrs, time, DETECTOR, &cfg.metric, score, level, &evidence);
        });
        if idle > 0 {
            self.evicted_idle.inc_by(idle as u64);
        }
        output.emit(out)
    }

    fn state_version(&self) -> u32 {
        STATE_VERSION
    }

    fn snapshot(&self) -> Result<Vec<u8>, StateError> {
        self.state.snapshot().map_err(|e| self.corrupt(format!("cannot serialize delta_ab state: {e}")))
    }

    fn restore(&mut self, bytes: &[u8]) -> Result<(), StateError> {
        let mut fresh = State::new(self.cfg.params, self.cfg.pairing.clone());
        fresh.restore(bytes).map_err(|e| self.corrupt(format!("delta_ab state: {e}")))?;
        self.state = fresh;
        Ok(())
    }

    fn series_count(&self) -> usize {
        self.state.series_count()
    }
}

//! Settings of `slo`: the objectives a user declares once, and their check into what the
//! processor runs (the event rule, the burn-rate ledger's parameters, the embedded forecast).

use super::openslo;

use crate::trend_forecast::config::{Span, TrendForecastConfig, parse_span};
use inferwatch_core::component::{FieldError, PathSeg};
use serde::{Deserialize, Deserializer};

const NS_PER_S: u64 = 1_000_000_000;
const HOUR_NS: u64 = 3600 * NS_PER_S;
/// Longest `period` accepted (the ledger keeps one bucket per hour of it).
pub const MAX_PERIOD_HOURS: u64 = 90 * 24;

/// Settings of the `slo` processor.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SloConfig {
    /// The objectives (at least one).
    pub objectives: Vec<ObjectiveConfig>,
    /// Most groups held per objective; beyond, the least recently seen 10 % are evicted (default 1000).
    pub max_groups: usize,
    /// How late a point may arrive and still count (default 0s: llm_signals emits in order).
    pub allowed_lateness: Span,
    /// OpenSLO v1 files (relative to the working directory) whose `SLO` documents become
    /// objectives after `objectives` (see [`super::openslo`]).
    pub openslo: Vec<String>,
}

impl Default for SloConfig {
    fn default() -> Self {
        SloConfig { objectives: Vec::new(), max_groups: 1000, allowed_lateness: Span(0), openslo: Vec::new() }
    }
}

/// A threshold: a duration (`70ms`, `1.5s`) for latency signals, or a plain number (seconds, or
/// a ratio for `availability`).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Threshold(pub Option<f64>);

impl<'de> Deserialize<'de> for Threshold {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            N(f64),
            S(String),
        }
        match Raw::deserialize(d)? {
            Raw::N(n) => Ok(Threshold(Some(n))),
            Raw::S(s) => {
                if let Ok(n) = s.trim().parse::<f64>() {
                    return Ok(Threshold(Some(n)));
                }
                parse_span(&s).map(|ns| Threshold(Some(ns as f64 / NS_PER_S as f64))).map_err(serde::de::Error::custom)
            }
        }
    }
}

/// A target: a ratio (`0.99`) or a percentage (`"99%"`, `"99.9 %"`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Target(pub f64);

impl Default for Target {
    fn default() -> Self {
        Target(0.99)
    }
}

impl<'de> Deserialize<'de> for Target {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            N(f64),
            S(String),
        }
        let bad = |s: &str| {
            serde::de::Error::custom(format!(
                "invalid target {s:?}: expected a ratio such as 0.99 or a percentage such as \"99%\""
            ))
        };
        match Raw::deserialize(d)? {
            Raw::N(n) => Ok(Target(n)),
            Raw::S(s) => {
                let t = s.trim();
                match t.strip_suffix('%') {
                    Some(p) => p.trim().parse::<f64>().map(|v| Target(v / 100.0)).map_err(|_| bad(&s)),
                    None => t.parse::<f64>().map(Target).map_err(|_| bad(&s)),
                }
            }
        }
    }
}

/// Which llm_signals source an objective counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// Span-derived signals (`source = spans`): exact per-request percentiles.
    #[default]
    Spans,
    /// Scrape-derived signals (`source = scrape`): from the server's histograms.
    Scrape,
    /// Both (each window of each source is an event).
    Any,
}

impl Source {
    /// Whether a point whose `source` attribute is `value` counts.
    pub fn accepts(self, value: Option<&str>) -> bool {
        match self {
            Source::Any => true,
            Source::Spans => value == Some("spans"),
            Source::Scrape => value == Some("scrape"),
        }
    }
}

/// One objective as declared.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ObjectiveConfig {
    /// Name (required, unique): the `slo` attribute of every output and alert.
    pub name: String,
    /// What is measured: an llm_signals gauge (`llm.ttft.p95`, `llm.tpot.p95`, `llm.e2e.p99`,
    /// `llm.queue.p99`, ... or the short forms `ttft_p95`, ...), `error_ratio` or `availability`.
    pub signal: String,
    /// Latency signals: the largest good value (`70ms`); `availability`: the largest error rate
    /// of a good window (default 0.05); `error_ratio`: not used.
    pub threshold: Threshold,
    /// Share of good events over `period` (default 99 %).
    pub target: Target,
    /// The compliance period (default 28d; whole hours, at most 90d).
    pub period: Span,
    /// spans (default), scrape or any: the source whose windows count as events.
    pub source: Source,
    /// The sources the breach forecast reads (default any: each source's series is forecast on
    /// its own, so nothing counts twice).
    pub forecast_source: Source,
    /// Only this model (`gen_ai.request.model`; empty: every model).
    pub model: String,
    /// Attributes whose values make one SLO group (default: the model).
    pub by: Vec<String>,
    /// Settings of the embedded `trend_forecast` (any of its keys but `metric` and `threshold`),
    /// or `false` to forecast nothing.
    pub forecast: Option<serde_json::Value>,
    /// Whether the burn-rate rules run and emit levels (default true).
    pub burn_rate_alerts: bool,
}

impl Default for ObjectiveConfig {
    fn default() -> Self {
        ObjectiveConfig {
            name: String::new(),
            signal: String::new(),
            threshold: Threshold(None),
            target: Target::default(),
            period: Span::days(28),
            source: Source::Spans,
            forecast_source: Source::Any,
            model: String::new(),
            by: vec!["gen_ai.request.model".into()],
            forecast: None,
            burn_rate_alerts: true,
        }
    }
}

/// How an objective turns input points into good / total events.
#[derive(Debug, Clone, PartialEq)]
pub enum Sli {
    /// Each window's point of `metric` is one event, good when its value ≤ `threshold`.
    Latency {
        /// The llm_signals gauge.
        metric: String,
        /// Largest good value, seconds.
        threshold: f64,
    },
    /// Requests: total = `llm.request.rate` × window length, bad = total × `llm.request.error_rate`.
    ErrorRatio,
    /// Each window with requests is one event, good when its `llm.request.error_rate` ≤ `threshold`.
    Availability {
        /// Largest error rate of a good window.
        threshold: f64,
    },
}

impl Sli {
    /// The metric whose points the embedded forecast reads, and its threshold.
    pub fn forecast_target(&self, target: f64) -> (String, f64) {
        match self {
            Sli::Latency { metric, threshold } => (metric.clone(), *threshold),
            Sli::ErrorRatio => (ERROR_RATE.into(), 1.0 - target),
            Sli::Availability { threshold } => (ERROR_RATE.into(), *threshold),
        }
    }

    /// The `slo.signal` attribute.
    pub fn signal_name(&self) -> &str {
        match self {
            Sli::Latency { metric, .. } => metric,
            Sli::ErrorRatio => "error_ratio",
            Sli::Availability { .. } => "availability",
        }
    }

    /// The `slo.threshold` attribute (NaN: none).
    pub fn threshold(&self) -> f64 {
        match self {
            Sli::Latency { threshold, .. } | Sli::Availability { threshold } => *threshold,
            Sli::ErrorRatio => f64::NAN,
        }
    }
}

/// llm_signals' window error rate.
pub const ERROR_RATE: &str = "llm.request.error_rate";
/// llm_signals' window request rate.
pub const REQUEST_RATE: &str = "llm.request.rate";

/// A checked objective.
#[derive(Debug, Clone)]
pub struct Objective {
    /// Its name.
    pub name: String,
    /// The event rule.
    pub sli: Sli,
    /// Target ratio, in (0, 1).
    pub target: f64,
    /// Period in whole hours.
    pub period_hours: u64,
    /// Source selection of the events.
    pub source: Source,
    /// Source selection of the forecast.
    pub forecast_source: Source,
    /// Model filter (empty: all).
    pub model: String,
    /// Group attributes.
    pub by: Vec<String>,
    /// The embedded forecast's settings (none: off).
    pub forecast: Option<crate::trend_forecast::config::Checked>,
    /// Burn-rate rules on.
    pub burn_rate_alerts: bool,
}

/// A checked configuration.
#[derive(Debug, Clone)]
pub struct Checked {
    /// The objectives, in declaration order.
    pub objectives: Vec<Objective>,
    /// Groups per objective.
    pub max_groups: usize,
    /// Allowed lateness, ns.
    pub lateness_ns: u64,
}

/// The canonical metric of a latency signal name (`tpot_p95` → `llm.tpot.p95`).
pub(super) fn latency_metric(signal: &str) -> Option<String> {
    let s = signal.trim();
    let dotted = if s.starts_with("llm.") { s.to_string() } else { format!("llm.{}", s.replace('_', ".")) };
    let parts: Vec<&str> = dotted.split('.').collect();
    let ok = parts.len() == 3
        && ["ttft", "tpot", "e2e", "queue"].contains(&parts[1])
        && ["p50", "p95", "p99"].contains(&parts[2]);
    ok.then_some(dotted)
}

fn at(i: usize, key: &str, message: impl Into<String>) -> FieldError {
    FieldError {
        path: vec![PathSeg::Key("objectives".into()), PathSeg::Index(i), PathSeg::Key(key.into())],
        message: message.into(),
    }
}

impl SloConfig {
    /// Checks the settings.
    pub fn check(&self) -> Result<Checked, FieldError> {
        if self.objectives.is_empty() && self.openslo.is_empty() {
            return Err(FieldError::at(
                "objectives",
                "declare at least one objective (name, signal, threshold, target), or OpenSLO files in openslo",
            ));
        }
        if self.max_groups == 0 {
            return Err(FieldError::at("max_groups", "must be at least 1"));
        }
        let mut out = Vec::with_capacity(self.objectives.len());
        for (i, o) in self.objectives.iter().enumerate() {
            out.push(o.check(i)?);
            if out[..out.len() - 1].iter().any(|p: &Objective| p.name == o.name) {
                return Err(at(i, "name", format!("duplicate objective name {:?}", o.name)));
            }
        }
        if !self.openslo.is_empty() {
            let more = openslo::objectives(&self.openslo, &out)?;
            out.extend(more);
        }
        Ok(Checked { objectives: out, max_groups: self.max_groups, lateness_ns: self.allowed_lateness.0 })
    }
}

impl ObjectiveConfig {
    /// Checks one objective; errors are at `objectives[i]`.
    pub(super) fn check(&self, i: usize) -> Result<Objective, FieldError> {
        let name = self.name.trim();
        if name.is_empty() {
            return Err(at(i, "name", "required: a name for the objective, e.g. tpot-p95"));
        }
        if !name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.:".contains(c)) {
            return Err(at(i, "name", "use letters, digits and - _ . : only"));
        }
        let t = self.target.0;
        if !(t > 0.0 && t < 1.0) {
            return Err(at(i, "target", format!("must be strictly between 0 and 1 (e.g. 0.99 or \"99%\"), got {t}")));
        }
        let sli = match self.signal.trim() {
            "" => return Err(at(i, "signal", "required: e.g. llm.tpot.p95, ttft_p95, error_ratio, availability")),
            "error_ratio" => {
                if self.threshold.0.is_some() {
                    return Err(at(i, "threshold", "error_ratio counts requests: its objective is the target alone"));
                }
                Sli::ErrorRatio
            }
            "availability" => {
                let th = self.threshold.0.unwrap_or(0.05);
                if !(0.0..1.0).contains(&th) {
                    return Err(at(i, "threshold", "availability: the largest error rate of a good window, in [0, 1)"));
                }
                Sli::Availability { threshold: th }
            }
            other => {
                let Some(metric) = latency_metric(other) else {
                    return Err(at(
                        i,
                        "signal",
                        format!(
                            "unknown signal {other:?}: expected llm.<ttft|tpot|e2e|queue>.<p50|p95|p99> (or ttft_p95 ...), \
                             error_ratio or availability"
                        ),
                    ));
                };
                let Some(th) = self.threshold.0 else {
                    return Err(at(i, "threshold", "required for a latency signal, e.g. 70ms"));
                };
                if !(th.is_finite() && th > 0.0) {
                    return Err(at(i, "threshold", "must be a positive duration"));
                }
                Sli::Latency { metric, threshold: th }
            }
        };
        let p = self.period.0;
        if p == 0 || !p.is_multiple_of(HOUR_NS) || p / HOUR_NS > MAX_PERIOD_HOURS {
            return Err(at(i, "period", "must be whole hours, from 1h to 90d (e.g. 28d)"));
        }
        if self.by.iter().any(|k| k.trim().is_empty()) {
            return Err(at(i, "by", "attribute names must not be empty"));
        }
        let forecast = match &self.forecast {
            Some(serde_json::Value::Bool(false)) => None,
            None | Some(serde_json::Value::Bool(true)) => {
                Some(self.forecast_config(&sli, i, &serde_json::json!({}))?)
            }
            Some(v @ serde_json::Value::Object(_)) => Some(self.forecast_config(&sli, i, v)?),
            Some(_) => return Err(at(i, "forecast", "expected trend_forecast settings (a map) or false")),
        };
        Ok(Objective {
            name: name.to_string(),
            sli,
            target: t,
            period_hours: p / HOUR_NS,
            source: self.source,
            forecast_source: self.forecast_source,
            model: self.model.trim().to_string(),
            by: self.by.clone(),
            forecast,
            burn_rate_alerts: self.burn_rate_alerts,
        })
    }

    fn forecast_config(
        &self,
        sli: &Sli,
        i: usize,
        settings: &serde_json::Value,
    ) -> Result<crate::trend_forecast::config::Checked, FieldError> {
        let prefix = |mut e: FieldError| {
            let mut path = vec![PathSeg::Key("objectives".into()), PathSeg::Index(i), PathSeg::Key("forecast".into())];
            path.append(&mut e.path);
            e.path = path;
            e
        };
        let mut v = settings.clone();
        if let Some(m) = v.as_object_mut() {
            for k in ["metric", "threshold"] {
                if m.contains_key(k) {
                    return Err(prefix(FieldError::at(
                        k,
                        "set by the objective (signal and threshold): remove it here",
                    )));
                }
            }
            let (metric, threshold) = sli.forecast_target(self.target.0);
            m.insert("metric".into(), metric.into());
            m.insert("threshold".into(), threshold.into());
            // The objective counts windows whose percentile is above the threshold: forecast the
            // hourly p95 of those windows, not their mean (issue 17, `eval --series`: 7 of 8 drifts
            // warned ≥ 14 d on the tuning family a against 6 of 8 with the mean; held-out b: 7 against 4).
            m.entry("statistic").or_insert_with(|| "p95".into());
        }
        let cfg: TrendForecastConfig = inferwatch_core::component::parse_config(&v).map_err(prefix)?;
        cfg.check().map_err(prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use inferwatch_core::component::parse_config;
    use serde_json::json;

    fn check(v: serde_json::Value) -> Result<Checked, FieldError> {
        parse_config::<SloConfig>(&v)?.check()
    }

    #[test]
    fn a_latency_objective_with_its_derived_forecast() {
        let c = check(json!({"objectives": [
            {"name": "tpot", "signal": "tpot_p95", "threshold": "70ms", "target": "99.5%", "period": "7d"}
        ]}))
        .unwrap();
        let o = &c.objectives[0];
        assert_eq!(o.sli, Sli::Latency { metric: "llm.tpot.p95".into(), threshold: 0.07 });
        assert!((o.target - 0.995).abs() < 1e-12);
        assert_eq!(o.period_hours, 168);
        assert_eq!(o.by, vec!["gen_ai.request.model".to_string()]);
        let f = o.forecast.as_ref().unwrap();
        assert_eq!((f.metric.as_str(), f.forecast.threshold), ("llm.tpot.p95", 0.07));
        let none = check(json!({"objectives": [{"name": "e", "signal": "error_ratio", "forecast": false}]})).unwrap();
        assert!(none.objectives[0].forecast.is_none());
        assert_eq!(none.objectives[0].sli, Sli::ErrorRatio);
    }

    #[test]
    fn errors_name_the_objective_and_key() {
        let path = |v| check(v).unwrap_err().path;
        let k =
            |i: usize, key: &str| vec![PathSeg::Key("objectives".into()), PathSeg::Index(i), PathSeg::Key(key.into())];
        assert_eq!(path(json!({"objectives": []})), vec![PathSeg::Key("objectives".into())]);
        assert_eq!(path(json!({"objectives": [{"name": "a", "signal": "tpot.p96", "threshold": 1}]})), k(0, "signal"));
        assert_eq!(path(json!({"objectives": [{"name": "a", "signal": "ttft_p95"}]})), k(0, "threshold"));
        assert_eq!(
            path(json!({"objectives": [{"name": "a", "signal": "error_ratio", "target": 1.0}]})),
            k(0, "target")
        );
        assert_eq!(
            path(json!({"objectives": [{"name": "a", "signal": "error_ratio", "period": "90m"}]})),
            k(0, "period")
        );
        assert_eq!(
            path(
                json!({"objectives": [{"name": "a", "signal": "error_ratio"}, {"name": "a", "signal": "availability"}]})
            ),
            k(1, "name")
        );
        let mut f = k(0, "forecast");
        f.push(PathSeg::Key("horizon".into()));
        assert_eq!(
            path(
                json!({"objectives": [{"name": "a", "signal": "e2e_p99", "threshold": "2s", "forecast": {"horizon": "3q"}}]})
            ),
            f
        );
        // A typo in a key is refused with its path.
        assert_eq!(
            path(json!({"objectives": [{"name": "a", "signal": "e2e_p99", "treshold": "2s"}]})),
            k(0, "treshold")
        );
    }
}

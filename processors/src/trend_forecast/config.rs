//! Settings of `trend_forecast` and their check into the units the processor uses.

use super::aggregate::Statistic;
use super::forecast;
use super::normal;
use super::season::Season;
use super::state;
use crate::detect::limits::{self, LimitDuration, SeriesLimits, with_series_limits};
use inferwatch_core::component::{FieldError, PathSeg};
use serde::{Deserialize, Deserializer};

const NS_PER_S: u64 = 1_000_000_000;
const DAY_NS: u64 = 86_400 * NS_PER_S;

/// Most aggregates a history may hold: each assessment is O(n²) in time and holds n(n−1)/2 slopes.
pub const MAX_HISTORY: u64 = 2048;

/// A duration: Go syntax (`90s`, `1h30m`) extended with days (`d`) and weeks (`w`), or an integer of ns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span(pub u64);

impl Span {
    /// `n` days.
    pub const fn days(n: u64) -> Self {
        Span(n * DAY_NS)
    }
}

/// Parses a duration such as `21d`, `1h`, `1d12h`, `0`; nanoseconds. The workspace's one
/// duration syntax: [`inferwatch_core::settings::parse_go_duration`] (Go's, plus `d` and `w`).
pub fn parse_span(s: &str) -> Result<u64, String> {
    // At most Go's limit (2^63 - 1 ns), so the nanoseconds fit in a u64.
    inferwatch_core::settings::parse_go_duration(s).map(|d| d.as_nanos() as u64).map_err(|e| e.to_string())
}

impl<'de> Deserialize<'de> for Span {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            S(String),
            N(u64),
        }
        match Raw::deserialize(d)? {
            Raw::S(s) => parse_span(&s).map(Span).map_err(serde::de::Error::custom),
            Raw::N(n) => Ok(Span(n)),
        }
    }
}

/// Which side of the threshold is a breach.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    /// The series breaches when it rises to the threshold or above.
    #[default]
    Above,
    /// The series breaches when it falls to the threshold or below.
    Below,
}

/// A seasonal component to remove.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Seasonality {
    /// Per aggregate of the day (hour of day with 1h aggregates), UTC.
    Daily,
    /// Per day of the week (an offset on top of the daily profile), UTC.
    Weekly,
}

/// Settings of `trend_forecast`.
#[derive(Debug, Clone, Deserialize)]
#[serde(remote = "Self", deny_unknown_fields, default)]
pub struct TrendForecastConfig {
    /// Name of the input metric (gauge or sum points; required).
    pub metric: String,
    /// The SLO threshold.
    pub threshold: f64,
    /// `above` (default) or `below`: which side of the threshold is a breach.
    pub direction: Direction,
    /// Forecasts within this are warnings, within a third of it critical (default 21d).
    pub horizon: Span,
    /// Aggregate (bucket) length, epoch-aligned, event time (default 1h).
    pub aggregate: Span,
    /// Statistic of a bucket's points: mean (default), max or p95.
    pub statistic: Statistic,
    /// How much rolling history the test uses (default 14d).
    pub history: Span,
    /// Most recent parts of the history also tested, so that a trend that started inside the history
    /// is not diluted by the flat part before it (default half and a quarter of `history`, those at
    /// least `min_history`; `[]` = off).
    pub recent: Option<Vec<Span>>,
    /// No output before the history holds this much (default 3d).
    pub min_history: Span,
    /// Significance level of the Mann-Kendall test (default 0.01).
    pub significance: f64,
    /// Significance the whole history's test must reach before a significant recent window may report
    /// (default 0.05; at least `significance`).
    pub history_significance: f64,
    /// Highest level before every configured season has two periods of history (default 0.5: below
    /// `warning`, so a new series raises no alert in its first two weeks unless already breached).
    pub provisional_cap: f64,
    /// Two-sided confidence of the slope's and the forecast's interval (default 0.9).
    pub confidence: f64,
    /// Seasons to remove once the history spans two periods (default daily, weekly).
    pub seasonality: Vec<Seasonality>,
    /// `max_series` (default 1000; beyond it the least recently seen 10 % are evicted),
    /// `idle_timeout` (default 2d: a series and its history are forgotten) and
    /// `allowed_lateness` (default 0s), top-level keys.
    #[serde(skip)]
    pub limits: SeriesLimits<Span>,
}

impl Default for TrendForecastConfig {
    fn default() -> Self {
        TrendForecastConfig {
            metric: String::new(),
            threshold: 0.8,
            direction: Direction::Above,
            horizon: Span::days(21),
            aggregate: Span(3600 * NS_PER_S),
            statistic: Statistic::Mean,
            history: Span::days(14),
            recent: None,
            min_history: Span::days(3),
            significance: 0.01,
            history_significance: 0.05,
            provisional_cap: 0.5,
            confidence: 0.9,
            seasonality: vec![Seasonality::Daily, Seasonality::Weekly],
            limits: SeriesLimits { max_series: 1000, idle_timeout: Span::days(2), allowed_lateness: Span(0) },
        }
    }
}

with_series_limits!(TrendForecastConfig, limits::ALL);

impl LimitDuration for Span {
    fn nanos(&self, _key: &str) -> Result<u64, FieldError> {
        Ok(self.0)
    }
}

/// A checked configuration.
#[derive(Debug, Clone)]
pub struct Checked {
    /// The input metric.
    pub metric: String,
    /// State parameters.
    pub state: state::Params,
    /// Test and forecast parameters.
    pub forecast: forecast::Params,
    /// Allowed lateness, ns.
    pub lateness_ns: u64,
}

impl TrendForecastConfig {
    /// Checks the settings.
    pub fn check(&self) -> Result<Checked, FieldError> {
        if self.metric.is_empty() {
            return Err(FieldError::at("metric", "required: the name of the metric to forecast"));
        }
        if !self.threshold.is_finite() {
            return Err(FieldError::at("threshold", "must be a finite number"));
        }
        let agg = self.aggregate.0;
        if agg == 0 {
            return Err(FieldError::at("aggregate", "must be greater than 0"));
        }
        if self.horizon.0 == 0 {
            return Err(FieldError::at("horizon", "must be greater than 0"));
        }
        let history = self.history.0 / agg;
        if !(3..=MAX_HISTORY).contains(&history) {
            return Err(FieldError::at(
                "history",
                format!(
                    "must hold between 3 and {MAX_HISTORY} aggregates (the test is quadratic in it), got {history}"
                ),
            ));
        }
        let min_points = self.min_history.0.div_ceil(agg).max(3);
        if min_points > history {
            return Err(FieldError::at("min_history", "must not be longer than history"));
        }
        let recent: Vec<u64> = match &self.recent {
            None => [history / 2, history / 4].into_iter().filter(|&s| s >= min_points).collect(),
            Some(list) => {
                let mut out = Vec::with_capacity(list.len());
                for (i, span) in list.iter().enumerate() {
                    let s = span.0 / agg;
                    if s < min_points || s >= history {
                        return Err(FieldError {
                            path: vec![PathSeg::Key("recent".into()), PathSeg::Index(i)],
                            message: "must be at least min_history and shorter than history".into(),
                        });
                    }
                    out.push(s);
                }
                out
            }
        };
        let mut recent = recent;
        recent.sort_unstable_by(|a, b| b.cmp(a));
        recent.dedup();
        if !(self.significance > 0.0 && self.significance <= 0.5) {
            return Err(FieldError::at("significance", "must be in (0, 0.5]"));
        }
        if !(self.history_significance >= self.significance && self.history_significance <= 0.5) {
            return Err(FieldError::at("history_significance", "must be in [significance, 0.5]"));
        }
        if !(0.0..=1.0).contains(&self.provisional_cap) {
            return Err(FieldError::at("provisional_cap", "must be in [0, 1]"));
        }
        let z_conf = normal::quantile(0.5 + self.confidence / 2.0)
            .filter(|_| self.confidence > 0.0 && self.confidence < 1.0)
            .ok_or_else(|| FieldError::at("confidence", "must be in (0, 1)"))?;
        let limits = self.limits.check()?;
        let mut seasons = Vec::new();
        for (i, s) in self.seasonality.iter().enumerate() {
            let at = |m: &str| FieldError {
                path: vec![PathSeg::Key("seasonality".into()), PathSeg::Index(i)],
                message: m.into(),
            };
            if !DAY_NS.is_multiple_of(agg) || DAY_NS / agg < 2 {
                return Err(at("needs an aggregate that divides a day into at least 2 parts"));
            }
            let per_day = DAY_NS / agg;
            let season = match s {
                Seasonality::Daily => Season { period: per_day, step: 1 },
                Seasonality::Weekly => Season { period: 7 * per_day, step: per_day },
            };
            if !seasons.contains(&season) {
                seasons.push(season);
            }
        }
        Ok(Checked {
            metric: self.metric.clone(),
            state: state::Params {
                aggregate_ns: agg,
                history,
                idle_ns: limits.idle_ns,
                max_series: limits.max_series,
                statistic: self.statistic,
            },
            forecast: forecast::Params {
                threshold: self.threshold,
                above: self.direction == Direction::Above,
                aggregate_s: agg as f64 / NS_PER_S as f64,
                horizon_s: self.horizon.0 as f64 / NS_PER_S as f64,
                long: history,
                recent,
                min_points: usize::try_from(min_points).unwrap_or(usize::MAX),
                significance: self.significance,
                history_significance: self.history_significance,
                provisional_cap: self.provisional_cap,
                z_conf,
                seasons,
            },
            lateness_ns: limits.lateness_ns,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use inferwatch_core::component::parse_config;
    use serde_json::json;

    #[test]
    fn spans_with_days_and_weeks() {
        assert_eq!(parse_span("21d"), Ok(21 * DAY_NS));
        assert_eq!(parse_span("1w1d"), Ok(8 * DAY_NS));
        assert_eq!(parse_span("1h30m"), Ok(5400 * NS_PER_S));
        assert_eq!(parse_span("0"), Ok(0));
        assert!(parse_span("3x").is_err() && parse_span("").is_err() && parse_span("d").is_err());
    }

    #[test]
    fn defaults_and_errors_name_their_key() {
        let c = parse_config::<TrendForecastConfig>(&json!({"metric": "kv"})).unwrap().check().unwrap();
        assert_eq!((c.forecast.long, c.forecast.recent.clone(), c.forecast.min_points), (336, vec![168, 84], 72));
        assert_eq!(c.forecast.seasons, vec![Season { period: 24, step: 1 }, Season { period: 168, step: 24 }]);
        assert_eq!(c.forecast.horizon_s, 21.0 * 86_400.0);
        let err = |v| parse_config::<TrendForecastConfig>(&v).and_then(|c| c.check()).unwrap_err();
        assert_eq!(err(json!({})).path, vec![PathSeg::Key("metric".into())]);
        assert_eq!(err(json!({"metric": "m", "bogus": 1})).path, vec![PathSeg::Key("bogus".into())]);
        assert_eq!(err(json!({"metric": "m", "horizon": "3q"})).path, vec![PathSeg::Key("horizon".into())]);
        assert_eq!(err(json!({"metric": "m", "significance": 0.0})).path, vec![PathSeg::Key("significance".into())]);
        assert_eq!(
            err(json!({"metric": "m", "aggregate": "7m", "history": "7d", "seasonality": ["daily"]})).path,
            vec![PathSeg::Key("seasonality".into()), PathSeg::Index(0)]
        );
        assert_eq!(err(json!({"metric": "m", "aggregate": "1m"})).path, vec![PathSeg::Key("history".into())]);
        assert_eq!(err(json!({"metric": "m", "min_history": "20d"})).path, vec![PathSeg::Key("min_history".into())]);
        assert_eq!(err(json!({"metric": "m", "statistic": "p42"})).path, vec![PathSeg::Key("statistic".into())]);
    }
}

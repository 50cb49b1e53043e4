//! Scraped vLLM / SGLang / TGI metrics → typed samples (as the `prometheus` receiver produces them).
//!
//! Names keep vLLM's and SGLang's colons; a counter is accepted with or without its `_total`
//! suffix. Which reading a server gets follows from the families its exposition contains (see
//! `tests/fixtures/servers/README.md`): vLLM ≥ 0.11 exposes `request_time_per_output_token_seconds`
//! (per-request TPOT) and `inter_token_latency_seconds` (ITL), vLLM ≤ 0.10 and V0 only
//! `time_per_output_token_seconds` (per-step intervals despite the name: read as ITL, and as TPOT
//! when no per-request TPOT is in the window, see [`Role::LatencyFallback`]); V0 has
//! `gpu_cache_usage_perc` instead of `kv_cache_usage_perc`. The bench's OTLP histograms
//! `inferwatch.bench.tle_bits` / `inferwatch.bench.rci` are quality signals ([`Role::Quality`]),
//! their model the point attribute `gen_ai.request.model`. Gauges
//! may be gauges or sums; counters must be cumulative sums; histograms cumulative classic
//! histograms. Anything else (other names, kinds or temporalities) is skipped.

use super::hist::Lat;
use super::model::{MODEL_ATTRIBUTE, VERSION_LABELS, column, opt_column};
use super::quality::{Qual, RCI_NAME, TLE_NAME};
use arrow_array::{
    Array, Float64Array, Int32Array, ListArray, MapArray, RecordBatch, StringArray, TimestampNanosecondArray,
    UInt8Array, UInt64Array,
};
use inferwatch_core::arrow::anyvalue::AttributesReader;
use inferwatch_core::arrow::{ConvError, schema};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use serde::{Deserialize, Serialize};

/// OTLP aggregation temporality CUMULATIVE.
const CUMULATIVE: i32 = 2;
/// The scrape label naming the model (vLLM).
pub const MODEL_LABEL: &str = "model_name";

/// A gauge signal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum GaugeRole {
    /// KV-cache usage fraction.
    KvUsage,
    /// Requests waiting.
    Waiting,
    /// Requests running.
    Running,
    /// A prefix-cache hit-rate gauge (SGLang `cache_hit_rate`, vLLM V0 `gpu_prefix_cache_hit_rate`):
    /// used when the hit and query counters are absent; negative values (V0: caching off) are skipped.
    PrefixHitRate,
    /// A deprecated KV-cache usage name (`vllm:gpu_cache_usage_perc`): used when the group's window
    /// has no [`GaugeRole::KvUsage`].
    KvUsageLegacy,
}

/// A signal computed as a rate of increase.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum RateRole {
    /// Preemptions.
    Preemptions,
    /// Prefix-cache queried tokens.
    PrefixQueries,
    /// Prefix-cache hit tokens.
    PrefixHits,
    /// Output (generated) tokens.
    OutputTokens,
    /// Input (prompt) tokens.
    InputTokens,
    /// Requests finished successfully.
    RequestsOk,
    /// Requests failed or aborted.
    RequestsErr,
    /// Every request, failed ones included (SGLang `num_requests_total`): when present, the
    /// request rate and the error rate's denominator.
    RequestsAll,
    /// Requests finished with another outcome, neither ok nor failed (vLLM `finished_reason`
    /// `repetition`, or one this table does not know): counted as requests, not as errors.
    RequestsOther,
}

/// What a recognised scraped series measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Role {
    /// A gauge: its last value per window.
    Gauge(GaugeRole),
    /// A cumulative counter: rate of its increases.
    Counter(RateRole),
    /// A cumulative latency histogram: quantiles of its window delta.
    Latency(Lat),
    /// A latency histogram read for its signal only when no [`Role::Latency`] histogram of the
    /// same signal is in the group's window (vLLM ≤ 0.10's per-token `time_per_output_token_seconds`
    /// as TPOT); a TPOT fallback is also the group's ITL (see [`Role::targets`]).
    LatencyFallback(Lat),
    /// A cumulative histogram of a quality signal (the bench's TLE and RCI).
    Quality(Qual),
    /// A cumulative histogram whose sum's rate is the signal (TGI token histograms).
    HistSum(RateRole),
}

/// Gauges: exposed name → role.
pub const GAUGES: &[(&str, GaugeRole)] = &[
    ("vllm:kv_cache_usage_perc", GaugeRole::KvUsage),
    ("vllm:gpu_cache_usage_perc", GaugeRole::KvUsageLegacy),
    ("vllm:num_requests_waiting", GaugeRole::Waiting),
    ("vllm:num_requests_running", GaugeRole::Running),
    ("vllm:gpu_prefix_cache_hit_rate", GaugeRole::PrefixHitRate),
    ("sglang:token_usage", GaugeRole::KvUsage),
    ("sglang:num_queue_reqs", GaugeRole::Waiting),
    ("sglang:num_running_reqs", GaugeRole::Running),
    ("sglang:cache_hit_rate", GaugeRole::PrefixHitRate),
    ("tgi_queue_size", GaugeRole::Waiting),
    ("tgi_batch_current_size", GaugeRole::Running),
];

/// Counters: registered name (the `_total` suffix is optional) → role. `vllm:request_success`
/// becomes [`RateRole::RequestsErr`] when its `finished_reason` is `abort` or `error`, and
/// [`RateRole::RequestsOther`] for any reason but `stop` and `length` (`repetition`).
pub const COUNTERS: &[(&str, RateRole)] = &[
    ("vllm:num_preemptions", RateRole::Preemptions),
    ("vllm:prefix_cache_queries", RateRole::PrefixQueries),
    ("vllm:gpu_prefix_cache_queries", RateRole::PrefixQueries),
    ("vllm:prefix_cache_hits", RateRole::PrefixHits),
    ("vllm:gpu_prefix_cache_hits", RateRole::PrefixHits),
    ("vllm:generation_tokens", RateRole::OutputTokens),
    ("vllm:prompt_tokens", RateRole::InputTokens),
    ("vllm:request_success", RateRole::RequestsOk),
    ("sglang:prompt_tokens", RateRole::InputTokens),
    ("sglang:generation_tokens", RateRole::OutputTokens),
    ("sglang:num_requests", RateRole::RequestsAll),
    ("sglang:num_aborted_requests", RateRole::RequestsErr),
    ("sglang:num_retracted_requests", RateRole::Preemptions),
    ("tgi_request_success", RateRole::RequestsOk),
    ("tgi_request_failure", RateRole::RequestsErr),
];

/// Histograms: name → role.
pub const HISTOGRAMS: &[(&str, Role)] = &[
    ("vllm:time_to_first_token_seconds", Role::Latency(Lat::Ttft)),
    ("vllm:request_time_per_output_token_seconds", Role::Latency(Lat::Tpot)),
    ("vllm:e2e_request_latency_seconds", Role::Latency(Lat::E2e)),
    ("vllm:request_queue_time_seconds", Role::Latency(Lat::Queue)),
    ("vllm:time_per_output_token_seconds", Role::LatencyFallback(Lat::Tpot)),
    ("vllm:inter_token_latency_seconds", Role::Latency(Lat::Itl)),
    ("sglang:inter_token_latency_seconds", Role::Latency(Lat::Itl)),
    ("sglang:time_to_first_token_seconds", Role::Latency(Lat::Ttft)),
    ("sglang:request_time_per_output_token_seconds", Role::Latency(Lat::Tpot)),
    ("sglang:e2e_request_latency_seconds", Role::Latency(Lat::E2e)),
    ("sglang:queue_time_seconds", Role::Latency(Lat::Queue)),
    ("tgi_request_duration", Role::Latency(Lat::E2e)),
    ("tgi_request_queue_duration", Role::Latency(Lat::Queue)),
    ("tgi_request_mean_time_per_token_duration", Role::Latency(Lat::Tpot)),
    ("tgi_request_generated_tokens", Role::HistSum(RateRole::OutputTokens)),
    ("tgi_request_input_length", Role::HistSum(RateRole::InputTokens)),
    (TLE_NAME, Role::Quality(Qual::Tle)),
    (RCI_NAME, Role::Quality(Qual::Rci)),
];

impl Role {
    /// The latency signals a histogram of this role feeds, each with whether it is a fallback
    /// there: a TPOT fallback (`vllm:time_per_output_token_seconds`, per decode step) is the
    /// group's ITL too, as a signal of its own.
    pub fn targets(self) -> Vec<(Lat, bool)> {
        match self {
            Role::Latency(l) => vec![(l, false)],
            Role::LatencyFallback(Lat::Tpot) => vec![(Lat::Tpot, true), (Lat::Itl, false)],
            Role::LatencyFallback(l) => vec![(l, true)],
            _ => Vec::new(),
        }
    }
}

/// The role of a metric name, if recognised.
pub fn role_of(name: &str) -> Option<Role> {
    if let Some((_, r)) = GAUGES.iter().find(|(n, _)| *n == name) {
        return Some(Role::Gauge(*r));
    }
    if let Some((_, r)) = HISTOGRAMS.iter().find(|(n, _)| *n == name) {
        return Some(*r);
    }
    let base = name.strip_suffix("_total").unwrap_or(name);
    COUNTERS.iter().find(|(n, _)| *n == base).map(|(_, r)| Role::Counter(*r))
}

/// One histogram point: bounds, per-bucket counts (`bounds.len() + 1`), count and sum.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HistPoint {
    /// Explicit bounds, strictly increasing.
    pub bounds: Vec<f64>,
    /// Per-bucket counts.
    pub counts: Vec<u64>,
    /// Count.
    pub count: u64,
    /// Sum (0 when unset).
    pub sum: f64,
}

impl HistPoint {
    /// Whether the shape is one a histogram can have.
    pub fn is_valid(&self) -> bool {
        self.counts.len() == self.bounds.len() + 1
            && self.bounds.iter().all(|b| b.is_finite())
            && self.bounds.windows(2).all(|w| w[0] < w[1])
    }
}

/// The value of a sample.
#[derive(Debug, Clone, PartialEq)]
pub enum SampleValue {
    /// A gauge or counter value.
    Number(f64),
    /// A histogram.
    Hist(HistPoint),
}

/// One recognised scraped point.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// What it measures.
    pub role: Role,
    /// Its series id.
    pub series: u64,
    /// Event time, ns.
    pub time: u64,
    /// Start time, ns (0 when unknown).
    pub start: u64,
    /// Its value.
    pub value: SampleValue,
}

/// One recognised scraped row: the sample and what its labels say about its group.
#[derive(Debug, Clone, PartialEq)]
pub struct Scraped {
    /// The sample.
    pub sample: Sample,
    /// Whether it is TGI's (a `tgi_*` metric).
    pub tgi: bool,
    /// Its `model_name` label, else its `gen_ai.request.model` attribute (OTLP pushes such as
    /// the bench's), when non-empty.
    pub model: Option<String>,
    /// Its version label (the first non-empty of [`VERSION_LABELS`]).
    pub version: Option<String>,
}

/// Reads samples of one metrics batch.
pub struct ScrapeReader<'a> {
    names: &'a StringArray,
    kinds: &'a UInt8Array,
    temporality: Option<&'a Int32Array>,
    times: &'a TimestampNanosecondArray,
    starts: Option<&'a TimestampNanosecondArray>,
    series: &'a UInt64Array,
    values: Option<&'a Float64Array>,
    counts: Option<&'a UInt64Array>,
    sums: Option<&'a Float64Array>,
    buckets: Option<&'a ListArray>,
    bounds: Option<&'a ListArray>,
    attrs: Option<AttributesReader<'a>>,
}

fn list_values<T: 'static + Array + Clone>(l: Option<&ListArray>, row: usize) -> Option<T> {
    let l = l.filter(|l| row < l.len() && l.is_valid(row))?;
    l.value(row).as_any().downcast_ref::<T>().cloned()
}

impl<'a> ScrapeReader<'a> {
    /// A reader over a metrics batch.
    pub fn new(batch: &'a RecordBatch) -> Result<Self, ConvError> {
        Ok(ScrapeReader {
            names: column(batch, schema::METRIC_NAME)?,
            kinds: column(batch, schema::KIND)?,
            temporality: opt_column(batch, schema::TEMPORALITY)?,
            times: column(batch, schema::TIME)?,
            starts: opt_column(batch, schema::START_TIME)?,
            series: column(batch, schema::SERIES_ID)?,
            values: opt_column(batch, schema::VALUE)?,
            counts: opt_column(batch, schema::COUNT)?,
            sums: opt_column(batch, schema::SUM)?,
            buckets: opt_column(batch, schema::BUCKET_COUNTS)?,
            bounds: opt_column(batch, schema::EXPLICIT_BOUNDS)?,
            attrs: opt_column::<MapArray>(batch, schema::ATTRIBUTES)?.map(AttributesReader::new).transpose()?,
        })
    }

    fn cumulative(&self, row: usize) -> bool {
        self.temporality.is_some_and(|t| t.is_valid(row) && t.value(row) == CUMULATIVE)
    }

    fn number(&self, row: usize) -> Option<f64> {
        self.values.filter(|v| v.is_valid(row)).map(|v| v.value(row)).filter(|v| v.is_finite())
    }

    fn histogram(&self, row: usize) -> Option<HistPoint> {
        let counts = list_values::<UInt64Array>(self.buckets, row)?;
        let bounds = list_values::<Float64Array>(self.bounds, row)?;
        let h = HistPoint {
            bounds: bounds.iter().map(|b| b.unwrap_or(f64::NAN)).collect(),
            counts: counts.iter().map(|c| c.unwrap_or(0)).collect(),
            count: self.counts.filter(|c| c.is_valid(row)).map_or(0, |c| c.value(row)),
            sum: self.sums.filter(|s| s.is_valid(row)).map(|s| s.value(row)).filter(|s| s.is_finite()).unwrap_or(0.0),
        };
        h.is_valid().then_some(h)
    }

    /// The recognised sample at `row` with what its labels say; `None` when the row is not a
    /// recognised metric of the expected kind.
    pub fn read(&self, row: usize) -> Result<Option<Scraped>, ConvError> {
        let name = self.names.value(row);
        let Some(mut role) = role_of(name) else { return Ok(None) };
        let kind = self.kinds.value(row);
        let value = match role {
            Role::Gauge(_) if kind == schema::kind::GAUGE || kind == schema::kind::SUM => {
                self.number(row).map(SampleValue::Number)
            }
            Role::Counter(_) if kind == schema::kind::SUM && self.cumulative(row) => {
                self.number(row).filter(|v| *v >= 0.0).map(SampleValue::Number)
            }
            Role::Latency(_) | Role::LatencyFallback(_) | Role::HistSum(_) | Role::Quality(_)
                if kind == schema::kind::HISTOGRAM && self.cumulative(row) =>
            {
                self.histogram(row).map(SampleValue::Hist)
            }
            _ => None,
        };
        let Some(value) = value else { return Ok(None) };
        let attrs = match &self.attrs {
            Some(a) => a.read(row)?,
            None => Vec::new(),
        };
        let label = |key: &str| {
            attrs.iter().find(|kv| kv.key == key).and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
                Value::StringValue(s) => Some(s.clone()),
                _ => None,
            })
        };
        if role == Role::Counter(RateRole::RequestsOk) && name.starts_with("vllm:") {
            role = Role::Counter(match label("finished_reason").as_deref() {
                Some("abort" | "error") => RateRole::RequestsErr,
                Some("stop" | "length") | None => RateRole::RequestsOk,
                Some(_) => RateRole::RequestsOther,
            });
        }
        let time = self.times.value(row) as u64;
        let start = self.starts.filter(|s| s.is_valid(row)).map_or(0, |s| s.value(row) as u64);
        let sample = Sample { role, series: self.series.value(row), time, start, value };
        Ok(Some(Scraped {
            sample,
            tgi: name.starts_with("tgi_"),
            model: label(MODEL_LABEL)
                .filter(|m| !m.is_empty())
                .or_else(|| label(MODEL_ATTRIBUTE).filter(|m| !m.is_empty())),
            version: VERSION_LABELS.iter().find_map(|k| label(k).filter(|v| !v.is_empty())),
        }))
    }
}

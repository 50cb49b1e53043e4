//! Connector `llm_signals`: LLM golden signals from request spans (traces → metrics) and from
//! scraped vLLM / SGLang / TGI metrics (metrics → metrics), per (model, version, instance).
//!
//! An Arrow processor run as a connector by [`inferwatch_core::arrow::stage::build_connector`]:
//! it reads the spans or metrics schema and emits only its derived metrics. Windows are
//! event-time, tumbling and epoch-aligned, and close on the watermark; nothing reads the wall
//! clock. Names, units, inputs and the model resolution order: docs/llm-signals.md.

pub mod hist;
pub mod input;
pub mod model;
pub mod output;
pub mod quality;
pub mod scraped;
pub mod spans;
pub mod state;

use crate::detect::adapter::Adapter;
use crate::detect::config::nanos;
use crate::detect::limits::{self, SeriesLimits, with_series_limits};
use crate::detect::sketch;
use arrow_array::RecordBatch;
use inferwatch_core::arrow::{ArrowProcessor, ArrowProcessorFactory, ConvError, Needs, metrics, schema};
use inferwatch_core::component::{ComponentError, ConnectorFactory, CreateContext, FieldError, NodeRef, parse_config};
use inferwatch_core::consumer::ConsumerRef;
use inferwatch_core::pdata::Signal;
use inferwatch_core::settings::GoDuration;
use inferwatch_core::state::StateError;
use model::{ModelRules, ResourceReader, Source};
use output::Emitter;
use serde::Deserialize;
use state::{Params, Skip, State};
use std::time::Duration;

/// Most `input_buckets` bounds (each adds one series per group and metric).
pub const MAX_INPUT_BUCKETS: usize = 16;

/// Version of the checkpoint format written by [`LlmSignals`] (2: group keys hold identity
/// attributes; 3: and `service.name`; 4: scrape windows hold histogram sums; 5: the detector kit's
/// series map envelope; 6: windows hold quality signals; 7: span windows hold the prompt-length
/// buckets, the header `input_buckets`).
pub const STATE_VERSION: u32 = 7;

/// Default `identity_attributes`: the pod identity `resourcedetection` / `k8s_attributes` set.
pub const DEFAULT_IDENTITY: [&str; 3] = ["k8s.namespace.name", "k8s.pod.name", "k8s.node.name"];

/// Output point attributes an identity attribute must not replace.
const RESERVED: [&str; 7] = [
    "gen_ai.request.model",
    "service.name",
    "service.version",
    "service.instance.id",
    "source",
    "gen_ai.request.id",
    input::INPUT_BUCKET_ATTRIBUTE,
];

/// Settings of `llm_signals`.
#[derive(Debug, Clone, Deserialize)]
#[serde(remote = "Self", deny_unknown_fields, default)]
pub struct LlmSignalsConfig {
    /// Window of the percentiles and rates (default 1m; > 0); tumbling, epoch-aligned, event time.
    pub window: GoDuration,
    /// Interval of event time between emissions of the cumulative histograms (default 15s; > 0).
    pub flush_interval: GoDuration,
    /// `allowed_lateness` (default 5s), `max_series` (most (model, version, instance) groups held,
    /// default 1000; beyond it the least recently seen 10 % are evicted) and `idle_timeout` (event
    /// time without input after which a group is forgotten, default 10m), top-level keys.
    #[serde(skip)]
    pub limits: SeriesLimits,
    /// DDSketch relative accuracy α of the span-derived percentiles (default 0.01).
    pub relative_accuracy: f64,
    /// Model when nothing else names one (default empty: fall back to service.name, then "unknown").
    pub default_model: String,
    /// Span attributes naming the model, tried in order (default gen_ai.response.model, gen_ai.request.model).
    pub model_attributes: Vec<String>,
    /// Model of TGI data carrying none (default empty).
    pub tgi_model: String,
    /// Also emit one gauge point per request span and latency (`llm.request.ttft` …, default false).
    pub per_request: bool,
    /// Resource attributes of the input copied onto every output point and part of its group
    /// (default k8s.namespace.name, k8s.pod.name, k8s.node.name; at most 16).
    pub identity_attributes: Vec<String>,
    /// Prompt-length bucket bounds in tokens, upper-exclusive, of the span-derived
    /// `llm.*.by_input.*` split (default 1024, 4096, 8192; strictly increasing, > 0; empty: no split).
    pub input_buckets: Vec<u64>,
    /// TTFTs each of the two buckets of `llm.ttft.long_short` needs in a window (default 5; ≥ 1).
    pub input_ratio_min_requests: u64,
}

impl Default for LlmSignalsConfig {
    fn default() -> Self {
        LlmSignalsConfig {
            window: GoDuration(Duration::from_secs(60)),
            flush_interval: GoDuration(Duration::from_secs(15)),
            limits: SeriesLimits {
                max_series: 1000,
                idle_timeout: GoDuration(Duration::from_secs(600)),
                allowed_lateness: GoDuration(Duration::from_secs(5)),
            },
            relative_accuracy: sketch::DEFAULT_ALPHA,
            default_model: String::new(),
            model_attributes: vec!["gen_ai.response.model".into(), "gen_ai.request.model".into()],
            tgi_model: String::new(),
            per_request: false,
            identity_attributes: DEFAULT_IDENTITY.map(String::from).to_vec(),
            input_buckets: input::DEFAULT_INPUT_BUCKETS.to_vec(),
            input_ratio_min_requests: input::DEFAULT_RATIO_MIN_REQUESTS,
        }
    }
}

with_series_limits!(LlmSignalsConfig, limits::ALL);

/// A checked configuration in the units the processor uses.
#[derive(Debug, Clone)]
struct Checked {
    params: Params,
    lateness_ns: u64,
    rules: ModelRules,
    per_request: bool,
    split: std::sync::Arc<input::InputSplit>,
}

impl LlmSignalsConfig {
    fn check(&self) -> Result<Checked, FieldError> {
        let window_ns = nanos("window", &self.window)?;
        if window_ns == 0 {
            return Err(FieldError::at("window", "must be greater than 0"));
        }
        let flush_ns = nanos("flush_interval", &self.flush_interval)?;
        if flush_ns == 0 {
            return Err(FieldError::at("flush_interval", "must be greater than 0"));
        }
        let limits = self.limits.check()?;
        let alpha = self.relative_accuracy;
        if !(alpha.is_finite() && (sketch::MIN_ALPHA..1.0).contains(&alpha)) {
            return Err(FieldError::at(
                "relative_accuracy",
                format!("must be between {} and 1 (exclusive), got {alpha}", sketch::MIN_ALPHA),
            ));
        }
        if let Some(i) = self.model_attributes.iter().position(String::is_empty) {
            return Err(FieldError {
                path: vec![
                    inferwatch_core::component::PathSeg::Key("model_attributes".into()),
                    inferwatch_core::component::PathSeg::Index(i),
                ],
                message: "attribute names must not be empty".into(),
            });
        }
        if self.identity_attributes.len() > 16 {
            return Err(FieldError::at("identity_attributes", "at most 16 attributes"));
        }
        for (i, k) in self.identity_attributes.iter().enumerate() {
            let problem = if k.is_empty() {
                Some("attribute names must not be empty".to_string())
            } else if RESERVED.contains(&k.as_str()) {
                Some(format!("{k:?} is an attribute llm_signals sets itself"))
            } else if self.identity_attributes[..i].contains(k) {
                Some(format!("{k:?} is listed twice"))
            } else {
                None
            };
            if let Some(message) = problem {
                return Err(FieldError {
                    path: vec![
                        inferwatch_core::component::PathSeg::Key("identity_attributes".into()),
                        inferwatch_core::component::PathSeg::Index(i),
                    ],
                    message,
                });
            }
        }
        if self.input_buckets.len() > MAX_INPUT_BUCKETS {
            return Err(FieldError::at(
                "input_buckets",
                format!(
                    "at most {MAX_INPUT_BUCKETS} bounds (one series each per group), got {}",
                    self.input_buckets.len()
                ),
            ));
        }
        for (i, b) in self.input_buckets.iter().enumerate() {
            let problem = if *b == 0 {
                Some("bounds must be greater than 0".to_string())
            } else if i > 0 && *b <= self.input_buckets[i - 1] {
                Some(format!("bounds must be strictly increasing: {b} after {}", self.input_buckets[i - 1]))
            } else {
                None
            };
            if let Some(message) = problem {
                return Err(FieldError {
                    path: vec![
                        inferwatch_core::component::PathSeg::Key("input_buckets".into()),
                        inferwatch_core::component::PathSeg::Index(i),
                    ],
                    message,
                });
            }
        }
        if self.input_ratio_min_requests == 0 {
            return Err(FieldError::at("input_ratio_min_requests", "must be at least 1"));
        }
        Ok(Checked {
            params: Params { window_ns, flush_ns, idle_ns: limits.idle_ns, max_series: limits.max_series, alpha },
            lateness_ns: limits.lateness_ns,
            rules: ModelRules {
                attributes: self.model_attributes.clone(),
                default_model: self.default_model.clone(),
                tgi_model: self.tgi_model.clone(),
                identity: self.identity_attributes.clone(),
            },
            per_request: self.per_request,
            split: std::sync::Arc::new(input::InputSplit::new(&self.input_buckets, self.input_ratio_min_requests)),
        })
    }
}

/// Factory of `llm_signals`.
pub struct LlmSignalsFactory;

impl ConnectorFactory for LlmSignalsFactory {
    fn type_name(&self) -> &'static str {
        "llm_signals"
    }
    fn signal_pairs(&self) -> &'static [(Signal, Signal)] {
        &[(Signal::Traces, Signal::Metrics), (Signal::Metrics, Signal::Metrics)]
    }
    fn parse(&self, cfg: &serde_json::Value) -> Result<inferwatch_core::component::Parsed, FieldError> {
        self.parse_arrow(cfg)
    }
    fn build(
        &self,
        ctx: CreateContext,
        parsed: &inferwatch_core::component::Parsed,
        from: Signal,
        to: Signal,
        next: ConsumerRef,
    ) -> Result<NodeRef, ComponentError> {
        if !self.signal_pairs().contains(&(from, to)) {
            return Err(ComponentError::Start(format!("llm_signals cannot connect {from} to {to}")));
        }
        inferwatch_core::arrow::stage::build_connector_parsed(ctx, self, parsed, from, to, next)
    }
}

impl ArrowProcessorFactory for LlmSignalsFactory {
    fn parse_arrow(&self, cfg: &serde_json::Value) -> Result<inferwatch_core::component::Parsed, FieldError> {
        Ok(std::sync::Arc::new(parse_config::<LlmSignalsConfig>(cfg)?.check()?))
    }
    fn build_arrow(
        &self,
        ctx: CreateContext,
        parsed: &inferwatch_core::component::Parsed,
        signal: Signal,
    ) -> Result<Box<dyn ArrowProcessor>, ComponentError> {
        if signal == Signal::Logs {
            return Err(ComponentError::Start("llm_signals reads traces or metrics, not logs".into()));
        }
        let checked = inferwatch_core::component::typed::<Checked>(parsed)?.clone();
        Ok(Box::new(LlmSignals::new(checked, signal, &ctx)))
    }
}

/// The running processor (one per connector input signal).
pub struct LlmSignals {
    cfg: Checked,
    signal: Signal,
    state: State,
    kit: Adapter,
}

/// Resource and scope columns every input row's group is read from.
const RESOURCE_COLUMNS: [&str; 5] = [
    schema::RESOURCE_INDEX,
    schema::SERVICE_NAME,
    schema::SERVICE_VERSION,
    schema::SERVICE_INSTANCE_ID,
    schema::RESOURCE_ATTRIBUTES,
];

impl LlmSignals {
    fn new(cfg: Checked, signal: Signal, ctx: &CreateContext) -> Self {
        LlmSignals {
            state: State::new(cfg.params, cfg.split.clone()),
            cfg,
            signal,
            kit: Adapter::new(ctx, "llm_signals"),
        }
    }

    fn count(&self, results: impl Iterator<Item = Result<usize, Skip>>) {
        let (mut evicted, mut late) = (0usize, 0u64);
        for r in results {
            match r {
                Ok(n) => evicted += n,
                Err(Skip::SeriesFull) => evicted += 1,
                Err(Skip::Late) => late += 1,
            }
        }
        // Groups at max_series and scraped series at their per-group limit.
        self.kit.evicted_max(evicted);
        if late > 0 {
            tracing::debug!(connector = %self.kit.name(), late, "input before the watermark ignored");
        }
    }

    fn process_spans(&mut self, batch: &RecordBatch, out: &mut Vec<RecordBatch>) -> Result<(), ConvError> {
        let reader = spans::SpanReader::new(batch)?.with_request_ids(self.cfg.per_request);
        let mut resources = ResourceReader::new(batch, &self.cfg.rules.identity)?;
        let times = inferwatch_core::arrow::time_column(batch)?;
        let mut results = Vec::new();
        let mut per_request = Emitter::default();
        for row in 0..batch.num_rows() {
            // The column holds the OTLP fixed64 bit pattern.
            let time = times.value(row) as u64;
            if time < self.state.watermark() {
                results.push(Err(Skip::Late));
                continue;
            }
            let Some((flavor, req, own)) = reader.read(row, &self.cfg.rules.attributes)? else { continue };
            let res = resources.info(row)?;
            let key = self.cfg.rules.key(Source::Spans, own.as_deref(), None, flavor == spans::Flavor::Tgi, &res);
            if self.cfg.per_request {
                output::push_request(&mut per_request, &key, time, &req);
            }
            results.push(self.state.add_request(key, time, &req));
        }
        self.count(results.into_iter());
        if let Some(req) = per_request.finish() {
            out.push(metrics::to_batch(&req)?);
        }
        Ok(())
    }

    fn process_scraped(&mut self, batch: &RecordBatch) -> Result<(), ConvError> {
        let reader = scraped::ScrapeReader::new(batch)?;
        let mut resources = ResourceReader::new(batch, &self.cfg.rules.identity)?;
        let mut results = Vec::new();
        for row in 0..batch.num_rows() {
            let Some(s) = reader.read(row)? else { continue };
            if s.sample.time < self.state.watermark() {
                results.push(Err(Skip::Late));
                continue;
            }
            let res = resources.info(row)?;
            let key = self.cfg.rules.key(Source::Scrape, s.model.as_deref(), s.version.as_deref(), s.tgi, &res);
            results.push(self.state.add_sample(key, s.sample));
        }
        self.count(results.into_iter());
        Ok(())
    }
}

impl ArrowProcessor for LlmSignals {
    fn needs(&self) -> Needs {
        let mut columns: Vec<&'static str> = RESOURCE_COLUMNS.to_vec();
        columns.extend([schema::TIME, schema::ATTRIBUTES]);
        match self.signal {
            Signal::Traces => {
                columns.extend([schema::NAME, schema::STATUS_CODE, schema::DURATION]);
                columns.extend(schema::PROMOTED_SPAN_ATTRIBUTES.iter().map(|(k, _)| *k));
            }
            _ => columns.extend([
                schema::METRIC_NAME,
                schema::KIND,
                schema::TEMPORALITY,
                schema::START_TIME,
                schema::SERIES_ID,
                schema::VALUE,
                schema::COUNT,
                schema::SUM,
                schema::BUCKET_COUNTS,
                schema::EXPLICIT_BOUNDS,
            ]),
        }
        Needs { signal: self.signal, columns }
    }

    fn allowed_lateness_ns(&self) -> u64 {
        self.cfg.lateness_ns
    }

    fn process(&mut self, batch: &RecordBatch, out: &mut Vec<RecordBatch>) -> Result<(), ConvError> {
        match (schema::signal_of(batch.schema_ref()), self.signal) {
            (Some(Signal::Traces), Signal::Traces) => self.process_spans(batch, out),
            (Some(Signal::Metrics), Signal::Metrics) => self.process_scraped(batch),
            _ => Ok(()),
        }
    }

    fn advance(&mut self, watermark_ns: u64, out: &mut Vec<RecordBatch>) -> Result<(), ConvError> {
        let mut em = Emitter::default();
        let idle = self.state.advance(watermark_ns, &mut em);
        self.kit.evicted_idle(idle);
        if let Some(req) = em.finish() {
            out.push(metrics::to_batch(&req)?);
        }
        Ok(())
    }

    fn state_version(&self) -> u32 {
        STATE_VERSION
    }

    fn snapshot(&self) -> Result<Vec<u8>, StateError> {
        self.kit.snapshot(self.state.snapshot())
    }

    fn restore(&mut self, bytes: &[u8]) -> Result<(), StateError> {
        self.state = self.kit.restore(State::new(self.cfg.params, self.cfg.split.clone()), bytes, State::restore)?;
        Ok(())
    }

    fn series_count(&self) -> usize {
        self.state.series_count()
    }
}

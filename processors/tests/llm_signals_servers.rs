//! `llm_signals` on the real-format `/metrics` captures of `tests/fixtures/servers` (issue 20):
//! each capture goes through the prometheus receiver's own parser and converter, after a scrape
//! of the same exposition with every value 0 (a freshly started server), so one window holds all
//! 100 requests of the capture; the derived signals are checked against the capture's own
//! sums, counts and buckets, read here from the text.

use inferwatch_core::arrow::{ArrowProcessor, ArrowProcessorFactory, metrics};
use inferwatch_core::component::{ComponentId, CreateContext};
use inferwatch_core::pdata::Signal;
use inferwatch_core::telemetry::Telemetry;
use inferwatch_processors::llm_signals::LlmSignalsFactory;
use inferwatch_receivers::prometheus::config::TargetAddr;
use inferwatch_receivers::prometheus::convert::{Converter, Target};
use inferwatch_receivers::prometheus::parse::{Format, parse};
use inferwatch_receivers::prometheus::tgi::is_tgi;
use opentelemetry_proto::tonic::common::v1::any_value;
use opentelemetry_proto::tonic::metrics::v1::{metric, number_data_point};
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

const MODEL: &str = "meta-llama/Llama-3.1-8B-Instruct";
/// The TGI target's model as the receiver would read it from `/info`.
const TGI_MODEL: &str = "bigscience/bloom-560m";
/// Scrape times (s): baseline and capture, 30 s apart, in the window [1767225600, 1767225660).
const T0: u64 = 1_767_225_610;
const T1: u64 = 1_767_225_640;
const WINDOW_END: u64 = 1_767_225_660;
const SECS: f64 = (T1 - T0) as f64;

fn capture(file: &str) -> String {
    let path = format!("{}/../tests/fixtures/servers/{file}.prom", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The same exposition with every sample 0 except the `_created` timestamps.
fn zeroed(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let name_end = line.find(['{', ' ']).unwrap_or(line.len());
        if line.is_empty() || line.starts_with('#') || line[..name_end].ends_with("_created") {
            out.push_str(line);
        } else {
            let value_at = line.rfind('}').map_or(name_end, |i| i + 1);
            out.push_str(&line[..value_at]);
            out.push_str(" 0");
        }
        out.push('\n');
    }
    out
}

/// One sample line of the capture: labels and value.
struct Line {
    labels: BTreeMap<String, String>,
    value: f64,
}

/// Every sample line of `name` (exact, suffix included).
fn lines(text: &str, name: &str) -> Vec<Line> {
    let mut out = Vec::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let name_end = line.find(['{', ' ']).unwrap_or(line.len());
        if &line[..name_end] != name {
            continue;
        }
        let mut labels = BTreeMap::new();
        let rest = match line[name_end..].strip_prefix('{') {
            Some(r) => {
                let close = r.rfind('}').unwrap();
                for pair in r[..close].split("\",").filter(|p| !p.is_empty()) {
                    let (k, v) = pair.split_once('=').unwrap();
                    labels.insert(k.to_string(), v.trim_matches('"').to_string());
                }
                &r[close + 1..]
            }
            None => &line[name_end..],
        };
        out.push(Line { labels, value: rest.split_whitespace().next().unwrap().parse().unwrap() });
    }
    out
}

fn total(text: &str, name: &str) -> f64 {
    lines(text, name).iter().map(|l| l.value).sum()
}

/// The mean `sum / count` of histogram family `family`, all series together.
fn mean(text: &str, family: &str) -> f64 {
    total(text, &format!("{family}_sum")) / total(text, &format!("{family}_count"))
}

/// The bucket `(lower, upper]` holding rank q·n of histogram `family` (all series added), and
/// whether every observation lies in that one bucket.
fn rank_bucket(text: &str, family: &str, q: f64) -> (f64, f64, bool) {
    let mut cum: BTreeMap<u64, (f64, f64)> = BTreeMap::new(); // bits of le → (le, cumulative)
    for l in lines(text, &format!("{family}_bucket")) {
        let le: f64 = match l.labels["le"].as_str() {
            "+Inf" => f64::INFINITY,
            v => v.parse().unwrap(),
        };
        cum.entry(le.to_bits()).or_insert((le, 0.0)).1 += l.value;
    }
    let mut buckets: Vec<(f64, f64)> = cum.into_values().collect();
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    let n = buckets.last().unwrap().1;
    let occupied = buckets.iter().scan(0.0, |below, (_, c)| {
        let inc = c - *below;
        *below = *c;
        Some(inc)
    });
    let one = occupied.filter(|inc| *inc > 0.0).count() == 1;
    let k = buckets.iter().position(|(_, c)| *c >= q * n).unwrap();
    let lower = if k == 0 { 0.0 } else { buckets[k - 1].0 };
    (lower, buckets[k].0, one)
}

/// The derived points of one capture: output name → value (one group, asserted).
fn derive(file: &str) -> BTreeMap<String, f64> {
    let text = capture(file);
    let base = zeroed(&text);
    let target = Target {
        job: file.split('-').next().unwrap().to_string(),
        addr: TargetAddr { host: "10.0.0.7".into(), port: 8000 },
        scheme: "http".into(),
        labels: Vec::new(),
        honor_labels: false,
    };
    let mut conv = Converter::new(target);
    let telemetry = Arc::new(Telemetry::new());
    let ctx = CreateContext::new(ComponentId::parse("llm_signals/servers").unwrap(), telemetry);
    let mut proc: Box<dyn ArrowProcessor> =
        LlmSignalsFactory.create_arrow(ctx, &json!({"window": "1m"}), Signal::Metrics).unwrap();
    for (body, t) in [(&base, T0), (&text, T1)] {
        let expo = parse(body, Format::Text).unwrap();
        let extra = if is_tgi(&expo) { vec![("model_name".to_string(), TGI_MODEL.to_string())] } else { vec![] };
        let converted = conv.convert(&expo, t * 1_000_000_000, &extra);
        let req = conv.request(converted);
        let mut out = Vec::new();
        proc.process(&metrics::to_batch(&req).unwrap(), &mut out).unwrap();
        assert!(out.is_empty());
    }
    let mut out = Vec::new();
    proc.advance(WINDOW_END * 1_000_000_000, &mut out).unwrap();
    let mut got = BTreeMap::new();
    let mut models = BTreeSet::new();
    for b in &out {
        let req = metrics::from_batch(b).unwrap();
        for m in req.resource_metrics.iter().flat_map(|r| &r.scope_metrics).flat_map(|s| &s.metrics) {
            let Some(metric::Data::Gauge(g)) = &m.data else { panic!("{}: not a gauge", m.name) };
            for p in &g.data_points {
                for kv in p.attributes.iter().filter(|kv| kv.key == "gen_ai.request.model") {
                    if let Some(any_value::Value::StringValue(s)) = kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                        models.insert(s.clone());
                    }
                }
                let v = match p.value.unwrap() {
                    number_data_point::Value::AsDouble(d) => d,
                    number_data_point::Value::AsInt(i) => i as f64,
                };
                assert!(got.insert(m.name.clone(), v).is_none(), "{file}: {} twice", m.name);
            }
        }
    }
    let want_model = if file.starts_with("tgi") { TGI_MODEL } else { MODEL };
    assert_eq!(models, BTreeSet::from([want_model.to_string()]), "{file}: one group, the model label's");
    got
}

fn close(got: f64, want: f64, what: &str) {
    assert!((got - want).abs() <= 1e-9 * want.abs().max(1.0), "{what}: got {got}, want {want}");
}

/// What one capture must give.
struct Expect {
    file: &'static str,
    /// Latency signal (`ttft`, `tpot`, `e2e`, `queue`) → the histogram family it is read from.
    latency: &'static [(&'static str, &'static str)],
    /// Scalar outputs beyond the latency ones.
    scalars: &'static [&'static str],
    /// Counter families of all requests and of the failed ones (summed over their series).
    requests: &'static [&'static str],
    errors: f64,
    /// (output tokens, input tokens): counter or histogram-sum families.
    tokens: (&'static str, &'static str),
    /// KV usage gauge family, if any.
    kv: Option<&'static str>,
    /// Waiting and running gauge families.
    queue: (&'static str, &'static str),
}

const BASE: &[&str] = &[
    "llm.request.rate",
    "llm.request.error_rate",
    "llm.tokens.output.rate",
    "llm.tokens.input.rate",
    "llm.requests.waiting",
    "llm.requests.running",
    "llm.queue.blocking",
];

const VLLM_LAT_V1: &[(&str, &str)] = &[
    ("ttft", "vllm:time_to_first_token_seconds"),
    ("tpot", "vllm:request_time_per_output_token_seconds"),
    ("e2e", "vllm:e2e_request_latency_seconds"),
    ("queue", "vllm:request_queue_time_seconds"),
    ("itl", "vllm:inter_token_latency_seconds"),
];
/// vLLM ≤ 0.10 and V0: the per-step `time_per_output_token_seconds` is the ITL and the TPOT fallback.
const VLLM_LAT_OLD: &[(&str, &str)] = &[
    ("ttft", "vllm:time_to_first_token_seconds"),
    ("tpot", "vllm:time_per_output_token_seconds"),
    ("e2e", "vllm:e2e_request_latency_seconds"),
    ("queue", "vllm:request_queue_time_seconds"),
    ("itl", "vllm:time_per_output_token_seconds"),
];

fn expectations() -> Vec<Expect> {
    vec![
        Expect {
            file: "vllm-0.33.0",
            latency: VLLM_LAT_V1,
            scalars: &[
                "llm.kv_cache.usage",
                "llm.preemption.rate",
                "llm.prefix_cache.hit_rate",
                "llm.prefix_cache.low",
            ],
            requests: &["vllm:request_success_total"],
            errors: 3.0, // abort 2 + error 1; repetition 1 is not an error
            tokens: ("vllm:generation_tokens_total", "vllm:prompt_tokens_total"),
            kv: Some("vllm:kv_cache_usage_perc"),
            queue: ("vllm:num_requests_waiting", "vllm:num_requests_running"),
        },
        Expect {
            file: "vllm-0.10.0",
            latency: VLLM_LAT_OLD,
            scalars: &[
                "llm.kv_cache.usage",
                "llm.preemption.rate",
                "llm.prefix_cache.hit_rate",
                "llm.prefix_cache.low",
            ],
            requests: &["vllm:request_success_total"],
            errors: 3.0, // abort only
            tokens: ("vllm:generation_tokens_total", "vllm:prompt_tokens_total"),
            kv: Some("vllm:kv_cache_usage_perc"),
            queue: ("vllm:num_requests_waiting", "vllm:num_requests_running"),
        },
        Expect {
            file: "vllm-0.6.6.post1",
            latency: VLLM_LAT_OLD,
            // gpu_prefix_cache_hit_rate is −1 (prefix caching off): no hit rate.
            scalars: &["llm.kv_cache.usage", "llm.preemption.rate"],
            requests: &["vllm:request_success_total"],
            errors: 3.0,
            tokens: ("vllm:generation_tokens_total", "vllm:prompt_tokens_total"),
            kv: Some("vllm:gpu_cache_usage_perc"),
            queue: ("vllm:num_requests_waiting", "vllm:num_requests_running"),
        },
        Expect {
            file: "sglang-0.5.23",
            latency: &[
                ("ttft", "sglang:time_to_first_token_seconds"),
                ("tpot", "sglang:request_time_per_output_token_seconds"),
                ("e2e", "sglang:e2e_request_latency_seconds"),
                ("queue", "sglang:queue_time_seconds"),
                ("itl", "sglang:inter_token_latency_seconds"),
            ],
            scalars: &["llm.kv_cache.usage", "llm.prefix_cache.hit_rate", "llm.prefix_cache.low"],
            requests: &["sglang:num_requests_total"],
            errors: 3.0,
            tokens: ("sglang:generation_tokens_total", "sglang:prompt_tokens_total"),
            kv: Some("sglang:token_usage"),
            queue: ("sglang:num_queue_reqs", "sglang:num_running_reqs"),
        },
        Expect {
            file: "tgi-3.3.7",
            latency: &[
                ("tpot", "tgi_request_mean_time_per_token_duration"),
                ("e2e", "tgi_request_duration"),
                ("queue", "tgi_request_queue_duration"),
            ],
            scalars: &[],
            requests: &["tgi_request_success", "tgi_request_failure"],
            errors: 4.0,
            tokens: ("tgi_request_generated_tokens_sum", "tgi_request_input_length_sum"),
            kv: None,
            queue: ("tgi_queue_size", "tgi_batch_current_size"),
        },
    ]
}

#[test]
fn llm_signals_servers_derive_what_each_capture_holds() {
    for e in expectations() {
        let text = capture(e.file);
        let got = derive(e.file);
        let f = e.file;
        let names: BTreeSet<&str> = got.keys().map(String::as_str).collect();
        let mut want: BTreeSet<String> = BASE.iter().chain(e.scalars).map(|s| s.to_string()).collect();
        for (sig, _) in e.latency {
            want.extend(["p50", "p95", "p99"].map(|p| format!("llm.{sig}.{p}")));
        }
        assert_eq!(names, want.iter().map(String::as_str).collect(), "{f}: the signals derived");

        let requests: f64 = e.requests.iter().map(|n| total(&text, n)).sum();
        close(got["llm.request.rate"], requests / SECS, &format!("{f}: request rate"));
        close(got["llm.request.error_rate"], e.errors / requests, &format!("{f}: error rate"));
        close(got["llm.tokens.output.rate"], total(&text, e.tokens.0) / SECS, &format!("{f}: output tokens"));
        close(got["llm.tokens.input.rate"], total(&text, e.tokens.1) / SECS, &format!("{f}: input tokens"));
        close(got["llm.requests.waiting"], total(&text, e.queue.0), &format!("{f}: waiting"));
        close(got["llm.requests.running"], total(&text, e.queue.1), &format!("{f}: running"));
        if let Some(kv) = e.kv {
            close(got["llm.kv_cache.usage"], total(&text, kv), &format!("{f}: kv usage"));
        }

        for (sig, family) in e.latency {
            let m = mean(&text, family);
            for (p, q) in [("p50", 0.5), ("p95", 0.95), ("p99", 0.99)] {
                let v = got[&format!("llm.{sig}.{p}")];
                let (lower, upper, one) = rank_bucket(&text, family, q);
                let what = format!("{f}: {sig} {p} = {v} from {family} (mean {m}, bucket ({lower}, {upper}])");
                if one {
                    // Every observation in one bucket: the window mean, not the bucket midpoint.
                    close(v, m.clamp(lower, upper), &what);
                } else {
                    assert!(lower <= v && v <= upper, "{what}: outside the bucket of rank q·n");
                }
            }
            let (p50, p99) = (got[&format!("llm.{sig}.p50")], got[&format!("llm.{sig}.p99")]);
            assert!(p50 <= got[&format!("llm.{sig}.p95")] && got[&format!("llm.{sig}.p95")] <= p99, "{f}: {sig} order");
        }
        let blocking = got["llm.queue.blocking"];
        assert_eq!(blocking, f64::from(u8::from(got["llm.queue.p99"] > 0.8)), "{f}: queue blocking");
    }
}

/// vLLM 0.33's queue times (mean 5.9 ms) all lie in its first request-latency bucket (0, 0.3 s]:
/// the percentiles are the mean, not the interpolated 0.15 s.
#[test]
fn llm_signals_servers_vllm_033_queue_in_one_bucket_reads_its_mean() {
    let text = capture("vllm-0.33.0");
    let got = derive("vllm-0.33.0");
    let m = mean(&text, "vllm:request_queue_time_seconds");
    assert!((m - 0.005_914_887).abs() < 1e-9, "capture mean {m}");
    for p in ["p50", "p95", "p99"] {
        close(got[&format!("llm.queue.{p}")], m, &format!("queue {p}"));
    }
    assert_eq!(got["llm.queue.blocking"], 0.0);
}

/// vLLM ≤ 0.10 and V0 have no per-request TPOT: `time_per_output_token_seconds` (per decode step)
/// is read as TPOT. Its mean is the table's derivation, decode time / (generated tokens − requests).
#[test]
fn llm_signals_servers_old_vllm_tpot_mean_is_the_decode_time_derivation() {
    for file in ["vllm-0.10.0", "vllm-0.6.6.post1"] {
        let text = capture(file);
        assert!(lines(&text, "vllm:request_time_per_output_token_seconds_count").is_empty());
        let derived = total(&text, "vllm:request_decode_time_seconds_sum")
            / (total(&text, "vllm:generation_tokens_total") - total(&text, "vllm:request_success_total"));
        let m = mean(&text, "vllm:time_per_output_token_seconds");
        assert!((m - derived).abs() < 1e-9, "{file}: per-step mean {m} vs derived {derived}");
        let got = derive(file);
        let (lower, upper, _) = rank_bucket(&text, "vllm:time_per_output_token_seconds", 0.5);
        assert!(lower <= got["llm.tpot.p50"] && got["llm.tpot.p50"] <= upper, "{file}: tpot p50");
    }
}

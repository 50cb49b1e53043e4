//! What a person reads in an alert: its name per detector, the observed value, baseline and
//! threshold in the signal's unit, a one-sentence summary, and links built from templates.

use super::input::value_string;
use super::lifecycle::{Kind, Severity};
use inferwatch_core::component::FieldError;
use opentelemetry_proto::tonic::common::v1::{KeyValue, any_value};

/// `alertname` of a detector without a name of its own.
pub const DEFAULT_ALERTNAME: &str = "LLMDegradation";

/// The built-in `alertname` of each known detector (docs/alerts.md).
pub const ALERTNAMES: &[(&str, &str)] = &[
    ("slo_burn", "LLMSloBurnRate"),
    ("trend_forecast", "LLMBreachForecast"),
    ("zscore_skew", "LLMLatencyAnomaly"),
    ("ewma_chart", "LLMLatencyAnomaly"),
    ("cusum", "LLMLatencyAnomaly"),
    ("anomaly_ensemble", "LLMMetricAnomaly"),
    ("kv_pressure", "LLMKvCachePressure"),
    ("delta_ab", "LLMVersionRegression"),
    ("peer_outlier", "LLMReplicaSlowerThanPeers"),
    ("coupled_model", "LLMUnexplainedLatency"),
    ("lstm_ae", "LLMMultiSignalAnomaly"),
    ("pca", "LLMMultiSignalAnomaly"),
];

/// The built-in `alertname` of `detector` (`LLMDegradation` for an unknown one).
pub fn alertname(detector: &str) -> &'static str {
    ALERTNAMES.iter().find(|(d, _)| *d == detector).map_or(DEFAULT_ALERTNAME, |(_, n)| n)
}

/// How a signal's values read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// Seconds (latencies, queue times): shown in ms under 1 s.
    Seconds,
    /// A fraction in [0, 1]: shown as a percentage.
    Ratio,
    /// Events per second.
    PerSecond,
    /// Tokens per second.
    TokensPerSecond,
    /// A plain number.
    Plain,
}

/// The unit of a signal, from its name (`llm.tpot.p95` → seconds, `llm.kv_cache.usage` → ratio).
pub fn unit_of(metric: &str) -> Unit {
    let m = metric.to_ascii_lowercase();
    let has = |w: &[&str]| w.iter().any(|x| m.contains(x));
    if has(&["usage", "hit_rate", "ratio", "utilization", "fragmentation", "error_rate", "availability"]) {
        Unit::Ratio
    } else if has(&["tokens"]) && has(&["rate", "throughput"]) {
        Unit::TokensPerSecond
    } else if has(&["rate", "throughput"]) {
        Unit::PerSecond
    } else if has(&["ttft", "tpot", "itl", "e2e", "queue", "latency", "duration", "seconds", "time"]) {
        Unit::Seconds
    } else {
        Unit::Plain
    }
}

/// `v` with about three significant digits, trailing zeros dropped (`2.1`, `70`, `0.0004`).
pub fn number(v: f64) -> String {
    if !v.is_finite() {
        return if v.is_nan() {
            "NaN".into()
        } else if v > 0.0 {
            "∞".into()
        } else {
            "-∞".into()
        };
    }
    let a = v.abs();
    let decimals = if a >= 100.0 || a == 0.0 {
        0
    } else if a >= 10.0 {
        1
    } else if a >= 1.0 {
        2
    } else {
        // 2 decimals more than the position of the first significant digit, at most 9.
        (2 - a.log10().floor() as i32).clamp(0, 9) as usize
    };
    let s = format!("{v:.decimals$}");
    let s = if s.contains('.') { s.trim_end_matches('0').trim_end_matches('.').to_string() } else { s };
    if s == "-0" { "0".into() } else { s }
}

/// A duration in seconds, humanely: `45 s`, `12 min`, `5 h`, `16 days`.
pub fn duration(secs: f64) -> String {
    let (scale, name) = duration_unit(secs);
    format!("{} {name}", number(round_to(secs / scale)))
}

fn round_to(v: f64) -> f64 {
    if v.abs() >= 10.0 { v.round() } else { (v * 10.0).round() / 10.0 }
}

/// The unit a duration is best read in: (seconds per unit, name).
fn duration_unit(secs: f64) -> (f64, &'static str) {
    let a = secs.abs();
    if a < 120.0 {
        (1.0, "s")
    } else if a < 2.0 * 3600.0 {
        (60.0, "min")
    } else if a < 2.0 * 86_400.0 {
        (3600.0, "h")
    } else {
        (86_400.0, "days")
    }
}

/// A value of a signal in its unit (`70 ms`, `2.1 s`, `97%`, `0.4/s`).
pub fn value(v: f64, unit: Unit) -> String {
    match unit {
        Unit::Seconds if v.is_finite() && v.abs() < 1.0 => format!("{} ms", number(v * 1000.0)),
        Unit::Seconds if v.is_finite() && v.abs() >= 120.0 => duration(v),
        Unit::Seconds => format!("{} s", number(v)),
        Unit::Ratio => format!("{}%", number(v * 100.0)),
        Unit::PerSecond => format!("{}/s", number(v)),
        Unit::TokensPerSecond => format!("{} tok/s", number(v)),
        Unit::Plain => number(v),
    }
}

/// A readable name of a signal: `llm.tpot.p95` → `TPOT p95`, `llm.kv_cache.usage` → `KV cache usage`.
pub fn signal_name(metric: &str) -> String {
    let m = metric.strip_prefix("llm.").unwrap_or(metric);
    let words: Vec<String> = m
        .split(['.', '_'])
        .filter(|w| !w.is_empty())
        .map(|w| match w {
            "ttft" | "tpot" | "itl" | "kv" | "gpu" => w.to_ascii_uppercase(),
            "e2e" => "e2e latency".into(),
            other => other.to_string(),
        })
        .collect();
    if words.is_empty() { metric.to_string() } else { words.join(" ") }
}

/// What the alert is about: its identity and context labels and the triggering point.
#[derive(Debug, Clone, Copy)]
pub struct Subject<'a> {
    /// Identity labels (detector, metric, group attributes) and context attributes.
    pub labels: &'a [(String, String)],
    /// The point's evidence attributes (absent for an eviction).
    pub evidence: Option<&'a [KeyValue]>,
    /// The level of the point.
    pub level: Option<f64>,
    /// The score at the same time.
    pub score: Option<f64>,
    /// `llm.slo.breach_eta` (s) at the same time.
    pub breach_eta: Option<f64>,
}

impl Subject<'_> {
    /// A label's value.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str()).filter(|v| !v.is_empty())
    }

    fn ev(&self, key: &str) -> Option<&any_value::Value> {
        self.evidence?.iter().find(|kv| kv.key == key).and_then(|kv| kv.value.as_ref()).and_then(|v| v.value.as_ref())
    }

    /// A numeric evidence attribute.
    pub fn f64(&self, key: &str) -> Option<f64> {
        match self.ev(key)? {
            any_value::Value::DoubleValue(d) => Some(*d),
            any_value::Value::IntValue(i) => Some(*i as f64),
            any_value::Value::StringValue(s) => s.parse().ok(),
            _ => None,
        }
    }

    /// A string evidence attribute.
    pub fn str(&self, key: &str) -> Option<String> {
        let kv = self.evidence?.iter().find(|kv| kv.key == key)?;
        kv.value.as_ref().and_then(value_string).filter(|s| !s.is_empty())
    }

    fn detector(&self) -> &str {
        self.label("detector").unwrap_or("?")
    }

    fn metric(&self) -> &str {
        self.label("metric").unwrap_or("?")
    }
}

/// The numbers of an alert in its signal's unit, read from the detector's evidence.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Facts {
    /// The observed value of the signal.
    pub value: Option<f64>,
    /// What the detector expected (its baseline).
    pub baseline: Option<f64>,
    /// The value beyond which the signal is bad (SLO threshold, forecast threshold, ...).
    pub threshold: Option<f64>,
    /// Forecast: seconds until the threshold is crossed, and its interval.
    pub eta: Option<f64>,
    /// Low end of the ETA's interval (s).
    pub eta_low: Option<f64>,
    /// High end of the ETA's interval (s; may be infinite).
    pub eta_high: Option<f64>,
}

/// The facts of `s` by its detector's evidence keys (docs/alerts.md, "value, baseline, threshold").
pub fn facts(s: &Subject<'_>) -> Facts {
    let slo_threshold = s.f64("slo.threshold");
    let mut f = match s.detector() {
        "zscore_skew" => Facts { value: s.f64("value"), baseline: s.f64("zscore.mean"), ..Facts::default() },
        "ewma_chart" => Facts { value: s.f64("value"), baseline: s.f64("ewma.baseline"), ..Facts::default() },
        "cusum" => Facts { value: s.f64("value"), baseline: s.f64("cusum.baseline"), ..Facts::default() },
        "anomaly_ensemble" => Facts { value: s.f64("value"), ..Facts::default() },
        "trend_forecast" => Facts {
            value: s.f64("value"),
            threshold: s.f64("threshold"),
            eta: s.f64("eta"),
            eta_low: s.f64("eta_low"),
            eta_high: s.f64("eta_high"),
            ..Facts::default()
        },
        "coupled_model" => {
            Facts { value: s.f64("coupled.latency"), baseline: s.f64("coupled.predicted"), ..Facts::default() }
        }
        "kv_pressure" => Facts { value: s.f64("kv_pressure.usage"), ..Facts::default() },
        "peer_outlier" => Facts {
            value: s.f64("peer_outlier.value"),
            baseline: s.f64("peer_outlier.peer_median"),
            threshold: s.f64("peer_outlier.bound"),
            ..Facts::default()
        },
        "delta_ab" => {
            let base = s.f64("delta_ab.value_baseline");
            let th = s.f64("delta_ab.threshold");
            let threshold = match (base, th, s.str("delta_ab.kind").as_deref()) {
                (Some(b), Some(t), Some("latency")) => Some(b + t / 1000.0),
                (Some(b), Some(t), Some(_)) => Some(b * (1.0 + t)),
                _ => None,
            };
            Facts { value: s.f64("delta_ab.value_candidate"), baseline: base, threshold, ..Facts::default() }
        }
        "slo_burn" => {
            Facts { value: s.f64("value").or_else(|| s.f64("slo.value")), threshold: slo_threshold, ..Facts::default() }
        }
        d => Facts {
            value: s.f64("value").or_else(|| s.f64(&format!("{d}.error"))),
            threshold: s.f64("threshold"),
            ..Facts::default()
        },
    };
    if f.threshold.is_none() {
        f.threshold = slo_threshold;
    }
    if f.eta.is_none() {
        f.eta = s.breach_eta.or_else(|| s.f64("eta"));
        f.eta_low = f.eta_low.or_else(|| s.f64("eta_low"));
        f.eta_high = f.eta_high.or_else(|| s.f64("eta_high"));
    }
    for v in [&mut f.value, &mut f.baseline, &mut f.threshold, &mut f.eta, &mut f.eta_low] {
        *v = v.filter(|x| x.is_finite());
    }
    f.eta_high = f.eta_high.filter(|x| !x.is_nan());
    f
}

/// `TPOT p95 of llama-3-8b on vllm-0` (model and instance when known).
fn who(s: &Subject<'_>) -> String {
    let mut w = signal_name(s.metric());
    if let Some(m) = s.label("gen_ai.request.model") {
        w.push_str(" of ");
        w.push_str(m);
    }
    if let Some(i) = s.label("service.instance.id").or_else(|| s.label("k8s.pod.name")) {
        w.push_str(" on ");
        w.push_str(i);
    }
    w
}

/// `in about 16 days (12–21)`.
fn eta_text(eta: f64, lo: Option<f64>, hi: Option<f64>) -> String {
    if eta <= 0.0 {
        return "already (the forecast's level is past it)".into();
    }
    let (scale, name) = duration_unit(eta);
    let n = |v: f64| number(round_to(v / scale));
    let mut t = format!("in about {} {name}", n(eta));
    match (lo, hi) {
        (Some(l), Some(h)) if h.is_infinite() => t.push_str(&format!(" (at least {})", n(l))),
        (Some(l), Some(h)) => t.push_str(&format!(" ({}–{})", n(l), n(h))),
        _ => {}
    }
    t
}

/// The target a forecast or burn rate is about: `SLO tpot-fast (70 ms)` or `70 ms`.
fn target(s: &Subject<'_>, th: Option<f64>, unit: Unit) -> String {
    match (s.label("slo"), th) {
        (Some(slo), Some(t)) => format!("SLO {slo} ({})", value(t, unit)),
        (Some(slo), None) => format!("SLO {slo}"),
        (None, Some(t)) => format!("threshold {}", value(t, unit)),
        (None, None) => "its threshold".into(),
    }
}

/// The firing sentence (without the state), e.g. `TPOT p95 of llama-3-8b on vllm-0 is rising
/// 0.4 ms/day; SLO 70 ms breached in about 16 days (12–21)`.
fn firing(s: &Subject<'_>, f: &Facts, sev: Severity) -> String {
    let unit = unit_of(s.metric());
    let who = who(s);
    let sev = sev.as_str();
    let detector = s.detector();
    if detector == "trend_forecast" || (detector != "slo_burn" && f.eta.is_some()) {
        let slope = s.f64("slope_per_day");
        let mut t = match slope {
            Some(d) if d < 0.0 => format!("{who} is falling {}/day", value(-d, unit)),
            Some(d) => format!("{who} is rising {}/day", value(d, unit)),
            None => format!("{who} is trending"),
        };
        let tg = target(s, f.threshold, unit);
        match f.eta {
            Some(eta) => t.push_str(&format!("; {tg} breached {}", eta_text(eta, f.eta_low, f.eta_high))),
            None => t.push_str(&format!(" towards {tg}")),
        }
        return t;
    }
    match detector {
        "slo_burn" => {
            let burn = s.f64("burn_rate").or_else(|| s.f64("slo.burn_rate")).or(s.score);
            let tg = target(s, f.threshold, unit);
            let mut t = match burn {
                Some(b) => format!("{who} burns the error budget of {tg} {}× as fast as it allows", number(b)),
                None => format!("{who} burns the error budget of {tg} too fast"),
            };
            if let Some(r) = s.f64("error_budget.remaining").or_else(|| s.f64("slo.error_budget.remaining")) {
                t.push_str(&format!("; {} of it left", value(r, Unit::Ratio)));
            }
            format!("{t} ({})", if sev == "critical" { "page" } else { "ticket" })
        }
        "kv_pressure" => {
            let mut parts = Vec::new();
            let flags = s.str("kv_pressure.flags").unwrap_or_default();
            let flagged = |f: &str| flags.split(',').any(|x| x == f);
            let mut add = |flag: &str, key: &str, text: &dyn Fn(f64) -> String| {
                if let Some(v) = s.f64(key).filter(|_| flagged(flag)) {
                    parts.push(text(v));
                }
            };
            add("usage_high", "kv_pressure.usage", &|v| format!("usage {}", value(v, Unit::Ratio)));
            add("queue_blocking", "kv_pressure.queue_p99_s", &|v| format!("queue p99 {}", value(v, Unit::Seconds)));
            add("preempting", "kv_pressure.preemption_rate", &|v| format!("{} preemptions/s", number(v)));
            add("hit_rate_low", "kv_pressure.hit_rate", &|v| {
                format!("prefix-cache hit rate {}", value(v, Unit::Ratio))
            });
            add("fragmented", "kv_pressure.kvf", &|v| format!("fragmentation {}", number(v)));
            if parts.is_empty()
                && let Some(u) = f.value
            {
                parts.push(format!("usage {}", value(u, Unit::Ratio)));
            }
            let mut w = "KV cache".to_string();
            if let Some(m) = s.label("gen_ai.request.model") {
                w.push_str(&format!(" of {m}"));
            }
            if let Some(i) = s.label("service.instance.id") {
                w.push_str(&format!(" on {i}"));
            }
            if parts.is_empty() {
                format!("{w} is under pressure ({sev})")
            } else {
                format!("{w} is under pressure: {} ({sev})", parts.join(", "))
            }
        }
        "delta_ab" => {
            let base = s.str("delta_ab.baseline").unwrap_or_else(|| "the baseline".into());
            let cand = s.str("delta_ab.candidate").unwrap_or_else(|| "the candidate".into());
            let mut t = format!("{who}: version {cand}");
            match (f.value, f.baseline, s.f64("delta_ab.delta_rel")) {
                (Some(v), Some(b), rel) => {
                    let pct = rel.map(|r| format!(" ({}{}%)", if r >= 0.0 { "+" } else { "" }, number(r * 100.0)));
                    t.push_str(&format!(
                        " is at {} against {} for {base}{}",
                        value(v, unit),
                        value(b, unit),
                        pct.unwrap_or_default()
                    ));
                }
                _ => t.push_str(&format!(" regressed against {base}")),
            }
            if let Some(th) = f.threshold {
                t.push_str(&format!(", beyond {}", value(th, unit)));
            }
            format!("{t} ({sev})")
        }
        "coupled_model" => {
            let mut t = match (f.value, f.baseline) {
                (Some(v), Some(b)) => {
                    format!("{who} is {} where its load model predicts {}", value(v, unit), value(b, unit))
                }
                _ => format!("{who} departs from its load model"),
            };
            if let Some(a) = s.str("coupled.attribution") {
                t.push_str(&format!(" (attributed to {a})"));
            }
            format!("{t} ({sev})")
        }
        "lstm_ae" | "pca" => {
            let mut t = "Multi-signal anomaly".to_string();
            if let Some(m) = s.label("gen_ai.request.model") {
                t.push_str(&format!(" of {m}"));
            }
            if let Some(i) = s.label("service.instance.id") {
                t.push_str(&format!(" on {i}"));
            }
            if let Some(e) = f.value {
                t.push_str(&format!(": {detector} error {}", number(e)));
            }
            if let Some(top) = s.str(&format!("{detector}.top_signal")) {
                t.push_str(&format!(", mostly {}", signal_name(&top)));
            }
            format!("{t} ({sev})")
        }
        _ => match (f.value, f.baseline) {
            (Some(v), Some(b)) => {
                format!("{who} is {} against a baseline of {} ({sev})", value(v, unit), value(b, unit))
            }
            (Some(v), None) => match f.threshold {
                Some(th) => format!("{who} is {} against a threshold of {} ({sev})", value(v, unit), value(th, unit)),
                None => format!("{who} is {} ({detector}, {sev})", value(v, unit)),
            },
            _ => match s.level {
                Some(l) => format!("{who} is anomalous ({detector} level {}, {sev})", number(l)),
                None => format!("{who} is anomalous ({detector}, {sev})"),
            },
        },
    }
}

/// The one-sentence summary of an alert record (`alert.summary`; the body adds the state).
pub fn summary(s: &Subject<'_>, kind: Kind, sev: Severity, resolve_below: f64) -> String {
    let f = facts(s);
    match kind {
        Kind::Evict => format!("{} is no longer tracked (max_alerts reached); reported as resolved", who(s)),
        Kind::Resolve => {
            let unit = unit_of(s.metric());
            let mut t = format!("{} is back to normal", who(s));
            if let Some(v) = f.value {
                t.push_str(&format!(" at {}", value(v, unit)));
            }
            if let Some(l) = s.level {
                t.push_str(&format!(" ({} level {} < {})", s.detector(), number(l), number(resolve_below)));
            }
            t
        }
        Kind::Fire | Kind::Escalate | Kind::Repeat => firing(s, &f, sev),
    }
}

/// A link template such as `http://grafana/d/x?var-model={{model}}`.
#[derive(Debug, Clone, PartialEq)]
pub struct Template {
    parts: Vec<Part>,
}

#[derive(Debug, Clone, PartialEq)]
enum Part {
    Text(String),
    Var(String),
}

impl Template {
    /// Parses `{{name}}` placeholders; `at` names the key for errors.
    pub fn parse(at: &str, s: &str) -> Result<Template, FieldError> {
        let mut parts = Vec::new();
        let mut rest = s;
        while let Some(i) = rest.find("{{") {
            if i > 0 {
                parts.push(Part::Text(rest[..i].to_string()));
            }
            let after = &rest[i + 2..];
            let Some(j) = after.find("}}") else {
                return Err(FieldError::at(at, format!("unclosed {{{{ in {s:?}")));
            };
            let name = after[..j].trim();
            if name.is_empty() || name.contains("{{") {
                return Err(FieldError::at(at, format!("empty or nested placeholder in {s:?}")));
            }
            parts.push(Part::Var(name.to_string()));
            rest = &after[j + 2..];
        }
        if rest.contains("}}") {
            return Err(FieldError::at(at, format!("}}}} without {{{{ in {s:?}")));
        }
        if !rest.is_empty() {
            parts.push(Part::Text(rest.to_string()));
        }
        Ok(Template { parts })
    }

    /// The link, each placeholder replaced by `var(name)` percent-encoded (empty when unknown).
    pub fn render(&self, var: &dyn Fn(&str) -> Option<String>) -> String {
        let mut out = String::new();
        for p in &self.parts {
            match p {
                Part::Text(t) => out.push_str(t),
                Part::Var(v) => out.push_str(&encode(&var(v).unwrap_or_default())),
            }
        }
        out
    }
}

/// Percent-encodes everything but RFC 3986's unreserved characters.
pub fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The short template names and the attributes they read.
pub const SHORT_NAMES: &[(&str, &str)] = &[
    ("model", "gen_ai.request.model"),
    ("version", "service.version"),
    ("instance", "service.instance.id"),
    ("pod", "k8s.pod.name"),
    ("namespace", "k8s.namespace.name"),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_and_units_read_humanely() {
        assert_eq!(number(2.1), "2.1");
        assert_eq!(number(70.000_000_1), "70");
        assert_eq!(number(0.0004), "0.0004");
        assert_eq!(number(12.345), "12.3");
        assert_eq!(number(-0.0), "0");
        assert_eq!(value(0.07, Unit::Seconds), "70 ms");
        assert_eq!(value(0.0004, Unit::Seconds), "0.4 ms");
        assert_eq!(value(2.1, Unit::Seconds), "2.1 s");
        assert_eq!(value(600.0, Unit::Seconds), "10 min");
        assert_eq!(value(0.97, Unit::Ratio), "97%");
        assert_eq!(duration(16.2 * 86_400.0), "16 days");
        assert_eq!(duration(5.0 * 3600.0), "5 h");
        assert_eq!(duration(45.0), "45 s");
        assert_eq!(unit_of("llm.tpot.p95"), Unit::Seconds);
        assert_eq!(unit_of("llm.queue.p99"), Unit::Seconds);
        assert_eq!(unit_of("llm.kv_cache.usage"), Unit::Ratio);
        assert_eq!(unit_of("llm.prefix_cache.hit_rate"), Unit::Ratio);
        assert_eq!(unit_of("llm.tokens.output.rate"), Unit::TokensPerSecond);
        assert_eq!(unit_of("llm.preemption.rate"), Unit::PerSecond);
        assert_eq!(signal_name("llm.tpot.p95"), "TPOT p95");
        assert_eq!(signal_name("llm.kv_cache.usage"), "KV cache usage");
        assert_eq!(signal_name("llm.e2e.p99"), "e2e latency p99");
    }

    #[test]
    fn templates_encode_and_reject_bad_braces() {
        let t = Template::parse("links.x", "http://g/d?var-model={{model}}&m={{ metric }}").unwrap();
        let got = t.render(&|k| match k {
            "model" => Some("llama 3/8b".into()),
            "metric" => Some("llm.ttft.p95".into()),
            _ => None,
        });
        assert_eq!(got, "http://g/d?var-model=llama%203%2F8b&m=llm.ttft.p95");
        assert_eq!(Template::parse("x", "a{{b}}c{{d}}").unwrap().render(&|_| None), "ac");
        for bad in ["a{{b", "a}}", "{{}}"] {
            assert!(Template::parse("x", bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn every_known_detector_has_a_name() {
        for d in [
            "slo_burn",
            "trend_forecast",
            "zscore_skew",
            "cusum",
            "anomaly_ensemble",
            "kv_pressure",
            "delta_ab",
            "coupled_model",
            "lstm_ae",
            "peer_outlier",
        ] {
            assert_ne!(alertname(d), DEFAULT_ALERTNAME, "{d}");
        }
        assert_eq!(alertname("custom"), DEFAULT_ALERTNAME);
    }
}

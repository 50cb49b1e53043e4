//! The detector pipeline eval runs a scenario through, and the variables a user's own
//! `--config` may reference (`${env:SLO_SIGNAL}`, `${env:SLO_THRESHOLD}`, `${env:BASELINE}`,
//! `${env:CANDIDATE}`).

use super::truth::{GroundTruth, Kind};
use std::collections::BTreeMap;

/// The variables of a scenario a pipeline template may use. For A/B scenarios BASELINE and
/// CANDIDATE are the two instances (`service.instance.id`), so an A/A pair on one version works too.
pub fn variables(truth: &GroundTruth) -> BTreeMap<&'static str, String> {
    let mut v = BTreeMap::new();
    v.insert("SLO_SIGNAL", truth.slo_signal());
    v.insert("SLO_THRESHOLD", format!("{}", truth.slo.threshold_s));
    let (a, b) = truth.ab.as_ref().map(|ab| (ab.baseline.clone(), ab.candidate.clone())).unwrap_or_default();
    v.insert("BASELINE", a);
    v.insert("CANDIDATE", b);
    v
}

/// The pipeline of fleet scenarios (the text of eval/configs/fleet.yaml): peer_outlier on
/// llm_signals' per-replica latency percentiles from the scrapes, and delta_ab pooled over the
/// fleet per model on per-request TTFT from the spans, the version from `service.version`,
/// versions paired automatically (the rolled-out one against the most-seen older one).
pub const FLEET_CONFIG: &str = include_str!("../../configs/fleet.yaml");

/// The default detector pipeline for a scenario (docs/eval.md): the scenario's SLO declared once
/// to the `slo` processor (its burn-rate rules and its embedded trend_forecast on the SLO's signal
/// and threshold) on llm_signals from the spans (5-minute windows over exact per-request values:
/// `source: spans`, the default; its forecast reads both sources, `forecast_source: any`, which needs
/// the 5-minute span windows' lateness); cusum (fast faults) and kv_pressure on the scraped signals; for A/B
/// scenarios per-request points into delta_ab; all levels into the alerts connector with its
/// default `for` and per-detector defaults.
pub fn default_config(truth: &GroundTruth) -> String {
    if truth.kind() == Kind::Fleet {
        return FLEET_CONFIG.to_string();
    }
    let v = variables(truth);
    let signal = &v["SLO_SIGNAL"];
    let threshold = &v["SLO_THRESHOLD"];
    let ab = truth.kind() == Kind::Ab;
    let mut s = String::new();
    s.push_str("receivers:\n  eval_feed: {}\n");
    s.push_str("connectors:\n  llm_signals: {}\n  llm_signals/spans: { window: 5m }\n");
    if ab {
        s.push_str("  llm_signals/requests: { per_request: true }\n");
    }
    s.push_str("  alerts: { warning: 0.6, critical: 0.8, log: false }\n");
    s.push_str("processors:\n");
    s.push_str("  cusum: { metrics: [llm.ttft.p95, llm.tpot.p95, llm.e2e.p95] }\n");
    s.push_str("  kv_pressure: {}\n");
    s.push_str(&format!(
        "  slo: {{ allowed_lateness: 6m, objectives: [{{ name: scenario-slo, signal: {signal}, threshold: {threshold}, target: 99%, \
         period: 28d, forecast: {{ horizon: 21d, aggregate: 1h }} }}] }}\n"
    ));
    if ab {
        s.push_str(&format!(
            "  delta_ab: {{ metric: llm.request.ttft, version_attribute: service.instance.id, baseline: {}, \
             candidate: {}, statistic: p95, window: 10m, lookback: 3h }}\n",
            v["BASELINE"], v["CANDIDATE"]
        ));
    }
    s.push_str(&format!("exporters:\n  eval_capture: {{ metrics: [{signal}, llm.slo.breach_eta] }}\n"));
    s.push_str("service:\n  pipelines:\n");
    s.push_str("    metrics/in: { receivers: [eval_feed], exporters: [llm_signals] }\n");
    s.push_str(
        "    metrics/detect: { receivers: [llm_signals], processors: [cusum, kv_pressure], exporters: [alerts] }\n",
    );
    let traces_out = if ab { "[llm_signals/spans, llm_signals/requests]" } else { "[llm_signals/spans]" };
    s.push_str(&format!("    traces/in: {{ receivers: [eval_feed], exporters: {traces_out} }}\n"));
    s.push_str(
        "    metrics/slo: { receivers: [llm_signals, llm_signals/spans], processors: [slo], \
         exporters: [alerts, eval_capture] }\n",
    );
    if ab {
        s.push_str(
            "    metrics/ab: { receivers: [llm_signals/requests], processors: [delta_ab], exporters: [alerts] }\n",
        );
    }
    s.push_str("    logs/alerts: { receivers: [alerts], exporters: [eval_capture] }\n");
    s
}

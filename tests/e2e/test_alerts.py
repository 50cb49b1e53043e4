"""Alerts end to end: `llm.anomaly.level` gauges → connector `alerts` → logs pipeline →
exporter `alertmanager` → a real Alertmanager (Debian package `prometheus-alertmanager`).

The Alertmanager runs the example config of deploy/alertmanager/alertmanager.yml (critical to
`llm-oncall`, warning to `llm-team`; its webhooks point at a closed port). The test sends level
gauges with the raw OTLP client so that one critical and one warning alert fire (after `for`),
checks that Alertmanager lists both at GET /api/v2/alerts with the expected labels (alertname
by detector, severity, model, instance), start time, annotations (a summary naming the model,
the instance and the values in their units; the pod; value / baseline; the dashboard link from
the connector's `links` template) and receivers, then sends quiet levels for `resolve_after`
and checks that both are resolved (no longer listed as active). Event times are in the recent
past, so everything runs on event time.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone

from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.metrics.v1 import metrics_pb2
from opentelemetry.proto.resource.v1 import resource_pb2

from support.agent import Ports, fast_retry
from support.client import GrpcClient
from support.otlp import MetricsRequest
from support.prometheus import wait_until

SEC = 1_000_000_000
GENERATOR = "http://inferwatch.e2e/alerts"
CRITICAL_MODEL = "llama-3-8b"
WARNING_MODEL = "mistral-7b"
ALERTNAME = "LLMLatencyAnomaly"
DASHBOARD = "http://grafana.e2e/d/inferwatch?var-model={{model}}&var-instance={{instance}}"
# The observed TTFT p95 (s) per model, against a baseline of 250 ms.
VALUES = {CRITICAL_MODEL: 2.1, WARNING_MODEL: 0.4}


def _kv(k: str, v) -> common_pb2.KeyValue:
    av = common_pb2.AnyValue()
    if isinstance(v, int):
        av.int_value = v
    elif isinstance(v, float):
        av.double_value = v
    else:
        av.string_value = v
    return common_pb2.KeyValue(key=k, value=av)


def levels(model: str, points: list[tuple[int, float]]) -> MetricsRequest:
    """`llm.anomaly.level` points (event time ns, level) of zscore_skew on llm.ttft.p95 for `model`,
    on a resource naming the version and instance, with score points beside them."""
    resource = resource_pb2.Resource(attributes=[
        _kv("service.name", "vllm"), _kv("service.version", "v2"), _kv("service.instance.id", "gpu-0"),
        _kv("k8s.pod.name", "vllm-0")])
    attrs = [_kv("detector", "zscore_skew"), _kv("metric", "llm.ttft.p95"), _kv("gen_ai.request.model", model),
             _kv("window", 50), _kv("value", VALUES.get(model, 0.3)), _kv("zscore.mean", 0.25)]
    lv = [metrics_pb2.NumberDataPoint(time_unix_nano=t, as_double=v, attributes=attrs) for t, v in points]
    sc = [metrics_pb2.NumberDataPoint(time_unix_nano=t, as_double=v * 10, attributes=attrs) for t, v in points]
    return MetricsRequest(resource_metrics=[metrics_pb2.ResourceMetrics(
        resource=resource,
        scope_metrics=[metrics_pb2.ScopeMetrics(metrics=[
            metrics_pb2.Metric(name="llm.anomaly.score", unit="1", gauge=metrics_pb2.Gauge(data_points=sc)),
            metrics_pb2.Metric(name="llm.anomaly.level", unit="1", gauge=metrics_pb2.Gauge(data_points=lv)),
        ])],
    )])


def agent_config(ports: Ports, am_url: str) -> dict:
    return {
        "receivers": {"otlp": {"protocols": {"grpc": {"endpoint": ports.grpc_endpoint}}}},
        "connectors": {"alerts": {"warning": 0.6, "critical": 0.8, "for": "2s", "resolve_after": "2s",
                                  "repeat_interval": "1m", "links": {"dashboard": DASHBOARD}}},
        "exporters": {"alertmanager": {"endpoint": am_url, "generator_url": GENERATOR, "repeat": "2s",
                                       "timeout": "5s", "retry_on_failure": fast_retry()}},
        "extensions": {"health_check": {"endpoint": f"127.0.0.1:{ports.health}"}},
        "service": {
            "extensions": ["health_check"],
            "telemetry": {"metrics": {"address": f"127.0.0.1:{ports.metrics}"}},
            "pipelines": {
                "metrics": {"receivers": ["otlp"], "exporters": ["alerts"]},
                "logs/alerts": {"receivers": ["alerts"], "exporters": ["alertmanager"]},
            },
        },
    }


def ts(s: str) -> float:
    """An Alertmanager RFC 3339 time as Unix seconds."""
    return datetime.fromisoformat(s.replace("Z", "+00:00")).astimezone(timezone.utc).timestamp()


def test_alerts_fire_and_resolve_in_a_real_alertmanager(alertmanager, agents):
    am = alertmanager.start()
    ports = Ports()
    agent = agents("agent", agent_config(ports, am.url), ports)
    t0 = time.time_ns() - 30 * SEC
    c = GrpcClient(ports.grpc_endpoint)
    try:
        # Level ≥ 0.8 from t0 (critical) and 0.7 (warning) for 3 s: pending, firing at t0 + 2 s.
        c.export("metrics", levels(CRITICAL_MODEL, [(t0 + i * SEC, 0.9) for i in range(4)]))
        c.export("metrics", levels(WARNING_MODEL, [(t0 + i * SEC, 0.7) for i in range(4)]))

        def firing():
            got = {a["labels"]["model"]: a for a in am.alerts(alertname=ALERTNAME)}
            return got if len(got) == 2 and all(a["status"]["state"] == "active" for a in got.values()) else None

        got = wait_until(firing, 30, lambda: f"alerts: {am.alerts()}\nagent log:\n{agent.log()[-4000:]}")
        now = time.time()
        for model, severity, receiver in [(CRITICAL_MODEL, "critical", "llm-oncall"),
                                          (WARNING_MODEL, "warning", "llm-team")]:
            a = got[model]
            assert a["labels"] == {
                "alertname": ALERTNAME, "severity": severity, "detector": "zscore_skew",
                "metric": "llm.ttft.p95", "model": model, "version": "v2", "instance": "gpu-0",
            }, a
            assert [r["name"] for r in a["receivers"]] == [receiver], a
            assert a["generatorURL"] == GENERATOR
            assert abs(ts(a["startsAt"]) - (t0 + 2 * SEC) / SEC) < 0.002, a["startsAt"]
            assert ts(a["endsAt"]) > now, "a firing alert ends in the future (refreshed by the re-send)"
            ann = a["annotations"]
            value = {CRITICAL_MODEL: "2.1 s", WARNING_MODEL: "400 ms"}[model]
            assert ann["summary"] == (
                f"TTFT p95 of {model} on gpu-0 is {value} against a baseline of 250 ms ({severity})"), ann
            assert ann["pod"] == "vllm-0", ann
            assert float(ann["value"]) == VALUES[model] and float(ann["baseline"]) == 0.25, ann
            assert ann["dashboard_url"] == f"http://grafana.e2e/d/inferwatch?var-model={model}&var-instance=gpu-0", ann
            assert len(ann["alert_id"]) == 16 and int(ann["alert_id"], 16) >= 0, ann
            assert ann["evidence_window"] == "50" and float(ann["evidence_level"]) in (0.9, 0.7), ann
        assert got[CRITICAL_MODEL]["annotations"]["alert_id"] != got[WARNING_MODEL]["annotations"]["alert_id"]

        # Quiet levels for resolve_after (2 s): both resolve; Alertmanager stops listing them as active.
        c.export("metrics", levels(CRITICAL_MODEL, [(t0 + 5 * SEC, 0.1), (t0 + 7 * SEC, 0.1)]))
        c.export("metrics", levels(WARNING_MODEL, [(t0 + 5 * SEC, 0.2), (t0 + 7 * SEC, 0.2)]))

        def resolved():
            now = time.time()
            live = [a for a in am.alerts(alertname=ALERTNAME)
                    if a["status"]["state"] == "active" and ts(a["endsAt"]) > now]
            return not live

        wait_until(resolved, 30, lambda: f"alerts still active: {am.alerts()}")
    finally:
        c.close()
    # Two firing and two resolved records at least (plus re-sends of the firing ones).
    agent.wait_metric("otelcol_exporter_sent_log_records_total", lambda v: v >= 4, exporter="alertmanager")
    assert agent.metric("otelcol_exporter_send_failed_log_records_total", exporter="alertmanager") == 0


TRAP = """\
receivers:
  otlp: { protocols: { grpc: { endpoint: 127.0.0.1:0 } } }
connectors:
  alerts:
    for: 2m
    per_detector:
      trend_forecast:
        for: 2m
        stale_after: 5m
exporters:
  debug: {}
service:
  pipelines:
    metrics: { receivers: [otlp], exporters: [alerts] }
    logs: { receivers: [alerts], exporters: [debug] }
"""


def test_validate_warns_about_an_alert_that_can_never_fire_and_still_exits_0(tmp_path):
    """`inferwatch validate` prints a warning with file:line of the offending key, exit code 0."""
    import subprocess

    from support.agent import binary

    cfg = tmp_path / "trap.yaml"
    cfg.write_text(TRAP)
    p = subprocess.run([str(binary()), "validate", "--config", str(cfg)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "configuration is valid" in p.stdout, p.stdout
    warn = [line for line in p.stderr.splitlines() if line.startswith("warning: ")]
    assert len(warn) == 1, p.stderr
    # Line 8 column 9 is `for: 2m` under per_detector.trend_forecast.
    assert f"{cfg}:8:9: " in warn[0], warn
    assert "connectors.alerts.per_detector.trend_forecast.for" in warn[0] and "never fire" in warn[0], warn
    # Without the per_detector override the built-in for: 0s applies: no warning.
    cfg.write_text(TRAP.replace("    per_detector:\n      trend_forecast:\n        for: 2m\n        stale_after: 5m\n", ""))
    p = subprocess.run([str(binary()), "validate", "--config", str(cfg)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "warning" not in p.stderr, p.stderr

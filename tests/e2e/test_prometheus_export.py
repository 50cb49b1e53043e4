"""The `prometheus` and `prometheusremotewrite` exporters against a real Prometheus.

One agent (otlp receiver -> batch -> two `prometheus` exporters, one answering in the text format
and one in OpenMetrics, and a `prometheusremotewrite` exporter) and one Prometheus that scrapes both
endpoints every second and has its remote-write receiver on. Known OTLP metrics go in (a gauge, a
cumulative counter, a delta counter sent in two parts, a histogram, on a resource with the service
identity and two more attributes); the test then reads Prometheus's HTTP API until the series are
there with the expected values, once per way in: `via="scrape"`, `via="scrape_om"` (const_labels
of the two pull exporters) and `via="remote_write"` (external_labels of the remote-write exporter).
"""

from __future__ import annotations

import time

import pytest

from support import prometheus as prom
from support.agent import free_port, make_config
from support.client import GrpcClient
from support.otlp import MetricsRequest
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.metrics.v1 import metrics_pb2
from opentelemetry.proto.resource.v1 import resource_pb2

JOB = "e2e-ns/e2e-svc"
INSTANCE = "inst-1"
VIAS = ("scrape", "scrape_om", "remote_write")
# Histogram of 10 observations: 2 in (0.05, 0.1], 6 in (0.1, 0.25], 2 in (0.25, 0.5].
BOUNDS = [0.05, 0.1, 0.25, 0.5, 1.0]
COUNTS = [0, 2, 6, 2, 0, 0]
# histogram_quantile interpolates linearly inside the bucket holding the rank.
P50 = 0.1 + (0.25 - 0.1) * (5 - 2) / 6      # rank 5 of 10, in (0.1, 0.25]
P95 = 0.25 + (0.5 - 0.25) * (9.5 - 8) / 2   # rank 9.5 of 10, in (0.25, 0.5]


def _kv(k: str, v: str) -> common_pb2.KeyValue:
    return common_pb2.KeyValue(key=k, value=common_pb2.AnyValue(string_value=v))


def _request(metrics: list) -> MetricsRequest:
    resource = resource_pb2.Resource(attributes=[
        _kv("service.name", "e2e-svc"), _kv("service.namespace", "e2e-ns"), _kv("service.instance.id", INSTANCE),
        _kv("host.name", "e2e-host"), _kv("deployment.environment", "test"),
    ])
    scope = common_pb2.InstrumentationScope(name="e2e.prom", version="0.1")
    return MetricsRequest(resource_metrics=[metrics_pb2.ResourceMetrics(
        resource=resource, scope_metrics=[metrics_pb2.ScopeMetrics(scope=scope, metrics=metrics)])])


def _payloads(now: int) -> list[MetricsRequest]:
    sec = 1_000_000_000
    model = [_kv("model", "llama-3")]
    cumulative = metrics_pb2.AGGREGATION_TEMPORALITY_CUMULATIVE
    delta = metrics_pb2.AGGREGATION_TEMPORALITY_DELTA
    first = _request([
        metrics_pb2.Metric(name="llm.kv_cache.usage", unit="1", gauge=metrics_pb2.Gauge(data_points=[
            metrics_pb2.NumberDataPoint(time_unix_nano=now, as_double=0.625, attributes=model)])),
        metrics_pb2.Metric(name="llm.requests", unit="{request}", sum=metrics_pb2.Sum(
            aggregation_temporality=cumulative, is_monotonic=True, data_points=[
                metrics_pb2.NumberDataPoint(start_time_unix_nano=now - 60 * sec, time_unix_nano=now, as_int=42,
                                            attributes=model + [_kv("status", "ok")])])),
        metrics_pb2.Metric(name="gen_ai.server.time_to_first_token", unit="s", histogram=metrics_pb2.Histogram(
            aggregation_temporality=cumulative, data_points=[metrics_pb2.HistogramDataPoint(
                start_time_unix_nano=now - 60 * sec, time_unix_nano=now, count=sum(COUNTS), sum=2.1,
                bucket_counts=COUNTS, explicit_bounds=BOUNDS, attributes=model)])),
        metrics_pb2.Metric(name="llm.output_tokens", unit="{token}", sum=metrics_pb2.Sum(
            aggregation_temporality=delta, is_monotonic=True, data_points=[
                metrics_pb2.NumberDataPoint(start_time_unix_nano=now - 2 * sec, time_unix_nano=now - sec, as_int=3,
                                            attributes=model)])),
    ])
    second = _request([
        metrics_pb2.Metric(name="llm.output_tokens", unit="{token}", sum=metrics_pb2.Sum(
            aggregation_temporality=delta, is_monotonic=True, data_points=[
                metrics_pb2.NumberDataPoint(start_time_unix_nano=now - sec, time_unix_nano=now, as_int=4,
                                            attributes=model)])),
    ])
    return [first, second]


@pytest.fixture
def prometheus_server(tmp_path):
    """Makes (not starts) Prometheus servers; stops them after the test's agents have stopped."""
    servers: list[prom.Prometheus] = []

    def make(scrape: dict[str, str]) -> prom.Prometheus:
        prom.binary()  # skips (or fails under CI=true) without the Debian package
        s = prom.Prometheus(tmp_path, scrape)
        servers.append(s)
        return s

    yield make
    for s in servers:
        s.stop()


def test_scraped_and_remote_written_series_reach_prometheus(prometheus_server, agents):
    text_port, om_port = free_port(), free_port()
    p = prometheus_server({"inferwatch-text": f"127.0.0.1:{text_port}", "inferwatch-om": f"127.0.0.1:{om_port}"})
    p.start()
    exporters = {
        "prometheus/text": {"endpoint": f"127.0.0.1:{text_port}", "const_labels": {"via": "scrape"}},
        "prometheus/om": {"endpoint": f"127.0.0.1:{om_port}", "const_labels": {"via": "scrape_om"},
                          "enable_open_metrics": True},
        "prometheusremotewrite": {
            "endpoint": p.remote_write_url,
            "external_labels": {"via": "remote_write"},
            "timeout": "5s",
            "retry_on_failure": {"enabled": True, "initial_interval": "100ms", "max_interval": "1s",
                                 "max_elapsed_time": "30s"},
        },
    }
    cfg, ports = make_config(exporters, signals=("metrics",))
    a = agents("agent", cfg, ports)

    c = GrpcClient(ports.grpc_endpoint)
    try:
        for req in _payloads(time.time_ns()):
            c.export("metrics", req)
    finally:
        c.close()

    def diag() -> str:
        names = sorted({s["__name__"] + ":" + s.get("via", "") for s in p.series('{via!=""}')})
        return f"targets: {p.targets_health()}\nseries: {names}\nprometheus log:\n{p.log(4000)}"

    def one(expr: str) -> dict | None:
        r = p.query(expr)
        return r[0] if len(r) == 1 else None

    for via in VIAS:
        sel = f'via="{via}",job="{JOB}",instance="{INSTANCE}"'
        # Every series is there with its value (the delta counter as the sum of its two parts).
        checks = {
            f'llm_kv_cache_usage_ratio{{{sel},model="llama-3"}}': 0.625,
            f'llm_requests_total{{{sel},model="llama-3",status="ok"}}': 42,
            f'llm_output_tokens_total{{{sel},model="llama-3"}}': 7,
            f'gen_ai_server_time_to_first_token_seconds_count{{{sel}}}': 10,
            f'gen_ai_server_time_to_first_token_seconds_sum{{{sel}}}': 2.1,
            f'gen_ai_server_time_to_first_token_seconds_bucket{{{sel},le="0.25"}}': 8,
            f'gen_ai_server_time_to_first_token_seconds_bucket{{{sel},le="+Inf"}}': 10,
        }
        for expr, want in checks.items():
            got = prom.wait_until(lambda: (r := one(expr)) and abs(r["value"] - want) < 1e-9 and r, 60,
                                  lambda: f"{expr} == {want}: got {p.query(expr)}\n{diag()}")
            assert got["metric"]["otel_scope_name"] == "e2e.prom", got
            assert got["metric"]["otel_scope_version"] == "0.1", got

        q50 = one(f'histogram_quantile(0.5, gen_ai_server_time_to_first_token_seconds_bucket{{{sel}}})')
        q95 = one(f'histogram_quantile(0.95, gen_ai_server_time_to_first_token_seconds_bucket{{{sel}}})')
        assert q50 is not None and abs(q50["value"] - P50) < 1e-9 and 0.1 < q50["value"] <= 0.25, (via, q50)
        assert q95 is not None and abs(q95["value"] - P95) < 1e-9 and 0.25 < q95["value"] <= 0.5, (via, q95)

        info = prom.wait_until(lambda: one(f"target_info{{{sel}}}"), 30, lambda: f"target_info {via}\n{diag()}")
        labels = dict(info["metric"])
        assert info["value"] == 1
        labels.pop("__name__")
        assert labels == {"via": via, "job": JOB, "instance": INSTANCE, "host_name": "e2e-host",
                          "deployment_environment": "test"}, labels

    # The two ways in carry the same series (names and labels but `via`).
    def keys(via: str) -> set:
        return {tuple(sorted((k, v) for k, v in s.items() if k != "via"))
                for s in p.series(f'{{via="{via}"}}')}
    assert keys("scrape") == keys("remote_write") == keys("scrape_om"), (keys("scrape") ^ keys("remote_write"))
    assert p.targets_health() == {"inferwatch-text": "up", "inferwatch-om": "up"}

    # The agent counted every point as sent and none as failed or dropped.
    a.wait_metric("otelcol_exporter_sent_metric_points_total", lambda v: v == 5, exporter="prometheusremotewrite")
    for e in exporters:
        assert a.metric("otelcol_exporter_send_failed_metric_points_total", exporter=e) == 0, e
        assert a.metric("otelcol_processor_dropped_metric_points_total", processor=e) == 0, e

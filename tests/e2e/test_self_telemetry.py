"""`service.telemetry` as otelcol has it: the agent's own metrics pushed over OTLP by a periodic
reader (gRPC, HTTP/protobuf, HTTP/JSON) with the configured resource, the pull endpoint in text
0.0.4 or OpenMetrics as the scrape's Accept asks (checked with promtool, Python's
prometheus_client parsers and a real Prometheus scrape), and JSON logs.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time

import pytest
import requests

from support import otlp
from support import prometheus as prom
from support.agent import Ports, binary, free_port, make_config, otlp_exporter
from support.client import GrpcClient, trace_request

OM_ACCEPT = "application/openmetrics-text; version=1.0.0; charset=utf-8"
RESOURCE = {"service.name": "edge-7", "k8s.pod.name": "pod-a", "service.version": None}


def config(sink_endpoint: str, telemetry: dict) -> tuple[dict, Ports]:
    """A traces pipeline to `sink_endpoint`, with `telemetry` added to service.telemetry."""
    cfg, ports = make_config({"otlp/sink": otlp_exporter(sink_endpoint)}, signals=("traces",))
    readers = telemetry.get("metrics", {}).get("readers")
    if readers is not None:
        # With readers, the pull endpoint is a reader too (otelcol takes address or readers).
        readers.append({"pull": {"exporter": {"prometheus": {"host": "127.0.0.1", "port": ports.metrics}}}})
        del cfg["service"]["telemetry"]["metrics"]
    cfg["service"]["telemetry"].update(telemetry)
    return cfg, ports


def send_spans(ports: Ports, n: int) -> None:
    c = GrpcClient(ports.grpc_endpoint)
    try:
        c.export("traces", trace_request(n)[0])
    finally:
        c.close()


def pushed(sink, name: str) -> list[tuple[dict, object]]:
    """(resource attributes, metric) for every pushed metric named `name`."""
    return [(otlp.attrs(rm.resource.attributes), m) for rm, _, m in sink.metrics() if m.name == name]


def point_value(p) -> float:
    return p.as_int if p.WhichOneof("value") == "as_int" else p.as_double


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf", "http/json"])
def test_periodic_reader_pushes_every_self_metric_with_the_resource(agents, grpc_sink, http_sink, protocol):
    data_sink = grpc_sink()
    if protocol == "grpc":
        self_sink = grpc_sink()
        exporter = {"protocol": "grpc", "endpoint": self_sink.endpoint, "insecure": True}
    else:
        self_sink = http_sink()
        # No path: the exporter posts to /v1/metrics, as otelcol's does.
        exporter = {"protocol": protocol, "endpoint": self_sink.endpoint,
                    "headers": [{"name": "x-tenant", "value": "edge"}]}
    cfg, ports = config(data_sink.endpoint, {
        "resource": RESOURCE,
        "metrics": {"readers": [{"periodic": {"interval": 300, "timeout": 2000, "exporter": {"otlp": exporter}}}]},
    })
    a = agents("agent", cfg, ports)
    send_spans(ports, 7)
    data_sink.wait_items("traces", 7)

    def accepted() -> list[float]:
        return [point_value(p) for _, m in pushed(self_sink, "otelcol_receiver_accepted_spans")
                for p in m.sum.data_points
                if otlp.attrs(p.attributes) == {"receiver": "otlp", "transport": "grpc"}]

    self_sink.wait_for(lambda: 7 in accepted(), timeout=20, what="otelcol_receiver_accepted_spans = 7 pushed")
    res, m = pushed(self_sink, "otelcol_receiver_accepted_spans")[-1]
    # The configured resource over otelcol's defaults; null removed service.version.
    assert res["service.name"] == "edge-7" and res["k8s.pod.name"] == "pod-a", res
    assert "service.version" not in res, res
    assert len(res["service.instance.id"]) == 36, res
    # Counters are monotonic cumulative sums, gauges gauges, with help text and units.
    assert m.WhichOneof("data") == "sum" and m.sum.is_monotonic, m
    assert m.sum.aggregation_temporality == 2  # CUMULATIVE
    assert m.description == "Items successfully pushed into the pipeline (spans)"
    [(_, cap)] = pushed(self_sink, "otelcol_exporter_queue_capacity")[-1:]
    assert cap.WhichOneof("data") == "gauge", cap
    assert {point_value(p) for p in cap.gauge.data_points
            if otlp.attrs(p.attributes) == {"exporter": "otlp/sink", "data_type": "traces"}} == {1000}
    [(_, up)] = pushed(self_sink, "otelcol_process_uptime")[-1:]
    assert up.unit == "s" and up.sum.is_monotonic and up.sum.data_points[0].as_double > 0, up
    [(_, rss)] = pushed(self_sink, "otelcol_process_memory_rss")[-1:]
    assert rss.unit == "By" and rss.gauge.data_points[0].as_double > 1e6, rss
    # Every family with series on the pull endpoint is pushed, under the same (otelcol's) name.
    from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_om
    text = requests.get(f"http://127.0.0.1:{ports.metrics}/metrics", timeout=5, headers={"Accept": OM_ACCEPT}).text
    pulled = {f.name for f in parse_om(text) if f.samples and f.name != "target"}
    assert len(pulled) > 20, pulled
    names = {m.name for _, _, m in self_sink.metrics()}
    assert pulled <= names, sorted(pulled - names)
    if protocol != "grpc":
        got = self_sink.delivered("metrics")[-1]
        assert got.metadata.get("x-tenant") == "edge", got.metadata
        assert got.content_type == ("application/json" if protocol == "http/json" else "application/x-protobuf")
    # The pull endpoint's target_info carries the same resource.
    info = [line for line in a.metrics_text().splitlines() if line.startswith("target_info{")]
    assert len(info) == 1 and 'service_name="edge-7"' in info[0] and 'k8s_pod_name="pod-a"' in info[0], info
    assert f'service_instance_id="{res["service.instance.id"]}"' in info[0], (info, res)
    assert a.stop() == 0


def test_unreachable_push_endpoint_blocks_nothing(agents, grpc_sink):
    """A periodic reader to a closed port: the pipeline delivers, /metrics answers, shutdown is prompt."""
    sink = grpc_sink()
    dead = f"127.0.0.1:{free_port()}"
    cfg, ports = config(sink.endpoint, {"metrics": {"readers": [
        {"periodic": {"interval": 100, "timeout": 500,
                      "exporter": {"otlp": {"protocol": "grpc", "endpoint": dead, "insecure": True}}}},
    ]}})
    a = agents("agent", cfg, ports)
    for _ in range(5):
        send_spans(ports, 20)
    sink.wait_items("traces", 100)
    a.wait_metric("otelcol_exporter_sent_spans_total", lambda v: v == 100, exporter="otlp/sink")
    rss = [a.metric("otelcol_process_memory_rss")]
    for _ in range(5):
        send_spans(ports, 20)
    sink.wait_items("traces", 200)
    rss.append(a.metric("otelcol_process_memory_rss"))
    assert rss[1] < rss[0] * 1.5, rss
    t0 = time.monotonic()
    assert a.stop() == 0, a.log()[-3000:]
    # The last export is bounded by the reader's timeout (and the SDK's 5 s shutdown wait).
    assert time.monotonic() - t0 < 12, a.log()[-2000:]


def test_openmetrics_and_text_scrapes_parse_with_real_parsers(agents, grpc_sink):
    from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_om
    from prometheus_client.parser import text_string_to_metric_families as parse_text

    sink = grpc_sink()
    cfg, ports = config(sink.endpoint, {"resource": RESOURCE})
    agents("agent", cfg, ports)
    send_spans(ports, 5)
    sink.wait_items("traces", 5)
    url = f"http://127.0.0.1:{ports.metrics}/metrics"

    r = requests.get(url, headers={"Accept": OM_ACCEPT}, timeout=5)
    assert r.headers["Content-Type"] == OM_ACCEPT, r.headers
    assert r.text.endswith("# EOF\n")
    om = {f.name: f for f in parse_om(r.text)}  # raises on any OpenMetrics violation
    assert om["target"].type == "info"
    [info] = om["target"].samples
    assert info.name == "target_info" and info.labels["service_name"] == "edge-7", info
    assert info.labels["k8s_pod_name"] == "pod-a" and "service_version" not in info.labels, info
    spans = om["otelcol_receiver_accepted_spans"]
    assert spans.type == "counter" and spans.documentation == "Items successfully pushed into the pipeline (spans)"
    [s] = [s for s in spans.samples if s.labels == {"receiver": "otlp", "transport": "grpc"}]
    assert (s.name, s.value) == ("otelcol_receiver_accepted_spans_total", 5.0)
    assert om["otelcol_process_cpu_seconds"].unit == "seconds"
    assert om["otelcol_exporter_queue_capacity"].type == "gauge"

    # No Accept (and */*): text 0.0.4, counters named with _total on their TYPE line.
    for headers in ({}, {"Accept": "*/*"}, {"Accept": "text/plain;version=0.0.4;q=0.9,application/openmetrics-text;q=0.5"}):
        r = requests.get(url, headers=headers, timeout=5)
        assert r.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8", (headers, r.headers)
        assert "# EOF" not in r.text and "# UNIT" not in r.text
    text = {f.name: f for f in parse_text(r.text)}
    assert text["otelcol_receiver_accepted_spans"].type == "counter"
    assert "# TYPE otelcol_receiver_accepted_spans_total counter" in r.text
    assert text["target_info"].type == "gauge"
    # q-values decide, not the order.
    r = requests.get(url, headers={"Accept": "text/plain;q=0.2, application/openmetrics-text;q=0.8"}, timeout=5)
    assert r.headers["Content-Type"] == OM_ACCEPT

    promtool = shutil.which("promtool") or "/usr/bin/promtool"
    if not shutil.os.access(promtool, shutil.os.X_OK):
        pytest.skip("promtool not installed (scripts/test.sh installs it)")
    p = subprocess.run([promtool, "check", "metrics"], input=requests.get(url, timeout=5).text,
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stdout + p.stderr


def test_prometheus_scrapes_the_self_metrics(agents, grpc_sink, tmp_path):
    """A real Prometheus (which asks for OpenMetrics first) scrapes the endpoint."""
    prom.binary()
    sink = grpc_sink()
    cfg, ports = config(sink.endpoint, {"resource": RESOURCE})
    agents("agent", cfg, ports)
    send_spans(ports, 3)
    sink.wait_items("traces", 3)
    p = prom.Prometheus(tmp_path, {"inferwatch-self": f"127.0.0.1:{ports.metrics}"})
    p.start()
    try:
        prom.wait_until(lambda: p.targets_health().get("inferwatch-self") == "up", 30,
                        lambda: f"target health {p.targets_health()}")
        got = prom.wait_until(lambda: p.query('otelcol_receiver_accepted_spans_total{transport="grpc"}'), 30,
                              "accepted spans in Prometheus")
        assert got[0]["value"] == 3, got
        info = prom.wait_until(lambda: p.query('target_info{service_name="edge-7"}'), 30, "target_info")
        assert info[0]["metric"]["k8s_pod_name"] == "pod-a", info
    finally:
        p.stop()


def test_json_logs_with_the_configured_level(tmp_path, grpc_sink):
    """logs.encoding: json writes one JSON object per line; logs.level (no --log-level) still filters."""
    from support import yamlgen

    sink = grpc_sink()
    cfg, ports = config(sink.endpoint, {"logs": {"encoding": "json", "level": "warn",
                                                 "disable_stacktrace": False}})
    path = tmp_path / "json.yaml"
    path.write_text(yamlgen.dump(cfg))
    log = tmp_path / "json.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([binary(), "run", "--config", str(path)], stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and proc.poll() is None:
                try:
                    if requests.get(f"http://127.0.0.1:{ports.health}/", timeout=1).status_code == 200:
                        break
                except requests.RequestException:
                    pass
                time.sleep(0.05)  # polling interval while the agent starts
            send_spans(ports, 2)
            sink.wait_items("traces", 2)
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=20) == 0, log.read_text()
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    assert lines, "no log lines"
    assert {line["level"] for line in lines} <= {"WARN", "ERROR"}, lines
    warn = [line for line in lines if "disable_stacktrace" in line["fields"]["message"]]
    assert warn and warn[0]["level"] == "WARN" and "timestamp" in warn[0], lines

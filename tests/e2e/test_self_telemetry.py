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
    families = [f for f in parse_om(text) if f.samples and f.name != "target"]
    pulled = {f.name for f in families}
    assert len(pulled) > 20, pulled
    names = {m.name for _, _, m in self_sink.metrics()}
    assert pulled <= names, sorted(pulled - names)
    # The same values: the pipeline's counters and gauges (still now that the traffic is
    # delivered) read the same in the latest push as on the pull endpoint.
    stable = [f for f in families if f.name.startswith(("otelcol_receiver_", "otelcol_exporter_"))]
    want = {(f.name, tuple(sorted(s.labels.items()))): s.value for f in stable for s in f.samples}
    assert want[("otelcol_exporter_sent_spans", (("exporter", "otlp/sink"),))] == 7, want

    def latest() -> dict:
        got = {}
        for _, _, m in self_sink.metrics():  # in arrival order: later pushes overwrite
            for p in otlp.data_points(m):
                got[(m.name, tuple(sorted(otlp.attrs(p.attributes).items())))] = float(point_value(p))
        return got

    self_sink.wait_for(lambda: all(latest().get(k) == v for k, v in want.items()), timeout=20,
                       what=f"pushed values equal to /metrics {want}")
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
        sent = prom.wait_until(lambda: p.query('otelcol_exporter_sent_spans_total{exporter="otlp/sink"}'), 30,
                               "sent spans in Prometheus")
        assert sent[0]["value"] == 3, sent
        cap = p.query('otelcol_exporter_queue_capacity{exporter="otlp/sink",data_type="traces"}')
        assert [c["value"] for c in cap] == [1000], cap
        info = prom.wait_until(lambda: p.query('target_info{service_name="edge-7"}'), 30, "target_info")
        assert info[0]["metric"]["k8s_pod_name"] == "pod-a", info
        assert "service_version" not in info[0]["metric"], info
        # Prometheus negotiated OpenMetrics: its metadata has the OpenMetrics family name of a
        # counter (no _total; text 0.0.4 would give otelcol_receiver_accepted_spans_total) and
        # units, which only OpenMetrics carries.
        meta = prom.wait_until(lambda: p._get("/api/v1/metadata", {"metric": "otelcol_process_cpu_seconds"}), 30,
                               "metadata of otelcol_process_cpu_seconds")
        assert meta["otelcol_process_cpu_seconds"][0]["type"] == "counter", meta
        assert meta["otelcol_process_cpu_seconds"][0]["unit"] == "seconds", meta
        spans = p._get("/api/v1/metadata", {"metric": "otelcol_receiver_accepted_spans"})
        assert spans["otelcol_receiver_accepted_spans"][0]["help"] == \
            "Items successfully pushed into the pipeline (spans)", spans
        assert not p._get("/api/v1/metadata", {"metric": "otelcol_receiver_accepted_spans_total"}), \
            "text 0.0.4 was scraped, not OpenMetrics"
        up = p.query('up{job="inferwatch-self"}')
        assert [u["value"] for u in up] == [1], up
    finally:
        p.stop()


def run_until_healthy(cfg: dict, ports: Ports, tmp_path, sink, name: str) -> tuple[str, str]:
    """Runs the agent on `cfg` until its health check answers, sends 2 spans, stops it with
    SIGTERM (exit 0); returns its stdout and stderr."""
    from support import yamlgen

    path = tmp_path / f"{name}.yaml"
    path.write_text(yamlgen.dump(cfg))
    out_path, err_path = tmp_path / f"{name}.stdout", tmp_path / f"{name}.stderr"
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        proc = subprocess.Popen([binary(), "run", "--config", str(path)], stdout=out, stderr=err,
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
            code = proc.wait(timeout=20)
    assert code == 0, err_path.read_text()
    return out_path.read_text(), err_path.read_text()


def test_json_logs_every_line_to_every_output_with_the_initial_fields(tmp_path, grpc_sink):
    """logs.encoding: json: every stderr line is one JSON object with timestamp, level and message
    at the top level and the initial_fields; a file in output_paths gets the same lines."""
    sink = grpc_sink()
    logfile = tmp_path / "logs" / "agent.log"
    logfile.parent.mkdir()
    cfg, ports = config(sink.endpoint, {"logs": {
        "encoding": "json", "level": "info", "disable_stacktrace": False,
        "output_paths": ["stderr", str(logfile)], "initial_fields": {"cluster": "eu-1", "shard": 3},
    }})
    out, err = run_until_healthy(cfg, ports, tmp_path, sink, "json")
    assert out == "", out
    lines = [json.loads(line) for line in err.splitlines()]  # raises on any line that is not JSON
    assert len(lines) >= 3, err
    for line in lines:
        assert isinstance(line, dict), line
        assert {"timestamp", "level", "message"} <= line.keys(), line
        assert line["level"] in {"ERROR", "WARN", "INFO"}, line
        assert (line["cluster"], line["shard"]) == ("eu-1", 3), line
        assert "fields" not in line and "target" not in line, line
    assert any(line["level"] == "INFO" for line in lines), lines
    [warn] = [line for line in lines if "disable_stacktrace" in line["message"]]
    assert warn["level"] == "WARN", warn
    # The file holds the same lines as stderr.
    assert logfile.read_text() == err


def test_log_level_and_stdout_output(tmp_path, grpc_sink):
    """logs.level: warn filters (no --log-level); output_paths: [stdout] leaves stderr empty;
    a console line carries the initial_fields at its end."""
    sink = grpc_sink()
    cfg, ports = config(sink.endpoint, {"logs": {"level": "warn", "disable_stacktrace": False,
                                                 "output_paths": ["stdout"], "initial_fields": {"cluster": "eu-1"}}})
    out, err = run_until_healthy(cfg, ports, tmp_path, sink, "console")
    assert err == "", err
    lines = out.splitlines()
    assert lines, "no log lines"
    assert all(" INFO " not in line for line in lines), out
    [warn] = [line for line in lines if "disable_stacktrace" in line]
    assert " WARN " in warn and warn.endswith(' cluster="eu-1"'), warn


def test_a_log_file_that_cannot_be_opened_stops_the_start(tmp_path, grpc_sink):
    from support import yamlgen

    sink = grpc_sink()
    bad = tmp_path / "missing-dir" / "agent.log"
    cfg, _ = config(sink.endpoint, {"logs": {"output_paths": [str(bad)]}})
    path = tmp_path / "bad.yaml"
    path.write_text(yamlgen.dump(cfg))
    r = subprocess.run([binary(), "run", "--config", str(path)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2, r.stderr
    assert f"service.telemetry.logs.output_paths: cannot open {bad}" in r.stderr, r.stderr

"""Self-telemetry: otelcol-named counters with exact counts, and the health_check extension."""

from __future__ import annotations

import requests

from support.agent import Ports, make_config, otlp_exporter
from support.client import GrpcClient, http_post, logs_request, metrics_request, trace_request


def test_counts_after_known_traffic(agents, grpc_sink):
    sink = grpc_sink()
    cfg, ports = make_config({"otlp/sink": otlp_exporter(sink.endpoint, sending_queue={
        "enabled": True, "num_consumers": 3, "queue_size": 123})})
    a = agents("agent", cfg, ports)
    c = GrpcClient(ports.grpc_endpoint)
    try:
        for n in (10, 20, 7):
            c.export("traces", trace_request(n)[0])
        c.export("metrics", metrics_request(5))
    finally:
        c.close()
    assert http_post(ports.http_url, "traces", trace_request(11)[0]).status_code == 200
    assert http_post(ports.http_url, "logs", logs_request(4)).status_code == 200
    sink.wait_items("traces", 48)
    sink.wait_items("metrics", 5)
    sink.wait_items("logs", 4)
    # The exporter counts after the sink answered; wait for the counter rather than assume.
    a.wait_metric("otelcol_exporter_sent_log_records_total", lambda v: v == 4, exporter="otlp/sink")
    a.wait_metric("otelcol_exporter_sent_spans_total", lambda v: v == 48, exporter="otlp/sink")

    r = requests.get(f"http://127.0.0.1:{ports.metrics}/metrics", timeout=5,
                     headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    assert r.status_code == 200
    assert r.headers.get("Content-Type", "").startswith("application/openmetrics-text; version=1.0.0"), r.headers
    text = r.text
    assert text.rstrip().endswith("# EOF"), text[-200:]
    assert "# TYPE otelcol_receiver_accepted_spans counter" in text

    m = a.metric
    assert m("otelcol_receiver_accepted_spans_total", receiver="otlp", transport="grpc") == 37
    assert m("otelcol_receiver_accepted_spans_total", receiver="otlp", transport="http") == 11
    assert m("otelcol_receiver_accepted_metric_points_total", receiver="otlp", transport="grpc") == 5
    assert m("otelcol_receiver_accepted_log_records_total", receiver="otlp", transport="http") == 4
    assert m("otelcol_receiver_accepted_log_records_total", receiver="otlp", transport="grpc") == 0
    assert m("otelcol_receiver_refused_spans_total", receiver="otlp") == 0
    assert m("otelcol_exporter_sent_spans_total", exporter="otlp/sink") == 48
    assert m("otelcol_exporter_sent_metric_points_total", exporter="otlp/sink") == 5
    assert m("otelcol_exporter_sent_log_records_total", exporter="otlp/sink") == 4
    assert m("otelcol_exporter_send_failed_spans_total", exporter="otlp/sink") == 0
    assert m("otelcol_exporter_enqueue_failed_spans_total", exporter="otlp/sink") == 0
    for sig in ("traces", "metrics", "logs"):
        assert m("otelcol_exporter_queue_capacity", exporter="otlp/sink", data_type=sig) == 123
        assert m("otelcol_exporter_queue_size", exporter="otlp/sink", data_type=sig) == 0
    # Counts match what the sink actually got.
    assert sink.item_count("traces") == 48

    names = {s.name for s in a.samples()}
    for n in ("otelcol_process_memory_rss", "otelcol_process_cpu_seconds_total"):
        assert n in names, f"{n} missing"
    rss = m("otelcol_process_memory_rss")
    proc_rss = a.proc_status()["VmRSS"] * 1024
    assert 0.5 * proc_rss < rss < 2 * proc_rss, (rss, proc_rss)
    assert m("otelcol_process_cpu_seconds_total") >= 0  # clock-tick resolution: may still read 0


def test_failed_sends_are_counted(agents):
    """A dead exporter with retries off: everything it got counts as send_failed."""
    from support.agent import free_port

    cfg, ports = make_config({"otlp/dead": otlp_exporter(f"127.0.0.1:{free_port()}", retry_on_failure={"enabled": False})},
                             signals=("traces",))
    a = agents("agent", cfg, ports)
    c = GrpcClient(ports.grpc_endpoint)
    try:
        c.export("traces", trace_request(9)[0])
        c.export("traces", trace_request(4)[0])
    finally:
        c.close()
    a.wait_metric("otelcol_exporter_send_failed_spans_total", lambda v: v == 13, exporter="otlp/dead")
    assert a.metric("otelcol_exporter_sent_spans_total", exporter="otlp/dead") == 0


def test_health_check(agents, grpc_sink):
    sink = grpc_sink()
    cfg, ports = make_config({"otlp/sink": otlp_exporter(sink.endpoint)})
    a = agents("agent", cfg, ports)
    r = requests.get(f"http://127.0.0.1:{ports.health}/", timeout=2)
    assert r.status_code == 200, r.text
    assert a.running()


def test_health_check_custom_path(agents, grpc_sink):
    sink = grpc_sink()
    ports = Ports()
    cfg, _ = make_config({"otlp/sink": otlp_exporter(sink.endpoint)}, ports=ports, health=False)
    cfg["extensions"] = {"health_check/custom": {"endpoint": f"127.0.0.1:{ports.health}", "path": "/health/status"}}
    cfg["service"]["extensions"] = ["health_check/custom"]
    a = agents("agent", cfg, ports, start=False)
    a.start(wait=False)
    # wait_ready polls `/`, which this agent does not serve: poll the custom path instead.
    import time

    deadline = time.monotonic() + 20
    code = None
    while time.monotonic() < deadline and a.running():
        try:
            code = requests.get(f"http://127.0.0.1:{ports.health}/health/status", timeout=1).status_code
            if code == 200:
                break
        except requests.RequestException:
            pass
        time.sleep(0.05)  # polling interval
    assert code == 200, a.log()
    assert requests.get(f"http://127.0.0.1:{ports.health}/", timeout=2).status_code == 404


def test_telemetry_can_be_turned_off(agents, grpc_sink):
    sink = grpc_sink()
    cfg, ports = make_config({"otlp/sink": otlp_exporter(sink.endpoint)})
    cfg["service"]["telemetry"] = {"metrics": {"level": "none"}}
    agents("agent", cfg, ports)
    try:
        requests.get(f"http://127.0.0.1:{ports.metrics}/metrics", timeout=2)
        raise AssertionError("metrics served although level: none")
    except requests.ConnectionError:
        pass


def test_log_level_flag(agents, grpc_sink):
    sink = grpc_sink()
    cfg, ports = make_config({"otlp/sink": otlp_exporter(sink.endpoint)})
    quiet = agents("quiet", cfg, ports, log_level="warn")
    assert quiet.stop() == 0
    assert " INFO " not in quiet.log(), quiet.log()
    cfg, ports = make_config({"otlp/sink": otlp_exporter(sink.endpoint)})
    loud = agents("loud", cfg, ports, log_level="debug")
    assert loud.stop() == 0
    assert " INFO " in loud.log() and " DEBUG " in loud.log(), loud.log()[-2000:]

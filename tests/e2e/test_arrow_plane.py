"""The Arrow data plane end to end: conversions counted (none on a pass-through pipeline),
event time with late data counted and excluded, window_stats output, replay determinism, and
a replay killed with SIGKILL that resumes from its checkpoint with the same derived output."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from support import yamlgen
from support.agent import Ports, free_port, make_config, otlp_exporter, parse_openmetrics
from support.client import GrpcClient, _kv, trace_request
from support.otlp import MetricsRequest, iter_metrics, data_points
from opentelemetry.proto.metrics.v1 import metrics_pb2
from opentelemetry.proto.resource.v1 import resource_pb2

REPO = Path(__file__).resolve().parents[2]
T0 = 1_767_225_600_000_000_000  # 2026-01-01T00:00:00Z
S = 1_000_000_000


def gauge_request(points: list[tuple[int, float]], name: str = "llm.ttft", series: str = "a") -> MetricsRequest:
    """One gauge with points (offset seconds from T0, value) of one series."""
    pts = [metrics_pb2.NumberDataPoint(as_double=v, time_unix_nano=T0 + off * S, attributes=[_kv("series", series)])
           for off, v in points]
    return MetricsRequest(resource_metrics=[metrics_pb2.ResourceMetrics(
        resource=resource_pb2.Resource(attributes=[_kv("service.name", "vllm")]),
        scope_metrics=[metrics_pb2.ScopeMetrics(metrics=[metrics_pb2.Metric(
            name=name, unit="s", gauge=metrics_pb2.Gauge(data_points=pts))])],
    )])


def conversions(agent) -> float:
    return sum(s.value for s in agent.samples() if s.name == "inferwatch_arrow_conversions_total")


def test_pass_through_pipeline_makes_no_arrow_conversion(agents, grpc_sink):
    sink = grpc_sink()
    cfg, ports = make_config({"otlp/sink": otlp_exporter(sink.endpoint)}, signals=("traces", "metrics"))
    a = agents("passthrough", cfg, ports)
    c = GrpcClient(ports.grpc_endpoint)
    try:
        for _ in range(3):
            c.export("traces", trace_request(50)[0])
            c.export("metrics", gauge_request([(i, float(i)) for i in range(20)]))
    finally:
        c.close()
    sink.wait_items("traces", 150)
    sink.wait_items("metrics", 60)
    a.wait_metric("otelcol_exporter_sent_metric_points_total", lambda v: v == 60, exporter="otlp/sink")
    assert conversions(a) == 0
    assert "inferwatch_arrow_conversions_total{" not in a.metrics_text()


def test_adjacent_arrow_processors_convert_each_batch_once(agents, grpc_sink):
    sink = grpc_sink()
    cfg, ports = make_config(
        {"otlp/sink": otlp_exporter(sink.endpoint)},
        signals=("metrics",),
        processors={"window_stats/a": {"window": "10s"}, "window_stats/b": {"window": "1m", "stats": ["count"]}},
        pipeline_processors=("window_stats/a", "window_stats/b"),
    )
    a = agents("twoarrow", cfg, ports)
    c = GrpcClient(ports.grpc_endpoint)
    try:
        for k in range(5):
            c.export("metrics", gauge_request([(k * 30 + i, float(i)) for i in range(10)]))
    finally:
        c.close()
    # 50 input points pass unchanged; derived windows follow.
    sink.wait_for(lambda: sum(1 for _, _, m in sink.metrics() if m.name == "llm.ttft") >= 1, 20, "input")
    a.wait_metric("inferwatch_arrow_derived_points_total", lambda v: v > 0, processor="window_stats/a")
    # One conversion per request for both processors together (one stage), never two.
    assert conversions(a) == 5
    names = {m.name for _, _, m in sink.metrics()}
    assert "llm.ttft.window.p95" in names and "llm.ttft.window.count" in names


def test_late_points_are_counted_and_excluded(agents, grpc_sink):
    sink = grpc_sink()
    cfg, ports = make_config(
        {"otlp/sink": otlp_exporter(sink.endpoint)},
        signals=("metrics",),
        processors={"window_stats": {"window": "10s", "allowed_lateness": "5s", "stats": ["count", "max"]}},
        pipeline_processors=("window_stats",),
    )
    a = agents("late", cfg, ports)
    c = GrpcClient(ports.grpc_endpoint)
    try:
        # In order: 0..9 s (window [0,10)), then 12 s: watermark 7 s.
        c.export("metrics", gauge_request([(i, 1.0) for i in range(10)]))
        c.export("metrics", gauge_request([(12, 1.0)]))
        # 3 s is below the watermark (7 s): late, excluded. 8 s is above it: on time, counted.
        c.export("metrics", gauge_request([(3, 100.0)]))
        c.export("metrics", gauge_request([(8, 50.0)]))
        # 25 s moves the watermark to 20 s: window [0,10) and [10,20) close.
        c.export("metrics", gauge_request([(25, 1.0)]))
    finally:
        c.close()
    a.wait_metric("inferwatch_arrow_late_items_total", lambda v: v == 1, pipeline="metrics")

    def window(stat: str, end_s: int):
        for _, _, m in sink.metrics():
            if m.name == f"llm.ttft.window.{stat}":
                for p in data_points(m):
                    if p.time_unix_nano == T0 + end_s * S:
                        return p
        return None

    sink.wait_for(lambda: window("count", 20) is not None, 20, "window [10,20) emitted")
    first = window("count", 10)
    assert first is not None and first.as_int == 11  # 10 in-order points + the on-time 8 s point
    assert window("max", 10).as_double == 50.0  # the late 100.0 never entered the window
    assert window("count", 20).as_int == 1
    assert window("count", 30) is None  # [20,30) is still open (watermark 20 s)
    # Every input point, late or not, was passed on unchanged. The exporter's queue has several
    # consumers, so the last input request may reach the sink after the derived windows: wait for it.
    def raw():
        return [p for _, _, m in sink.metrics() if m.name == "llm.ttft" for p in data_points(m)]

    sink.wait_for(lambda: len(raw()) >= 14, 20, "all 14 input points passed on")
    assert len(raw()) == 14


# ---- replay ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def recording(tmp_path_factory, inferwatch_bin) -> Path:
    """A simulator scenario's OTLP JSON-lines output (a few simulated hours of metrics)."""
    out = tmp_path_factory.mktemp("rec")
    scenario = out / "scenario.yaml"
    base = (REPO / "scenarios" / "healthy_l4_busy.yaml").read_text()
    scenario.write_text(base.replace("duration: 7d", "duration: 2d"))
    r = subprocess.run([inferwatch_bin, "sim", "--scenario", str(scenario), "--out", str(out / "sim")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    metrics = out / "sim" / "metrics.jsonl"
    assert metrics.stat().st_size > 0
    return metrics


def replay_config(out: Path, storage: Path | None, metrics_port: int, interval: str = "100ms") -> dict:
    cfg = {
        "receivers": {"replay": {"batch_size": 2048}},
        "processors": {"window_stats": {"window": "5m", "allowed_lateness": "0s"}},
        "exporters": {"parquet": {"directory": str(out)}},
        "service": {
            "telemetry": {"metrics": {"address": f"127.0.0.1:{metrics_port}"}},
            "pipelines": {"metrics": {"receivers": ["replay"], "processors": ["window_stats"], "exporters": ["parquet"]}},
        },
    }
    if storage is not None:
        cfg["extensions"] = {"storage": {"directory": str(storage), "checkpoint_interval": interval}}
        cfg["service"]["extensions"] = ["storage"]
    return cfg


def files(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*.parquet"))}


def run_replay(bin_: str, cfg: dict, workdir: Path, inputs: list[Path], *args) -> subprocess.CompletedProcess:
    path = workdir / "replay.yaml"
    path.write_text(yamlgen.dump(cfg))
    return subprocess.run([bin_, "replay", "--config", str(path), *[a for i in inputs for a in ("--input", str(i))], *args],
                          capture_output=True, text=True, timeout=300)


def derived_rows(d: Path) -> list[tuple]:
    """(metric, series, window end, value) of every derived window point in the recording."""
    rows = []
    for p in sorted(d.rglob("*.parquet")):
        t = pq.read_table(p, columns=["metric_name", "series_id", "time_unix_nano", "value", "int_value"]).to_pylist()
        for r in t:
            if ".window." in r["metric_name"]:
                v = r["int_value"] if r["int_value"] is not None else r["value"]
                rows.append((r["metric_name"], r["series_id"], r["time_unix_nano"], v))
    return rows


def input_rows(d: Path) -> list[tuple]:
    rows = []
    for p in sorted(d.rglob("*.parquet")):
        for r in pq.read_table(p, columns=["metric_name", "series_id", "time_unix_nano", "value"]).to_pylist():
            if ".window." not in r["metric_name"]:
                rows.append((r["metric_name"], r["series_id"], r["time_unix_nano"], r["value"]))
    return rows


def test_replay_twice_gives_byte_identical_output(inferwatch_bin, recording, tmp_path):
    outs = []
    for k in range(2):
        out = tmp_path / f"out{k}"
        r = run_replay(inferwatch_bin, replay_config(out, None, free_port()), tmp_path, [recording])
        assert r.returncode == 0, r.stdout + r.stderr
        outs.append(files(out))
    assert outs[0], "no parquet written"
    assert outs[0] == outs[1]
    rows = derived_rows(tmp_path / "out0")
    assert len(rows) > 100, "window_stats derived nothing"


def test_replay_killed_midway_resumes_to_the_same_output(inferwatch_bin, recording, tmp_path):
    # The uninterrupted reference run.
    ref = tmp_path / "ref"
    r = run_replay(inferwatch_bin, replay_config(ref, tmp_path / "ref-state", free_port()), tmp_path, [recording])
    assert r.returncode == 0, r.stdout + r.stderr

    out, state = tmp_path / "out", tmp_path / "state"
    port = free_port()
    cfg = replay_config(out, state, port, interval="50ms")
    (tmp_path / "kill.yaml").write_text(yamlgen.dump(cfg))
    # Paced so that it is still running when killed; the kill waits for checkpoints, not for time.
    p = subprocess.Popen([inferwatch_bin, "replay", "--config", str(tmp_path / "kill.yaml"), "--input", str(recording),
                          "--speed", "20000"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    import requests
    import time as _t
    deadline = _t.monotonic() + 120
    killed = False
    while _t.monotonic() < deadline and p.poll() is None:
        try:
            text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
        except requests.RequestException:
            _t.sleep(0.05)
            continue
        ok = sum(s.value for s in parse_openmetrics(text)
                 if s.name == "inferwatch_checkpoints_total" and s.labels.get("result") == "ok")
        items = sum(s.value for s in parse_openmetrics(text) if s.name == "inferwatch_replay_items_total")
        if ok >= 3 and items > 0:
            p.send_signal(signal.SIGKILL)
            killed = True
            break
        _t.sleep(0.05)
    p.wait(timeout=30)
    assert killed, "replay finished before it could be killed; slow it down"
    partial = input_rows(out)
    # Resume: same command, same storage and output directories.
    r = run_replay(inferwatch_bin, cfg, tmp_path, [recording])
    assert r.returncode == 0, r.stdout + r.stderr
    assert not list(out.rglob("*.inprogress"))
    ref_derived, got_derived = derived_rows(ref), derived_rows(out)
    # At-least-once: every reference window is there; any extra row is an exact duplicate.
    assert set(got_derived) == set(ref_derived)
    assert len(got_derived) >= len(ref_derived)
    assert set(input_rows(out)) == set(input_rows(ref))
    assert len(input_rows(out)) >= len(input_rows(ref)) > len(partial)


def test_arrow_exporter_reuses_the_stage_conversion(agents, grpc_sink, tmp_path):
    sink = grpc_sink()
    rec = tmp_path / "rec"
    cfg, ports = make_config(
        {"otlp/sink": otlp_exporter(sink.endpoint), "parquet": {"directory": str(rec)}},
        signals=("metrics",),
        processors={"window_stats": {"window": "10s", "stats": ["count"]}},
        pipeline_processors=("window_stats",),
    )
    a = agents("reuse", cfg, ports)
    c = GrpcClient(ports.grpc_endpoint)
    try:
        for k in range(4):
            c.export("metrics", gauge_request([(k * 10 + i, float(i)) for i in range(10)]))
    finally:
        c.close()
    # Windows [0,10), [10,20), [20,30) closed: 3 derived points after the 40 inputs.
    sink.wait_for(lambda: sum(len(data_points(m)) for _, _, m in sink.metrics()) >= 43, 20, "input and derived")
    by_component = {s.labels.get("component"): s.value for s in a.samples()
                    if s.name == "inferwatch_arrow_conversions_total" and s.value > 0}
    # The stage converted each request once; the parquet exporter reused the stage's batches.
    assert by_component == {"stage metrics/window_stats": 4}, by_component
    assert a.stop() == 0
    # Without a storage extension, shutdown emits the still-open window [30,40) too.
    rows = sum(pq.read_table(p).num_rows for p in rec.rglob("*.parquet"))
    assert rows == 44

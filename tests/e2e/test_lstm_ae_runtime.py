"""lstm_ae without ONNX Runtime: with `on_missing_runtime: disable` the agent runs healthy, the other
pipelines deliver and the self-metric says 0; with the default `fail` the agent refuses to start
with one error naming what was looked for and the fix. The runtime is pointed at a missing file,
so the tests do not depend on what the machine has."""

from __future__ import annotations

import subprocess

from support import yamlgen
from support.agent import binary, free_port, make_config, otlp_exporter
from support.client import GrpcClient, trace_request

ROOT_MODEL = "models/lstm_ae_default.onnx"


def _with_lstm(cfg: dict, ports, on_missing: str, model: str) -> dict:
    cfg["processors"]["lstm_ae"] = {
        "model": model, "runtime_library": "/nonexistent/libonnxruntime.so.1.31.1", "on_missing_runtime": on_missing,
    }
    cfg["receivers"]["otlp/detect"] = {"protocols": {"grpc": {"endpoint": f"127.0.0.1:{free_port()}"}}}
    cfg["exporters"]["debug"] = {}
    cfg["service"]["pipelines"]["metrics/detect"] = {
        "receivers": ["otlp/detect"], "processors": ["lstm_ae"], "exporters": ["debug"]}
    return cfg


def test_disabled_lstm_ae_leaves_the_agent_healthy(agents, grpc_sink):
    import pathlib
    model = str(pathlib.Path(__file__).resolve().parents[2] / ROOT_MODEL)
    sink = grpc_sink()
    cfg, ports = make_config({"otlp/sink": otlp_exporter(sink.endpoint)}, signals=("traces",))
    cfg = _with_lstm(cfg, ports, "disable", model)
    a = agents("agent", cfg, ports)
    assert a.health() == 200
    c = GrpcClient(ports.grpc_endpoint)
    try:
        c.export("traces", trace_request(25)[0])
    finally:
        c.close()
    sink.wait_items("traces", 25)
    a.wait_metric("inferwatch_lstm_ae_runtime_available", lambda v: v == 0, processor="lstm_ae")
    log = a.log()
    assert "lstm_ae disabled" in log and "/nonexistent/libonnxruntime.so.1.31.1" in log, log[-2000:]


def test_missing_runtime_fails_the_start_with_the_fix(tmp_path):
    import pathlib
    model = str(pathlib.Path(__file__).resolve().parents[2] / ROOT_MODEL)
    cfg, ports = make_config({"debug": {}}, signals=("traces",))
    cfg = _with_lstm(cfg, ports, "fail", model)
    path = tmp_path / "agent.yaml"
    path.write_text(yamlgen.dump(cfg))
    r = subprocess.run([binary(), "run", "--config", str(path)], capture_output=True, text=True, timeout=60,
                       stdin=subprocess.DEVNULL)
    assert r.returncode != 0
    err = r.stdout + r.stderr
    assert "/nonexistent/libonnxruntime.so.1.31.1" in err, err[-3000:]
    assert "scripts/test.sh" in err or "ORT_DYLIB_PATH" in err, err[-3000:]

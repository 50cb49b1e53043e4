"""Pipeline shapes: batching and splitting keep every item with its own resource and scope,
the forward connector, fan-out to several pipelines, merged config files and env vars at run time."""

from __future__ import annotations

import collections
import threading

from google.protobuf.json_format import MessageToDict

from support import otlp
from support.agent import Ports, make_config, otlp_exporter
from support.client import GrpcClient, _kv, metrics_request, trace_request
from support.yamlgen import dump


def span_origin(res, scope, span) -> tuple:
    return (otlp.attrs(res.resource.attributes)["service.name"], scope.scope.name, span.name)


def test_batching_keeps_resources_and_scopes_apart(agents, grpc_sink):
    """Interleaved requests from 3 services x 2 scopes are merged by batch; no span changes owner."""
    sink = grpc_sink()
    cfg, ports = make_config({"otlp/sink": otlp_exporter(sink.endpoint)}, signals=("traces",),
                             batch={"timeout": "300ms", "send_batch_size": 200})
    agents("agent", cfg, ports)
    sent = {}

    def sender(svc: str) -> None:
        c = GrpcClient(ports.grpc_endpoint)
        try:
            for i in range(20):
                req, ids = trace_request(7, service=svc, name=f"{svc}-r{i}")
                req.resource_spans[0].resource.attributes.append(_kv("svc.index", i))
                req.resource_spans[0].scope_spans[0].scope.name = f"scope-{i % 2}"
                c.export("traces", req)
                for sid, (_, sc, sp) in zip(ids, otlp.iter_spans(req)):
                    sent[sid] = ((svc, sc.scope.name, sp.name), i)
        finally:
            c.close()

    threads = [threading.Thread(target=sender, args=(f"svc-{k}",)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(sent) == 3 * 20 * 7
    sink.wait_span_ids(sent.keys())
    got = {}
    for res, scope, span in sink.spans():
        assert span.span_id not in got, "span delivered twice"
        got[span.span_id] = (span_origin(res, scope, span), otlp.attrs(res.resource.attributes)["svc.index"])
    assert got == sent
    # Batching did merge: fewer requests than were sent.
    assert len(sink.delivered("traces")) < 60, sink.summary()


def _max_size_agent(agents, grpc_sink, signal):
    sink = grpc_sink()
    cfg, ports = make_config({"otlp/sink": otlp_exporter(sink.endpoint)}, signals=(signal,),
                             batch={"timeout": "200ms", "send_batch_size": 1000, "send_batch_max_size": 1000})
    agents("agent", cfg, ports)
    return sink, ports


def test_send_batch_max_size_splits_large_span_requests(agents, grpc_sink):
    sink, ports = _max_size_agent(agents, grpc_sink, "traces")
    req, ids = trace_request(2500, name="split")
    c = GrpcClient(ports.grpc_endpoint)
    try:
        c.export("traces", req)
    finally:
        c.close()
    sink.wait_span_ids(ids)
    sizes = [at.items for at in sink.delivered("traces")]
    assert max(sizes) <= 1000 and sum(sizes) == 2500, sizes
    want = {MessageToDict(s)["spanId"]: MessageToDict(s) for _, _, s in otlp.iter_spans(req)}
    assert {MessageToDict(s)["spanId"]: MessageToDict(s) for _, _, s in sink.spans()} == want


def test_send_batch_max_size_splits_one_big_metric(agents, grpc_sink):
    """One gauge with 2500 points and send_batch_max_size 1000: otelcol splits the points of the
    metric across batches (each part keeps the metric's name and type); no batch may exceed the max."""
    sink, ports = _max_size_agent(agents, grpc_sink, "metrics")
    c = GrpcClient(ports.grpc_endpoint)
    try:
        c.export("metrics", metrics_request(2500))
    finally:
        c.close()
    sink.wait_items("metrics", 2500)
    points = [(mm.name, p.as_int) for _, _, mm in sink.metrics() for p in otlp.data_points(mm)]
    assert sorted(points) == sorted(("e2e.gauge", i) for i in range(2500))
    assert all(mm.HasField("gauge") for _, _, mm in sink.metrics())
    sizes = [at.items for at in sink.delivered("metrics")]
    assert max(sizes) <= 1000, f"batches of {sizes} points; send_batch_max_size is 1000"


def test_forward_connector_and_fan_out(agents, grpc_sink):
    """otlp -> traces/in -> forward -> traces/out -> sink A, and otlp -> traces/copy -> sink B."""
    sink_a, sink_b = grpc_sink(), grpc_sink()
    ports = Ports()
    cfg = {
        "receivers": {"otlp": {"protocols": {"grpc": {"endpoint": ports.grpc_endpoint}}}},
        "processors": {"batch": {"timeout": "100ms"}},
        "exporters": {"otlp/a": otlp_exporter(sink_a.endpoint), "otlp/b": otlp_exporter(sink_b.endpoint)},
        "connectors": {"forward": None},
        "extensions": {"health_check": {"endpoint": f"127.0.0.1:{ports.health}"}},
        "service": {
            "extensions": ["health_check"],
            "telemetry": {"metrics": {"address": f"127.0.0.1:{ports.metrics}"}},
            "pipelines": {
                "traces/in": {"receivers": ["otlp"], "exporters": ["forward"]},
                "traces/out": {"receivers": ["forward"], "processors": ["batch"], "exporters": ["otlp/a"]},
                "traces/copy": {"receivers": ["otlp"], "exporters": ["otlp/b"]},
            },
        },
    }
    agents("agent", cfg, ports)
    req, ids = trace_request(25, name="fwd")
    c = GrpcClient(ports.grpc_endpoint)
    try:
        c.export("traces", req)
    finally:
        c.close()
    sink_a.wait_span_ids(ids)
    sink_b.wait_span_ids(ids)
    want = sorted(MessageToDict(s)["spanId"] for _, _, s in otlp.iter_spans(req))
    for sink in (sink_a, sink_b):
        got = collections.Counter(MessageToDict(s)["spanId"] for _, _, s in sink.spans())
        assert sorted(got) == want and set(got.values()) == {1}


def test_merged_config_files_and_env_at_run_time(agents, grpc_sink, tmp_path):
    """A base file pointing nowhere, an override pointing at the sink through ${env:...}."""
    sink = grpc_sink()
    cfg, ports = make_config({"otlp/out": otlp_exporter("127.0.0.1:9")}, signals=("logs",))
    (tmp_path / "override.yaml").write_text(dump({
        "exporters": {"otlp/out": {"endpoint": "${env:INFERWATCH_E2E_SINK}", "headers": {"x-from": "override"}}},
    }))
    a = agents("agent", cfg, ports, start=False, extra_args=("--config", str(tmp_path / "override.yaml")),
               env={"INFERWATCH_E2E_SINK": sink.endpoint})
    a.start()
    from support.client import logs_request

    c = GrpcClient(ports.grpc_endpoint)
    try:
        c.export("logs", logs_request(3))
    finally:
        c.close()
    sink.wait_items("logs", 3)
    assert all(at.metadata.get("x-from") == "override" for at in sink.delivered("logs"))
    # The override merged into the base: the base's queue and retry settings still apply.
    assert a.metric("otelcol_exporter_queue_capacity", exporter="otlp/out", data_type="logs") == 1000


def test_otlp_exporter_endpoint_forms(agents, grpc_sink):
    """`host:port` with tls.insecure, and `http://host:port` (plaintext by scheme)."""
    sink = grpc_sink()
    plain = otlp_exporter(sink.endpoint)
    by_scheme = otlp_exporter(f"http://{sink.endpoint}")
    del by_scheme["tls"]
    cfg, ports = make_config({"otlp/plain": plain, "otlp/scheme": by_scheme}, signals=("traces",))
    a = agents("agent", cfg, ports)
    req, ids = trace_request(4, name="forms")
    c = GrpcClient(ports.grpc_endpoint)
    try:
        c.export("traces", req)
    finally:
        c.close()
    sink.wait_items("traces", 8)
    assert collections.Counter(sink.span_ids()) == {i: 2 for i in ids}
    for name in ("otlp/plain", "otlp/scheme"):
        a.wait_metric("otelcol_exporter_sent_spans_total", lambda v: v == 4, exporter=name)

"""Round trips: OTel Python SDK -> agent A -> agent B -> Python sink, and raw OTLP/JSON.

Agent A: otlp receiver (gRPC + HTTP) -> batch -> otlp exporter to B.
Agent B: otlp receiver (gRPC) -> batch -> otlp exporter (gzip, with a header) to the sink.
What the sink receives is compared with what the SDK sent, field by field.
"""

from __future__ import annotations

import base64
import gzip
import json

import pytest
import requests
from google.protobuf.json_format import MessageToDict
from opentelemetry._logs import SeverityNumber
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from support import otlp, sdk
from support.agent import make_config, otlp_exporter, otlphttp_exporter

RESOURCE = {
    "service.name": "e2e-roundtrip",
    "service.version": "2.0.1",
    "deployment.environment": "test",
    "host.cores": 64,
    "gpu.present": True,
}


@pytest.fixture
def chain(agents, grpc_sink):
    """Starts sink, B, A; returns (A, B, sink)."""
    sink = grpc_sink()
    cfg_b, ports_b = make_config(
        {"otlp/sink": otlp_exporter(sink.endpoint, compression="gzip", headers={"x-tenant": "e2e-tenant"})},
        protocols=("grpc",),
    )
    b = agents("agent-b", cfg_b, ports_b)
    cfg_a, ports_a = make_config({"otlp/b": otlp_exporter(ports_b.grpc_endpoint, compression="none")})
    a = agents("agent-a", cfg_a, ports_a)
    return a, b, sink


def endpoint_for(agent, transport: str) -> str:
    return agent.ports.grpc_endpoint if transport == "grpc" else agent.ports.http_url


def as_dict(msg) -> dict:
    return MessageToDict(msg, preserving_proto_field_name=True)


def keyed(triples, key):
    """{key(item): (resource attrs, scope name, scope version, item dict)}; fails on duplicates."""
    out = {}
    for res, scope, item in triples:
        k = key(item)
        assert k not in out, f"item {k!r} delivered more than once"
        out[k] = (otlp.attrs(res.resource.attributes), scope.scope.name, scope.scope.version, as_dict(item))
    return out


def make_spans(tracer) -> int:
    """A small trace with every attribute type, events, links, kinds and statuses. Returns count."""
    n = 0
    with tracer.start_as_current_span(
        "http.request",
        kind=SpanKind.SERVER,
        attributes={
            "http.method": "POST",
            "http.status_code": 200,
            "latency.ratio": 0.125,
            "cache.hit": False,
            "tags": ["a", "b", "c"],
            "ints": [1, -2, 3_000_000_000],
            "floats": [0.5, 1.5],
            "bools": [True, False],
            "unicode": "k\u00e4se \u2603",
        },
    ) as root:
        n += 1
        root.add_event("request.received", {"bytes": 1024, "path": "/v1/chat/completions"})
        with tracer.start_as_current_span("llm.generate", kind=SpanKind.INTERNAL) as gen:
            n += 1
            gen.set_attribute("llm.model", "llama-3-70b")
            gen.set_attribute("llm.tokens.output", 517)
            gen.add_event("first_token", {"ttft_ms": 83.5})
            for i in range(3):
                with tracer.start_as_current_span(f"kv.alloc.{i}", kind=SpanKind.CLIENT) as kv:
                    n += 1
                    kv.set_attribute("block", i)
        with tracer.start_as_current_span("db.query", kind=SpanKind.CLIENT,
                                          links=[Link(root.get_span_context(), {"link.kind": "follows"})]) as db:
            n += 1
            db.set_status(Status(StatusCode.ERROR, "deadline exceeded"))
            db.record_exception(ValueError("boom"))
    with tracer.start_as_current_span("consumer.poll", kind=SpanKind.CONSUMER) as other:
        n += 1
        other.set_status(Status(StatusCode.OK))
    with tracer.start_as_current_span("producer.send", kind=SpanKind.PRODUCER):
        n += 1
    return n


@pytest.mark.parametrize("transport,compression", [("grpc", None), ("grpc", "gzip"), ("http", None), ("http", "gzip")])
def test_sdk_traces_arrive_exactly(chain, transport, compression):
    a, b, sink = chain
    sender = sdk.trace_sender(transport, endpoint_for(a, transport), RESOURCE, compression)
    try:
        n = make_spans(sender.tracer())
        assert sender.flush(), "SDK could not export to agent A"
        expected = sender.expected()
    finally:
        sender.shutdown()
    sink.wait_spans(n)
    want = keyed(otlp.iter_spans(expected), lambda s: s.span_id)
    got = keyed(sink.spans(), lambda s: s.span_id)
    assert len(want) == n
    assert set(got) == set(want), "span ids differ"
    for k in want:
        assert got[k] == want[k], f"span {want[k][3]['name']} differs"
    # Parent links as the SDK built them.
    by_name = {v[3]["name"]: v[3] for v in got.values()}
    root = by_name["http.request"]
    assert "parent_span_id" not in root
    assert by_name["llm.generate"]["parent_span_id"] == root["span_id"]
    assert by_name["kv.alloc.1"]["parent_span_id"] == by_name["llm.generate"]["span_id"]
    assert len({v[3]["trace_id"] for v in got.values() if v[3]["name"] not in ("consumer.poll", "producer.send")}) == 1
    # B's exporter header reached the sink.
    assert all(at.metadata.get("x-tenant") == "e2e-tenant" for at in sink.delivered("traces"))
    # Nothing was refused or failed on the way.
    for agent in (a, b):
        assert agent.metric("otelcol_exporter_send_failed_spans_total") == 0
        assert agent.metric("otelcol_receiver_refused_spans_total") == 0


def _instrument(meter_provider):
    meter = meter_provider.get_meter("e2e.tests.metrics", "3.1.4")
    requests_total = meter.create_counter("llm.requests", unit="{request}", description="requests served")
    inflight = meter.create_up_down_counter("llm.inflight", unit="{request}", description="in flight")
    ttft = meter.create_histogram("llm.ttft", unit="ms", description="time to first token")
    kv = meter.create_gauge("gpu.kv_cache.usage", unit="1", description="KV cache use")
    requests_total.add(5, {"model": "a", "status": "ok"})
    requests_total.add(7, {"model": "a", "status": "ok"})
    requests_total.add(3, {"model": "b", "status": "error"})
    inflight.add(10, {"model": "a"})
    inflight.add(-4, {"model": "a"})
    for v in (1.0, 5.0, 50.0, 1200.0):
        ttft.record(v, {"model": "a"})
    kv.set(0.875, {"gpu": "0"})
    kv.set(0.25, {"gpu": "1"})


@pytest.mark.parametrize("transport", ["grpc", "http"])
def test_sdk_metrics_arrive_exactly(chain, transport):
    a, b, sink = chain
    sender = sdk.meter_sender(transport, endpoint_for(a, transport), RESOURCE)
    _instrument(sender.provider)
    assert sender.provider.force_flush(30_000)
    sender.provider.shutdown()  # exports a second, identical-valued collection
    assert sender.all_succeeded(), "SDK export to agent A failed"
    expected = sender.expected()
    want_points = sum(otlp.count_items("metrics", e) for e in expected)
    sink.wait_items("metrics", want_points)

    def flat(triples):
        return sorted(json.dumps([otlp.attrs(r.resource.attributes), s.scope.name, s.scope.version, as_dict(m)],
                                 sort_keys=True) for r, s, m in triples)

    assert flat(sink.metrics()) == flat(t for e in expected for t in otlp.iter_metrics(e))

    # And the values themselves, spelled out.
    last = {}
    for _, scope, m in sink.metrics():
        assert scope.scope.name == "e2e.tests.metrics" and scope.scope.version == "3.1.4"
        last[m.name] = m
    counter = last["llm.requests"]
    assert counter.unit == "{request}" and counter.description == "requests served"
    assert counter.sum.is_monotonic and counter.sum.aggregation_temporality == 2  # cumulative
    pts = {tuple(sorted(otlp.attrs(p.attributes).items())): p.as_int for p in counter.sum.data_points}
    assert pts == {(("model", "a"), ("status", "ok")): 12, (("model", "b"), ("status", "error")): 3}
    updown = last["llm.inflight"]
    assert not updown.sum.is_monotonic
    assert [p.as_int for p in updown.sum.data_points] == [6]
    hist = last["llm.ttft"].histogram.data_points[0]
    assert otlp.attrs(hist.attributes) == {"model": "a"}
    assert (hist.count, hist.sum, hist.min, hist.max) == (4, 1256.0, 1.0, 1200.0)
    assert sum(hist.bucket_counts) == 4 and len(hist.bucket_counts) == len(hist.explicit_bounds) + 1
    gauge = {otlp.attrs(p.attributes)["gpu"]: p.as_double for p in last["gpu.kv_cache.usage"].gauge.data_points}
    assert gauge == {"0": 0.875, "1": 0.25}
    assert {otlp.attrs(r.resource.attributes)["service.name"] for r, _, _ in sink.metrics()} == {"e2e-roundtrip"}


@pytest.mark.parametrize("transport", ["grpc", "http"])
def test_sdk_logs_arrive_exactly(chain, transport):
    a, b, sink = chain
    sender = sdk.log_sender(transport, endpoint_for(a, transport), RESOURCE)
    tracer_provider = sdk.trace_sender("grpc", a.ports.grpc_endpoint, RESOURCE)  # only for a span context
    try:
        logger = sender.logger()
        logger.emit(body="engine started", severity_number=SeverityNumber.INFO, severity_text="INFO",
                    attributes={"gpu.count": 8})
        logger.emit(body="KV cache at 97%", severity_number=SeverityNumber.WARN, severity_text="WARN",
                    attributes={"kv.usage": 0.97, "model": "llama"})
        with tracer_provider.tracer().start_as_current_span("request"):
            logger.emit(body={"event": "oom", "bytes": 1 << 33, "retry": False}, severity_number=SeverityNumber.ERROR,
                        severity_text="ERROR", attributes={"tags": ["x", "y"]})
        logger.emit(body="fatal: CUDA error", severity_number=SeverityNumber.FATAL4, severity_text="FATAL")
        assert sender.flush()
        expected = sender.expected()
    finally:
        sender.shutdown()
        tracer_provider.shutdown()
    sink.wait_items("logs", 4)

    def key(rec):
        return json.dumps(MessageToDict(rec.body), sort_keys=True)

    want = keyed(otlp.iter_logs(expected), key)
    got = keyed(sink.logs(), key)
    assert got == want
    by_sev = {v[3]["severity_text"]: v[3] for v in got.values()}
    assert by_sev["WARN"]["severity_number"] == "SEVERITY_NUMBER_WARN"
    assert by_sev["FATAL"]["severity_number"] == "SEVERITY_NUMBER_FATAL4"
    assert len(by_sev["ERROR"]["trace_id"]) > 0 and len(by_sev["ERROR"]["span_id"]) > 0
    assert "trace_id" not in by_sev["INFO"]


# --- raw OTLP/JSON and protobuf over HTTP --------------------------------------------------------

TRACE_ID = "5b8efff798038103d269b633813fc60c"
SPAN_ID = "eee19b7ec3c1b174"
PARENT_ID = "eee19b7ec3c1b173"

TRACES_JSON = {
    "resourceSpans": [{
        "resource": {"attributes": [
            {"key": "service.name", "value": {"stringValue": "json-svc"}},
            {"key": "replicas", "value": {"intValue": "3"}},
        ]},
        "scopeSpans": [{
            "scope": {"name": "json.scope", "version": "0.0.1"},
            "spans": [{
                "traceId": TRACE_ID,
                "spanId": SPAN_ID,
                "parentSpanId": PARENT_ID,
                "name": "json-span",
                "kind": "SPAN_KIND_SERVER",
                "startTimeUnixNano": "1700000000000000001",
                "endTimeUnixNano": "1700000000123456789",
                "attributes": [
                    {"key": "big", "value": {"intValue": "9007199254740993"}},
                    {"key": "small", "value": {"intValue": 7}},
                    {"key": "ratio", "value": {"doubleValue": 0.5}},
                    {"key": "ok", "value": {"boolValue": True}},
                    {"key": "raw", "value": {"bytesValue": base64.b64encode(b"\x00\x01\xfe").decode()}},
                    {"key": "list", "value": {"arrayValue": {"values": [{"stringValue": "a"}, {"intValue": "2"}]}}},
                    {"key": "map", "value": {"kvlistValue": {"values": [{"key": "k", "value": {"stringValue": "v"}}]}}},
                ],
                "events": [{"timeUnixNano": "1700000000000000500", "name": "ev",
                            "attributes": [{"key": "n", "value": {"intValue": "1"}}]}],
                "status": {"code": "STATUS_CODE_ERROR", "message": "bad"},
            }, {
                "traceId": TRACE_ID,
                "spanId": "0000000000000001",
                "name": "numeric-enums",
                "kind": 3,
                "startTimeUnixNano": "1700000000000000001",
                "endTimeUnixNano": "1700000000000000002",
                "status": {"code": 1},
            }],
        }],
    }],
}

METRICS_JSON = {
    "resourceMetrics": [{
        "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "json-svc"}}]},
        "scopeMetrics": [{
            "scope": {"name": "json.scope"},
            "metrics": [
                {"name": "tokens", "unit": "{token}", "sum": {
                    "aggregationTemporality": "AGGREGATION_TEMPORALITY_CUMULATIVE", "isMonotonic": True,
                    "dataPoints": [{"asInt": "12345678901234", "timeUnixNano": "1700000000000000000",
                                    "startTimeUnixNano": "1690000000000000000",
                                    "attributes": [{"key": "model", "value": {"stringValue": "m"}}]}]}},
                {"name": "util", "gauge": {"dataPoints": [{"asDouble": 0.75, "timeUnixNano": "1700000000000000000"}]}},
                {"name": "lat", "histogram": {"aggregationTemporality": 1, "dataPoints": [{
                    "timeUnixNano": "1700000000000000000", "count": "3", "sum": 6.5,
                    "bucketCounts": ["1", "2"], "explicitBounds": [2.0]}]}},
            ],
        }],
    }],
}

LOGS_JSON = {
    "resourceLogs": [{
        "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "json-svc"}}]},
        "scopeLogs": [{
            "scope": {"name": "json.logs"},
            "logRecords": [
                {"timeUnixNano": "1700000000000000000", "severityNumber": "SEVERITY_NUMBER_ERROR",
                 "severityText": "ERROR", "body": {"stringValue": "json log line"}, "traceId": TRACE_ID,
                 "spanId": SPAN_ID, "attributes": [{"key": "attempt", "value": {"intValue": "4"}}]},
                {"timeUnixNano": "1700000000000000001", "severityNumber": 9, "body": {"stringValue": "second"}},
            ],
        }],
    }],
}


def post(url: str, body: bytes, ctype: str, gz: bool = False):
    headers = {"Content-Type": ctype}
    if gz:
        body = gzip.compress(body)
        headers["Content-Encoding"] = "gzip"
    return requests.post(url, data=body, headers=headers, timeout=10)


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip"])
def test_raw_otlp_json_over_http(chain, gz):
    a, b, sink = chain
    base = a.ports.http_url
    for path, doc in (("/v1/traces", TRACES_JSON), ("/v1/metrics", METRICS_JSON), ("/v1/logs", LOGS_JSON)):
        r = post(base + path, json.dumps(doc).encode(), "application/json", gz)
        assert r.status_code == 200, f"{path}: {r.status_code} {r.text}"
        assert r.headers["Content-Type"].startswith("application/json"), r.headers
        body = r.json()
        assert not body.get("partialSuccess"), body
    sink.wait_spans(2)
    sink.wait_items("metrics", 3)
    sink.wait_items("logs", 2)

    spans = {s.name: (res, sc, s) for res, sc, s in sink.spans()}
    res, sc, s = spans["json-span"]
    assert s.trace_id == bytes.fromhex(TRACE_ID)
    assert s.span_id == bytes.fromhex(SPAN_ID)
    assert s.parent_span_id == bytes.fromhex(PARENT_ID)
    assert s.kind == 2  # SERVER
    assert s.start_time_unix_nano == 1700000000000000001
    assert s.end_time_unix_nano == 1700000000123456789
    assert otlp.attrs(s.attributes) == {
        "big": 9007199254740993, "small": 7, "ratio": 0.5, "ok": True, "raw": b"\x00\x01\xfe",
        "list": ["a", 2], "map": {"k": "v"},
    }
    assert [(e.name, e.time_unix_nano, otlp.attrs(e.attributes)) for e in s.events] == [("ev", 1700000000000000500, {"n": 1})]
    assert (s.status.code, s.status.message) == (2, "bad")
    assert otlp.attrs(res.resource.attributes) == {"service.name": "json-svc", "replicas": 3}
    assert (sc.scope.name, sc.scope.version) == ("json.scope", "0.0.1")
    n = spans["numeric-enums"][2]
    assert (n.kind, n.status.code, n.span_id, n.parent_span_id) == (3, 1, bytes.fromhex("0000000000000001"), b"")

    metrics = {m.name: m for _, _, m in sink.metrics()}
    tok = metrics["tokens"]
    assert tok.unit == "{token}" and tok.sum.is_monotonic and tok.sum.aggregation_temporality == 2
    p = tok.sum.data_points[0]
    assert (p.as_int, p.time_unix_nano, p.start_time_unix_nano) == (12345678901234, 1700000000000000000, 1690000000000000000)
    assert otlp.attrs(p.attributes) == {"model": "m"}
    assert metrics["util"].gauge.data_points[0].as_double == 0.75
    h = metrics["lat"].histogram
    assert h.aggregation_temporality == 1
    assert (h.data_points[0].count, h.data_points[0].sum, list(h.data_points[0].bucket_counts),
            list(h.data_points[0].explicit_bounds)) == (3, 6.5, [1, 2], [2.0])

    logs = {r.body.string_value: r for _, _, r in sink.logs()}
    first = logs["json log line"]
    assert (first.severity_number, first.severity_text, first.time_unix_nano) == (17, "ERROR", 1700000000000000000)
    assert first.trace_id == bytes.fromhex(TRACE_ID) and first.span_id == bytes.fromhex(SPAN_ID)
    assert otlp.attrs(first.attributes) == {"attempt": 4}
    assert logs["second"].severity_number == 9


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip"])
def test_raw_protobuf_over_http(chain, gz):
    a, b, sink = chain
    req = otlp.otlp_json_to_proto("traces", TRACES_JSON)
    r = post(a.ports.http_url + "/v1/traces", req.SerializeToString(), "application/x-protobuf", gz)
    assert r.status_code == 200, r.text
    assert r.headers["Content-Type"].startswith("application/x-protobuf")
    resp = otlp.RESPONSE_TYPES["traces"].FromString(r.content)
    assert not resp.HasField("partial_success") or resp.partial_success.rejected_spans == 0
    sink.wait_spans(2)
    got = sorted((as_dict(s) for _, _, s in sink.spans()), key=lambda d: d["name"])
    want = sorted((as_dict(s) for _, _, s in otlp.iter_spans(req)), key=lambda d: d["name"])
    assert got == want


@pytest.mark.parametrize("encoding", ["proto", "json"])
def test_otlphttp_exporter_delivers_exactly(agents, http_sink, encoding):
    """SDK -> agent (otlphttp exporter, proto or json, gzip) -> Python OTLP/HTTP sink."""
    sink = http_sink()
    cfg, ports = make_config({"otlphttp/sink": otlphttp_exporter(sink.endpoint, encoding=encoding, compression="gzip",
                                                                 headers={"authorization": "Bearer t0k"})})
    a = agents("agent", cfg, ports)
    sender = sdk.trace_sender("grpc", ports.grpc_endpoint, RESOURCE)
    logs = sdk.log_sender("grpc", ports.grpc_endpoint, RESOURCE)
    try:
        n = make_spans(sender.tracer())
        logs.logger().emit(body="via otlphttp", severity_number=SeverityNumber.INFO2, attributes={"k": [1, 2]})
        assert sender.flush() and logs.flush()
        expected, expected_logs = sender.expected(), logs.expected()
    finally:
        sender.shutdown()
        logs.shutdown()
    sink.wait_spans(n)
    sink.wait_items("logs", 1)
    want = keyed(otlp.iter_spans(expected), lambda s: s.span_id)
    got = keyed(sink.spans(), lambda s: s.span_id)
    assert got == want
    assert keyed(sink.logs(), lambda r: r.body.string_value) == keyed(otlp.iter_logs(expected_logs),
                                                                      lambda r: r.body.string_value)
    ctype = "application/json" if encoding == "json" else "application/x-protobuf"
    for at in sink.delivered():
        assert at.content_type == ctype
        assert at.content_encoding == "gzip"
        assert at.metadata.get("authorization") == "Bearer t0k"
    # The counter moves once the exporter has read the sink's answer: poll, then check exactly.
    a.wait_metric("otelcol_exporter_sent_spans_total", lambda v: v >= n, exporter="otlphttp/sink")
    assert a.metric("otelcol_exporter_sent_spans_total", exporter="otlphttp/sink") == n


def test_debug_exporter_prints_items(agents):
    """The debug exporter writes what it gets to stdout (captured in the agent's log)."""
    from support.client import GrpcClient, trace_request

    cfg, ports = make_config({"debug": {"verbosity": "detailed"}}, signals=("traces",))
    a = agents("agent", cfg, ports)
    req, ids = trace_request(2, name="debug-visible-span")
    c = GrpcClient(ports.grpc_endpoint)
    try:
        c.export("traces", req)
    finally:
        c.close()
    a.wait_metric("otelcol_exporter_sent_spans_total", lambda v: v == 2, exporter="debug")
    assert a.stop() == 0
    out = a.log()
    assert "debug-visible-span-0" in out and "debug-visible-span-1" in out, out[-2000:]
    assert ids[0].hex() in out, "detailed verbosity should show span ids"

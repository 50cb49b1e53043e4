"""Malformed input is refused with a reason (HTTP 400 / gRPC INVALID_ARGUMENT), and the agent
keeps serving good requests after each one."""

from __future__ import annotations

import json

import grpc
import pytest
import requests
from google.rpc import status_pb2

from support import otlp
from support.agent import make_config, otlp_exporter
from support.client import GrpcClient, http_post, trace_request

PROTO = "application/x-protobuf"
JSON = "application/json"


@pytest.fixture
def agent_and_sink(agents, grpc_sink):
    sink = grpc_sink()
    cfg, ports = make_config({"otlp/sink": otlp_exporter(sink.endpoint)})
    a = agents("agent", cfg, ports)
    return a, sink


def reason(r: requests.Response) -> str:
    """The error message of an OTLP/HTTP error answer, whatever its encoding."""
    ctype = r.headers.get("Content-Type", "")
    if ctype.startswith(PROTO):
        return status_pb2.Status.FromString(r.content).message
    if ctype.startswith(JSON):
        return json.loads(r.content).get("message", "")
    return r.text


def good_request_still_works(a, sink, via: str = "http") -> None:
    req, ids = trace_request(3, name=f"good-after-bad-{via}")
    if via == "http":
        r = http_post(a.ports.http_url, "traces", req)
        assert r.status_code == 200, r.text
    else:
        c = GrpcClient(a.ports.grpc_endpoint)
        try:
            c.export("traces", req)
        finally:
            c.close()
    sink.wait_span_ids(ids)


BAD_HTTP = [
    # id, content type, content encoding, body, words the reason should contain (any of)
    ("garbage-protobuf", PROTO, None, b"\xff\xff\xff\xff\x0f\x01\x02", ("proto", "decod", "invalid")),
    ("truncated-protobuf", PROTO, None, None, ("proto", "decod", "invalid", "buffer")),
    ("malformed-json", JSON, None, b'{"resourceSpans": [ {"scopeSpans": ', ("json", "EOF", "parse", "expected", "invalid")),
    ("json-wrong-type", JSON, None, b'{"resourceSpans": "nope"}', ("json", "invalid", "expected", "type")),
    ("json-bad-hex-id", JSON, None,
     json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "zz" * 16, "spanId": "00" * 7 + "01",
                                                               "name": "x"}]}]}]}).encode(),
     ("hex", "trace", "id", "invalid")),
    ("bad-gzip", PROTO, "gzip", b"this is not gzip at all", ("gzip", "decompress", "invalid", "corrupt", "header", "end of file")),
    ("bad-gzip-json", JSON, "gzip", b"\x1f\x8b\x08\x00garbage", ("gzip", "decompress", "invalid", "corrupt", "end of file")),
]


@pytest.mark.parametrize("name,ctype,encoding,body,words", BAD_HTTP, ids=[b[0] for b in BAD_HTTP])
def test_malformed_http_is_400_with_reason(agent_and_sink, name, ctype, encoding, body, words):
    a, sink = agent_and_sink
    if body is None:  # a valid request cut in the middle of a field
        req, _ = trace_request(5)
        body = req.SerializeToString()[:-7]
    headers = {"Content-Type": ctype}
    if encoding:
        headers["Content-Encoding"] = encoding
    r = requests.post(f"{a.ports.http_url}/v1/traces", data=body, headers=headers, timeout=10)
    assert r.status_code == 400, f"{r.status_code}: {r.text!r}"
    why = reason(r)
    assert why, f"400 without a reason: {r.content!r}"
    assert any(w.lower() in why.lower() for w in words), f"reason {why!r} names none of {words}"
    good_request_still_works(a, sink)
    assert a.metric("otelcol_receiver_accepted_spans_total", transport="http") == 3


def test_unsupported_content_type_is_415(agent_and_sink):
    a, sink = agent_and_sink
    r = requests.post(f"{a.ports.http_url}/v1/traces", data=b"hello", headers={"Content-Type": "text/plain"}, timeout=10)
    assert r.status_code == 415, r.text
    good_request_still_works(a, sink)


def test_error_answer_is_in_the_request_encoding(agent_and_sink):
    """A JSON request gets a JSON google.rpc.Status; a protobuf one a protobuf Status."""
    a, _ = agent_and_sink
    r = requests.post(f"{a.ports.http_url}/v1/logs", data=b"{", headers={"Content-Type": JSON}, timeout=10)
    assert r.status_code == 400 and r.headers["Content-Type"].startswith(JSON)
    body = json.loads(r.content)
    assert body.get("code") == 3 and body.get("message"), body  # 3 = INVALID_ARGUMENT
    r = requests.post(f"{a.ports.http_url}/v1/metrics", data=b"\xff\xff", headers={"Content-Type": PROTO}, timeout=10)
    assert r.status_code == 400 and r.headers["Content-Type"].startswith(PROTO)
    st = status_pb2.Status.FromString(r.content)
    assert st.code == 3 and st.message


@pytest.mark.parametrize("signal", ["traces", "metrics", "logs"])
def test_malformed_grpc_is_invalid_argument(agent_and_sink, signal):
    a, sink = agent_and_sink
    c = GrpcClient(a.ports.grpc_endpoint)
    try:
        with pytest.raises(grpc.RpcError) as err:
            c.raw(signal, b"\xff\xff\xff\xff\x0f garbage")
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value
        assert err.value.details(), "INVALID_ARGUMENT without a reason"
        # A truncated (but otherwise valid) message too.
        req, _ = trace_request(4)
        body = req.SerializeToString()[:-5]
        with pytest.raises(grpc.RpcError) as err:
            c.raw(signal, body)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value
    finally:
        c.close()
    good_request_still_works(a, sink, via="grpc")


def test_invalid_ids_are_a_partial_success(agent_and_sink):
    """Spans with wrong-length ids are rejected one by one; the valid spans of the request pass."""
    a, sink = agent_and_sink
    req, ids = trace_request(3, name="mixed")
    spans = req.resource_spans[0].scope_spans[0].spans
    spans[1].trace_id = b"\x01\x02\x03"  # 3 bytes instead of 16
    good = [ids[0], ids[2]]
    c = GrpcClient(a.ports.grpc_endpoint)
    try:
        resp = c.export("traces", req)
    finally:
        c.close()
    assert resp.partial_success.rejected_spans == 1, resp
    assert resp.partial_success.error_message, resp
    sink.wait_span_ids(good)
    r = http_post(a.ports.http_url, "traces", req)
    assert r.status_code == 200
    pr = otlp.RESPONSE_TYPES["traces"].FromString(r.content)
    assert pr.partial_success.rejected_spans == 1
    good_request_still_works(a, sink)
    assert sorted(s.name for _, _, s in sink.spans() if s.name.startswith("mixed")) == ["mixed-0", "mixed-0", "mixed-2", "mixed-2"]


def test_gzip_grpc_and_http_accepted(agent_and_sink):
    a, sink = agent_and_sink
    req, ids = trace_request(5, name="gz")
    c = GrpcClient(a.ports.grpc_endpoint, compression=grpc.Compression.Gzip)
    try:
        c.export("traces", req)
    finally:
        c.close()
    req2, ids2 = trace_request(5, name="gzhttp")
    r = http_post(a.ports.http_url, "traces", req2, gz=True)
    assert r.status_code == 200, r.text
    sink.wait_span_ids(ids + ids2)


def test_oversized_requests_are_refused(agents, grpc_sink):
    """max_recv_msg_size_mib (gRPC) and max_request_body_size (HTTP, after decompression)."""
    from support.agent import Ports

    sink = grpc_sink()
    ports = Ports()
    cfg, _ = make_config({"otlp/sink": otlp_exporter(sink.endpoint)}, ports=ports)
    cfg["receivers"]["otlp"]["protocols"]["grpc"]["max_recv_msg_size_mib"] = 1
    cfg["receivers"]["otlp"]["protocols"]["http"]["max_request_body_size"] = 1024 * 1024
    a = agents("agent", cfg, ports)
    big, _ = trace_request(3, payload_bytes=600 * 1024)  # ~1.8 MB
    r = http_post(a.ports.http_url, "traces", big, gz=True)  # small on the wire, big once inflated
    assert r.status_code == 413, (r.status_code, r.text)
    assert reason(r)
    good_request_still_works(a, sink)
    c = GrpcClient(ports.grpc_endpoint)
    try:
        with pytest.raises(grpc.RpcError) as err:
            c.export("traces", big)
        # gRPC's status code table: a message larger than the configured limit is RESOURCE_EXHAUSTED.
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, (err.value.code(), err.value.details())
    finally:
        c.close()
    good_request_still_works(a, sink, via="grpc")
    assert sink.item_count("traces") == 6

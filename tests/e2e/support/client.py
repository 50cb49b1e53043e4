"""Raw OTLP senders (no SDK): build requests with known ids and send them over gRPC or HTTP.

Used where a test must know exactly which items the agent acknowledged.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Optional

import grpc
import requests
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2_grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.logs.v1 import logs_pb2
from opentelemetry.proto.metrics.v1 import metrics_pb2
from opentelemetry.proto.resource.v1 import resource_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

from . import otlp

_counter = itertools.count(1)
_counter_lock = threading.Lock()


def _kv(k: str, v) -> common_pb2.KeyValue:
    av = common_pb2.AnyValue()
    if isinstance(v, bool):
        av.bool_value = v
    elif isinstance(v, int):
        av.int_value = v
    elif isinstance(v, float):
        av.double_value = v
    else:
        av.string_value = str(v)
    return common_pb2.KeyValue(key=k, value=av)


def new_span_id() -> bytes:
    """A unique, non-zero 8-byte span id (a process-wide counter plus randomness)."""
    with _counter_lock:
        n = next(_counter)
    return (n.to_bytes(4, "big") + os.urandom(4))


def trace_request(n: int, *, service: str = "e2e", payload_bytes: int = 0, name: str = "span",
                  trace_id: Optional[bytes] = None) -> tuple[otlp.TraceRequest, list[bytes]]:
    """A request with `n` spans of one trace; each span may carry a `payload` attribute of the given size."""
    tid = trace_id or os.urandom(16)
    now = time.time_ns()
    payload = "x" * payload_bytes if payload_bytes else None
    spans, ids = [], []
    for i in range(n):
        sid = new_span_id()
        ids.append(sid)
        attrs = [_kv("i", i), _kv("kind", "e2e")]
        if payload:
            attrs.append(_kv("payload", payload))
        spans.append(trace_pb2.Span(trace_id=tid, span_id=sid, name=f"{name}-{i}", kind=trace_pb2.Span.SPAN_KIND_SERVER,
                                    start_time_unix_nano=now, end_time_unix_nano=now + 1000, attributes=attrs))
    req = otlp.TraceRequest(resource_spans=[trace_pb2.ResourceSpans(
        resource=resource_pb2.Resource(attributes=[_kv("service.name", service)]),
        scope_spans=[trace_pb2.ScopeSpans(scope=common_pb2.InstrumentationScope(name="e2e.raw"), spans=spans)],
    )])
    return req, ids


def metrics_request(n: int, service: str = "e2e") -> otlp.MetricsRequest:
    now = time.time_ns()
    pts = [metrics_pb2.NumberDataPoint(as_int=i, time_unix_nano=now, attributes=[_kv("i", i)]) for i in range(n)]
    return otlp.MetricsRequest(resource_metrics=[metrics_pb2.ResourceMetrics(
        resource=resource_pb2.Resource(attributes=[_kv("service.name", service)]),
        scope_metrics=[metrics_pb2.ScopeMetrics(metrics=[metrics_pb2.Metric(name="e2e.gauge", gauge=metrics_pb2.Gauge(data_points=pts))])],
    )])


def logs_request(n: int, service: str = "e2e") -> otlp.LogsRequest:
    now = time.time_ns()
    recs = [logs_pb2.LogRecord(time_unix_nano=now, severity_number=9, body=common_pb2.AnyValue(string_value=f"log {i}"))
            for i in range(n)]
    return otlp.LogsRequest(resource_logs=[logs_pb2.ResourceLogs(
        resource=resource_pb2.Resource(attributes=[_kv("service.name", service)]),
        scope_logs=[logs_pb2.ScopeLogs(log_records=recs)],
    )])


class GrpcClient:
    """OTLP/gRPC client to one endpoint."""

    def __init__(self, endpoint: str, compression: Optional[grpc.Compression] = None) -> None:
        opts = [("grpc.max_send_message_length", 256 * 1024 * 1024), ("grpc.enable_retries", 0)]
        self.channel = grpc.insecure_channel(endpoint, options=opts, compression=compression)
        self.traces = trace_service_pb2_grpc.TraceServiceStub(self.channel)
        self.metrics = metrics_service_pb2_grpc.MetricsServiceStub(self.channel)
        self.logs = logs_service_pb2_grpc.LogsServiceStub(self.channel)

    def export(self, signal: str, req, timeout: float = 10.0):
        stub = {"traces": self.traces, "metrics": self.metrics, "logs": self.logs}[signal]
        return stub.Export(req, timeout=timeout)

    def export_with_call(self, signal: str, req, timeout: float = 10.0):
        stub = {"traces": self.traces, "metrics": self.metrics, "logs": self.logs}[signal]
        return stub.Export.with_call(req, timeout=timeout)

    def raw(self, signal: str, payload: bytes, timeout: float = 10.0):
        """Sends `payload` unparsed as the request body (for malformed-input tests)."""
        call = self.channel.unary_unary(otlp.GRPC_METHODS[signal], request_serializer=None,
                                        response_deserializer=None)
        return call(payload, timeout=timeout)

    def close(self) -> None:
        self.channel.close()


def http_post(base_url: str, signal: str, req, gz: bool = False, timeout: float = 10.0) -> requests.Response:
    import gzip

    body = req.SerializeToString()
    headers = {"Content-Type": "application/x-protobuf"}
    if gz:
        body = gzip.compress(body)
        headers["Content-Encoding"] = "gzip"
    return requests.post(f"{base_url}/v1/{signal}", data=body, headers=headers, timeout=timeout)


@dataclass
class SendLog:
    """What a load generator sent and what the agent answered."""

    acked: list[bytes] = field(default_factory=list)  # span ids of requests answered OK
    refused: dict[str, int] = field(default_factory=dict)  # status name -> count of requests
    errors: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    retry_info: int = 0  # refusals that carried a RetryInfo / Retry-After

    def ok(self, ids) -> None:
        with self.lock:
            self.acked.extend(ids)

    def refuse(self, name: str, retry_hint: bool) -> None:
        with self.lock:
            self.refused[name] = self.refused.get(name, 0) + 1
            self.retry_info += int(retry_hint)


def has_retry_info(err: grpc.RpcError) -> bool:
    """Whether a gRPC error carries google.rpc.RetryInfo in its status details."""
    try:
        from google.rpc import error_details_pb2, status_pb2
    except ImportError:  # pragma: no cover
        return False
    for k, v in (err.trailing_metadata() or ()):
        if k == "grpc-status-details-bin":
            st = status_pb2.Status.FromString(v)
            for d in st.details:
                if d.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
                    return True
    return False


def pump_grpc(endpoint: str, log: SendLog, stop: threading.Event, *, spans_per_request: int, payload_bytes: int = 0,
              max_requests: int = 10_000, deadline_s: float = 60.0, service: str = "e2e") -> None:
    """Sends trace requests until `stop` is set, `max_requests` were sent or `deadline_s` passed."""
    client = GrpcClient(endpoint)
    end = time.monotonic() + deadline_s
    try:
        for _ in range(max_requests):
            if stop.is_set() or time.monotonic() > end:
                return
            req, ids = trace_request(spans_per_request, payload_bytes=payload_bytes, service=service)
            try:
                client.export("traces", req, timeout=10)
                log.ok(ids)
            except grpc.RpcError as e:
                code = e.code()
                if code in (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE):
                    log.refuse(code.name, has_retry_info(e))
                    stop.wait(0.02)  # a short back-off so the loop does not spin
                else:
                    with log.lock:
                        log.errors.append(f"{code.name}: {e.details()}")
                    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                        continue
                    return
    finally:
        client.close()

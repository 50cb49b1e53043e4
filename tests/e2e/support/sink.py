"""Scriptable OTLP sinks (gRPC and HTTP) that record every request they are sent.

A sink stands in for Tempo / Jaeger / another collector downstream of the agent. Every
export request is recorded as an `Attempt`; the ones answered OK are the delivered data.
The answer is scripted through `Behavior`: UNAVAILABLE for the first N requests or the first
S seconds, a fixed error code for every request, a delay per request.

Waiting is done on a condition variable with a deadline (`wait_for`), never by sleeping.
"""

from __future__ import annotations

import gzip
import http.server
import json
import random
import threading
import time
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import grpc
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2_grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc

from . import otlp

GRPC_TO_HTTP = {
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.INTERNAL: 500,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
}


@dataclass
class Attempt:
    """One export request as the sink saw it."""

    signal: str
    request: Any
    metadata: dict
    at: float
    code: Optional[grpc.StatusCode]  # None: answered OK
    transport: str
    content_type: str = ""
    content_encoding: str = ""

    @property
    def ok(self) -> bool:
        return self.code is None

    @property
    def items(self) -> int:
        return otlp.count_items(self.signal, self.request)


@dataclass
class Behavior:
    """How the sink answers. Mutate under `lock` (or through the setters) while it runs."""

    fail_first: int = 0  # answer `fail_code` to the first N requests (all signals together)
    fail_for_s: float = 0.0  # answer `fail_code` until this many seconds after the sink started
    fail_code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE
    always: Optional[grpc.StatusCode] = None  # answer this code to every request
    delay_s: float = 0.0  # sleep before answering each request
    retry_after_s: Optional[int] = None  # with a scripted failure: RetryInfo (gRPC) / Retry-After (HTTP)
    fail_ratio: float = 0.0  # answer `fail_code` to this share of requests (seeded, reproducible)
    seed: int = 1234
    lock: threading.Lock = field(default_factory=threading.Lock)
    _rng: Any = None
    _seen: int = 0
    _started: float = field(default_factory=time.monotonic)

    def decide(self) -> tuple[Optional[grpc.StatusCode], float]:
        with self.lock:
            self._seen += 1
            delay = self.delay_s
            if self.always is not None:
                return self.always, delay
            if self._seen <= self.fail_first:
                return self.fail_code, delay
            if self.fail_for_s and time.monotonic() - self._started < self.fail_for_s:
                return self.fail_code, delay
            if self.fail_ratio:
                if self._rng is None:
                    self._rng = random.Random(self.seed)
                if self._rng.random() < self.fail_ratio:
                    return self.fail_code, delay
            return None, delay


class Recorder:
    """Attempts, with waiting on a condition."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.attempts: list[Attempt] = []

    def add(self, a: Attempt) -> None:
        with self.cond:
            self.attempts.append(a)
            self.cond.notify_all()

    def snapshot(self) -> list[Attempt]:
        with self.cond:
            return list(self.attempts)

    def delivered(self, signal: Optional[str] = None) -> list[Attempt]:
        return [a for a in self.snapshot() if a.ok and (signal is None or a.signal == signal)]

    def wait_for(self, pred: Callable[[], bool], timeout: float, what: str = "condition") -> None:
        """Waits until `pred()` holds; fails the test with `what` after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while not pred():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"timed out after {timeout}s waiting for {what}; sink saw {self.summary()}")
                self.cond.wait(min(left, 0.5))

    def summary(self) -> str:
        by: dict[tuple[str, str], list[int]] = {}
        for a in list(self.attempts):
            k = (a.signal, "OK" if a.ok else a.code.name)
            v = by.setdefault(k, [0, 0])
            v[0] += 1
            v[1] += a.items
        return ", ".join(f"{s} {c}: {n} requests / {i} items" for (s, c), (n, i) in sorted(by.items())) or "nothing"

    # --- delivered data, flattened ------------------------------------------------------------

    def spans(self) -> list[tuple[Any, Any, Any]]:
        return [t for a in self.delivered("traces") for t in otlp.iter_spans(a.request)]

    def metrics(self) -> list[tuple[Any, Any, Any]]:
        return [t for a in self.delivered("metrics") for t in otlp.iter_metrics(a.request)]

    def logs(self) -> list[tuple[Any, Any, Any]]:
        return [t for a in self.delivered("logs") for t in otlp.iter_logs(a.request)]

    def item_count(self, signal: str) -> int:
        return sum(a.items for a in self.delivered(signal))

    def span_ids(self) -> list[bytes]:
        return [s.span_id for _, _, s in self.spans()]

    def wait_items(self, signal: str, n: int, timeout: float = 30.0) -> None:
        self.wait_for(lambda: self._items_unlocked(signal) >= n, timeout, f">= {n} {signal} items")

    def wait_spans(self, n: int, timeout: float = 30.0) -> None:
        self.wait_items("traces", n, timeout)

    def wait_span_ids(self, ids, timeout: float = 30.0) -> None:
        missing = set(ids)
        wanted, seen = len(missing), 0

        # Incremental: each check reads only the attempts recorded since the last one (the check
        # runs under the recorder's lock, so a rescan of millions of spans would stall the sink).
        def have() -> bool:
            nonlocal seen
            new, seen = self.attempts[seen:], len(self.attempts)
            for a in new:
                if a.ok and a.signal == "traces":
                    missing.difference_update(s.span_id for _, _, s in otlp.iter_spans(a.request))
            return not missing

        try:
            self.wait_for(have, timeout, f"{wanted} specific span ids")
        except AssertionError as e:
            raise AssertionError(f"{e}; {len(missing)} of them still missing") from None

    def _items_unlocked(self, signal: str) -> int:
        return sum(a.items for a in self.attempts if a.ok and a.signal == signal)


def _status_with_retry_info(code: grpc.StatusCode, seconds: int) -> bytes:
    """A serialized google.rpc.Status carrying a RetryInfo detail."""
    from google.protobuf import duration_pb2
    from google.rpc import error_details_pb2, status_pb2

    st = status_pb2.Status(code=code.value[0], message=f"sink scripted {code.name}")
    st.details.add().Pack(error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(seconds=seconds)))
    return st.SerializeToString()


class _Sink:
    def __init__(self, behavior: Optional[Behavior] = None) -> None:
        self.behavior = behavior or Behavior()
        self.rec = Recorder()
        self.port = 0

    # Convenience pass-throughs.
    def __getattr__(self, name):
        if name in {"spans", "metrics", "logs", "wait_for", "wait_items", "wait_spans", "wait_span_ids",
                    "delivered", "snapshot", "item_count", "span_ids", "summary"}:
            return getattr(self.rec, name)
        raise AttributeError(name)


class GrpcSink(_Sink):
    """An OTLP/gRPC server on 127.0.0.1 (TraceService, MetricsService, LogsService)."""

    def __init__(self, port: int = 0, behavior: Optional[Behavior] = None, workers: int = 16) -> None:
        super().__init__(behavior)
        self._want_port = port
        self._workers = workers
        self.server: Optional[grpc.Server] = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _handler(self, signal: str):
        sink = self

        def export(request, context):
            md = {k: v for k, v in (context.invocation_metadata() or ())}
            code, delay = sink.behavior.decide()
            if delay:
                time.sleep(delay)
            sink.rec.add(Attempt(signal, request, md, time.monotonic(), code, "grpc"))
            if code is not None:
                if sink.behavior.retry_after_s is not None:
                    context.set_trailing_metadata(((
                        "grpc-status-details-bin", _status_with_retry_info(code, sink.behavior.retry_after_s)),))
                context.abort(code, f"sink scripted {code.name}")
            return otlp.RESPONSE_TYPES[signal]()

        return export

    def start(self) -> "GrpcSink":
        opts = [("grpc.max_receive_message_length", 256 * 1024 * 1024), ("grpc.so_reuseport", 0)]
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=self._workers), options=opts)

        class T(trace_service_pb2_grpc.TraceServiceServicer):
            Export = staticmethod(self._handler("traces"))

        class M(metrics_service_pb2_grpc.MetricsServiceServicer):
            Export = staticmethod(self._handler("metrics"))

        class L(logs_service_pb2_grpc.LogsServiceServicer):
            Export = staticmethod(self._handler("logs"))

        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(T(), self.server)
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(M(), self.server)
        logs_service_pb2_grpc.add_LogsServiceServicer_to_server(L(), self.server)
        self.port = self.server.add_insecure_port(f"127.0.0.1:{self._want_port}")
        if self.port == 0:
            raise RuntimeError(f"grpc sink cannot bind 127.0.0.1:{self._want_port}")
        self.server.start()
        self.behavior._started = time.monotonic()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop(grace=None).wait(5)
            self.server = None


class HttpSink(_Sink):
    """An OTLP/HTTP server on 127.0.0.1 (POST /v1/traces|metrics|logs; protobuf or JSON; gzip)."""

    PATHS = {"/v1/traces": "traces", "/v1/metrics": "metrics", "/v1/logs": "logs"}

    def __init__(self, port: int = 0, behavior: Optional[Behavior] = None) -> None:
        super().__init__(behavior)
        self._want_port = port
        self.httpd: Optional[http.server.ThreadingHTTPServer] = None
        self._thread: Optional[threading.Thread] = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "HttpSink":
        sink = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def _md(self) -> dict:
                return {k.lower(): v for k, v in self.headers.items()}

            def _answer(self, status: int, body: bytes, ctype: str) -> None:
                self.send_response(status)
                if status != 200 and sink.behavior.retry_after_s is not None:
                    self.send_header("Retry-After", str(sink.behavior.retry_after_s))
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self):
                signal = sink.PATHS.get(self.path.split("?")[0])
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                if signal is None:
                    self._answer(404, b"not found", "text/plain")
                    return
                enc = (self.headers.get("Content-Encoding") or "").lower()
                ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
                try:
                    body = gzip.decompress(raw) if enc == "gzip" else raw
                    if ctype == "application/json":
                        req = otlp.otlp_json_to_proto(signal, json.loads(body))
                    else:
                        req = otlp.REQUEST_TYPES[signal].FromString(body)
                except Exception as e:  # a broken exporter is a test failure, seen as 400s
                    sink.rec.add(Attempt(signal, otlp.REQUEST_TYPES[signal](), self._md(), time.monotonic(),
                                         grpc.StatusCode.INVALID_ARGUMENT, "http", ctype, enc))
                    self._answer(400, f"sink cannot decode: {e}".encode(), "text/plain")
                    return
                code, delay = sink.behavior.decide()
                if delay:
                    time.sleep(delay)
                sink.rec.add(Attempt(signal, req, self._md(), time.monotonic(), code, "http", ctype, enc))
                if code is not None:
                    self._answer(GRPC_TO_HTTP.get(code, 500), f"sink scripted {code.name}".encode(), "text/plain")
                    return
                if ctype == "application/json":
                    self._answer(200, b"{}", "application/json")
                else:
                    resp = otlp.RESPONSE_TYPES[signal]().SerializeToString()
                    self._answer(200, resp, "application/x-protobuf")

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", self._want_port), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self._thread = threading.Thread(target=self.httpd.serve_forever, name=f"http-sink-{self.port}", daemon=True)
        self._thread.start()
        self.behavior._started = time.monotonic()
        return self

    def stop(self) -> None:
        if self.httpd is not None:
            self.httpd.shutdown()
            self.httpd.server_close()
            self.httpd = None

"""Soak (INFERWATCH_SLOW=1 only).

1. Sustained load through A -> B -> a flaky sink: four senders push spans through two agents
   for SOAK_S seconds while the sink answers UNAVAILABLE to 10 % of requests. Every
   acknowledged span must arrive, and RSS after the run must not have grown much past what it
   was after the warm-up (a leak check).
2. Steady state (issue 15 item 6): INFERWATCH_SOAK_SECS (default 1800 = 30 minutes) at a steady
   INFERWATCH_SOAK_SPANS_PER_S (default 20,000) LLM request spans/s into one agent that exports
   them over OTLP/gRPC to a counting sink, derives the golden signals (llm_signals), runs the
   detectors (slo, zscore_skew, kv_pressure) on them and scrapes its own self-metrics every 2 s
   (into the Prometheus exporter that also serves the detectors' output). Every ~10 s it samples the agent's RSS, open fds
   (/proc/PID/fd) and `otelcol_exporter_queue_size`; after the warm-up a least-squares slope is
   fitted to each, and the growth it implies over the measured window must stay within
   RSS_DRIFT_MIB, FD_DRIFT and QUEUE_DRIFT. 0 loss: the sink counts exactly the spans acked.
   Try it short: INFERWATCH_SLOW=1 INFERWATCH_SOAK_SECS=120 pytest tests/e2e/test_soak.py -k steady
"""

from __future__ import annotations

import os
import threading
import time
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from support.agent import Ports, free_port, make_config, otlp_exporter
from support.client import SendLog, pump_grpc
from support.sink import Behavior

SOAK_S = float(os.environ.get("INFERWATCH_SOAK_S", "90"))
RSS_GROWTH_MIB = 40


@pytest.mark.slow
@pytest.mark.timeout(int(SOAK_S) + 180)
def test_soak_flaky_downstream_loses_nothing(agents, grpc_sink):
    sink = grpc_sink(Behavior(fail_ratio=0.1, fail_code=grpc.StatusCode.UNAVAILABLE))
    cfg_b, ports_b = make_config({"otlp/sink": otlp_exporter(sink.endpoint)}, signals=("traces",), protocols=("grpc",))
    b = agents("agent-b", cfg_b, ports_b)
    cfg_a, ports_a = make_config(
        {"otlp/b": otlp_exporter(ports_b.grpc_endpoint)},
        processors={"memory_limiter": {"check_interval": "1s", "limit_mib": 400, "spike_limit_mib": 80}},
        pipeline_processors=("memory_limiter", "batch"),
        signals=("traces",),
    )
    a = agents("agent-a", cfg_a, ports_a)
    log = SendLog()
    stop = threading.Event()
    pumps = [threading.Thread(target=pump_grpc, args=(ports_a.grpc_endpoint, log, stop),
                              kwargs={"spans_per_request": 100, "payload_bytes": 64, "deadline_s": SOAK_S,
                                      "max_requests": 10**9, "service": f"soak{k}"}, daemon=True)
             for k in range(4)]
    for p in pumps:
        p.start()
    stop.wait(min(15.0, SOAK_S / 4))  # warm-up, part of the scenario
    warm = {n: ag.proc_status()["VmRSS"] for n, ag in (("a", a), ("b", b))}
    for p in pumps:
        p.join(SOAK_S + 30)
    stop.set()
    assert not log.errors, log.errors[:5]
    sink.wait_span_ids(log.acked, timeout=60)
    assert set(log.acked) <= set(sink.span_ids())
    time.sleep(2)  # let allocator caches settle before the leak check (not a synchronisation)
    for n, ag in (("a", a), ("b", b)):
        now = ag.proc_status()["VmRSS"]
        assert now - warm[n] < RSS_GROWTH_MIB * 1024, f"agent {n} RSS grew {(now - warm[n]) // 1024} MiB during the soak"
    print(f"soak: {len(log.acked)} spans acked and delivered, refusals {log.refused}, sink {sink.summary()}")


# ---- 2. steady state ------------------------------------------------------------------------

STEADY_S = float(os.environ.get("INFERWATCH_SOAK_SECS", "1800"))
SPANS_PER_S = int(os.environ.get("INFERWATCH_SOAK_SPANS_PER_S", "20000"))
SAMPLE_EVERY_S = 10.0 if STEADY_S >= 300 else 5.0
SPANS_PER_REQUEST = 100
SENDERS = 4
# Bounds on the growth the fitted slope implies over the measured window (after the warm-up).
RSS_DRIFT_MIB = 32.0
FD_DRIFT = 5.0
QUEUE_DRIFT = 10.0


def slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope (per second) of (t, value) points."""
    n = len(points)
    if n < 2:
        return 0.0
    mt = sum(t for t, _ in points) / n
    mv = sum(v for _, v in points) / n
    den = sum((t - mt) ** 2 for t, _ in points)
    return 0.0 if den == 0 else sum((t - mt) * (v - mv) for t, v in points) / den


def test_slope_fits_a_line():
    assert abs(slope([(0, 1.0), (1, 3.0), (2, 5.0)]) - 2.0) < 1e-9
    assert slope([(0, 4.0), (10, 4.0), (20, 4.0)]) == 0.0
    assert abs(slope([(0, 0.0), (1, 1.0), (2, 0.0), (3, 1.0)]) - 0.2) < 1e-9


class CountingSink:
    """An OTLP/gRPC trace sink that only counts spans (a soak's volume cannot be kept)."""

    def __init__(self) -> None:
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
        self._req = trace_service_pb2.ExportTraceServiceRequest
        self._resp = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
        self.lock = threading.Lock()
        self.spans = 0
        self.requests = 0
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8),
                                  options=[("grpc.max_receive_message_length", 256 * 1024 * 1024)])
        handler = grpc.method_handlers_generic_handler("opentelemetry.proto.collector.trace.v1.TraceService", {
            "Export": grpc.unary_unary_rpc_method_handler(self._export)})
        self.server.add_generic_rpc_handlers((handler,))
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def _export(self, raw: bytes, context) -> bytes:
        req = self._req.FromString(raw)
        n = sum(len(ss.spans) for rs in req.resource_spans for ss in rs.scope_spans)
        with self.lock:
            self.spans += n
            self.requests += 1
        return self._resp

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def count(self) -> int:
        with self.lock:
            return self.spans

    def stop(self) -> None:
        self.server.stop(grace=None).wait(5)


def llm_requests(k: int, count: int) -> list:
    """`count` trace requests of SPANS_PER_REQUEST LLM request spans each (sender `k`)."""
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
    from opentelemetry.proto.common.v1 import common_pb2
    from opentelemetry.proto.resource.v1 import resource_pb2
    from opentelemetry.proto.trace.v1 import trace_pb2

    def kv(key, v):
        if isinstance(v, str):
            return common_pb2.KeyValue(key=key, value=common_pb2.AnyValue(string_value=v))
        if isinstance(v, int):
            return common_pb2.KeyValue(key=key, value=common_pb2.AnyValue(int_value=v))
        return common_pb2.KeyValue(key=key, value=common_pb2.AnyValue(double_value=v))

    now = time.time_ns()
    out = []
    for r in range(count):
        spans = []
        for i in range(SPANS_PER_REQUEST):
            n = (r * SPANS_PER_REQUEST + i)
            spans.append(trace_pb2.Span(
                trace_id=os.urandom(16), span_id=(k << 56 | n + 1).to_bytes(8, "big"), name="chat llama",
                kind=trace_pb2.Span.SPAN_KIND_SERVER, start_time_unix_nano=now, end_time_unix_nano=now + 800_000_000,
                attributes=[kv("gen_ai.operation.name", "chat"), kv("gen_ai.request.model", "llama"),
                            kv("gen_ai.usage.input_tokens", 200 + n % 50), kv("gen_ai.usage.output_tokens", 100),
                            kv("gen_ai.latency.time_to_first_token", 0.05 + (n % 7) * 0.01),
                            kv("gen_ai.latency.e2e", 0.8 + (n % 5) * 0.05)]))
        req = trace_service_pb2.ExportTraceServiceRequest(resource_spans=[trace_pb2.ResourceSpans(
            resource=resource_pb2.Resource(attributes=[kv("service.name", "soak"),
                                                       kv("service.instance.id", f"127.0.0.1:{8000 + k}")]),
            scope_spans=[trace_pb2.ScopeSpans(spans=spans)])])
        out.append(req)
    return out


def paced_sender(endpoint: str, payloads: list, rate_rps: float, stop: threading.Event, acked: list,
                 errors: list) -> None:
    """Sends `payloads` round-robin at `rate_rps` requests/s until `stop`, each with its spans
    restamped to now (llm_signals drops late spans); counts acked spans."""
    ch = grpc.insecure_channel(endpoint)
    call = ch.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export")
    interval = 1.0 / rate_rps
    next_at = time.monotonic()
    i = 0
    try:
        while not stop.is_set():
            try:
                req = payloads[i % len(payloads)]
                now = time.time_ns()
                for sp in req.resource_spans[0].scope_spans[0].spans:
                    sp.start_time_unix_nano = now - 800_000_000
                    sp.end_time_unix_nano = now
                call(req.SerializeToString(), timeout=10)
                acked[0] += SPANS_PER_REQUEST
            except grpc.RpcError as e:
                acked[1] += 1
                if e.code() not in (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE):
                    errors.append(f"{e.code().name}: {e.details()}")
            i += 1
            next_at += interval
            # Pacing (a rate, not a synchronisation): wait for the next send slot.
            stop.wait(max(0.0, next_at - time.monotonic()))
    finally:
        ch.close()


def steady_config(sink_endpoint: str) -> tuple[dict, Ports, int]:
    ports = Ports()
    prom_port = free_port()
    cfg, ports = make_config(
        {"otlp/sink": otlp_exporter(sink_endpoint)},
        ports=ports,
        processors={"memory_limiter": {"check_interval": "1s", "limit_mib": 400, "spike_limit_mib": 80},
                    "batch": {"timeout": "200ms", "send_batch_size": 8192},
                    "slo": {"objectives": [{"name": "e2e", "signal": "llm.e2e.p99", "threshold": "2s", "target": "99%",
                                            "period": "1h"}]},
                    "zscore_skew": {"metrics": ["llm.ttft.p95", "llm.e2e.p95"], "window": 20},
                    "kv_pressure": {}},
        pipeline_processors=("memory_limiter", "batch"),
        signals=("traces",),
        protocols=("grpc",),
    )
    cfg["exporters"]["prometheus"] = {"endpoint": f"127.0.0.1:{prom_port}"}
    cfg["connectors"] = {"llm_signals": {"window": "10s", "flush_interval": "5s", "allowed_lateness": "2s"}}
    cfg["receivers"]["prometheus"] = {"config": {"scrape_configs": [{
        "job_name": "self", "scrape_interval": "2s", "scrape_timeout": "1s",
        # Only the self-metrics: scraping the prometheus exporter that the scrape feeds would be
        # a loop (each scrape re-exports the last one's series under new labels, without bound).
        "static_configs": [{"targets": [f"127.0.0.1:{ports.metrics}"]}]}]}}
    pipes = cfg["service"]["pipelines"]
    pipes["traces"]["exporters"] = ["otlp/sink", "llm_signals"]
    pipes["metrics/detect"] = {"receivers": ["llm_signals"], "processors": ["slo", "zscore_skew", "kv_pressure"],
                               "exporters": ["prometheus"]}
    pipes["metrics/scrape"] = {"receivers": ["prometheus"], "exporters": ["prometheus"]}
    return cfg, ports, prom_port


def scraped_and_detected(self_metrics: str, prom_text: str) -> tuple[float, int]:
    """Metric points the prometheus receiver took in, and golden-signal lines the detect pipeline exported."""
    scraped = sum(float(line.rsplit(" ", 1)[-1]) for line in self_metrics.splitlines()
                  if line.startswith("otelcol_receiver_accepted_metric_points") and 'receiver="prometheus"' in line)
    golden = sum(1 for line in prom_text.splitlines() if line.startswith(("llm_", "gen_ai_")))
    return scraped, golden


@pytest.mark.slow
@pytest.mark.timeout(int(STEADY_S) + 300)
def test_soak_steady_20k_spans_per_second_flat_and_lossless(agents):
    sink = CountingSink()
    try:
        cfg, ports, prom_port = steady_config(sink.endpoint)
        a = agents("agent", cfg, ports)
        pid = a.pid
        payloads = [llm_requests(k, 20) for k in range(SENDERS)]
        stop = threading.Event()
        counters = [[0, 0] for _ in range(SENDERS)]
        errors: list[str] = []
        threads = [threading.Thread(target=paced_sender,
                                    args=(ports.grpc_endpoint, payloads[k], SPANS_PER_S / SPANS_PER_REQUEST / SENDERS,
                                          stop, counters[k], errors), daemon=True) for k in range(SENDERS)]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        warmup = min(120.0, STEADY_S * 0.25)
        samples: list[dict] = []
        while time.monotonic() - t0 < STEADY_S:
            stop.wait(SAMPLE_EVERY_S)  # the sampling period (the test's clock), not a synchronisation
            t = time.monotonic() - t0
            st = a.proc_status()
            samples.append({"t": t, "rss_mib": st["VmRSS"] / 1024, "fds": len(os.listdir(f"/proc/{pid}/fd")),
                            "queue": a.metric("otelcol_exporter_queue_size", exporter="otlp/sink"),
                            "acked": sum(c[0] for c in counters), "sink": sink.count()})
            assert a.running(), f"agent exited during the soak; log:\n{a.log()[-3000:]}"
        stop.set()
        for t in threads:
            t.join(30)
        elapsed = time.monotonic() - t0
        acked = sum(c[0] for c in counters)
        refused = sum(c[1] for c in counters)
        assert not errors, errors[:5]
        # 0 loss: every acked span reaches the sink (polled with a deadline).
        deadline = time.monotonic() + 60
        while sink.count() < acked and time.monotonic() < deadline:
            time.sleep(0.2)  # polling interval
        delivered = sink.count()
        # Scrapes and detectors ran: the prometheus receiver took points in, golden signals came out.
        import requests
        scraped, golden = scraped_and_detected(a.metrics_text(),
                                               requests.get(f"http://127.0.0.1:{prom_port}/metrics", timeout=5).text)
        steady = [s for s in samples if s["t"] >= warmup]
        window_s = steady[-1]["t"] - steady[0]["t"] if len(steady) > 1 else 0.0
        fits = {k: slope([(s["t"], s[k]) for s in steady]) for k in ("rss_mib", "fds", "queue")}
        rate = acked / elapsed
        report = (f"soak steady: {elapsed:.0f} s, {acked} spans acked ({rate:.0f}/s, target {SPANS_PER_S}), "
                  f"{delivered} delivered, {refused} refused requests; over {window_s:.0f} s after a {warmup:.0f} s "
                  f"warm-up: RSS slope {fits['rss_mib'] * 60:+.3f} MiB/min (RSS {steady[0]['rss_mib']:.0f} -> "
                  f"{steady[-1]['rss_mib']:.0f} MiB), fds slope {fits['fds'] * 60:+.3f}/min "
                  f"({steady[0]['fds']} -> {steady[-1]['fds']}), queue slope {fits['queue'] * 60:+.3f} batches/min "
                  f"(max {max(s['queue'] for s in steady):.0f}); {scraped:.0f} scraped points, "
                  f"{golden} golden-signal series")
        print(report)
        Path(os.environ.get("INFERWATCH_SOAK_REPORT", "/dev/null")).write_text(report + "\n")
        assert len(steady) >= 3, f"too few samples after the warm-up: {samples}"
        assert delivered == acked, f"lost {acked - delivered} of {acked} acked spans; {report}"
        assert rate >= 0.8 * SPANS_PER_S, f"the load was not sustained: {report}"
        assert refused * SPANS_PER_REQUEST <= 0.01 * acked, f"the agent refused load at a steady rate: {report}"
        assert fits["rss_mib"] * window_s < RSS_DRIFT_MIB, f"RSS grows: {report}"
        assert fits["fds"] * window_s < FD_DRIFT, f"fds grow: {report}"
        assert fits["queue"] * window_s < QUEUE_DRIFT, f"the exporter queue grows: {report}"
        assert scraped > 0, f"the scrapes took nothing in: {report}"
        assert golden > 0, f"no golden signals reached the detectors' exporter: {report}"
    finally:
        sink.stop()

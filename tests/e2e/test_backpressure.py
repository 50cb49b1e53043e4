"""Backpressure: the memory limiter refuses (RESOURCE_EXHAUSTED / 429) before memory runs away,
and a full exporter queue refuses (UNAVAILABLE / 503), both with a retry hint."""

from __future__ import annotations

import threading
import time

import grpc
import requests

from support.agent import make_config, otlp_exporter
from support.client import GrpcClient, SendLog, has_retry_info, http_post, trace_request
from support.sink import Behavior

MIB = 1024 * 1024
# How far above limit_mib the peak RSS (VmHWM) may go: requests being decoded while the limiter
# has not yet measured, allocator slack. Stated here so a regression beyond it fails loudly.
MARGIN_MIB = 50
LIMIT_ABOVE_IDLE_MIB = 80
SPIKE_MIB = 20
# Once downstream is fast again the backlog drains in about a second; memory must fall back
# under the soft limit (and data be accepted again) well within this.
RECOVERY_S = 15


def idle_rss_mib(agents, exporter_endpoint: str) -> float:
    """RSS of an idle agent with the same pipeline (no limiter), in MiB."""
    cfg, ports = make_config({"otlp/sink": otlp_exporter(exporter_endpoint)}, signals=("traces",))
    probe = agents("idle-probe", cfg, ports)
    rss = probe.proc_status()["VmRSS"] / 1024
    assert probe.stop() == 0
    return rss


def test_memory_limiter_refuses_and_bounds_rss(agents, grpc_sink):
    sink = grpc_sink(Behavior(delay_s=0.5))  # slow downstream: data piles up inside the agent
    idle = idle_rss_mib(agents, sink.endpoint)
    limit = int(idle + LIMIT_ABOVE_IDLE_MIB)
    cfg, ports = make_config(
        {"otlp/sink": otlp_exporter(sink.endpoint, sending_queue={"enabled": True, "num_consumers": 2, "queue_size": 100000},
                                    compression="none")},
        processors={"memory_limiter": {"check_interval": "50ms", "limit_mib": limit, "spike_limit_mib": SPIKE_MIB}},
        pipeline_processors=("memory_limiter", "batch"),
        signals=("traces",),
        batch={"timeout": "100ms", "send_batch_size": 2000, "send_batch_max_size": 2000},
        shutdown_timeout="1s",
    )
    a = agents("limited", cfg, ports)

    # Big requests (1000 spans x ~1 KiB), prebuilt so the senders are fast.
    bodies = [trace_request(1000, payload_bytes=1024, name=f"big{i}")[0] for i in range(4)]
    log = SendLog()
    http_codes: dict[int, int] = {}
    http_retry_after: list[str] = []
    stop = threading.Event()
    peak = {"hwm": 0}

    def grpc_pump(k: int) -> None:
        c = GrpcClient(ports.grpc_endpoint)
        try:
            i = 0
            while not stop.is_set():
                try:
                    c.export("traces", bodies[(i + k) % len(bodies)], timeout=10)
                    log.ok([b"x"])
                except grpc.RpcError as e:
                    if e.code() in (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE):
                        log.refuse(e.code().name, has_retry_info(e))
                        stop.wait(0.01)
                    else:
                        log.errors.append(f"{e.code().name}: {e.details()}")
                        return
                i += 1
        finally:
            c.close()

    def http_pump() -> None:
        while not stop.is_set():
            try:
                r = http_post(ports.http_url, "traces", bodies[0], timeout=10)
            except requests.RequestException as e:
                log.errors.append(f"http: {e}")
                return
            http_codes[r.status_code] = http_codes.get(r.status_code, 0) + 1
            if r.status_code == 429:
                http_retry_after.append(r.headers.get("Retry-After", ""))
                stop.wait(0.01)

    threads = [threading.Thread(target=grpc_pump, args=(k,), daemon=True) for k in range(3)]
    threads.append(threading.Thread(target=http_pump, daemon=True))
    for t in threads:
        t.start()
    t0 = time.monotonic()
    try:
        # Push until both transports have been refused for memory a few times (bounded: 40 s).
        while time.monotonic() - t0 < 40:
            peak["hwm"] = max(peak["hwm"], a.proc_status()["VmHWM"])
            if log.refused.get("RESOURCE_EXHAUSTED", 0) >= 20 and http_codes.get(429, 0) >= 3:
                break
            if log.errors or not a.running():
                break
            stop.wait(0.1)
        # Keep the pressure on a little longer to see the limit hold, and stop it at a moment
        # when RSS is above the hard limit: the agent must then get back under the soft limit by
        # itself once the backlog drains.
        end = time.monotonic() + 3
        hard_end = end + 10
        while a.running() and time.monotonic() < hard_end:
            st = a.proc_status()
            peak["hwm"] = max(peak["hwm"], st["VmHWM"])
            if time.monotonic() >= end and st["VmRSS"] > limit * 1024:
                break
            stop.wait(0.05)
    finally:
        stop.set()
        for t in threads:
            t.join(15)
    assert a.running(), f"agent died under memory pressure:\n{a.log()[-3000:]}"
    hwm_mib = max(peak["hwm"], a.proc_status()["VmHWM"]) / 1024
    print(f"idle {idle:.0f} MiB, limit {limit} MiB, peak {hwm_mib:.0f} MiB, grpc {log.refused}, http {http_codes}")
    assert not log.errors, log.errors[:5]
    assert log.refused.get("RESOURCE_EXHAUSTED", 0) > 0, f"never refused for memory: grpc {log.refused}, http {http_codes}"
    assert log.retry_info == sum(log.refused.values()), "refusals without google.rpc.RetryInfo"
    assert http_codes.get(429, 0) > 0, f"HTTP never got 429: {http_codes}"
    assert all(v.strip().isdigit() for v in http_retry_after), f"429 without a numeric Retry-After: {http_retry_after[:5]}"
    assert hwm_mib < limit + MARGIN_MIB, f"peak RSS {hwm_mib:.0f} MiB exceeds limit {limit} + {MARGIN_MIB} MiB"
    assert a.metric("otelcol_receiver_refused_spans_total") > 0
    assert a.metric("otelcol_processor_refused_spans_total", processor="memory_limiter") > 0

    # Once downstream is fast again and the backlog drains, data is accepted again.
    with sink.behavior.lock:
        sink.behavior.delay_s = 0
    c = GrpcClient(ports.grpc_endpoint)
    deadline = time.monotonic() + RECOVERY_S
    accepted = False
    last = ""
    try:
        while time.monotonic() < deadline:
            req, ids = trace_request(5, name="after-pressure")
            try:
                c.export("traces", req)
                accepted = True
                break
            except grpc.RpcError as e:
                last = f"{e.code().name}: {e.details()}"
                time.sleep(0.2)  # polling interval
    finally:
        c.close()
    if not accepted:
        m = a.metric
        raise AssertionError(
            f"agent still refuses {RECOVERY_S} s after the pressure stopped ({last}); RSS {a.proc_status()['VmRSS'] // 1024} MiB, "
            f"exporter queue {m('otelcol_exporter_queue_size', data_type='traces')}, "
            f"accepted {m('otelcol_receiver_accepted_spans_total')}, sent {m('otelcol_exporter_sent_spans_total')}, "
            f"sink got {sink.item_count('traces')} spans")
    sink.wait_span_ids(ids)


def test_full_exporter_queue_refuses_with_unavailable(agents, grpc_sink):
    """queue_size 2 and a slow downstream: the receiver answers UNAVAILABLE / 503, and the counts add up."""
    sink = grpc_sink(Behavior(delay_s=0.3))
    cfg, ports = make_config(
        {"otlp/slow": otlp_exporter(sink.endpoint, sending_queue={"enabled": True, "num_consumers": 1, "queue_size": 2})},
        pipeline_processors=(),
        signals=("traces",),
        shutdown_timeout="5s",
    )
    a = agents("queue", cfg, ports)
    c = GrpcClient(ports.grpc_endpoint)
    acked: list[bytes] = []
    refused_spans = 0
    retry_hints = 0
    try:
        for _ in range(12):
            req, ids = trace_request(10, name="q")
            try:
                c.export("traces", req)
                acked.extend(ids)
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.UNAVAILABLE, (e.code(), e.details())
                refused_spans += len(ids)
                retry_hints += int(has_retry_info(e))
        req, ids = trace_request(10, name="q-http")
        r = http_post(ports.http_url, "traces", req)
        if r.status_code == 200:
            acked.extend(ids)
        else:
            assert r.status_code == 503, (r.status_code, r.text)
            assert r.headers.get("Retry-After", "").strip().isdigit(), r.headers
            refused_spans += len(ids)
    finally:
        c.close()
    assert refused_spans > 0, "a queue of 2 behind a slow sink never filled"
    assert retry_hints > 0, "UNAVAILABLE without RetryInfo"
    sink.wait_span_ids(acked, timeout=30)
    assert set(sink.span_ids()) == set(acked), "refused spans were delivered anyway (or acked ones lost)"
    assert a.metric("otelcol_receiver_accepted_spans_total") == len(acked)
    assert a.metric("otelcol_receiver_refused_spans_total") == refused_spans
    assert a.metric("otelcol_exporter_enqueue_failed_spans_total", exporter="otlp/slow") == refused_spans
    assert a.metric("otelcol_exporter_queue_capacity", exporter="otlp/slow", data_type="traces") == 2
    a.wait_metric("otelcol_exporter_queue_size", lambda v: v == 0, exporter="otlp/slow", data_type="traces")

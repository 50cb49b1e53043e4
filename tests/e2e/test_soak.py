"""Soak (INFERWATCH_SLOW=1 only): sustained load through A -> B -> a flaky sink.

Four senders push spans through two agents for SOAK_S seconds while the sink answers
UNAVAILABLE to 10 % of requests. Every acknowledged span must arrive, and RSS after the run
must not have grown much past what it was after the warm-up (a leak check).
"""

from __future__ import annotations

import os
import threading
import time

import grpc
import pytest

from support.agent import make_config, otlp_exporter
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

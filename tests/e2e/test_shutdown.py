"""Graceful shutdown: receivers stop first, queues drain within service.shutdown_timeout, exit 0,
and nothing the agent acknowledged is lost."""

from __future__ import annotations

import re
import signal
import threading
import time

import pytest
import requests

from support.agent import free_port, make_config, otlp_exporter
from support.client import SendLog, pump_grpc
from support.sink import Behavior

SHUTDOWN_TIMEOUT_S = 5


def test_sigterm_under_load_delivers_everything_acknowledged(agents, grpc_sink):
    sink = grpc_sink(Behavior(delay_s=0.02))
    cfg, ports = make_config(
        {"otlp/sink": otlp_exporter(sink.endpoint, sending_queue={"enabled": True, "num_consumers": 2, "queue_size": 5000})},
        signals=("traces",),
        shutdown_timeout=f"{SHUTDOWN_TIMEOUT_S}s",
        batch={"timeout": "500ms", "send_batch_size": 300},
    )
    a = agents("agent", cfg, ports)
    log = SendLog()
    stop = threading.Event()
    pumps = [threading.Thread(target=pump_grpc, args=(ports.grpc_endpoint, log, stop),
                              kwargs={"spans_per_request": 50, "deadline_s": 30, "service": f"pump{k}"}, daemon=True)
             for k in range(4)]
    for p in pumps:
        p.start()
    try:
        # Load until a good amount is in flight (bounded), then SIGTERM while the pumps keep sending.
        sink.wait_items("traces", 2000, timeout=20)
        t0 = time.monotonic()
        a.send_signal(signal.SIGTERM)
        a.proc.wait(SHUTDOWN_TIMEOUT_S + 10)
        took = time.monotonic() - t0
    finally:
        stop.set()
        for p in pumps:
            p.join(15)
    assert a.proc.returncode == 0, f"exit code {a.proc.returncode}"
    assert took <= SHUTDOWN_TIMEOUT_S + 2, f"shutdown took {took:.1f}s (timeout {SHUTDOWN_TIMEOUT_S}s)"
    unexpected = [e for e in log.errors if not e.startswith(("UNAVAILABLE", "DEADLINE_EXCEEDED"))]
    assert not unexpected, unexpected[:5]
    acked = set(log.acked)
    got = set(sink.span_ids())
    missing = acked - got
    print(f"acked {len(acked)} spans, delivered {len(got)}, shutdown {took:.2f}s, refused {log.refused}")
    assert len(acked) >= 2000
    assert not missing, f"{len(missing)} of {len(acked)} acknowledged spans were lost at shutdown"


def test_sigterm_with_dead_downstream_exits_within_timeout(agents):
    cfg, ports = make_config({"otlp/dead": otlp_exporter(f"127.0.0.1:{free_port()}")}, signals=("traces", "logs"),
                             shutdown_timeout="2s")
    a = agents("agent", cfg, ports)
    from support.client import GrpcClient, trace_request

    c = GrpcClient(ports.grpc_endpoint)
    try:
        for _ in range(5):
            c.export("traces", trace_request(20)[0])  # accepted into the queue; can never be delivered
    finally:
        c.close()
    a.wait_metric("otelcol_receiver_accepted_spans_total", lambda v: v == 100)
    t0 = time.monotonic()
    a.send_signal(signal.SIGTERM)
    # While it drains, the health check must stop saying 200 (503, or no longer listening).
    health = None
    while time.monotonic() - t0 < 1.5 and a.running():
        try:
            health = requests.get(f"http://127.0.0.1:{ports.health}/", timeout=0.5).status_code
        except requests.RequestException:
            health = "down"
        if health != 200:
            break
        time.sleep(0.05)  # polling interval
    rc = a.stop(timeout=15)
    took = time.monotonic() - t0
    # Accepted data was dropped: the exit code says so (3), distinct from a bad config (2).
    assert rc == 3, f"exit {rc}\n{a.log()[-2000:]}"
    assert took <= 2 + 2, f"shutdown with an undeliverable queue took {took:.1f}s (timeout 2s)"
    assert health != 200, "health_check still answered 200 1.5 s into the shutdown"
    # The loss is reported, not silent.
    assert "could not be delivered" in a.log() or "undelivered" in a.log() or "dropped" in a.log(), a.log()[-2000:]
    m = re.search(r"(\d+) accepted items could not be delivered and were dropped", a.log())
    assert m and int(m.group(1)) == 100, a.log()[-2000:]


def test_sigint_is_a_graceful_stop_too(agents, grpc_sink):
    sink = grpc_sink()
    cfg, ports = make_config({"otlp/sink": otlp_exporter(sink.endpoint)}, signals=("logs",),
                             batch={"timeout": "10s", "send_batch_size": 100000})
    a = agents("agent", cfg, ports)
    from support.client import GrpcClient, logs_request

    c = GrpcClient(ports.grpc_endpoint)
    try:
        c.export("logs", logs_request(7))  # sits in the batch buffer (10 s timeout)
    finally:
        c.close()
    assert sink.item_count("logs") == 0
    rc = a.stop(timeout=15, sig=signal.SIGINT)
    assert rc == 0
    assert sink.item_count("logs") == 7, "the batch buffer was not flushed on shutdown"
    assert a.stop_seconds < 5, f"took {a.stop_seconds:.1f}s"


def test_port_in_use_fails_start_loudly(agents):
    """A receiver that cannot bind stops the agent with a non-zero exit and names the address."""
    import socket

    from support.agent import Ports

    ports = Ports()
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", ports.grpc))
    blocker.listen()
    try:
        cfg, _ = make_config({"debug": {}}, ports=ports, signals=("traces",))
        a = agents("agent", cfg, ports, start=False)
        a.start(wait=False)
        rc = a.proc.wait(20)
    finally:
        blocker.close()
    assert rc not in (0, None), a.log()
    assert rc != 2, "exit 2 is for configuration errors"
    assert f"127.0.0.1:{ports.grpc}" in a.log(), a.log()


def test_open_files_soft_limit_is_raised_to_the_hard_limit(agents, tmp_path):
    """At the 1,024 soft limit a default unit leaves, the agent raises it to the hard limit."""
    import os
    import resource
    import subprocess

    from support import yamlgen
    from support.agent import binary, with_nofile

    cfg, ports = make_config({"debug": {}}, signals=("traces",))
    path = tmp_path / "nofile.yaml"
    path.write_text(yamlgen.dump(cfg))
    soft, hard = 1024, min(8192, resource.getrlimit(resource.RLIMIT_NOFILE)[1])
    if hard <= soft:
        pytest.skip(f"hard limit {hard} leaves nothing to raise")
    log = tmp_path / "nofile.log"
    env = {k: v for k, v in os.environ.items() if k != "RUST_LOG"}
    with open(log, "wb") as out:
        p = subprocess.Popen(with_nofile([binary(), "--log-level", "info", "run", "--config", str(path)], soft, hard),
                             stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
    try:
        deadline = time.monotonic() + 20
        limits = ""
        while time.monotonic() < deadline and p.poll() is None:
            if "pipelines running" in log.read_text():
                limits = open(f"/proc/{p.pid}/limits").read()
                break
            time.sleep(0.05)  # polling interval
        line = next((l for l in limits.splitlines() if l.startswith("Max open files")), "")
        assert line.split()[3:5] == [str(hard), str(hard)], (line, log.read_text())
        text = log.read_text()
        assert "raised the open-files limit" in text and f"old={soft}" in text and f"new={hard}" in text, text
    finally:
        p.terminate()
        assert p.wait(15) == 0

"""Downstream failures: an outage, permanent rejections, and a dead exporter beside a live one."""

from __future__ import annotations

import collections
import re
import time

import grpc
import pytest

from support import otlp
from support.agent import free_port, make_config, otlp_exporter, otlphttp_exporter
from support.client import GrpcClient, trace_request
from support.sink import Behavior

OUTAGE_S = 10.0


def test_downstream_outage_then_recovery_delivers_every_accepted_span(agents, grpc_sink):
    """The sink is down for 10 s while spans keep coming; once it is up, every acked span arrives."""
    port = free_port()  # nothing listens here until the sink starts
    cfg, ports = make_config({"otlp/sink": otlp_exporter(f"127.0.0.1:{port}")}, signals=("traces",))
    a = agents("agent", cfg, ports)
    client = GrpcClient(ports.grpc_endpoint)
    acked: list[bytes] = []
    t0 = time.monotonic()
    try:
        # Keep sending through the whole outage, 25 spans every 0.5 s (the pacing is the scenario,
        # not a synchronisation).
        while time.monotonic() - t0 < OUTAGE_S:
            req, ids = trace_request(25, name="outage")
            client.export("traces", req)  # must be accepted: the queue has room
            acked.extend(ids)
            time.sleep(0.5)
        assert a.metric("otelcol_exporter_sent_spans_total", exporter="otlp/sink") == 0
        sink = grpc_sink(port=port)
        req, ids = trace_request(25, name="after")
        client.export("traces", req)
        acked.extend(ids)
    finally:
        client.close()
    sink.wait_span_ids(acked, timeout=30)
    got = collections.Counter(sink.span_ids())
    missing = set(acked) - set(got)
    assert not missing, f"{len(missing)} of {len(acked)} acknowledged spans never arrived"
    assert set(got) == set(acked), "the sink got spans nobody sent"
    dups = sum(c - 1 for c in got.values() if c > 1)
    # At-least-once is allowed; report how often a span came twice.
    print(f"{len(acked)} spans, {dups} duplicates after the outage")
    a.wait_metric("otelcol_exporter_sent_spans_total", lambda v: v >= len(acked), exporter="otlp/sink")
    assert a.metric("otelcol_receiver_refused_spans_total") == 0
    assert a.metric("otelcol_exporter_send_failed_spans_total") == 0


@pytest.mark.parametrize("kind", ["otlp", "otlphttp"])
def test_permanent_rejection_is_counted_and_not_retried(agents, grpc_sink, http_sink, kind):
    """INVALID_ARGUMENT / HTTP 400 from downstream: items counted as failed, each request sent once."""
    behavior = Behavior(always=grpc.StatusCode.INVALID_ARGUMENT)
    if kind == "otlp":
        sink = grpc_sink(behavior)
        exporter = otlp_exporter(sink.endpoint)
    else:
        sink = http_sink(behavior)
        exporter = otlphttp_exporter(sink.endpoint)
    cfg, ports = make_config({"otlp/sink": exporter} if kind == "otlp" else {"otlphttp/sink": exporter},
                             signals=("traces",))
    name = f"{kind}/sink"
    a = agents("agent", cfg, ports)
    client = GrpcClient(ports.grpc_endpoint)
    sent: list[bytes] = []
    try:
        for _ in range(3):
            req, ids = trace_request(10, name="rejected")
            client.export("traces", req)  # the agent accepts; downstream rejects later
            sent.extend(ids)
        a.wait_metric("otelcol_exporter_send_failed_spans_total", lambda v: v >= 30, exporter=name)
        # Now downstream accepts; a sentinel span shows when the exporter has moved on. Had the
        # rejected spans been retried, they would now be delivered too.
        with behavior.lock:
            behavior.always = None
        req, sentinel = trace_request(1, name="sentinel")
        client.export("traces", req)
    finally:
        client.close()
    sink.wait_span_ids(sentinel)
    attempts = [at for at in sink.snapshot() if at.signal == "traces"]
    seen = collections.Counter(s.span_id for at in attempts for _, _, s in otlp.iter_spans(at.request))
    assert set(sent) <= set(seen), "some spans never reached downstream at all"
    resent = {sid: n for sid, n in seen.items() if sid in set(sent) and n > 1}
    assert not resent, f"{len(resent)} rejected spans were sent more than once (retried a permanent error)"
    assert set(sink.span_ids()) == set(sentinel), "rejected spans were delivered later"
    assert a.metric("otelcol_exporter_send_failed_spans_total", exporter=name) == 30
    a.wait_metric("otelcol_exporter_sent_spans_total", lambda v: v >= 1, exporter=name)
    assert a.metric("otelcol_exporter_sent_spans_total", exporter=name) == 1


def test_dead_exporter_does_not_block_live_one(agents, grpc_sink):
    """Two exporters in one pipeline; one points at a closed port. The live one gets everything."""
    sink = grpc_sink()
    dead = f"127.0.0.1:{free_port()}"
    cfg, ports = make_config(
        {"otlp/dead": otlp_exporter(dead), "otlp/live": otlp_exporter(sink.endpoint)},
        signals=("traces", "logs"), shutdown_timeout="2s",
    )
    a = agents("agent", cfg, ports)
    client = GrpcClient(ports.grpc_endpoint)
    acked: list[bytes] = []
    try:
        for _ in range(40):
            req, ids = trace_request(50, name="fanout")
            client.export("traces", req)
            acked.extend(ids)
    finally:
        client.close()
    sink.wait_span_ids(acked, timeout=30)
    got = collections.Counter(sink.span_ids())
    assert set(got) == set(acked)
    assert all(n == 1 for n in got.values()), "the live exporter delivered duplicates"
    a.wait_metric("otelcol_exporter_sent_spans_total", lambda v: v == len(acked), exporter="otlp/live")
    assert a.metric("otelcol_exporter_sent_spans_total", exporter="otlp/dead") == 0
    assert a.metric("otelcol_receiver_refused_spans_total") == 0
    # The dead exporter holds its data (queued or retrying), and the agent still reports healthy.
    assert a.health() == 200
    # Its data can never be delivered: the stop says how much was dropped and exits 3.
    rc = a.stop(timeout=15)
    assert rc == 3, f"exit {rc}: a stop that drops accepted data must not exit 0\n{a.log()[-2000:]}"
    assert "accepted items could not be delivered and were dropped" in a.log(), a.log()[-2000:]


@pytest.mark.parametrize("kind", ["otlp", "otlphttp"])
def test_server_retry_delay_replaces_backoff(agents, grpc_sink, http_sink, kind):
    """Downstream says "retry in 2 s" (gRPC RetryInfo / HTTP Retry-After): the exporter waits that
    long instead of its 100 ms back-off, then delivers."""
    behavior = Behavior(fail_first=1, retry_after_s=2)
    if kind == "otlp":
        sink = grpc_sink(behavior)
        exporter = otlp_exporter(sink.endpoint)
    else:
        sink = http_sink(behavior)
        exporter = otlphttp_exporter(sink.endpoint)
    cfg, ports = make_config({f"{kind}/sink": exporter}, signals=("traces",))
    agents("agent", cfg, ports)
    req, ids = trace_request(3, name="retry-after")
    c = GrpcClient(ports.grpc_endpoint)
    try:
        c.export("traces", req)
    finally:
        c.close()
    sink.wait_span_ids(ids)
    attempts = [at for at in sink.snapshot() if at.signal == "traces"]
    assert [at.ok for at in attempts] == [False, True], sink.summary()
    gap = attempts[1].at - attempts[0].at
    assert 1.8 <= gap <= 6, f"retried after {gap:.2f}s; the server asked for 2s"


# ---- a corrupt state file (issue 15): quarantined, never a crash loop -----------------------

STATE_FILE = "inferwatch-state.redb"


def storage_config(state_dir, on_corrupt: str | None = None):
    cfg, ports = make_config({"debug": {}}, signals=("traces",))
    st = {"directory": str(state_dir), "checkpoint_interval": "100ms"}
    if on_corrupt:
        st["on_corrupt"] = on_corrupt
    cfg["extensions"]["storage"] = st
    cfg["service"]["extensions"].append("storage")
    return cfg, ports


def write_valid_state(agents, state_dir) -> bytes:
    cfg, ports = storage_config(state_dir)
    a = agents("seed", cfg, ports)
    a.wait_metric("inferwatch_checkpoints_total", lambda v: v >= 1, result="ok")
    assert a.stop(timeout=15) == 0, a.log()
    return (state_dir / STATE_FILE).read_bytes()


def corrupt(kind: str, path, valid: bytes) -> None:
    if kind == "garbage":
        path.write_bytes(b"\x5a" * len(valid))
    elif kind == "flipped":
        # Every byte after the header flipped: what a failing disk or a bad copy leaves.
        path.write_bytes(valid[:512] + bytes(b ^ 0xFF for b in valid[512:]))
    elif kind == "header":
        path.write_bytes(bytes(b ^ 0xFF for b in valid[:4096]) + valid[4096:])
    elif kind == "truncated":
        path.write_bytes(valid[: len(valid) // 3])
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "directory":
        path.unlink()
        path.mkdir()
    else:
        raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["garbage", "flipped", "header", "truncated", "empty", "directory"])
def test_corrupt_state_file_is_moved_aside_and_the_agent_serves(agents, tmp_path, kind):
    state = tmp_path / "state"
    valid = write_valid_state(agents, state)
    corrupt(kind, state / STATE_FILE, valid)
    cfg, ports = storage_config(state)
    a = agents("agent", cfg, ports)  # starts and serves: no exit 1, no panic (101), no crash loop
    assert a.health() == 200
    moved = sorted(p.name for p in state.iterdir() if ".corrupt-" in p.name)
    log = a.log()
    warns = [l for l in log.splitlines() if "WARN" in l and "state file unusable" in l]
    if kind == "truncated" and not moved:
        # redb can repair a file cut after its last commit; then nothing was lost.
        assert not warns, log
    else:
        assert len(moved) == 1, (moved, log)
        assert re.fullmatch(r"inferwatch-state\.redb\.corrupt-\d+", moved[0]), moved
        assert len(warns) == 1, log
        assert moved[0] in warns[0], warns[0]
        reason = a.metric("inferwatch_state_unusable_total", scope="file")
        assert reason == 1, a.metrics_text()
        if kind == "empty":
            assert "reason=empty" in warns[0] or 'reason="empty"' in warns[0] or "0 bytes" in warns[0], warns[0]
    assert "panicked at" not in log, log  # no panic escaped to the default hook
    # The fresh store works: checkpoints succeed, and a restart finds no corruption.
    a.wait_metric("inferwatch_checkpoints_total", lambda v: v >= 2, result="ok")
    assert a.stop(timeout=15) == 0, a.log()
    b = agents("again", cfg, ports)
    assert "state file unusable" not in b.log(), b.log()


def test_on_corrupt_fail_exits_2_with_one_line_and_keeps_the_file(agents, tmp_path):
    state = tmp_path / "state"
    valid = write_valid_state(agents, state)
    corrupt("garbage", state / STATE_FILE, valid)
    cfg, ports = storage_config(state, on_corrupt="fail")
    a = agents("agent", cfg, ports, start=False)
    a.start(wait=False)
    rc = a.proc.wait(20)
    log = a.log()
    assert rc == 2, f"exit {rc}\n{log}"
    errors = [l for l in log.splitlines() if l.startswith("error:")]
    assert len(errors) == 1, log
    assert str(state / STATE_FILE) in errors[0] and "on_corrupt" in errors[0], errors[0]
    assert "panicked at" not in log, log  # no panic escaped to the default hook
    assert (state / STATE_FILE).read_bytes() == b"\x5a" * len(valid), "the file must be left as it was"
    assert not [p for p in state.iterdir() if ".corrupt-" in p.name]

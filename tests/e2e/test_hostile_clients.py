"""What an attacker found, as regression tests against the real binary on loopback: idle and
slow connections must not starve good clients, decompression bombs in parallel must not
inflate memory, and one gRPC connection cannot open streams without limit.

The agent runs with RLIMIT_NOFILE 1024 (soft and hard, what a default systemd unit leaves), so
that the agent's own limits, not a raised descriptor limit, are what keeps it serving."""

from __future__ import annotations

import concurrent.futures as cf
import gzip
import resource
import socket
import time
import zlib

import grpc
import pytest
import requests

from support.agent import make_config, otlp_exporter
from support.client import GrpcClient, http_post, trace_request

NOFILE = 1024


def _raise_own_fd_limit(need: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < need:
        if hard != resource.RLIM_INFINITY and hard < need:
            pytest.skip(f"the test needs {need} descriptors; hard limit {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))


def _agent(agents, grpc_sink, receiver_over: dict | None = None, memory_limit_mib: int | None = None):
    sink = grpc_sink()
    procs = {}
    pp: tuple = ("batch",)
    if memory_limit_mib:
        procs["memory_limiter"] = {"check_interval": "100ms", "limit_mib": memory_limit_mib, "spike_limit_mib": 64}
        pp = ("memory_limiter", "batch")
    cfg, ports = make_config({"otlp/sink": otlp_exporter(sink.endpoint)}, signals=("traces",), processors=procs,
                             pipeline_processors=pp)
    for proto in ("grpc", "http"):
        cfg["receivers"]["otlp"]["protocols"][proto].update((receiver_over or {}).get(proto, {}))
    return agents("agent", cfg, ports, nofile=NOFILE), ports, sink


def _good_client_latencies(ports, n: int = 10) -> list[float]:
    """Exports `n` small requests on fresh connections, alternating gRPC and HTTP; each must succeed
    within its 5 s client deadline (what a real exporter would wait before retrying)."""
    out = []
    for i in range(n):
        req, _ = trace_request(2, name="good")
        t0 = time.monotonic()
        if i % 2 == 0:
            c = GrpcClient(ports.grpc_endpoint)
            try:
                c.export("traces", req, timeout=5)
            finally:
                c.close()
        else:
            r = http_post(ports.http_url, "traces", req, timeout=5)
            assert r.status_code == 200, r.text
        out.append(time.monotonic() - t0)
    return out


def test_idle_and_slow_connections_do_not_starve_good_clients(agents, grpc_sink):
    _raise_own_fd_limit(8192)
    a, ports, sink = _agent(agents, grpc_sink)
    idle: list[socket.socket] = []
    try:
        # 1,100 idle TCP connections to each listener (more than the agent's 1,024 descriptors) ...
        for port in (ports.http, ports.grpc, ports.health):
            for _ in range(1100 if port != ports.health else 300):
                s = socket.socket()
                s.setblocking(False)
                try:
                    s.connect(("127.0.0.1", port))
                except BlockingIOError:
                    pass
                idle.append(s)
        # ... and slowloris clients sending one header byte at a time.
        slow = []
        for _ in range(50):
            s = socket.create_connection(("127.0.0.1", ports.http), timeout=5)
            s.sendall(b"POST /v1/traces HTTP/1.1\r\nHost: x\r\n")
            slow.append(s)
        for s in slow:
            try:
                s.send(b"X")
            except OSError:
                pass
        # Each good request must succeed within its client's 5 s deadline (a starved listener
        # times out); the latencies are printed, not asserted (a shared machine's timing).
        lat = _good_client_latencies(ports)
        print(f"good client latencies {lat}")
        assert requests.get(f"http://127.0.0.1:{ports.health}/", timeout=2).status_code == 200
        assert a.running()
        sink.wait_spans(2 * len(lat), timeout=20)
    finally:
        for s in idle:
            s.close()


def test_slow_header_client_is_cut_off(agents, grpc_sink):
    a, ports, _ = _agent(agents, grpc_sink, {"http": {"read_header_timeout": "1s"}})
    s = socket.create_connection(("127.0.0.1", ports.http), timeout=10)
    s.sendall(b"POST /v1/traces HTTP/1.1\r\n")
    t0 = time.monotonic()
    closed = False
    while time.monotonic() - t0 < 8:
        try:
            s.sendall(b"X")  # one header byte per 0.2 s
            s.settimeout(0.2)
            data = s.recv(4096)
            if data == b"" or data.startswith(b"HTTP/1.1 408") or data.startswith(b"HTTP/1.1 400"):
                closed = True
                break
        except socket.timeout:
            continue
        except OSError:
            closed = True
            break
    s.close()
    assert closed, "a client sending one header byte at a time was not cut off within 8 s"
    assert time.monotonic() - t0 >= 0.9
    assert a.running()


def _gzip_bomb(inflated_mib: int) -> bytes:
    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    chunk = b"\0" * (1 << 20)
    parts = [c.compress(chunk) for _ in range(inflated_mib)]
    parts.append(c.flush())
    return b"".join(parts)


def test_parallel_gzip_bombs_keep_memory_bounded_and_good_clients_served(agents, grpc_sink):
    a, ports, sink = _agent(agents, grpc_sink, memory_limit_mib=512)
    base = a.proc_status()["VmRSS"]
    bomb = _gzip_bomb(64)  # 64 MiB inflated, ~64 KB on the wire
    assert len(bomb) < 200_000

    def http_bomb(_):
        try:
            r = requests.post(f"{ports.http_url}/v1/traces", data=bomb, timeout=30,
                              headers={"Content-Type": "application/x-protobuf", "Content-Encoding": "gzip"})
            return r.status_code
        except requests.RequestException as e:
            return type(e).__name__

    def grpc_bomb(_):
        c = GrpcClient(ports.grpc_endpoint)
        try:
            # A raw body that grpcio sends gzip-compressed (grpc-encoding: gzip).
            call = c.channel.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export",
                                         request_serializer=None, response_deserializer=None)
            call(b"\0" * (64 << 20), timeout=30, compression=grpc.Compression.Gzip)
            return "OK"
        except grpc.RpcError as e:
            return e.code().name
        finally:
            c.close()

    with cf.ThreadPoolExecutor(48) as pool:
        futs = [pool.submit(http_bomb, i) for i in range(32)] + [pool.submit(grpc_bomb, i) for i in range(8)]
        lat = _good_client_latencies(ports, 6)
        codes = [f.result() for f in futs]
    assert all(c in (400, 413, 429, 503) for c in codes[:32]), codes[:32]
    assert all(c in ("INVALID_ARGUMENT", "RESOURCE_EXHAUSTED", "UNAVAILABLE") for c in codes[32:]), codes[32:]
    hwm = a.proc_status()["VmHWM"]
    print(f"RSS before {base / 1024:.0f} MiB, high-water mark {hwm / 1024:.0f} MiB, good-client latencies {lat}")
    # The inflation budget is 128 MiB process-wide (plus decode buffers and what the allocator
    # keeps); before it, 48 such bombs took RSS to 1.49 GiB.
    assert hwm - base < 400 * 1024, f"RSS grew by {(hwm - base) / 1024:.0f} MiB under 40 parallel bombs"
    # Starvation shows as a good client's 5 s deadline expiring inside _good_client_latencies.
    sink.wait_spans(2 * len(lat), timeout=20)
    assert a.running()


def test_one_grpc_connection_cannot_open_unbounded_streams(agents, grpc_sink):
    """The gRPC listener advertises SETTINGS_MAX_CONCURRENT_STREAMS (a finding: 20,000 streams on
    one connection were accepted), so clients queue streams beyond it."""
    a, ports, sink = _agent(agents, grpc_sink)
    # Read the server's HTTP/2 SETTINGS frame: SETTINGS_MAX_CONCURRENT_STREAMS (id 3) must be present.
    s = socket.create_connection(("127.0.0.1", ports.grpc), timeout=5)
    s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")
    buf = b""
    deadline = time.monotonic() + 5
    while len(buf) < 9 and time.monotonic() < deadline:
        buf += s.recv(4096)
    length = int.from_bytes(buf[0:3], "big")
    while len(buf) < 9 + length and time.monotonic() < deadline:
        buf += s.recv(4096)
    s.close()
    assert buf[3] == 0x4, f"first server frame is not SETTINGS: {buf[:9]!r}"
    payload = buf[9:9 + length]
    settings = {int.from_bytes(payload[i:i + 2], "big"): int.from_bytes(payload[i + 2:i + 6], "big")
                for i in range(0, len(payload), 6)}
    assert 3 in settings, f"no SETTINGS_MAX_CONCURRENT_STREAMS advertised: {settings}"
    assert 1 <= settings[3] <= 1000, settings
    assert a.running()


def test_http_body_is_limited_before_decoding(agents, grpc_sink):
    """A request body above max_request_body_size is refused with 413 (or 400) and a reason."""
    a, ports, _ = _agent(agents, grpc_sink, {"http": {"max_request_body_size": 1 << 20}})
    r = requests.post(f"{ports.http_url}/v1/traces", data=gzip.compress(b"\0" * (4 << 20)), timeout=10,
                      headers={"Content-Type": "application/x-protobuf", "Content-Encoding": "gzip"})
    assert r.status_code in (400, 413), (r.status_code, r.text)
    assert r.text.strip(), "no reason given"
    assert a.running()

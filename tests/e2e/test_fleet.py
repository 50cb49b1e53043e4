"""The fleet tier with real processes: agents (`inferwatch`, otlp receiver -> `loadbalancing`)
route by model (routing_key: attributes, routing_attributes: [gen_ai.request.model]) over a
consistent-hash ring to gateways (`inferwatch`, otlp receiver -> otlp exporter, no queue, into
a capture sink of their own, so that a gateway acknowledges only what its sink holds).

- 4 agents -> 3 gateways (static resolver), spans of 200 series from the OpenTelemetry Python
  SDK and gauge points of the same 200 series over grpcio with OTLP protos: every series lands
  on exactly one gateway, the same one from all 4 agents, and each gateway gets a share;
  restarting an agent with one gateway left out of its list moves that gateway's series and
  no other;
- the DNS resolver against a tiny UDP DNS server run by the test (`nameservers`): dropping one
  gateway's address from the answer changes the ring within one resolver interval and moves
  only that gateway's series;
- going from 3 to 4 gateways moves about 1/4 of 4,000 keys, every one of them to the new
  gateway (the fraction is printed; within 20 % of 1/4);
- a gateway SIGKILLed under load (4 agents, DNS resolver, the answer updated after the kill)
  loses no item any agent acknowledged: every acknowledged span id is in some gateway's sink
  (the loss count and the duplicates are printed); the spans sent after the kill (tagged so) of
  the victim's models are on both survivors, every acknowledged one of them, and neither
  survivor got the other's models; a short run by default, ten times longer with
  INFERWATCH_SLOW=1;
- deploy/pipelines/gateway.yaml as shipped, behind an agent: peer_outlier flags the one replica
  of 8 that is 30 % slower than its peers (and no other), its alert leaves as an OTLP log record,
  and each series the agent sent is forwarded exactly once.
"""

from __future__ import annotations

import collections
import socket
import struct
import threading
import time

import grpc
import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.metrics.v1 import metrics_pb2
from opentelemetry.proto.resource.v1 import resource_pb2
from opentelemetry.proto.trace.v1 import trace_pb2
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExportResult

from support import otlp
from support.agent import Ports, fast_retry, free_port
from support.client import GrpcClient, _kv, new_span_id
from support.sim import wait_until

MODEL = "gen_ai.request.model"
SERIES = 200
RESOLVER_INTERVAL_S = 1.0


def model(i: int) -> str:
    return f"model-{i:04d}"


# --- the processes ------------------------------------------------------------------------------


class Gateway:
    """An inferwatch gateway on `host:port` forwarding into its own capture sink."""

    def __init__(self, agents, grpc_sink, name: str, host: str = "127.0.0.1", port: int | None = None) -> None:
        self.name, self.host, self.port = name, host, port or free_port()
        self.sink = grpc_sink()
        ports = Ports()
        # No queue: the gateway answers an agent only once its sink has the data, so whatever a
        # gateway acknowledged is in a sink even if the gateway is killed right after.
        exporter = {"endpoint": self.sink.endpoint, "tls": {"insecure": True}, "timeout": "5s",
                    "sending_queue": {"enabled": False}, "retry_on_failure": {"enabled": False}}
        cfg = {
            "receivers": {"otlp": {"protocols": {"grpc": {"endpoint": self.endpoint}}}},
            "exporters": {"otlp/sink": exporter},
            "extensions": {"health_check": {"endpoint": f"127.0.0.1:{ports.health}"}},
            "service": {
                "extensions": ["health_check"],
                "telemetry": {"metrics": {"address": f"127.0.0.1:{ports.metrics}"}},
                "pipelines": {s: {"receivers": ["otlp"], "exporters": ["otlp/sink"]} for s in ("traces", "metrics")},
            },
        }
        self.proc = agents(name, cfg, ports, start=False)

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self) -> "Gateway":
        self.proc.start()
        wait_until(lambda: _connects(self.host, self.port), 10, f"{self.name} listening on {self.endpoint}")
        return self


def _connects(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def lb_exporter(resolver: dict) -> dict:
    return {
        "routing_key": "attributes",
        "routing_attributes": [MODEL],
        "protocol": {"otlp": {"tls": {"insecure": True}, "timeout": "2s",
                              "sending_queue": {"queue_size": 5000},
                              # Until delivered or re-routed: a dead backend keeps its share queued.
                              "retry_on_failure": fast_retry(max_elapsed_time="0s", max_interval="500ms")}},
        "resolver": resolver,
    }


def start_agent(agents, name: str, resolver: dict):
    ports = Ports()
    cfg = {
        "receivers": {"otlp": {"protocols": {"grpc": {"endpoint": ports.grpc_endpoint}}}},
        "exporters": {"loadbalancing": lb_exporter(resolver)},
        "extensions": {"health_check": {"endpoint": f"127.0.0.1:{ports.health}"}},
        "service": {
            "extensions": ["health_check"],
            "telemetry": {"metrics": {"address": f"127.0.0.1:{ports.metrics}"}},
            "pipelines": {s: {"receivers": ["otlp"], "exporters": ["loadbalancing"]} for s in ("traces", "metrics")},
        },
    }
    return agents(name, cfg, ports)


def static(*gws: Gateway) -> dict:
    return {"static": {"hostnames": [g.endpoint for g in gws]}}


def num_backends(agent) -> float:
    values = [s.value for s in agent.samples() if s.name == "otelcol_loadbalancer_num_backends"]
    return max(values) if values else -1


# --- what is sent and where it landed --------------------------------------------------------


class AckingSpanExporter(OTLPSpanExporter):
    """The SDK's OTLP/gRPC span exporter, keeping the ids of the spans the agent acknowledged."""

    def __init__(self, endpoint: str) -> None:
        super().__init__(endpoint=endpoint, insecure=True, timeout=10)
        self.acked: list[int] = []
        self.failed = 0

    def export(self, spans):
        r = super().export(spans)
        if r == SpanExportResult.SUCCESS:
            self.acked.extend(s.context.span_id for s in spans)
        else:
            self.failed += len(spans)
        return r


def send_sdk_spans(agent, keys: range, tag: str) -> list[int]:
    """One span per series through the SDK (BatchSpanProcessor); the acknowledged span ids."""
    exporter = AckingSpanExporter(agent.ports.grpc_endpoint)
    tp = TracerProvider(resource=Resource.create({"service.name": "vllm", "service.instance.id": agent.name}))
    tp.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=50, max_export_batch_size=256,
                                             max_queue_size=max(2048, len(keys))))
    tracer = tp.get_tracer("e2e.fleet")
    for i in keys:
        with tracer.start_as_current_span(f"{tag} {model(i)}", attributes={MODEL: model(i), "tag": tag}):
            pass
    assert tp.force_flush(30_000)
    tp.shutdown()
    assert exporter.failed == 0 and len(exporter.acked) == len(keys), (exporter.failed, len(exporter.acked))
    return exporter.acked


def gauge_request(keys: range, instance: str, tag: str) -> otlp.MetricsRequest:
    """One gauge point per series (the model on the point), in one request the agent must split."""
    now = time.time_ns()
    pts = [metrics_pb2.NumberDataPoint(as_double=float(i), time_unix_nano=now,
                                       attributes=[_kv(MODEL, model(i)), _kv("tag", tag)]) for i in keys]
    return otlp.MetricsRequest(resource_metrics=[metrics_pb2.ResourceMetrics(
        resource=resource_pb2.Resource(attributes=[_kv("service.name", "vllm"), _kv("service.instance.id", instance)]),
        scope_metrics=[metrics_pb2.ScopeMetrics(metrics=[
            metrics_pb2.Metric(name="llm.ttft.p95", unit="s", gauge=metrics_pb2.Gauge(data_points=pts))])],
    )])


def send_gauges(agent, keys: range, tag: str) -> None:
    c = GrpcClient(agent.ports.grpc_endpoint)
    try:
        c.export("metrics", gauge_request(keys, agent.name, tag))
    finally:
        c.close()


def landed(gateways: list[Gateway], tag: str) -> dict[str, dict[str, collections.Counter]]:
    """{signal: {model: Counter(gateway name -> items)}} of the items tagged `tag` in the sinks."""
    out: dict[str, dict[str, collections.Counter]] = {"traces": collections.defaultdict(collections.Counter),
                                                      "metrics": collections.defaultdict(collections.Counter)}
    for g in gateways:
        for _, _, span in g.sink.spans():
            a = otlp.attrs(span.attributes)
            if a.get("tag") == tag:
                out["traces"][a[MODEL]][g.name] += 1
        for _, _, m in g.sink.metrics():
            for p in otlp.data_points(m):
                a = otlp.attrs(p.attributes)
                if a.get("tag") == tag:
                    out["metrics"][a[MODEL]][g.name] += 1
    return out


def wait_landed(gateways: list[Gateway], tag: str, per_model: int, keys: range, timeout: float = 30):
    """Waits until every series of `keys` has `per_model` items of each signal in the sinks."""
    def complete():
        got = landed(gateways, tag)
        ok = all(sum(got[s][model(i)].values()) >= per_model for s in got for i in keys)
        return got if ok else None

    return wait_until(complete, timeout, f"{per_model} items of each of {len(keys)} series tagged {tag}",
                      interval=0.1)


def owner_map(got: dict, keys: range) -> dict[str, str]:
    """model -> the one gateway that got every item of it (spans and points); fails otherwise."""
    owners = {}
    for i in keys:
        m = model(i)
        where = set(got["traces"][m]) | set(got["metrics"][m])
        assert len(where) == 1, f"{m} landed on {sorted(where)}"
        owners[m] = where.pop()
    return owners


def send_and_map(agents_, gateways, keys: range, tag: str) -> dict[str, str]:
    for a in agents_:
        send_sdk_spans(a, keys, tag)
        send_gauges(a, keys, tag)
    got = wait_landed(gateways, tag, len(agents_), keys)
    for s in ("traces", "metrics"):
        extra = {m: c for m, c in got[s].items() if sum(c.values()) != len(agents_)}
        assert not extra, f"{s}: series with other than {len(agents_)} items: {dict(list(extra.items())[:5])}"
    return owner_map(got, keys)


# --- static resolver --------------------------------------------------------------------------


def test_each_series_lands_on_one_gateway_from_all_agents_and_a_removed_gateway_moves_only_its_series(
        agents, grpc_sink):
    gws = [Gateway(agents, grpc_sink, f"gw{k}").start() for k in range(3)]
    fleet = [start_agent(agents, f"agent{k}", static(*gws)) for k in range(4)]
    for a in fleet:
        wait_until(lambda a=a: num_backends(a) == 3, 10, f"{a.name}: otelcol_loadbalancer_num_backends 3")
    keys = range(SERIES)

    owners = send_and_map(fleet, gws, keys, "r1")     # one owner per series, from all 4 agents
    share = collections.Counter(owners.values())
    print(f"series per gateway (3 gateways, {SERIES} series): {dict(sorted(share.items()))}")
    assert set(share) == {g.name for g in gws}, share
    assert all(0.15 * SERIES <= n <= 0.55 * SERIES for n in share.values()), share
    # The per-backend self-metric counts what went where.
    routed = sum(s.value for s in fleet[0].samples() if s.name == "otelcol_loadbalancer_backend_items_total")
    assert routed == 2 * SERIES, f"agent0 routed {routed} items, sent {2 * SERIES}"

    # agent0 restarted without the gateway that owns the most series: those move, no other does.
    gone = share.most_common(1)[0][0]
    rest = [g for g in gws if g.name != gone]
    assert fleet[0].stop() == 0
    agent0 = start_agent(agents, "agent0b", static(*rest))
    wait_until(lambda: num_backends(agent0) == 2, 10, "agent0b: 2 backends")
    after = send_and_map([agent0], gws, keys, "r2")
    moved = {m for m in owners if after[m] != owners[m]}
    assert moved == {m for m, g in owners.items() if g == gone}, \
        f"{len(moved - {m for m, g in owners.items() if g == gone})} series of the remaining gateways moved"
    assert not any(after[m] == gone for m in after)
    assert {after[m] for m in moved} == {g.name for g in rest}, "the moved series did not spread over the remaining gateways"
    # The agents that kept the full list still route as before.
    assert send_and_map(fleet[1:2], gws, keys, "r3") == owners


def test_going_from_3_to_4_gateways_moves_a_quarter_of_the_keys_all_to_the_new_one(agents, grpc_sink):
    # 4,000 keys: their sampling noise (±2.7 % of 1/4, one sd) stays well below the ring's own
    # (256 points a backend: ±6 %), so the bound tests the ring.
    keys = range(4000)
    gws = [Gateway(agents, grpc_sink, f"gw{k}").start() for k in range(4)]
    a3 = start_agent(agents, "agent-3gw", static(*gws[:3]))
    wait_until(lambda: num_backends(a3) == 3, 10, "3 backends")
    before = send_and_map([a3], gws, keys, "three")
    assert a3.stop() == 0
    a4 = start_agent(agents, "agent-4gw", static(*gws))
    wait_until(lambda: num_backends(a4) == 4, 10, "4 backends")
    after = send_and_map([a4], gws, keys, "four")
    moved = [m for m in before if after[m] != before[m]]
    fraction = len(moved) / len(keys)
    print(f"key movement 3 -> 4 gateways: {len(moved)} of {len(keys)} keys = {fraction:.3f} (ideal 0.250)")
    assert all(after[m] == "gw3" for m in moved), "keys moved between the old gateways"
    assert abs(fraction - 0.25) <= 0.2 * 0.25, f"moved {fraction:.3f} of the keys, ideal 0.25 (±20 %)"


# --- DNS resolver -----------------------------------------------------------------------------


class TinyDns:
    """A UDP DNS server answering A queries for one name (and names under it, in case a search
    domain is appended) with a list of addresses the test changes; AAAA gets an empty answer."""

    def __init__(self, name: str, addresses: list[str]) -> None:
        self.name = name.rstrip(".").lower()
        self.addresses = list(addresses)
        self.queries = 0
        self.lock = threading.Lock()
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.stop_flag = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def set(self, addresses: list[str]) -> None:
        with self.lock:
            self.addresses = list(addresses)

    def _serve(self) -> None:
        while not self.stop_flag.is_set():
            try:
                data, peer = self.sock.recvfrom(4096)
            except socket.timeout:
                continue
            except OSError:
                return
            try:
                reply = self._answer(data)
            except (IndexError, struct.error, UnicodeDecodeError):
                continue
            self.sock.sendto(reply, peer)

    def _answer(self, q: bytes) -> bytes:
        qid, flags, qdcount = struct.unpack(">HHH", q[:6])
        labels, pos = [], 12
        while q[pos]:
            n = q[pos]
            labels.append(q[pos + 1:pos + 1 + n].decode("ascii"))
            pos += 1 + n
        qtype, _ = struct.unpack(">HH", q[pos + 1:pos + 5])
        question = q[12:pos + 5]
        name = ".".join(labels).lower()
        with self.lock:
            self.queries += 1
            addresses = list(self.addresses)
        known = name == self.name or name.startswith(self.name + ".")
        rcode = 0 if known else 3
        answers = b""
        count = 0
        if known and qtype == 1:
            for ip in addresses:
                answers += struct.pack(">HHHIH", 0xC00C, 1, 1, 0, 4) + socket.inet_aton(ip)
                count += 1
        header = struct.pack(">HHHHHH", qid, 0x8180 | (flags & 0x0100) | rcode, 1, count, 0, 0)
        return header + question + answers

    def close(self) -> None:
        self.stop_flag.set()
        self.sock.close()
        self.thread.join(2)


@pytest.fixture
def dns():
    servers: list[TinyDns] = []

    def make(name: str, addresses: list[str]) -> TinyDns:
        s = TinyDns(name, addresses)
        servers.append(s)
        return s

    yield make
    for s in servers:
        s.close()


def dns_gateways(agents, grpc_sink, n: int) -> tuple[list[Gateway], int]:
    """n gateways on 127.0.0.2.. on one port (DNS gives addresses, the resolver one port)."""
    port = free_port()
    return [Gateway(agents, grpc_sink, f"gw{k}", host=f"127.0.0.{k + 2}", port=port).start() for k in range(n)], port


def dns_resolver(server: TinyDns, port: int) -> dict:
    return {"dns": {"hostname": server.name, "port": port, "interval": f"{RESOLVER_INTERVAL_S:g}s", "timeout": "1s",
                    "nameservers": [f"127.0.0.1:{server.port}"]}}


def test_dns_resolver_drops_a_gateway_within_one_interval_and_moves_only_its_series(agents, grpc_sink, dns):
    gws, port = dns_gateways(agents, grpc_sink, 3)
    server = dns("gateways.fleet.test", [g.host for g in gws])
    fleet = [start_agent(agents, f"agent{k}", dns_resolver(server, port)) for k in range(2)]
    for a in fleet:
        wait_until(lambda a=a: num_backends(a) == 3, 10, f"{a.name}: 3 backends from DNS")
    assert server.queries > 0
    keys = range(SERIES)
    owners = send_and_map(fleet, gws, keys, "d1")
    share = collections.Counter(owners.values())
    gone = share.most_common(1)[0][0]
    rest = [g for g in gws if g.name != gone]

    t0 = time.monotonic()
    server.set([g.host for g in rest])
    for a in fleet:
        wait_until(lambda a=a: num_backends(a) == 2, 3 * RESOLVER_INTERVAL_S + 5, f"{a.name}: 2 backends")
    took = time.monotonic() - t0
    print(f"DNS answer changed -> both agents' rings at 2 backends in {took:.2f}s (interval {RESOLVER_INTERVAL_S}s)")
    # One interval, plus the lookup's timeout and the polling of two agents' metrics.
    assert took <= RESOLVER_INTERVAL_S + 1.0 + 0.5, f"ring changed after {took:.2f}s"

    after = send_and_map(fleet, gws, keys, "d2")
    moved = {m for m in owners if after[m] != owners[m]}
    assert moved == {m for m, g in owners.items() if g == gone}, "series of the remaining gateways moved"
    assert len(moved) == share[gone]


# --- a gateway killed under load ------------------------------------------------------------------


def span_request(rng_state: list[int], n: int, tag: str = "kill") -> tuple[otlp.TraceRequest, list[bytes], list[str]]:
    """n spans of assorted series (the models cycle through SERIES), one trace, tagged `tag`;
    with their span ids and models."""
    tid = new_span_id() + new_span_id()
    now = time.time_ns()
    spans, ids, models = [], [], []
    for _ in range(n):
        rng_state[0] = (rng_state[0] * 1103515245 + 12345) % (1 << 31)
        sid = new_span_id()
        ids.append(sid)
        models.append(model(rng_state[0] % SERIES))
        spans.append(trace_pb2.Span(trace_id=tid, span_id=sid, name="load", start_time_unix_nano=now,
                                    end_time_unix_nano=now + 1000,
                                    attributes=[_kv(MODEL, models[-1]), _kv("tag", tag)]))
    req = otlp.TraceRequest(resource_spans=[trace_pb2.ResourceSpans(
        resource=resource_pb2.Resource(attributes=[_kv("service.name", "vllm")]),
        scope_spans=[trace_pb2.ScopeSpans(scope=common_pb2.InstrumentationScope(name="e2e.fleet"), spans=spans)])])
    return req, ids, models


@pytest.mark.parametrize("scale", [pytest.param(1, id="short"), pytest.param(10, id="long", marks=pytest.mark.slow)])
def test_killing_a_gateway_under_load_loses_no_acknowledged_span(agents, grpc_sink, dns, scale):
    gws, port = dns_gateways(agents, grpc_sink, 3)
    server = dns("gateways.fleet.test", [g.host for g in gws])
    fleet = [start_agent(agents, f"agent{k}", dns_resolver(server, port)) for k in range(4)]
    for a in fleet:
        wait_until(lambda a=a: num_backends(a) == 3, 10, f"{a.name}: 3 backends")

    acked: list[bytes] = []
    acked_after_kill: dict[bytes, str] = {}     # span id -> model, of the spans sent after the kill
    refused = collections.Counter()
    lock = threading.Lock()
    stop = threading.Event()
    killed = threading.Event()                 # set once the SIGKILL was sent: later spans say so

    def load(agent, seed: int) -> None:
        c = GrpcClient(agent.ports.grpc_endpoint)
        state = [seed]
        try:
            while not stop.is_set():
                post = killed.is_set()
                req, ids, models = span_request(state, 20, "post-kill" if post else "pre-kill")
                try:
                    c.export("traces", req, timeout=10)
                except grpc.RpcError as e:
                    with lock:
                        refused[e.code().name] += len(ids)
                    continue
                with lock:
                    acked.extend(ids)
                    if post:
                        acked_after_kill.update(zip(ids, models))
        finally:
            c.close()

    threads = [threading.Thread(target=load, args=(a, 7 + k)) for k, a in enumerate(fleet)]
    for t in threads:
        t.start()
    victim = gws[1]
    try:
        wait_until(lambda: len(acked) > scale * 2_000 and victim.sink.item_count("traces") > scale * 200, 60,
                   "load reaching every gateway")
        at_kill = len(acked)
        victim.proc.kill()          # SIGKILL, and reaped: nothing sent from here on can reach its sink
        killed.set()
        # The agents go on acknowledging: the victim's share waits in its backend queue.
        wait_until(lambda: len(acked) > at_kill + scale * 500, 30, "the agents acknowledging spans after the kill")
        server.set([g.host for g in gws if g is not victim])
        for a in fleet:
            wait_until(lambda a=a: num_backends(a) == 2, 3 * RESOLVER_INTERVAL_S + 5, f"{a.name}: 2 backends")
        after_ring = len(acked)
        wait_until(lambda: len(acked) > after_ring + scale * 1_000, 60, "load after the ring change")
    finally:
        stop.set()
        for t in threads:
            t.join(30)

    def missing() -> set[bytes]:
        got = set()
        for g in gws:
            got.update(g.sink.span_ids())
        return set(acked) - got

    try:
        wait_until(lambda: not missing(), 60, "every acknowledged span in a sink", interval=0.5)
    except AssertionError:
        pass
    lost = missing()
    counts = collections.Counter(sid for g in gws for sid in g.sink.span_ids())
    dups = sum(c - 1 for c in counts.values() if c > 1)
    print(f"gateway SIGKILL under load: {len(acked)} spans acknowledged by 4 agents, {len(lost)} lost, "
          f"{dups} duplicates, refused {dict(refused)}; per sink "
          f"{ {g.name: g.sink.item_count('traces') for g in gws} }")
    assert not lost, f"{len(lost)} of {len(acked)} acknowledged spans never reached a gateway's sink"

    # The victim's share went to the others: its keys (the models it held before the kill),
    # sent after the kill, are in the surviving sinks, on each of them, and every one of those
    # spans the agents acknowledged is there. The survivors' own keys stayed where they were.
    def by_tag(g: Gateway, tag: str) -> dict[bytes, str]:
        return {span.span_id: otlp.attrs(span.attributes)[MODEL] for _, _, span in g.sink.spans()
                if otlp.attrs(span.attributes).get("tag") == tag}

    survivors = [g for g in gws if g is not victim]
    pre = {g.name: by_tag(g, "pre-kill") for g in gws}
    victim_keys = set(pre[victim.name].values())
    # (Pre-kill spans of the victim's models still queued at the kill went to the survivors too.)
    survivor_keys = {g.name: set(pre[g.name].values()) - victim_keys for g in survivors}
    assert victim_keys and all(survivor_keys.values()), {n: len(k) for n, k in survivor_keys.items()}
    assert not set.intersection(*survivor_keys.values()), "a model on two surviving gateways before the kill"
    assert not by_tag(victim, "post-kill"), "the killed gateway's sink got spans sent after the kill"
    post = {g.name: by_tag(g, "post-kill") for g in survivors}
    moved = {g.name: {sid for sid, m in post[g.name].items() if m in victim_keys} for g in survivors}
    acked_victim = {sid for sid, m in acked_after_kill.items() if m in victim_keys}
    print(f"victim {victim.name} held {len(victim_keys)} of {SERIES} models; after the kill "
          f"{len(acked_victim)} spans of them acknowledged, in the survivors' sinks "
          f"{ {n: len(v) for n, v in moved.items()} }")
    assert acked_victim, "no span of the victim's models acknowledged after the kill"
    assert all(moved.values()), f"a survivor got none of the victim's models after the kill: {moved.keys()}"
    assert acked_victim <= set().union(*moved.values()), \
        f"{len(acked_victim - set().union(*moved.values()))} acknowledged post-kill spans of the victim's models missing"
    for g in survivors:
        theirs = set().union(*(k for n, k in survivor_keys.items() if n != g.name))
        stolen = set(post[g.name].values()) & theirs
        assert not stolen, f"{g.name} got another survivor's models after the kill: {sorted(stolen)[:5]}"


# --- the shipped gateway pipeline ---------------------------------------------------------------


def test_shipped_gateway_pipeline_flags_the_replica_worse_than_its_peers_and_forwards_each_series_once(
        agents, grpc_sink, tmp_path):
    """deploy/pipelines/gateway.yaml as shipped, behind an agent's `loadbalancing`: 8 replicas of
    one model send llm.tpot.p50 per 1-minute window (event time, 10 windows), one of them 30 %
    slower from the third window; peer_outlier flags that replica and no other, its alert goes
    out as an OTLP log record, and every series the agents sent is forwarded exactly once (the
    fleet pipelines pass on only their own outputs; the agents' own anomaly series are not
    judged again)."""
    from google.protobuf.json_format import MessageToDict

    from support.agent import REPO

    sink = grpc_sink()
    ports, prom = Ports(), free_port()
    env = {"INFERWATCH_GRPC_ENDPOINT": ports.grpc_endpoint, "INFERWATCH_HTTP_ENDPOINT": f"127.0.0.1:{ports.http}",
           "INFERWATCH_HEALTH_ENDPOINT": f"127.0.0.1:{ports.health}",
           "INFERWATCH_METRICS_ADDRESS": f"127.0.0.1:{ports.metrics}",
           "INFERWATCH_PROMETHEUS_ENDPOINT": f"127.0.0.1:{prom}", "INFERWATCH_STATE_DIR": str(tmp_path / "gw"),
           "GATEWAY_OTLP_ENDPOINT": sink.endpoint, "ALERTMANAGER_URL": ""}
    agents("gateway", (REPO / "deploy" / "pipelines" / "gateway.yaml").read_text(), ports, env=env)
    agent = start_agent(agents, "agent", {"static": {"hostnames": [ports.grpc_endpoint]}})

    replicas = [f"10.0.0.{r}:8000" for r in range(8)]
    slow = replicas[3]
    base = (time.time_ns() // 60_000_000_000 - 15) * 60_000_000_000
    c = GrpcClient(agent.ports.grpc_endpoint)
    sent = 0
    try:
        for w in range(10):
            rms = []
            for r, inst in enumerate(replicas):
                v = 0.2 + 0.002 * ((r * 7 + w) % 5)
                if inst == slow and w >= 2:
                    v *= 1.3
                t = base + w * 60_000_000_000 + 30_000_000_000
                metrics = [metrics_pb2.Metric(name="llm.tpot.p50", unit="s", gauge=metrics_pb2.Gauge(data_points=[
                    metrics_pb2.NumberDataPoint(as_double=v, time_unix_nano=t)]))]
                if r == 0:   # an agent's own detector output: forwarded, never judged by the peers
                    metrics.append(metrics_pb2.Metric(name="llm.anomaly.level", gauge=metrics_pb2.Gauge(data_points=[
                        metrics_pb2.NumberDataPoint(as_double=0.0, time_unix_nano=t, attributes=[
                            _kv("detector", "zscore_skew"), _kv("metric", "llm.ttft.p95")])])))
                sent += len(metrics)
                rms.append(metrics_pb2.ResourceMetrics(
                    resource=resource_pb2.Resource(attributes=[_kv("service.name", "vllm"), _kv(MODEL, "llama"),
                                                               _kv("service.instance.id", inst)]),
                    scope_metrics=[metrics_pb2.ScopeMetrics(metrics=metrics)]))
            c.export("metrics", otlp.MetricsRequest(resource_metrics=rms))
            # One window after the other, as agents send them a minute apart (a burst could reach
            # the gateway out of order through the agent's parallel senders, and a window behind
            # the watermark is late).
            wait_until(lambda: sum(1 for _, _, m in sink.metrics() if m.name == "llm.tpot.p50"
                                   for _ in otlp.data_points(m)) >= 8 * (w + 1), 20, f"window {w} at the gateway")
    finally:
        c.close()

    def levels() -> dict[str, float]:
        out: dict[str, float] = {}
        for rm, _, m in sink.metrics():
            if m.name != "llm.anomaly.level":
                continue
            for p in otlp.data_points(m):
                a = {**otlp.attrs(rm.resource.attributes), **otlp.attrs(p.attributes)}
                if a.get("detector") == "peer_outlier":
                    out[a["service.instance.id"]] = max(out.get(a["service.instance.id"], 0.0), p.as_double)
        return out

    def alert_records() -> list[str]:
        return [str(MessageToDict(rec)) for _, _, rec in sink.logs()]

    wait_until(lambda: levels().get(slow, 0) >= 0.8, 30, f"peer_outlier flagging {slow} at the gateway's backend")
    wait_until(lambda: any("peer_outlier" in r and slow in r for r in alert_records()), 30,
               "the fleet alert as an OTLP log record")
    got = levels()
    print(f"peer_outlier levels per replica: {got}")
    assert set(got) == set(replicas), got
    assert all(v < 0.6 for inst, v in got.items() if inst != slow), got
    assert not any("peer_outlier" in r and inst in r for r in alert_records() for inst in replicas if inst != slow)
    # Each series forwarded exactly once: the agents' points, and no peer_outlier judgement of
    # the agents' own anomaly series.
    forwarded = collections.Counter(
        (otlp.attrs(rm.resource.attributes)["service.instance.id"], m.name, p.time_unix_nano)
        for rm, _, m in sink.metrics() for p in otlp.data_points(m)
        if m.name == "llm.tpot.p50" or otlp.attrs(p.attributes).get("detector") == "zscore_skew")
    assert sum(forwarded.values()) == sent and set(forwarded.values()) == {1}, forwarded.most_common(3)
    judged = {otlp.attrs(p.attributes).get("metric") for _, _, m in sink.metrics() if m.name == "llm.anomaly.level"
              for p in otlp.data_points(m) if otlp.attrs(p.attributes).get("detector") == "peer_outlier"}
    assert judged == {"llm.tpot.p50"}, judged


def test_shipped_gateway_pipeline_compares_versions_pooled_over_the_replicas(agents, grpc_sink, tmp_path):
    """deploy/pipelines/gateway.yaml's fleet A/B: v1 on 8 replicas, then v2 rolled out to 4 of
    them with a TTFT 40 ms higher; the request spans of every replica reach the gateway of their
    model, llm_signals/requests turns them into per-request points there and delta_ab, grouped by
    model only, judges v2 against v1 pooled over the replicas: a regression, with both versions'
    sample counts from several replicas; the per-request points themselves never leave."""
    from google.protobuf.json_format import MessageToDict

    from support.agent import REPO

    sink = grpc_sink()
    ports, prom = Ports(), free_port()
    env = {"INFERWATCH_GRPC_ENDPOINT": ports.grpc_endpoint, "INFERWATCH_HTTP_ENDPOINT": f"127.0.0.1:{ports.http}",
           "INFERWATCH_HEALTH_ENDPOINT": f"127.0.0.1:{ports.health}",
           "INFERWATCH_METRICS_ADDRESS": f"127.0.0.1:{ports.metrics}",
           "INFERWATCH_PROMETHEUS_ENDPOINT": f"127.0.0.1:{prom}", "INFERWATCH_STATE_DIR": str(tmp_path / "gw"),
           "GATEWAY_OTLP_ENDPOINT": sink.endpoint, "ALERTMANAGER_URL": "", "AB_WINDOW": "1m", "AB_LOOKBACK": "1m",
           "AB_WARMUP": "0s"}
    agents("gateway", (REPO / "deploy" / "pipelines" / "gateway.yaml").read_text(), ports, env=env)
    agent = start_agent(agents, "agent", {"static": {"hostnames": [ports.grpc_endpoint]}})

    minute = 60_000_000_000
    base = (time.time_ns() // minute - 20) * minute
    c = GrpcClient(agent.ports.grpc_endpoint)
    sent = 0
    try:
        for w in range(6):
            rss = []
            for r in range(8):
                version = "v2" if (w >= 1 and r >= 4) else "v1"
                spans = []
                for k in range(12):
                    ttft = 0.100 + 0.001 * ((r * 5 + k * 3 + w) % 7) + (0.040 if version == "v2" else 0.0)
                    end = base + w * minute + (5 + 4 * k) * 1_000_000_000 + r * 1_000_000
                    spans.append(trace_pb2.Span(
                        trace_id=new_span_id() + new_span_id(), span_id=new_span_id(), name="llm_request",
                        kind=trace_pb2.Span.SPAN_KIND_SERVER, start_time_unix_nano=end - 500_000_000,
                        end_time_unix_nano=end,
                        attributes=[_kv("gen_ai.latency.time_to_first_token", ttft), _kv("gen_ai.latency.e2e", 0.5)]))
                sent += len(spans)
                rss.append(trace_pb2.ResourceSpans(
                    resource=resource_pb2.Resource(attributes=[
                        _kv("service.name", "vllm"), _kv(MODEL, "llama"), _kv("service.version", version),
                        _kv("service.instance.id", f"10.0.1.{r}:8000")]),
                    scope_spans=[trace_pb2.ScopeSpans(spans=spans)]))
            c.export("traces", otlp.TraceRequest(resource_spans=rss))
            # One window after the other (a span behind llm_signals' watermark yields no point).
            wait_until(lambda: sink.item_count("traces") >= sent, 20, f"window {w}'s spans at the gateway's backend")
    finally:
        c.close()

    def verdicts() -> list[dict]:
        out = []
        for rm, _, m in sink.metrics():
            if m.name != "llm.anomaly.level":
                continue
            for p in otlp.data_points(m):
                a = otlp.attrs(p.attributes)
                if a.get("detector") == "delta_ab":
                    out.append({**a, "level": p.as_double, "resource": otlp.attrs(rm.resource.attributes)})
        return out

    wait_until(lambda: any(v.get("delta_ab.verdict") == "regression" for v in verdicts()), 30,
               "delta_ab's regression of v2 at the gateway's backend")
    reg = next(v for v in verdicts() if v.get("delta_ab.verdict") == "regression")
    print(f"fleet A/B at the gateway: {({k: reg[k] for k in reg if k.startswith('delta_ab.')})}")
    assert (reg["delta_ab.baseline"], reg["delta_ab.candidate"]) == ("v1", "v2"), reg
    assert reg[MODEL] == "llama" and reg["level"] >= 0.6, reg
    # Pooled: more samples per version in one window than any one replica sends (12).
    assert reg["delta_ab.n_baseline"] >= 4 * 12 and reg["delta_ab.n_candidate"] >= 4 * 12, reg
    assert 30 <= reg["delta_ab.value_candidate"] * 1000 - reg["delta_ab.value_baseline"] * 1000 <= 50, reg
    wait_until(lambda: any("delta_ab" in str(MessageToDict(rec)) for _, _, rec in sink.logs()), 30,
               "the fleet A/B alert as an OTLP log record")
    names = {m.name for _, _, m in sink.metrics()}
    assert not {n for n in names if n.startswith("llm.request.")}, names

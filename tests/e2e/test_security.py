"""TLS, mTLS, certificate rotation and authentication on the OTLP receiver, with real clients:
the OpenTelemetry Python SDK's OTLP exporters (gRPC and HTTP), grpcio and requests, against
certificates the test makes with openssl. Also the client side: an exporter that authenticates
to its downstream and forwards a tenant header it got from the sender (`include_metadata` +
`headers_setter`)."""

from __future__ import annotations

import socket
import ssl
import time

import grpc
import pytest
import requests
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpanExporter
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult

from support.agent import Ports, make_config, otlp_exporter, otlphttp_exporter
from support.certs import make_ca
from support.client import trace_request

TOKEN = "s3cr3t-token-e2e"


@pytest.fixture(autouse=True)
def _only_the_test_ca(monkeypatch):
    """requests prefers REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE over a session's `verify` (the SDK's
    `certificate_file`): without clearing them the machine's bundle, not the test CA, is used."""
    for k in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
        monkeypatch.delenv(k, raising=False)


def _export_with(exporter, name: str = "tls-span"):
    """Exports one span through `exporter` and returns the SDK's result."""
    provider = TracerProvider(resource=Resource.create({"service.name": "e2e-security"}))
    results = []

    class Capture(SimpleSpanProcessor):
        def on_end(self, span):
            results.append(self.span_exporter.export((span,)))

    provider.add_span_processor(Capture(exporter))
    with provider.get_tracer("e2e").start_as_current_span(name):
        pass
    provider.shutdown()
    return results[0] if results else None


def _tls_agent(agents, grpc_sink, tmp_path, tls: dict, auth: dict | None = None, extensions: dict | None = None):
    sink = grpc_sink()
    cfg, ports = make_config({"otlp/sink": otlp_exporter(sink.endpoint)}, signals=("traces",))
    for proto in ("grpc", "http"):
        cfg["receivers"]["otlp"]["protocols"][proto]["tls"] = tls
        if auth:
            cfg["receivers"]["otlp"]["protocols"][proto]["auth"] = auth
    for k, v in (extensions or {}).items():
        cfg["extensions"][k] = v
        cfg["service"]["extensions"].append(k)
    return agents("agent", cfg, ports), ports, sink


def _peer_cert_der(port: int, ca) -> bytes:
    ctx = ssl.create_default_context(cafile=str(ca))
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        with ctx.wrap_socket(s, server_hostname="127.0.0.1") as t:
            return t.getpeercert(binary_form=True)


def test_sdk_exports_over_tls_and_plaintext_is_refused(agents, grpc_sink, tmp_path):
    pki = make_ca(tmp_path / "pki")
    crt, key = pki.issue("server")
    a, ports, sink = _tls_agent(agents, grpc_sink, tmp_path, {"cert_file": str(crt), "key_file": str(key)})

    creds = grpc.ssl_channel_credentials(root_certificates=pki.ca.read_bytes())
    r = _export_with(GrpcSpanExporter(endpoint=f"https://127.0.0.1:{ports.grpc}", credentials=creds, timeout=10))
    assert r == SpanExportResult.SUCCESS
    r = _export_with(HttpSpanExporter(endpoint=f"https://127.0.0.1:{ports.http}/v1/traces",
                                      certificate_file=str(pki.ca), timeout=10))
    assert r == SpanExportResult.SUCCESS
    sink.wait_spans(2, timeout=20)

    # Plain text on the TLS ports: refused (gRPC UNAVAILABLE, HTTP connection error), nothing exported.
    ch = grpc.insecure_channel(ports.grpc_endpoint)
    with pytest.raises(grpc.RpcError) as e:
        trace_service_pb2_grpc.TraceServiceStub(ch).Export(trace_request(1)[0], timeout=5)
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    ch.close()
    with pytest.raises(requests.exceptions.ConnectionError):
        requests.post(f"http://127.0.0.1:{ports.http}/v1/traces", data=trace_request(1)[0].SerializeToString(),
                      headers={"Content-Type": "application/x-protobuf"}, timeout=5)
    # A client that does not trust the agent's CA refuses the handshake.
    other = make_ca(tmp_path / "other", "other-ca")
    with pytest.raises(ssl.SSLError):
        _peer_cert_der(ports.grpc, other.ca)
    assert sink.item_count("traces") == 2
    assert a.running()


def test_mtls_refuses_a_client_without_a_certificate(agents, grpc_sink, tmp_path):
    pki = make_ca(tmp_path / "pki")
    crt, key = pki.issue("server")
    ccrt, ckey = pki.issue("client", client=True, cn="client-a")
    a, ports, sink = _tls_agent(agents, grpc_sink, tmp_path,
                                {"cert_file": str(crt), "key_file": str(key), "client_ca_file": str(pki.ca)})
    ca = pki.ca.read_bytes()
    no_cert = grpc.ssl_channel_credentials(root_certificates=ca)
    r = _export_with(GrpcSpanExporter(endpoint=f"https://127.0.0.1:{ports.grpc}", credentials=no_cert, timeout=5))
    assert r == SpanExportResult.FAILURE
    with pytest.raises(requests.exceptions.SSLError):
        requests.post(f"https://127.0.0.1:{ports.http}/v1/traces", data=trace_request(1)[0].SerializeToString(),
                      headers={"Content-Type": "application/x-protobuf"}, verify=str(pki.ca), timeout=5)

    with_cert = grpc.ssl_channel_credentials(root_certificates=ca, private_key=ckey.read_bytes(),
                                             certificate_chain=ccrt.read_bytes())
    r = _export_with(GrpcSpanExporter(endpoint=f"https://127.0.0.1:{ports.grpc}", credentials=with_cert, timeout=10))
    assert r == SpanExportResult.SUCCESS
    r = _export_with(HttpSpanExporter(endpoint=f"https://127.0.0.1:{ports.http}/v1/traces",
                                      certificate_file=str(pki.ca), client_certificate_file=str(ccrt),
                                      client_key_file=str(ckey), timeout=10))
    assert r == SpanExportResult.SUCCESS
    sink.wait_spans(2, timeout=20)
    assert sink.item_count("traces") == 2


def test_rotated_certificate_is_picked_up_without_a_restart(agents, grpc_sink, tmp_path):
    pki = make_ca(tmp_path / "pki")
    crt, key = pki.issue("server")
    live_crt, live_key = tmp_path / "live.crt", tmp_path / "live.key"
    live_crt.write_bytes(crt.read_bytes())
    live_key.write_bytes(key.read_bytes())
    a, ports, _ = _tls_agent(agents, grpc_sink, tmp_path,
                             {"cert_file": str(live_crt), "key_file": str(live_key), "reload_interval": "1s"})
    before = _peer_cert_der(ports.http, pki.ca)
    new_crt, new_key = pki.issue("server2")
    # Key first, then certificate, each replaced atomically (as cert-manager's volume update does).
    for src, dst in ((new_key, live_key), (new_crt, live_crt)):
        tmp = dst.with_suffix(".tmp")
        tmp.write_bytes(src.read_bytes())
        tmp.replace(dst)
    deadline = time.monotonic() + 15
    after = before
    while time.monotonic() < deadline and after == before:
        time.sleep(0.2)  # polling interval
        after = _peer_cert_der(ports.http, pki.ca)
    assert after != before, "the agent still presents the old certificate 15 s after rotation"
    assert _peer_cert_der(ports.grpc, pki.ca) == after
    assert a.running()


@pytest.mark.parametrize("transport", ["grpc", "http"])
def test_bearer_token_is_checked(agents, grpc_sink, transport):
    sink = grpc_sink()
    cfg, ports = make_config({"otlp/sink": otlp_exporter(sink.endpoint)}, signals=("traces",))
    for proto in ("grpc", "http"):
        cfg["receivers"]["otlp"]["protocols"][proto]["auth"] = {"authenticator": "bearertokenauth"}
    cfg["extensions"]["bearertokenauth"] = {"token": TOKEN}
    cfg["service"]["extensions"].append("bearertokenauth")
    a = agents("agent", cfg, ports)
    req = trace_request(3)[0]
    if transport == "grpc":
        ch = grpc.insecure_channel(ports.grpc_endpoint)
        stub = trace_service_pb2_grpc.TraceServiceStub(ch)
        for md in ((), (("authorization", "Bearer wrong"),), (("authorization", f"Basic {TOKEN}"),)):
            with pytest.raises(grpc.RpcError) as e:
                stub.Export(req, metadata=md, timeout=5)
            assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED, md
            assert TOKEN not in (e.value.details() or "")
        stub.Export(req, metadata=(("authorization", f"Bearer {TOKEN}"),), timeout=5)
        ch.close()
    else:
        url = f"{ports.http_url}/v1/traces"
        body = req.SerializeToString()
        for h in ({}, {"Authorization": "Bearer wrong"}):
            r = requests.post(url, data=body, headers={"Content-Type": "application/x-protobuf", **h}, timeout=5)
            assert r.status_code == 401, (h, r.status_code, r.text)
            assert TOKEN not in r.text
        # The SDK's exporter with the token in its headers gets through.
        exp = HttpSpanExporter(endpoint=url, headers={"authorization": f"Bearer {TOKEN}"}, timeout=10)
        assert _export_with(exp) == SpanExportResult.SUCCESS
    sink.wait_spans(3 if transport == "grpc" else 1, timeout=20)
    text = a.metrics_text()
    assert TOKEN not in text and TOKEN not in a.log()
    refused = [ln for ln in text.splitlines() if "auth" in ln and not ln.startswith("#")]
    assert any(float(ln.rsplit(" ", 1)[1]) >= 2 for ln in refused), refused


def test_exporter_authenticates_and_forwards_the_tenant_header(agents, http_sink):
    """Receiver with include_metadata -> batch keyed by tenant -> otlphttp exporter with
    headers_setter (X-Scope-OrgID from the request) and a bearer token of its own."""
    sink = http_sink()
    exp = otlphttp_exporter(sink.endpoint, auth={"authenticator": "headers_setter"})
    cfg, ports = make_config({"otlphttp/sink": exp}, signals=("traces",),
                             batch={"timeout": "200ms", "send_batch_size": 512, "metadata_keys": ["x-scope-orgid"]})
    for proto in ("grpc", "http"):
        cfg["receivers"]["otlp"]["protocols"][proto]["include_metadata"] = True
    cfg["extensions"]["headers_setter"] = {"headers": [
        {"key": "X-Scope-OrgID", "from_context": "x-scope-orgid", "action": "upsert"},
        {"key": "Authorization", "value": f"Bearer {TOKEN}", "action": "upsert"},
    ]}
    cfg["service"]["extensions"].append("headers_setter")
    agents("agent", cfg, ports)
    ch = grpc.insecure_channel(ports.grpc_endpoint)
    stub = trace_service_pb2_grpc.TraceServiceStub(ch)
    for tenant, n in (("tenant-a", 2), ("tenant-b", 3)):
        stub.Export(trace_request(n)[0], metadata=(("x-scope-orgid", tenant),), timeout=5)
    ch.close()
    sink.wait_spans(5, timeout=20)
    by_tenant: dict[str, int] = {}
    for att in sink.delivered("traces"):
        assert att.metadata.get("authorization") == f"Bearer {TOKEN}"
        t = att.metadata.get("x-scope-orgid")
        by_tenant[t] = by_tenant.get(t, 0) + att.items
    assert by_tenant == {"tenant-a": 2, "tenant-b": 3}


def test_basic_auth_with_an_htpasswd_file(agents, grpc_sink, tmp_path):
    """basicauth with a bcrypt htpasswd file (made with the `bcrypt` package, as htpasswd -B does)."""
    import base64

    import bcrypt

    htpasswd = tmp_path / "htpasswd"
    htpasswd.write_text("alice:" + bcrypt.hashpw(b"wonderland", bcrypt.gensalt(rounds=5)).decode() + "\n")
    sink = grpc_sink()
    cfg, ports = make_config({"otlp/sink": otlp_exporter(sink.endpoint)}, signals=("traces",))
    for proto in ("grpc", "http"):
        cfg["receivers"]["otlp"]["protocols"][proto]["auth"] = {"authenticator": "basicauth/clients"}
    cfg["extensions"]["basicauth/clients"] = {"htpasswd": {"file": str(htpasswd)}}
    cfg["service"]["extensions"].append("basicauth/clients")
    a = agents("agent", cfg, ports)

    def basic(user: str, pw: str) -> str:
        return "Basic " + base64.b64encode(f"{user}:{pw}".encode()).decode()

    url = f"{ports.http_url}/v1/traces"
    body = trace_request(2)[0].SerializeToString()
    ct = {"Content-Type": "application/x-protobuf"}
    for h in ({}, {"Authorization": basic("alice", "wrong")}, {"Authorization": basic("bob", "wonderland")}):
        r = requests.post(url, data=body, headers={**ct, **h}, timeout=5)
        assert r.status_code == 401, (h, r.status_code)
    r = requests.post(url, data=body, headers={**ct, "Authorization": basic("alice", "wonderland")}, timeout=5)
    assert r.status_code == 200, r.text
    ch = grpc.insecure_channel(ports.grpc_endpoint)
    stub = trace_service_pb2_grpc.TraceServiceStub(ch)
    with pytest.raises(grpc.RpcError) as e:
        stub.Export(trace_request(1)[0], metadata=(("authorization", basic("alice", "nope")),), timeout=5)
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    stub.Export(trace_request(1)[0], metadata=(("authorization", basic("alice", "wonderland")),), timeout=5)
    ch.close()
    sink.wait_spans(3, timeout=20)
    assert "wonderland" not in a.log()


class _MetricsTarget:
    """An HTTPS /metrics endpoint (Python's http.server + ssl) that wants a bearer token."""

    def __init__(self, crt, key, token: str, series: int) -> None:
        import http.server
        import threading

        self.seen_auth: list[str] = []
        target = self
        page = "".join(f'demo_requests_total{{path="/p{i}"}} {i}\n' for i in range(series)).encode()

        class H(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                target.seen_auth.append(self.headers.get("Authorization") or "")
                if self.headers.get("Authorization") != f"Bearer {token}":
                    self.send_response(401)
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(page)))
                self.end_headers()
                self.wfile.write(page)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(str(crt), str(key))
        self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.mark.parametrize("series,limit", [(20, 100), (500, 100)])
def test_https_scrape_with_a_bearer_token_and_a_sample_limit(agents, grpc_sink, tmp_path, series, limit):
    pki = make_ca(tmp_path / "pki")
    crt, key = pki.issue("target")
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    target = _MetricsTarget(crt, key, TOKEN, series)
    try:
        sink = grpc_sink()
        ports = Ports()
        cfg = {
            "receivers": {"prometheus": {"config": {"scrape_configs": [{
                "job_name": "secure", "scrape_interval": "500ms", "scrape_timeout": "400ms", "scheme": "https",
                "tls_config": {"ca_file": str(pki.ca)},
                "authorization": {"type": "Bearer", "credentials_file": str(token_file)},
                "sample_limit": limit,
                "static_configs": [{"targets": [f"127.0.0.1:{target.port}"]}],
            }]}}},
            "exporters": {"otlp/sink": otlp_exporter(sink.endpoint)},
            "extensions": {"health_check": {"endpoint": f"127.0.0.1:{ports.health}"}},
            "service": {"extensions": ["health_check"],
                        "telemetry": {"metrics": {"address": f"127.0.0.1:{ports.metrics}"}},
                        "pipelines": {"metrics": {"receivers": ["prometheus"], "exporters": ["otlp/sink"]}}},
        }
        a = agents("agent", cfg, ports)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and len(target.seen_auth) < 3:
            time.sleep(0.1)  # polling interval
        assert len(target.seen_auth) >= 3, "the target was not scraped three times"
        assert set(target.seen_auth) == {f"Bearer {TOKEN}"}, target.seen_auth
        if series <= limit:
            sink.wait_items("metrics", series, timeout=20)
        else:
            # Over sample_limit the whole scrape fails (Prometheus semantics): counted, nothing forwarded.
            a.wait_metric("inferwatch_scrape_failures_total", lambda v: v >= 2, timeout=15)
            text = a.metrics_text()
            assert "sample_limit" in text, [ln for ln in text.splitlines() if "scrape" in ln]
            assert not any(n.startswith("demo_requests") for n in _metric_names(sink)), "a refused scrape was forwarded"
        assert TOKEN not in a.log()
    finally:
        target.stop()


def _metric_names(sink) -> set[str]:
    out = set()
    for att in sink.delivered("metrics"):
        for rm in att.request.resource_metrics:
            for sm in rm.scope_metrics:
                out.update(m.name for m in sm.metrics)
    return out


def test_health_check_and_self_metrics_over_tls(agents, grpc_sink, tmp_path):
    """The control endpoints take `tls` too: health_check (confighttp) and the self-metrics
    reader (`readers[].pull.exporter.prometheus.tls`)."""
    pki = make_ca(tmp_path / "pki")
    crt, key = pki.issue("server")
    tls = {"cert_file": str(crt), "key_file": str(key)}
    sink = grpc_sink()
    cfg, ports = make_config({"otlp/sink": otlp_exporter(sink.endpoint)}, signals=("traces",))
    cfg["extensions"]["health_check"]["tls"] = tls
    cfg["service"]["telemetry"] = {"metrics": {"readers": [{"pull": {"exporter": {"prometheus": {
        "host": "127.0.0.1", "port": ports.metrics, "tls": tls}}}}]}}
    a = agents("agent", cfg, ports, start=False)
    a.start(wait=False)
    deadline = time.monotonic() + 20
    health = None
    while time.monotonic() < deadline and health is None:
        try:
            health = requests.get(f"https://127.0.0.1:{ports.health}/", verify=str(pki.ca), timeout=2)
        except requests.RequestException:
            time.sleep(0.1)  # polling interval: the agent is starting
    assert health is not None and health.status_code == 200, a.log()[-2000:]
    m = requests.get(f"https://127.0.0.1:{ports.metrics}/metrics", verify=str(pki.ca), timeout=5)
    assert m.status_code == 200 and "otelcol_receiver_accepted_spans" in m.text
    with pytest.raises(requests.exceptions.ConnectionError):
        requests.get(f"http://127.0.0.1:{ports.metrics}/metrics", timeout=5)
    a.stop()

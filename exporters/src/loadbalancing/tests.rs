use super::config::*;
use super::exporter::LoadBalancer;
use super::resolver::Resolver;
use super::resolver::dns::DnsResolverConfig;
use super::ring::{Ring, VNODES, hash_key};
use super::split::{Splitter, service_hash};
use inferwatch_core::component::{ComponentId, CreateContext, FieldError, Node};
use inferwatch_core::consumer::Consumer;
use inferwatch_core::pdata::{Encoded, Payload, Signal};
use inferwatch_core::telemetry::Telemetry;
use inferwatch_testkit::otlp as b;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use parking_lot::Mutex;
use serde_json::json;
use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn cfg(v: serde_json::Value) -> Result<LoadBalancingConfig, FieldError> {
    LoadBalancingConfig::from_value(&v)
}

fn err(v: serde_json::Value) -> FieldError {
    match cfg(v) {
        Ok(_) => panic!("accepted"),
        Err(e) => e,
    }
}

const STATIC: &str = "127.0.0.1:4317";

#[test]
fn config_defaults_and_errors_name_the_field() {
    let c = cfg(json!({"resolver": {"static": {"hostnames": [STATIC, "gw-2"]}}})).unwrap();
    assert_eq!(c.key_for(Signal::Traces).unwrap(), RoutingKey::TraceId);
    assert_eq!(c.key_for(Signal::Metrics).unwrap(), RoutingKey::Service);
    assert_eq!(c.key_for(Signal::Logs).unwrap(), RoutingKey::Service);
    assert_eq!(c.backend_down_after, DEFAULT_DOWN_AFTER);
    match &c.resolver {
        ResolverConfig::Static(s) => assert_eq!(s.backends(), vec!["127.0.0.1:4317", "gw-2:4317"]),
        other => panic!("{other:?}"),
    }
    // The otlp exporter's settings are read and checked, the endpoint replaced per backend.
    let c = cfg(json!({
        "protocol": {"otlp": {"endpoint": "ignored:1", "tls": {"insecure": true}, "timeout": "2s",
            "sending_queue": {"queue_size": 77}, "retry_on_failure": {"enabled": true}}},
        "resolver": {"static": {"hostnames": [STATIC]}}, "backend_down_after": "1s"}))
    .unwrap();
    assert_eq!(c.otlp.exporter.timeout(), Some(Duration::from_secs(2)));
    assert_eq!(c.otlp.exporter.sending_queue.queue_size, 77);
    assert!(c.otlp.client.tls.insecure);
    assert_eq!(c.otlp_for("10.0.0.1:4317").unwrap().endpoint.unwrap().authority, "10.0.0.1:4317");
    assert_eq!(c.backend_down_after, Duration::from_secs(1));

    let r = json!({"static": {"hostnames": [STATIC]}});
    let cases = [
        (json!({"resolver": r, "routing_key": "traceId"}), "routing_key"),
        (json!({"resolver": r, "routing_key": "attributes"}), "routing_attributes"),
        (json!({"resolver": r, "routing_key": "attributes", "routing_attributes": ["a", ""]}), "routing_attributes.1"),
        (json!({"resolver": r, "routing_attributes": ["a"]}), "routing_attributes"),
        (json!({"resolver": r, "routing_keys": "service"}), "routing_keys"),
        (json!({}), "resolver"),
        (json!({"resolver": {"static": {"hostnames": [STATIC]}, "dns": {"hostname": "gw"}}}), "resolver"),
        (json!({"resolver": {"static": {"hostnames": []}}}), "resolver.static.hostnames"),
        (json!({"resolver": {"static": {"hostnames": [STATIC, "a:b"]}}}), "resolver.static.hostnames.1"),
        (json!({"resolver": {"static": {"hostname": [STATIC]}}}), "resolver.static.hostname"),
        (json!({"resolver": {"dns": {}}}), "resolver.dns.hostname"),
        (
            json!({"resolver": {"dns": {"hostname": "gw", "nameservers": ["1.1.1.1:53", "dns.local"]}}}),
            "resolver.dns.nameservers.1",
        ),
        (json!({"resolver": {"dns": {"hostname": "gw", "interval": "0s"}}}), "resolver.dns.interval"),
        (json!({"resolver": {"dns": {"hostname": "gw", "port": 0}}}), "resolver.dns.port"),
        (json!({"resolver": {"k8s": {}}}), "resolver.k8s.service"),
        (json!({"resolver": {"consul": {}}}), "resolver.consul"),
        (json!({"resolver": r, "protocol": {"otlp": {"tlss": {}}}}), "protocol.otlp.tlss"),
        (
            json!({"resolver": r, "protocol": {"otlp": {"retry_on_failure": {"multiplier": -1}}}}),
            "protocol.otlp.retry_on_failure.multiplier",
        ),
        (json!({"resolver": r, "protocol": {"otlphttp": {}}}), "protocol.otlphttp"),
    ];
    for (v, path) in cases {
        let e = err(v.clone());
        assert_eq!(e.dotted(), path, "{v}: {e}");
    }
    // Unknown keys keep serde's candidates, from which validation says "did you mean".
    let e = err(json!({"resolver": r, "routing_keys": "service"}));
    assert!(e.message.contains("routing_key"), "{e}");

    // A key that cannot route the pipeline's signal is an error at routing_key.
    let c = cfg(json!({"resolver": r, "routing_key": "streamID"})).unwrap();
    assert_eq!(c.key_for(Signal::Traces).unwrap_err().dotted(), "routing_key");
    assert_eq!(c.key_for(Signal::Metrics).unwrap(), RoutingKey::StreamId);
    let c = cfg(json!({"resolver": r, "routing_key": "traceID"})).unwrap();
    assert!(c.key_for(Signal::Metrics).is_err());
    assert!(c.key_for(Signal::Logs).is_ok());
    let c = cfg(json!({"resolver": r, "routing_key": "resource"})).unwrap();
    assert!(c.key_for(Signal::Traces).is_err());

    let d: DnsResolverConfig = inferwatch_core::component::parse_config(&json!({"hostname": "gw"})).unwrap();
    assert_eq!((d.effective_interval(), d.effective_timeout()), (Duration::from_secs(5), Duration::from_secs(1)));
}

#[test]
fn factory_builds_refuses_a_key_of_another_signal_and_warns_of_an_endpoint() {
    use inferwatch_core::component::ExporterFactory;
    let f = super::LoadBalancingExporterFactory;
    let v = json!({"routing_key": "metric", "protocol": {"otlp": {"endpoint": "x:1"}},
        "resolver": {"static": {"hostnames": [STATIC]}}});
    let parsed = f.parse(&v).unwrap();
    let ctx = || CreateContext::new(ComponentId::parse("loadbalancing").unwrap(), Arc::new(Telemetry::new()));
    assert!(f.build(ctx(), &parsed, Signal::Metrics).is_ok());
    match f.build(ctx(), &parsed, Signal::Traces) {
        Err(inferwatch_core::component::ComponentError::Config(e)) => assert_eq!(e.dotted(), "routing_key"),
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("metric routed traces"),
    }
    assert_eq!(f.warnings(&v).first().map(FieldError::dotted).as_deref(), Some("protocol.otlp.endpoint"));
}

fn members(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("10.0.0.{}:4317", i + 1)).collect()
}

fn owners(ring: &Ring, keys: usize) -> Vec<String> {
    (0..keys).map(|k| ring.members()[ring.owner(hash_key(format!("key-{k}").as_bytes())).unwrap()].clone()).collect()
}

#[test]
fn ring_moves_only_the_keys_it_must() {
    const KEYS: usize = 100_000;
    let r3 = Ring::new(members(3));
    let r4 = Ring::new(members(4));
    let o3 = owners(&r3, KEYS);
    let o4 = owners(&r4, KEYS);
    // Every key has exactly one owner, the same on every lookup and for any member order.
    let mut rev = members(3);
    rev.reverse();
    assert_eq!(owners(&Ring::new(rev), KEYS), o3);
    assert!(Ring::new(Vec::new()).owner(1).is_none());

    // 3 -> 4: only keys moving to the new member move, about 1/4 of them.
    let moved = o3.iter().zip(&o4).filter(|(a, b)| a != b).count();
    assert!(o3.iter().zip(&o4).all(|(a, b)| a == b || b == "10.0.0.4:4317"), "a key moved between old members");
    let fraction = moved as f64 / KEYS as f64;
    println!("ring: 3 -> 4 backends moved {moved} of {KEYS} keys = {fraction:.4} (ideal 0.25, {VNODES} vnodes)");
    assert!((fraction - 0.25).abs() <= 0.25 * 0.2, "moved {fraction}");

    // 4 -> 3 by removing one: only that member's keys move.
    let mut without = members(4);
    without.remove(1);
    let o = owners(&Ring::new(without), KEYS);
    for (before, after) in o4.iter().zip(&o) {
        if before != "10.0.0.2:4317" {
            assert_eq!(before, after);
        } else {
            assert_ne!(after, "10.0.0.2:4317");
        }
    }

    // Load spread over N backends.
    for n in [3usize, 4, 10] {
        let o = owners(&Ring::new(members(n)), KEYS);
        let mut counts: HashMap<&str, usize> = HashMap::new();
        o.iter().for_each(|m| *counts.entry(m).or_default() += 1);
        assert_eq!(counts.len(), n);
        let mean = KEYS as f64 / n as f64;
        let var = counts.values().map(|&c| (c as f64 - mean).powi(2)).sum::<f64>() / n as f64;
        let rel = var.sqrt() / mean;
        let (min, max) = (counts.values().min().unwrap(), counts.values().max().unwrap());
        println!(
            "ring: {n} backends: std-dev {:.1} keys = {:.2} % of the mean; min {min} max {max}",
            var.sqrt(),
            rel * 100.0
        );
        assert!(rel < 0.15, "spread {rel}");
    }

    // A member marked down gives its keys to the next members; no other key moves.
    let r = Ring::new(members(3));
    for k in 0..10_000 {
        let h = hash_key(format!("key-{k}").as_bytes());
        let o = r.owner(h).unwrap();
        let live = r.owner_where(h, |i| i != 0).unwrap();
        assert_ne!(live, 0);
        if o != 0 {
            assert_eq!(live, o);
        }
    }
}

/// 200 services in one traces request, each with `k` spans.
fn traces_of(services: usize, k: usize) -> ExportTraceServiceRequest {
    let rs = (0..services)
        .map(|s| {
            let spans = (0..k)
                .map(|i| {
                    let mut sp = b::span(&format!("op{i}"), 2, b::kvs(&[("series", &format!("s{s}"))]));
                    sp.trace_id = (s as u128 * 1000 + i as u128).to_be_bytes().to_vec();
                    sp.span_id = (i as u64 + 1).to_be_bytes().to_vec();
                    sp
                })
                .collect();
            b::resource_spans(b::kvs(&[("service.name", &format!("svc-{s}"))]), b::scope("scope", "1"), spans)
        })
        .collect();
    ExportTraceServiceRequest { resource_spans: rs }
}

fn service_of(rs: &opentelemetry_proto::tonic::trace::v1::ResourceSpans) -> String {
    inferwatch_testkit::attrs::str_attr(&rs.resource.as_ref().unwrap().attributes, "service.name")
        .unwrap_or("")
        .to_string()
}

#[test]
fn service_split_of_encoded_payloads_stays_on_the_wire_and_keeps_every_item() {
    use prost::Message;
    let req = traces_of(200, 3);
    let bytes = bytes::Bytes::from(req.encode_to_vec());
    let e = Encoded::new(Signal::Traces, bytes).unwrap();
    let ring = Ring::new(members(3));
    let s = Splitter { key: RoutingKey::Service, attributes: vec![] };
    let parts = s.split(Payload::Encoded(e), &|h| ring.owner(h)).unwrap();
    assert_eq!(parts.len(), 3);
    assert_eq!(parts.iter().map(|(_, p)| p.item_count()).sum::<usize>(), 600);
    let mut seen = BTreeMap::new();
    for (i, p) in &parts {
        assert!(matches!(p, Payload::Encoded(_)), "split on the wire");
        let Payload::Traces(t) = p.decoded().unwrap().into_owned() else { panic!() };
        for rs in &t.resource_spans {
            let svc = service_of(rs);
            let want = ring.owner(service_hash(rs.resource.as_ref())).unwrap();
            assert_eq!(*i, want, "{svc}");
            assert!(seen.insert(svc, *i).is_none(), "one service on one backend");
            assert_eq!(rs.scope_spans[0].spans.len(), 3);
        }
    }
    assert_eq!(seen.len(), 200);
    // The decoded form routes the same way.
    let parts2 = s.split(Payload::Traces(req), &|h| ring.owner(h)).unwrap();
    let by: BTreeMap<usize, usize> = parts2.iter().map(|(i, p)| (*i, p.item_count())).collect();
    let by1: BTreeMap<usize, usize> = parts.iter().map(|(i, p)| (*i, p.item_count())).collect();
    assert_eq!(by, by1);
}

#[test]
fn finer_keys_split_items_keeping_resource_and_scope() {
    let ring = Ring::new(members(3));
    // traceID: spans of one resource spread, each trace whole on one backend.
    let s = Splitter { key: RoutingKey::TraceId, attributes: vec![] };
    let parts = s.split(Payload::Traces(traces_of(20, 10)), &|h| ring.owner(h)).unwrap();
    assert_eq!(parts.iter().map(|(_, p)| p.item_count()).sum::<usize>(), 200);
    for (i, p) in &parts {
        let Payload::Traces(t) = p else { panic!() };
        for rs in &t.resource_spans {
            assert!(service_of(rs).starts_with("svc-"), "resource kept");
            assert_eq!(rs.scope_spans[0].scope.as_ref().unwrap().name, "scope", "scope kept");
            for sp in &rs.scope_spans[0].spans {
                assert_eq!(ring.owner(hash_key(&sp.trace_id)), Some(*i));
            }
        }
    }
    // attributes on metric points, all series in one resource: split per point.
    let points: Vec<_> = (0..200).map(|i| b::point(b::kvs(&[("series", &format!("s{i}"))]), 1, i as f64)).collect();
    let req = b::metrics_request(
        b::kvs(&[("service.name", "one")]),
        b::scope("scope", "1"),
        vec![b::gauge("g", "1", points.clone()), b::gauge("h", "1", points)],
    );
    for key in [RoutingKey::Attributes, RoutingKey::StreamId, RoutingKey::Metric, RoutingKey::Service] {
        let s = Splitter { key, attributes: vec!["series".into()] };
        let parts = s.split(Payload::Metrics(req.clone()), &|h| ring.owner(h)).unwrap();
        assert_eq!(parts.iter().map(|(_, p)| p.item_count()).sum::<usize>(), 400, "{key:?}");
        let mut where_: HashMap<String, usize> = HashMap::new();
        for (i, p) in &parts {
            let Payload::Metrics(m) = p else { panic!() };
            for g in b::gauge_points(m) {
                let k = match key {
                    RoutingKey::Attributes | RoutingKey::Service => g.attr("series").to_string(),
                    _ => format!("{}/{}", g.name, g.attr("series")),
                };
                let prev = where_.insert(k, *i);
                assert!(prev.is_none() || prev == Some(*i), "{key:?}: a series on two backends");
            }
        }
        let spread = parts.len();
        match key {
            RoutingKey::Service => assert_eq!(spread, 1),
            RoutingKey::Metric => assert!(spread <= 2),
            _ => assert_eq!(spread, 3, "{key:?} spreads the 200 series"),
        }
    }
    // attributes found on the resource route the resource whole.
    let s = Splitter { key: RoutingKey::Attributes, attributes: vec!["service.name".into()] };
    let parts = s.split(Payload::Metrics(req), &|h| ring.owner(h)).unwrap();
    assert_eq!(parts.len(), 1);
}

// ---- real backends ---------------------------------------------------------------------

/// An OTLP/gRPC sink on its own runtime (so that `kill` closes its listener and connections),
/// counting items per series (`series` attribute of a span or point, else the service).
struct Sink {
    addr: SocketAddr,
    counts: Arc<Mutex<HashMap<String, u64>>>,
    /// While set, metrics exports are refused as our receiver does under load
    /// (UNAVAILABLE with RetryInfo); the value counts the refusals.
    refuse: Arc<(std::sync::atomic::AtomicBool, std::sync::atomic::AtomicU64)>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

#[derive(Clone)]
struct SinkSvc(Arc<Mutex<HashMap<String, u64>>>, Arc<(std::sync::atomic::AtomicBool, std::sync::atomic::AtomicU64)>);

#[tonic::async_trait]
impl opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::TraceService for SinkSvc {
    async fn export(
        &self,
        r: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<
        tonic::Response<opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceResponse>,
        tonic::Status,
    > {
        let mut c = self.0.lock();
        for (_, _, sp) in b::spans_of(r.get_ref()) {
            *c.entry(inferwatch_testkit::attrs::str_attr(&sp.attributes, "series").unwrap_or("").to_string())
                .or_default() += 1;
        }
        Ok(tonic::Response::new(Default::default()))
    }
}

#[tonic::async_trait]
impl opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_server::MetricsService for SinkSvc {
    async fn export(
        &self,
        r: tonic::Request<ExportMetricsServiceRequest>,
    ) -> Result<
        tonic::Response<opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceResponse>,
        tonic::Status,
    > {
        use std::sync::atomic::Ordering::SeqCst;
        if self.1.0.load(SeqCst) && !b::gauge_points(r.get_ref()).is_empty() {
            self.1.1.fetch_add(1, SeqCst);
            use tonic_types::{ErrorDetails, StatusExt};
            return Err(tonic::Status::with_error_details(
                tonic::Code::Unavailable,
                "sending queue is full",
                ErrorDetails::with_retry_info(Some(Duration::from_millis(100))),
            ));
        }
        let mut c = self.0.lock();
        for g in b::gauge_points(r.get_ref()) {
            *c.entry(g.attr("series").to_string()).or_default() += 1;
        }
        Ok(tonic::Response::new(Default::default()))
    }
}

impl Sink {
    fn start() -> Sink {
        Sink::start_at("127.0.0.1:0")
    }

    /// A sink listening on `addr`.
    fn start_at(addr: &str) -> Sink {
        let std_listener = std::net::TcpListener::bind(addr).unwrap();
        std_listener.set_nonblocking(true).unwrap();
        let addr = std_listener.local_addr().unwrap();
        let counts = Arc::new(Mutex::new(HashMap::new()));
        let refuse = Arc::new((std::sync::atomic::AtomicBool::new(false), std::sync::atomic::AtomicU64::new(0)));
        let svc = SinkSvc(counts.clone(), refuse.clone());
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
            rt.block_on(async move {
                let l = tokio::net::TcpListener::from_std(std_listener).unwrap();
                let incoming = tonic::transport::server::TcpIncoming::from(l);
                use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_server::MetricsServiceServer;
                use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::TraceServiceServer;
                use tonic::codec::CompressionEncoding::Gzip;
                let serve = tonic::transport::Server::builder()
                    .add_service(TraceServiceServer::new(svc.clone()).accept_compressed(Gzip))
                    .add_service(MetricsServiceServer::new(svc).accept_compressed(Gzip))
                    .serve_with_incoming(incoming);
                tokio::select! {
                    _ = serve => {}
                    _ = rx => {}
                }
            });
            // Dropping the runtime drops every connection: the process is gone, as far as
            // its clients can tell.
            rt.shutdown_background();
        });
        Sink { addr, counts, refuse, stop: Some(tx), thread: Some(thread) }
    }

    fn endpoint(&self) -> String {
        self.addr.to_string()
    }

    fn kill(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
    }

    fn counts(&self) -> HashMap<String, u64> {
        self.counts.lock().clone()
    }

    fn total(&self) -> u64 {
        self.counts.lock().values().sum()
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        self.kill();
    }
}

fn lb(sinks: &[&Sink], key: &str, signal: Signal, telemetry: &Arc<Telemetry>) -> LoadBalancer {
    let hostnames: Vec<String> = sinks.iter().map(|s| s.endpoint()).collect();
    let c = cfg(json!({
        "routing_key": key, "routing_attributes": if key == "attributes" { json!(["series"]) } else { json!(null) },
        "protocol": {"otlp": {"tls": {"insecure": true}, "timeout": "1s", "compression": "none",
            "sending_queue": {"queue_size": 10000, "num_consumers": 4},
            "retry_on_failure": {"initial_interval": "50ms", "max_interval": "100ms", "max_elapsed_time": "60s"}}},
        "resolver": {"static": {"hostnames": hostnames}},
        "backend_down_after": "200ms",
    }))
    .unwrap();
    let ctx = CreateContext::new(ComponentId::parse("loadbalancing/t").unwrap(), telemetry.clone());
    LoadBalancer::new(&ctx, Arc::new(c), signal).unwrap()
}

/// Polls `cond` until it holds or 30 s pass.
async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `n` points of each of `series` series, one request per point round.
fn metric_rounds(series: usize, rounds: usize) -> Vec<Payload> {
    (0..rounds)
        .map(|r| {
            let points: Vec<_> =
                (0..series).map(|i| b::point(b::kvs(&[("series", &format!("s{i}"))]), r as u64 + 1, 1.0)).collect();
            Payload::Metrics(b::metrics_request(
                b::kvs(&[("service.name", "agent")]),
                b::scope("scope", "1"),
                vec![b::gauge("g", "1", points)],
            ))
        })
        .collect()
}

fn owners_of(sinks: &[&Sink]) -> HashMap<String, usize> {
    let mut o = HashMap::new();
    for (i, s) in sinks.iter().enumerate() {
        for k in s.counts().keys() {
            assert!(o.insert(k.clone(), i).is_none(), "series {k} on two backends");
        }
    }
    o
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn series_land_on_one_backend_and_removal_moves_only_its_series() {
    let (s0, s1, s2) = (Sink::start(), Sink::start(), Sink::start());
    let t = Arc::new(Telemetry::new());
    let e = lb(&[&s0, &s1, &s2], "attributes", Signal::Metrics, &t);
    e.start().await.unwrap();
    assert_eq!(e.backends().len(), 3);
    for p in metric_rounds(200, 5) {
        e.consume(p).await.unwrap();
    }
    let sinks = [&s0, &s1, &s2];
    eventually("1000 points", || sinks.iter().map(|s| s.total()).sum::<u64>() == 1000).await;
    let before = owners_of(&sinks);
    assert_eq!(before.len(), 200);
    for s in sinks {
        assert!(s.total() > 100, "each backend has a share: {}", s.total());
        assert!(s.counts().values().all(|&c| c == 5), "every point of a series on its one backend");
    }
    let text = t.render();
    assert!(text.contains("otelcol_loadbalancer_num_backends{exporter=\"loadbalancing/t\"} 3"), "{text}");
    assert!(text.contains("otelcol_loadbalancer_backend_items_total{exporter=\"loadbalancing/t\""), "{text}");

    // Remove backend 1 from the list: only its series move.
    e.set_backends(vec![s0.endpoint(), s2.endpoint()]).await;
    assert_eq!(e.backends().len(), 2);
    let (c0, c2) = (s0.counts(), s2.counts());
    for p in metric_rounds(200, 1) {
        e.consume(p).await.unwrap();
    }
    eventually("200 more points", || {
        s0.total() + s2.total() == (c0.values().sum::<u64>() + c2.values().sum::<u64>() + 200)
    })
    .await;
    let mut moved = 0;
    for (series, &was) in &before {
        let now0 = s0.counts().get(series).copied().unwrap_or(0) - c0.get(series).copied().unwrap_or(0);
        let now2 = s2.counts().get(series).copied().unwrap_or(0) - c2.get(series).copied().unwrap_or(0);
        let now = if now0 == 1 { 0 } else { 2 };
        assert_eq!(now0 + now2, 1, "{series}");
        if was == 1 {
            moved += 1;
        } else {
            assert_eq!(now, was, "{series} stayed where it was");
        }
    }
    println!("removing 1 of 3 backends moved {moved} of 200 series (its own)");
    let text = t.render();
    assert!(text.contains("otelcol_loadbalancer_ring_changes_total{exporter=\"loadbalancing/t\"} 2"), "{text}");
    assert_eq!(e.shutdown(Instant::now() + Duration::from_secs(5)).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_backend_loses_no_accepted_item() {
    let (s0, mut s1, s2) = (Sink::start(), Sink::start(), Sink::start());
    let t = Arc::new(Telemetry::new());
    let e = lb(&[&s0, &s1, &s2], "attributes", Signal::Metrics, &t);
    e.start().await.unwrap();
    let rounds = metric_rounds(200, 10);
    let mut sent = 0u64;
    for p in rounds.iter().take(5).cloned() {
        sent += p.item_count() as u64;
        e.consume(p).await.unwrap();
    }
    eventually("the first half", || s0.total() + s1.total() + s2.total() == sent).await;
    let at_kill = s1.total();
    assert!(at_kill > 0);
    s1.kill();
    // Accepted while the dead backend is still in the static list: queued for it, then handed on.
    for p in rounds.iter().skip(5).cloned() {
        sent += p.item_count() as u64;
        e.consume(p).await.unwrap();
    }
    eventually("every accepted item", || s0.total() + at_kill + s2.total() >= sent).await;
    assert_eq!(e.is_up(&s1.endpoint()), Some(false), "marked down");
    // Nothing more arrives: exactly what was accepted, no item twice.
    assert_eq!(e.shutdown(Instant::now() + Duration::from_secs(5)).await, 0);
    assert_eq!(s0.total() + at_kill + s2.total(), sent);
    let text = t.render();
    assert!(
        text.contains(&format!(
            "otelcol_loadbalancer_backend_up{{exporter=\"loadbalancing/t\",backend=\"{}\"}} 0",
            s1.endpoint()
        )),
        "{text}"
    );
    assert!(text.contains("otelcol_loadbalancer_rerouted_items_total"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_backend_hands_back_what_it_queued() {
    // Backend 1 is unreachable (nothing listens), so what it is given stays queued with it
    // until it is removed from the list; then all of it arrives at the others.
    let (s0, s2) = (Sink::start(), Sink::start());
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let t = Arc::new(Telemetry::new());
    let c = cfg(json!({"routing_key": "attributes", "routing_attributes": ["series"],
        "protocol": {"otlp": {"tls": {"insecure": true}, "timeout": "1s",
            "retry_on_failure": {"initial_interval": "50ms", "max_interval": "100ms", "max_elapsed_time": "0s"}}},
        "resolver": {"static": {"hostnames": [s0.endpoint(), dead.clone(), s2.endpoint()]}},
        "backend_down_after": "0s"}))
    .unwrap();
    let ctx = CreateContext::new(ComponentId::parse("loadbalancing").unwrap(), t.clone());
    let e = LoadBalancer::new(&ctx, Arc::new(c), Signal::Metrics).unwrap();
    e.start().await.unwrap();
    let mut sent = 0;
    for p in metric_rounds(200, 3) {
        sent += p.item_count() as u64;
        e.consume(p).await.unwrap();
    }
    // Never marked down (backend_down_after: 0s): its share waits in its queue.
    eventually("the live backends' share", || s0.total() + s2.total() > 0).await;
    assert!(s0.total() + s2.total() < sent);
    e.set_backends(vec![s0.endpoint(), s2.endpoint()]).await;
    eventually("every item", || s0.total() + s2.total() == sent).await;
    assert_eq!(e.shutdown(Instant::now() + Duration::from_secs(5)).await, 0);
    assert_eq!(s0.total() + s2.total(), sent);
}

/// An address nothing listens on (yet).
fn free_addr() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().to_string()
}

/// A load balancer over `hostnames` (routing by the `series` attribute).
fn lb_over(hostnames: Vec<String>, down_after: &str, t: &Arc<Telemetry>) -> LoadBalancer {
    let c = cfg(json!({"routing_key": "attributes", "routing_attributes": ["series"],
        "protocol": {"otlp": {"tls": {"insecure": true}, "timeout": "1s", "compression": "none",
            "retry_on_failure": {"initial_interval": "50ms", "max_interval": "100ms", "max_elapsed_time": "0s"}}},
        "resolver": {"static": {"hostnames": hostnames}},
        "backend_down_after": down_after}))
    .unwrap();
    let ctx = CreateContext::new(ComponentId::parse("loadbalancing").unwrap(), t.clone());
    LoadBalancer::new(&ctx, Arc::new(c), Signal::Metrics).unwrap()
}

/// 1a: an overloaded backend answering UNAVAILABLE + RetryInfo for far longer than
/// `backend_down_after` is pushing back, not down: it keeps its keys (a killed one is marked
/// down: `a_killed_backend_loses_no_accepted_item`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_pushing_back_under_load_is_never_marked_down() {
    use std::sync::atomic::Ordering::SeqCst;
    let (s0, s1) = (Sink::start(), Sink::start());
    let t = Arc::new(Telemetry::new());
    let e = lb_over(vec![s0.endpoint(), s1.endpoint()], "200ms", &t);
    e.start().await.unwrap();
    s1.refuse.0.store(true, SeqCst);
    let mut sent = 0;
    for p in metric_rounds(100, 3) {
        sent += p.item_count() as u64;
        e.consume(p).await.unwrap();
    }
    // Refused for 1.5 s (7× backend_down_after): never marked down, nothing moved to s0.
    let until = Instant::now() + Duration::from_millis(1500);
    while Instant::now() < until {
        assert_eq!(e.is_up(&s1.endpoint()), Some(true), "pushed back, marked down");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(s1.refuse.1.load(SeqCst) >= 5, "the backend refused: {}", s1.refuse.1.load(SeqCst));
    assert_eq!(s1.total(), 0);
    let on_s0 = s0.total();
    assert!(on_s0 < sent, "s1's share stays with s1");
    s1.refuse.0.store(false, SeqCst);
    eventually("every item", || s0.total() + s1.total() == sent).await;
    assert_eq!(s0.total(), on_s0, "nothing of s1's moved");
    assert_eq!(e.shutdown(Instant::now() + Duration::from_secs(5)).await, 0);
}

/// 1b: the resolver publishes [] while a backend's items are queued: they stay with it
/// (no other backend to hand them to) and arrive once it answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_list_keeps_queued_items_until_the_backend_returns() {
    let addr = free_addr();
    let t = Arc::new(Telemetry::new());
    let e = lb_over(vec![addr.clone()], "200ms", &t);
    e.start().await.unwrap();
    let mut sent = 0;
    for p in metric_rounds(50, 2) {
        sent += p.item_count() as u64;
        e.consume(p).await.unwrap();
    }
    e.set_backends(vec![]).await;
    assert!(e.backends().is_empty());
    // Well past backend_down_after, then the backend comes back.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let s = Sink::start_at(&addr);
    eventually("every queued item", || s.total() == sent).await;
    assert_eq!(e.shutdown(Instant::now() + Duration::from_secs(5)).await, 0);
    assert_eq!(s.total(), sent);
}

/// 1c: shutdown with a retiring backend that cannot deliver returns by its deadline (not the
/// 30 s retire deadline) and counts what it dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_with_a_down_backend_returns_by_the_deadline_and_counts() {
    let s0 = Sink::start();
    let dead = free_addr();
    let t = Arc::new(Telemetry::new());
    let e = lb_over(vec![s0.endpoint(), dead.clone()], "0s", &t);
    e.start().await.unwrap();
    let mut sent = 0;
    for p in metric_rounds(100, 2) {
        sent += p.item_count() as u64;
        e.consume(p).await.unwrap();
    }
    eventually("s0's share", || s0.total() > 0).await;
    // Both removed: no live backend to hand the dead one's share to.
    e.set_backends(vec![]).await;
    let started = Instant::now();
    let dropped = e.shutdown(Instant::now() + Duration::from_secs(1)).await;
    let took = started.elapsed();
    assert!(took < Duration::from_secs(3), "shutdown took {took:?}");
    assert!(dropped > 0);
    assert_eq!(dropped + s0.total(), sent, "every item delivered or counted");
    // And nothing starts after shutdown.
    e.set_backends(vec![s0.endpoint()]).await;
    assert!(e.backends().is_empty());
}

/// 1d: a part refused because its backend retired between the table's snapshot and the offer
/// is split again over the fresh table: the payload is accepted whole (not `Err` after other
/// parts were kept).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_retired_mid_dispatch_is_split_again_not_refused() {
    let (s0, s1) = (Sink::start(), Sink::start());
    let t = Arc::new(Telemetry::new());
    let e = lb_over(vec![s0.endpoint(), s1.endpoint()], "200ms", &t);
    e.start().await.unwrap();
    let stale = e.snapshot();
    e.set_backends(vec![s0.endpoint()]).await;
    eventually("s1 retired", || e.retired_done()).await;
    // As if the split ran before the retirement was marked: s1 looks live, its queue is closed.
    LoadBalancer::unmark_retired(&stale, &s1.endpoint());
    let p = metric_rounds(100, 1).remove(0);
    let n = p.item_count() as u64;
    e.consume_on(p, stale).await.unwrap();
    eventually("every item on s0", || s0.total() == n).await;
    assert_eq!(s1.total(), 0);
    assert_eq!(e.shutdown(Instant::now() + Duration::from_secs(5)).await, 0);
}

#[tokio::test]
async fn no_backend_is_backpressure() {
    let t = Arc::new(Telemetry::new());
    let c = cfg(json!({"resolver": {"static": {"hostnames": [STATIC]}}})).unwrap();
    let ctx = CreateContext::new(ComponentId::parse("loadbalancing").unwrap(), t);
    let e = LoadBalancer::new(&ctx, Arc::new(c), Signal::Traces).unwrap();
    // Not started: no backend yet.
    let r = e.consume(Payload::Traces(traces_of(1, 1))).await;
    assert!(r.as_ref().is_err_and(|e| e.is_retryable()), "{r:?}");
}

// ---- DNS ---------------------------------------------------------------------------------

/// A tiny DNS server: answers A queries for any name with `records` (TTL 0), AAAA with none.
async fn dns_server(records: Arc<Mutex<Vec<std::net::Ipv4Addr>>>) -> SocketAddr {
    let sock = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let addr = sock.local_addr().unwrap();
    tokio::spawn(async move {
        let mut buf = [0u8; 512];
        loop {
            let Ok((n, from)) = sock.recv_from(&mut buf).await else { return };
            let q = &buf[..n];
            if n < 12 {
                continue;
            }
            // The question: labels, then type and class.
            let mut p = 12;
            while p < n && q[p] != 0 {
                p += q[p] as usize + 1;
            }
            let qend = p + 5;
            if qend > n {
                continue;
            }
            let qtype = u16::from_be_bytes([q[p + 1], q[p + 2]]);
            let ips: Vec<_> = if qtype == 1 { records.lock().clone() } else { Vec::new() };
            let mut r = Vec::new();
            r.extend_from_slice(&q[0..2]);
            r.extend_from_slice(&[0x81, 0x80, 0, 1]);
            r.extend_from_slice(&(ips.len() as u16).to_be_bytes());
            r.extend_from_slice(&[0, 0, 0, 0]);
            r.extend_from_slice(&q[12..qend]);
            for ip in ips {
                r.extend_from_slice(&[0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 0, 0, 4]);
                r.extend_from_slice(&ip.octets());
            }
            let _ = sock.send_to(&r, from).await;
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dns_resolver_follows_the_records_within_one_interval() {
    use std::net::Ipv4Addr;
    let records = Arc::new(Mutex::new(vec![Ipv4Addr::new(127, 0, 0, 1), Ipv4Addr::new(127, 0, 0, 2)]));
    let ns = dns_server(records.clone()).await;
    let t = Arc::new(Telemetry::new());
    let interval = Duration::from_millis(300);
    let c: DnsResolverConfig = inferwatch_core::component::parse_config(&json!({
        "hostname": "gateway.test", "port": 14317, "interval": "300ms", "timeout": "500ms", "nameservers": [ns.to_string()]
    }))
    .unwrap();
    c.check().unwrap();
    let r = c.resolver("loadbalancing", Some(&t)).unwrap();
    let (tx, mut rx) = tokio::sync::watch::channel(Vec::new());
    let cancel = tokio_util::sync::CancellationToken::new();
    let h = tokio::spawn(r.run(tx, cancel.clone()));
    tokio::time::timeout(Duration::from_secs(10), rx.changed()).await.unwrap().unwrap();
    assert_eq!(*rx.borrow_and_update(), vec!["127.0.0.1:14317", "127.0.0.2:14317"]);

    *records.lock() = vec![Ipv4Addr::new(127, 0, 0, 3), Ipv4Addr::new(127, 0, 0, 1)];
    let changed_at = Instant::now();
    tokio::time::timeout(Duration::from_secs(10), rx.changed()).await.unwrap().unwrap();
    let took = changed_at.elapsed();
    assert_eq!(*rx.borrow_and_update(), vec!["127.0.0.1:14317", "127.0.0.3:14317"]);
    println!("dns: the change was seen after {took:?} (interval {interval:?})");
    assert!(took <= interval + Duration::from_millis(600), "{took:?}");

    // The same answer again is not published again; resolutions are counted.
    let text = || t.render();
    let resolved = |s: &str| {
        s.lines()
            .find(|l| l.starts_with("otelcol_loadbalancer_num_resolutions_total") && l.contains("success=\"true\""))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    let n = resolved(&text());
    eventually("two more resolutions", || resolved(&text()) >= n + 2.0).await;
    assert!(!rx.has_changed().unwrap(), "unchanged lists are not published");

    // An answer with no record keeps the last list and counts as a failed resolution.
    let failed = |s: &str| {
        s.lines()
            .find(|l| l.starts_with("otelcol_loadbalancer_num_resolutions_total") && l.contains("success=\"false\""))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    records.lock().clear();
    let f = failed(&text());
    eventually("two failed resolutions", || failed(&text()) >= f + 2.0).await;
    assert!(!rx.has_changed().unwrap(), "an empty answer is not published");
    assert_eq!(*rx.borrow(), vec!["127.0.0.1:14317", "127.0.0.3:14317"]);
    cancel.cancel();
    h.await.unwrap();
}

/// 1g, 2: a persistent per-backend queue is refused; otelcol's top-level timeout /
/// sending_queue / retry_on_failure are accepted and apply to each backend.
#[test]
fn storage_is_refused_and_top_level_queue_settings_apply_per_backend() {
    let st = json!({"static": {"hostnames": [STATIC]}});
    let e = err(json!({"resolver": st, "protocol": {"otlp": {"sending_queue": {"storage": "file_storage"}}}}));
    assert_eq!(e.dotted(), "protocol.otlp.sending_queue.storage", "{e}");
    assert!(e.message.contains("persistent queue"), "{e}");
    let e = err(json!({"resolver": st, "sending_queue": {"storage": "file_storage"}}));
    assert_eq!(e.dotted(), "sending_queue.storage", "{e}");
    let e = err(json!({"resolver": st, "timeout": "soon"}));
    assert_eq!(e.dotted(), "timeout", "{e}");
    let c = cfg(json!({"resolver": st, "timeout": "3s",
        "sending_queue": {"queue_size": 77},
        "retry_on_failure": {"enabled": false},
        "protocol": {"otlp": {"timeout": "9s", "sending_queue": {"queue_size": 5}}}}))
    .unwrap();
    let b = c.otlp_for("10.0.0.1:4317").unwrap();
    assert_eq!(b.exporter.sending_queue.queue_size, 77);
    assert!(!b.exporter.retry_on_failure.enabled);
    assert_eq!(b.exporter.timeout(), Some(Duration::from_secs(3)), "top-level timeout over protocol.otlp's");
}

#[test]
fn static_resolver_publishes_its_list() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let c =
            super::resolver::static_::StaticResolverConfig { hostnames: vec!["b:1".into(), "a".into(), "b:1".into()] };
        let (tx, rx) = tokio::sync::watch::channel(Vec::new());
        let cancel = tokio_util::sync::CancellationToken::new();
        let h = tokio::spawn(c.resolver().run(tx, cancel.clone()));
        let mut rx = rx;
        rx.changed().await.unwrap();
        assert_eq!(*rx.borrow(), vec!["a:4317", "b:1"]);
        cancel.cancel();
        h.await.unwrap();
    });
}

#[allow(dead_code)]
fn _resolver_is_object_safe(_: Box<dyn Resolver>) {}

// ---- wire split = decoded split ------------------------------------------------------------

mod wire_equivalence {
    use super::*;
    use inferwatch_testkit::rng::SplitMix64;
    use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
    use opentelemetry_proto::tonic::common::v1::{
        AnyValue, ArrayValue, InstrumentationScope, KeyValue, KeyValueList, any_value::Value,
    };
    use opentelemetry_proto::tonic::logs::v1::{LogRecord, ResourceLogs, ScopeLogs};
    use opentelemetry_proto::tonic::metrics::v1::{
        ExponentialHistogram, ExponentialHistogramDataPoint, Gauge, Histogram, HistogramDataPoint, Metric,
        NumberDataPoint, ResourceMetrics, ScopeMetrics, Sum, Summary, SummaryDataPoint, metric::Data,
    };
    use opentelemetry_proto::tonic::resource::v1::Resource;
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};

    const NAMES: [&str; 5] = ["service.name", "a", "b", "c", "d"];

    struct Gen(SplitMix64);

    impl Gen {
        fn n(&mut self, k: u64) -> u64 {
            self.0.below(k)
        }
        fn value(&mut self) -> AnyValue {
            let v = match self.n(7) {
                0..=2 => Value::StringValue(format!("v{}", self.n(4))),
                3 => Value::IntValue(self.n(3) as i64),
                4 => Value::BoolValue(self.n(2) == 1),
                5 => Value::ArrayValue(ArrayValue {
                    values: (0..self.n(3)).map(|i| AnyValue { value: Some(Value::IntValue(i as i64)) }).collect(),
                }),
                _ => Value::KvlistValue(KeyValueList {
                    values: vec![KeyValue {
                        key: "k".into(),
                        value: Some(AnyValue { value: Some(Value::StringValue(format!("x{}", self.n(2)))) }),
                        key_strindex: 0,
                    }],
                }),
            };
            AnyValue { value: Some(v) }
        }
        /// 0..3 attributes with names of the pool (a name may repeat: the first one counts).
        fn attrs(&mut self) -> Vec<KeyValue> {
            (0..self.n(4))
                .map(|_| KeyValue {
                    key: NAMES[self.n(NAMES.len() as u64) as usize].into(),
                    value: if self.n(8) == 0 { None } else { Some(self.value()) },
                    key_strindex: 0,
                })
                .collect()
        }
        fn resource(&mut self) -> Option<Resource> {
            (self.n(6) != 0).then(|| Resource { attributes: self.attrs(), ..Default::default() })
        }
        fn scope(&mut self) -> Option<InstrumentationScope> {
            (self.n(5) != 0).then(|| InstrumentationScope {
                name: format!("s{}", self.n(2)),
                version: format!("{}", self.n(2)),
                attributes: self.attrs(),
                ..Default::default()
            })
        }
        fn trace_id(&mut self) -> Vec<u8> {
            if self.n(10) == 0 { Vec::new() } else { (self.n(12) as u128 + 1).to_be_bytes().to_vec() }
        }
        fn traces(&mut self) -> ExportTraceServiceRequest {
            ExportTraceServiceRequest {
                resource_spans: (0..1 + self.n(4))
                    .map(|_| ResourceSpans {
                        resource: self.resource(),
                        scope_spans: (0..self.n(3))
                            .map(|_| ScopeSpans {
                                scope: self.scope(),
                                spans: (0..self.n(6))
                                    .map(|i| Span {
                                        trace_id: self.trace_id(),
                                        span_id: (i + 1).to_be_bytes().to_vec(),
                                        name: format!("op{i}"),
                                        attributes: self.attrs(),
                                        ..Default::default()
                                    })
                                    .collect(),
                                schema_url: "su".into(),
                            })
                            .collect(),
                        schema_url: "ru".into(),
                    })
                    .collect(),
            }
        }
        fn logs(&mut self) -> ExportLogsServiceRequest {
            ExportLogsServiceRequest {
                resource_logs: (0..1 + self.n(4))
                    .map(|_| ResourceLogs {
                        resource: self.resource(),
                        scope_logs: (0..self.n(3))
                            .map(|_| ScopeLogs {
                                scope: self.scope(),
                                log_records: (0..self.n(6))
                                    .map(|i| LogRecord {
                                        time_unix_nano: i,
                                        trace_id: self.trace_id(),
                                        body: Some(self.value()),
                                        attributes: self.attrs(),
                                        ..Default::default()
                                    })
                                    .collect(),
                                schema_url: String::new(),
                            })
                            .collect(),
                        schema_url: String::new(),
                    })
                    .collect(),
            }
        }
        fn metric(&mut self) -> Metric {
            let k = self.n(4);
            macro_rules! pts {
                ($t:ident, $f:ident) => {
                    (0..k).map(|i| $t { $f: self.attrs(), time_unix_nano: i, ..Default::default() }).collect()
                };
            }
            let data = match self.n(6) {
                0 => Some(Data::Gauge(Gauge { data_points: pts!(NumberDataPoint, attributes) })),
                1 => Some(Data::Sum(Sum {
                    data_points: pts!(NumberDataPoint, attributes),
                    aggregation_temporality: 2,
                    is_monotonic: true,
                })),
                2 => Some(Data::Histogram(Histogram {
                    data_points: pts!(HistogramDataPoint, attributes),
                    aggregation_temporality: 1,
                })),
                3 => Some(Data::ExponentialHistogram(ExponentialHistogram {
                    data_points: pts!(ExponentialHistogramDataPoint, attributes),
                    aggregation_temporality: 2,
                })),
                4 => Some(Data::Summary(Summary { data_points: pts!(SummaryDataPoint, attributes) })),
                _ => None,
            };
            Metric { name: format!("m{}", self.n(3)), unit: "1".into(), data, ..Default::default() }
        }
        fn metrics(&mut self) -> ExportMetricsServiceRequest {
            ExportMetricsServiceRequest {
                resource_metrics: (0..1 + self.n(4))
                    .map(|_| ResourceMetrics {
                        resource: self.resource(),
                        scope_metrics: (0..self.n(3))
                            .map(|_| ScopeMetrics {
                                scope: self.scope(),
                                metrics: (0..self.n(4)).map(|_| self.metric()).collect(),
                                schema_url: "su".into(),
                            })
                            .collect(),
                        schema_url: String::new(),
                    })
                    .collect(),
            }
        }
    }

    /// The decoded form without empty scopes and resources (they hold no items: a resource moved
    /// whole keeps them, one split drops them).
    fn decoded(p: &Payload) -> Payload {
        let mut p = p.decoded().unwrap().into_owned();
        match &mut p {
            Payload::Traces(r) => {
                r.resource_spans.iter_mut().for_each(|r| r.scope_spans.retain(|s| !s.spans.is_empty()));
                r.resource_spans.retain(|r| !r.scope_spans.is_empty());
            }
            Payload::Metrics(r) => {
                r.resource_metrics.iter_mut().for_each(|r| r.scope_metrics.retain(|s| !s.metrics.is_empty()));
                r.resource_metrics.retain(|r| !r.scope_metrics.is_empty());
            }
            Payload::Logs(r) => {
                r.resource_logs.iter_mut().for_each(|r| r.scope_logs.retain(|s| !s.log_records.is_empty()));
                r.resource_logs.retain(|r| !r.scope_logs.is_empty());
            }
            Payload::Encoded(_) => {}
        }
        p
    }

    /// Randomised payloads of every signal, split by every key that routes it: the encoded
    /// form, split on the wire, gives each backend exactly what the decoded form gives it.
    #[test]
    fn an_encoded_payload_routes_exactly_as_its_decoded_form_for_every_key() {
        let mut g = Gen(SplitMix64(42));
        let ring = Ring::new(members(4));
        let mut item_level_splits = 0;
        let mut checked = 0;
        for round in 0..1500 {
            let (signal, data) = match round % 3 {
                0 => (Signal::Traces, Payload::Traces(g.traces())),
                1 => (Signal::Metrics, Payload::Metrics(g.metrics())),
                _ => (Signal::Logs, Payload::Logs(g.logs())),
            };
            let bytes = bytes::Bytes::from(data.encode_to_vec());
            let Ok(e) = Encoded::new(signal, bytes) else { continue };
            for key in [
                RoutingKey::TraceId,
                RoutingKey::Service,
                RoutingKey::Resource,
                RoutingKey::Metric,
                RoutingKey::StreamId,
                RoutingKey::Attributes,
            ] {
                if !key.signals().contains(&signal) {
                    continue;
                }
                let n = 1 + g.n(3) as usize;
                let attributes: Vec<String> = (0..n).map(|_| NAMES[g.n(5) as usize].to_string()).collect();
                let s = Splitter { key, attributes };
                let pick = |h| ring.owner(h);
                let want = s.split(data.clone(), &pick).unwrap();
                let got = s.split(Payload::Encoded(e.clone()), &pick).unwrap();
                assert!(got.iter().all(|(_, p)| matches!(p, Payload::Encoded(_))), "{key:?}: split on the wire");
                let want: BTreeMap<usize, Payload> = want.iter().map(|(i, p)| (*i, decoded(p))).collect();
                let got: BTreeMap<usize, Payload> = got.iter().map(|(i, p)| (*i, decoded(p))).collect();
                assert_eq!(got, want, "{signal} {key:?} {:?}", s.attributes);
                assert_eq!(
                    got.values().map(Payload::item_count).sum::<usize>(),
                    data.item_count(),
                    "{signal} {key:?}: items kept"
                );
                // A resource entry on more than one backend: split below the resource.
                if got.len() > 1 {
                    let first_entries = |p: &Payload| p.encode_to_vec().len();
                    let total: usize = got.values().map(first_entries).sum();
                    if total > data.encoded_len() {
                        item_level_splits += 1;
                    }
                }
                checked += 1;
            }
        }
        assert!(checked > 3000, "{checked} splits compared");
        assert!(item_level_splits > 500, "only {item_level_splits} splits below the resource");
    }

    fn wrap(field: u32, body: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        prost::encoding::encode_key(field, prost::encoding::WireType::LengthDelimited, &mut v);
        prost::encoding::encode_varint(body.len() as u64, &mut v);
        v.extend_from_slice(body);
        v
    }

    /// Messages that occur twice on the wire merge as prost merges them (a resource entry made
    /// of two concatenated encodings, a span or log record made of two, a metric made of two,
    /// its data member repeated or replaced): the wire split reads them as the decoded path does.
    #[test]
    fn repeated_fields_merge_as_prost_merges_them() {
        use prost::Message;
        let mut g = Gen(SplitMix64(7));
        let ring = Ring::new(members(4));
        let mut checked = 0;
        for round in 0..600 {
            let signal = [Signal::Traces, Signal::Metrics, Signal::Logs][round % 3];
            let mut bytes = Vec::new();
            for _ in 0..1 + g.n(3) {
                let entry: Vec<u8> = match signal {
                    Signal::Traces => {
                        let (a, b) = (g.traces(), g.traces());
                        // One scope whose spans are each two spans' encodings.
                        let spans: Vec<Span> = b
                            .resource_spans
                            .iter()
                            .flat_map(|r| &r.scope_spans)
                            .flat_map(|s| s.spans.clone())
                            .collect();
                        let mut scope = Vec::new();
                        if let Some(sc) = g.scope() {
                            scope.extend(wrap(1, &sc.encode_to_vec()));
                        }
                        for w in spans.windows(2) {
                            scope.extend(wrap(2, &[w[0].encode_to_vec(), w[1].encode_to_vec()].concat()));
                        }
                        [a.resource_spans[0].encode_to_vec(), wrap(2, &scope), b.resource_spans[0].encode_to_vec()]
                            .concat()
                    }
                    Signal::Logs => {
                        let (a, b) = (g.logs(), g.logs());
                        let recs: Vec<LogRecord> = b
                            .resource_logs
                            .iter()
                            .flat_map(|r| &r.scope_logs)
                            .flat_map(|s| s.log_records.clone())
                            .collect();
                        let mut scope = Vec::new();
                        for w in recs.windows(2) {
                            scope.extend(wrap(2, &[w[0].encode_to_vec(), w[1].encode_to_vec()].concat()));
                        }
                        [a.resource_logs[0].encode_to_vec(), wrap(2, &scope), b.resource_logs[0].encode_to_vec()]
                            .concat()
                    }
                    Signal::Metrics => {
                        let (a, b) = (g.metrics(), g.metrics());
                        let ra = &a.resource_metrics[0];
                        // One scope whose metrics are each two metrics' encodings.
                        let mut scope = Vec::new();
                        if let Some(sc) = g.scope() {
                            scope.extend(wrap(1, &sc.encode_to_vec()));
                        }
                        for _ in 0..1 + g.n(3) {
                            let m = [g.metric().encode_to_vec(), g.metric().encode_to_vec()].concat();
                            scope.extend(wrap(2, &m));
                        }
                        [ra.encode_to_vec(), wrap(2, &scope), b.resource_metrics[0].encode_to_vec()].concat()
                    }
                };
                bytes.extend(wrap(1, &entry));
            }
            let Ok(e) = Encoded::new(signal, bytes::Bytes::from(bytes)) else { continue };
            let data = e.decode().unwrap();
            if data.item_count() == 0 {
                continue;
            }
            for key in [
                RoutingKey::TraceId,
                RoutingKey::Service,
                RoutingKey::Resource,
                RoutingKey::Metric,
                RoutingKey::StreamId,
                RoutingKey::Attributes,
            ] {
                if !key.signals().contains(&signal) {
                    continue;
                }
                let s =
                    Splitter { key, attributes: vec![NAMES[g.n(5) as usize].into(), NAMES[g.n(5) as usize].into()] };
                let pick = |h| ring.owner(h);
                let want: BTreeMap<usize, Payload> =
                    s.split(data.clone(), &pick).unwrap().iter().map(|(i, p)| (*i, decoded(p))).collect();
                let got = s.split(Payload::Encoded(e.clone()), &pick).unwrap();
                assert!(got.iter().all(|(_, p)| matches!(p, Payload::Encoded(_))), "{key:?}: split on the wire");
                let got: BTreeMap<usize, Payload> = got.iter().map(|(i, p)| (*i, decoded(p))).collect();
                assert_eq!(got, want, "{signal} {key:?} {:?}", s.attributes);
                checked += 1;
            }
        }
        assert!(checked > 800, "{checked} splits compared");
    }

    /// A resource whose items all go to one backend is passed as a slice of the input.
    #[test]
    fn a_whole_entry_is_not_copied() {
        use prost::Message;
        let req = traces_of(1, 5);
        let bytes = bytes::Bytes::from(req.encode_to_vec());
        let e = Encoded::new(Signal::Traces, bytes.clone()).unwrap();
        let s = Splitter { key: RoutingKey::TraceId, attributes: vec![] };
        let parts = s.split(Payload::Encoded(e), &|_| Some(2)).unwrap();
        assert_eq!(parts.len(), 1);
        let Payload::Encoded(out) = &parts[0].1 else { panic!("decoded") };
        let chunks = out.chunks();
        assert_eq!(chunks.len(), 1);
        assert_eq!(chunks[0].as_ptr(), bytes.as_ptr(), "the input's bytes");
        assert_eq!(out.item_count(), 5);
    }
}

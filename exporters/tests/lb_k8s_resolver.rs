//! `loadbalancing`'s `resolver.k8s` against a Kubernetes API server fixture over real HTTP: recorded
//! `EndpointSliceList` / `WatchEvent` responses (tests/fixtures/k8s/), served only at the
//! namespace's `endpointslices` path and only to the Service's label selector.

use inferwatch_core::kube::ApiConn;
use inferwatch_core::settings::TlsClientSettings;
use inferwatch_core::telemetry::Telemetry;
use inferwatch_exporters::loadbalancing::resolver::Resolver;
use inferwatch_exporters::loadbalancing::resolver::k8s::{K8sResolverConfig, NUM_RESOLUTIONS, own_namespace};
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

const LIST: &str = include_str!("fixtures/k8s/endpointslices-list.json");
const WATCH_1: &str = include_str!("fixtures/k8s/endpointslices-watch-1.json");
const WATCH_2: &str = include_str!("fixtures/k8s/endpointslices-watch-2.json");
const RELIST: &str = include_str!("fixtures/k8s/endpointslices-relist.json");

const SELECTOR: &str = "kubernetes.io/service-name=inferwatch-gateway";
const PATH: &str = "/apis/discovery.k8s.io/v1/namespaces/inferwatch/endpointslices";
const EXPORTER: &str = "loadbalancing/gateway";
const DEADLINE: Duration = Duration::from_secs(15);

fn fixture(text: &str) -> Value {
    serde_json::from_str(text).unwrap()
}

mod api {
    //! The API server fixture. `GET PATH?labelSelector=SELECTOR` answers the list (its items
    //! filtered by the selector, as the API server does) or, with `watch=1`, streams the next
    //! scripted watch (newline-delimited `WatchEvent`s) or stays open when none is left. Any other
    //! path is 404 and any other selector 400 (a `Status`, as the API server answers).
    use super::{PATH, SELECTOR};
    use axum::Router;
    use axum::body::Body;
    use axum::extract::{Query, State};
    use axum::http::{StatusCode, Uri, header};
    use axum::response::{IntoResponse, Response};
    use serde_json::{Value, json};
    use std::collections::{HashMap, VecDeque};
    use std::sync::Arc;
    use tokio::sync::mpsc;

    type Chunk = Result<String, std::io::Error>;

    #[derive(Default)]
    pub struct Api {
        pub port: u16,
        /// The EndpointSliceList of the namespace (all Services).
        pub list: parking_lot::Mutex<Value>,
        /// When set, lists are answered with this status.
        pub list_status: parking_lot::Mutex<Option<u16>>,
        /// Every request: path and query.
        pub requests: parking_lot::Mutex<Vec<(String, HashMap<String, String>)>>,
        watches: parking_lot::Mutex<VecDeque<mpsc::Receiver<Chunk>>>,
        open: parking_lot::Mutex<Vec<mpsc::Sender<Chunk>>>,
    }

    impl Api {
        pub fn lists(&self) -> usize {
            self.requests.lock().iter().filter(|(_, q)| !q.contains_key("watch")).count()
        }
        pub fn watch_versions(&self) -> Vec<String> {
            let r = self.requests.lock();
            r.iter()
                .filter(|(_, q)| q.contains_key("watch"))
                .filter_map(|(_, q)| q.get("resourceVersion").cloned())
                .collect()
        }
        /// The sender of the next watch stream.
        pub fn script_watch(&self) -> Watch {
            let (tx, rx) = mpsc::channel(16);
            self.watches.lock().push_back(rx);
            Watch(tx)
        }
    }

    pub struct Watch(mpsc::Sender<Chunk>);

    impl Watch {
        /// Writes `events` (WatchEvent objects) as one chunk.
        pub async fn send(&self, events: &[Value]) {
            let text: String = events.iter().map(|e| e.to_string() + "\n").collect();
            self.0.send(Ok(text)).await.unwrap();
        }
    }

    fn status(code: u16, reason: &str, message: &str) -> Response {
        let body = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                          "message": message, "reason": reason, "code": code});
        let code = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (code, [(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
    }

    async fn handle(State(a): State<Arc<Api>>, uri: Uri, Query(q): Query<HashMap<String, String>>) -> Response {
        a.requests.lock().push((uri.path().to_string(), q.clone()));
        if uri.path() != PATH {
            return status(
                404,
                "NotFound",
                &format!("the server could not find the requested resource ({})", uri.path()),
            );
        }
        if q.get("labelSelector").map(String::as_str) != Some(SELECTOR) {
            return status(400, "BadRequest", &format!("unexpected labelSelector {:?}", q.get("labelSelector")));
        }
        let json_type = [(header::CONTENT_TYPE, "application/json")];
        if q.get("watch").map(String::as_str) != Some("1") {
            if let Some(code) = *a.list_status.lock() {
                return status(code, "InternalError", "etcdserver: request timed out");
            }
            let mut list = a.list.lock().clone();
            let service = SELECTOR.split_once('=').map(|(_, v)| v).unwrap_or_default();
            if let Some(Value::Array(items)) = list.get_mut("items") {
                items.retain(|s| s.pointer("/metadata/labels/kubernetes.io~1service-name") == Some(&json!(service)));
            }
            return (json_type, list.to_string()).into_response();
        }
        let next = a.watches.lock().pop_front();
        let rx = match next {
            Some(rx) => rx,
            None => {
                let (tx, rx) = mpsc::channel(1);
                a.open.lock().push(tx);
                rx
            }
        };
        (json_type, Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx))).into_response()
    }

    pub async fn serve() -> Arc<Api> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let a = Arc::new(Api { port: listener.local_addr().unwrap().port(), ..Default::default() });
        let app = Router::new().fallback(handle).with_state(a.clone());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        a
    }
}

async fn until(what: &str, mut cond: impl FnMut() -> bool) {
    let end = Instant::now() + DEADLINE;
    while !cond() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The next published list.
async fn next(rx: &mut watch::Receiver<Vec<String>>, what: &str) -> Vec<String> {
    match tokio::time::timeout(DEADLINE, rx.changed()).await {
        Ok(Ok(())) => rx.borrow_and_update().clone(),
        other => panic!("no publication of {what}: {other:?}"),
    }
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

struct Running {
    rx: watch::Receiver<Vec<String>>,
    telemetry: Arc<Telemetry>,
    cancel: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Running {
    fn resolutions(&self, success: &str) -> u64 {
        NUM_RESOLUTIONS.get(&self.telemetry, [EXPORTER, "k8s", success]).get()
    }
    async fn stop(self) {
        self.cancel.cancel();
        tokio::time::timeout(DEADLINE, self.task).await.expect("the resolver stops when cancelled").unwrap();
    }
}

fn start(api: &api::Api, settings: Value, pod_namespace: Option<&str>) -> Running {
    let cfg: K8sResolverConfig = inferwatch_core::component::parse_config(&settings).unwrap();
    cfg.check().unwrap();
    let conn = ApiConn::new(&format!("http://127.0.0.1:{}", api.port), None, &TlsClientSettings::default()).unwrap();
    let telemetry = Arc::new(Telemetry::new());
    let r: Box<dyn Resolver> = Box::new(cfg.build(EXPORTER, conn, pod_namespace, Some(&telemetry)).unwrap());
    let (tx, rx) = watch::channel(Vec::new());
    let cancel = CancellationToken::new();
    let task = tokio::spawn(r.run(tx, cancel.clone()));
    Running { rx, telemetry, cancel, task }
}

/// Every request went to the namespace's endpointslices with the Service's selector.
fn assert_requests_scoped(api: &api::Api) {
    let r = api.requests.lock();
    assert!(!r.is_empty());
    for (path, q) in r.iter() {
        assert_eq!(path, PATH, "{q:?}");
        assert_eq!(q.get("labelSelector").map(String::as_str), Some(SELECTOR), "{path} {q:?}");
    }
}

#[tokio::test]
async fn list_then_modified_deleted_bookmark_and_410_keep_the_ready_backends() {
    let api = api::serve().await;
    *api.list.lock() = fixture(LIST);
    let w1 = api.script_watch();
    let w2 = api.script_watch();
    let mut run = start(&api, json!({"service": "inferwatch-gateway.inferwatch", "ports": [4317, 4318]}), None);

    // The list: ready (or ready-absent) endpoints of the three slices of the Service × both
    // ports; 10.244.3.8 (ready: false) left out, 10.244.2.31 (in two slices) once, the vllm
    // slice (another Service) never asked for.
    let first = next(&mut run.rx, "the list").await;
    assert_eq!(
        first,
        strings(&[
            "10.244.1.17:4317",
            "10.244.1.17:4318",
            "10.244.2.31:4317",
            "10.244.2.31:4318",
            "10.244.4.12:4317",
            "10.244.4.12:4318",
            "10.244.5.5:4317",
            "10.244.5.5:4318",
            "[fd00:10:244:1::11]:4317",
            "[fd00:10:244:1::11]:4318",
        ])
    );
    {
        let r = api.requests.lock();
        assert_eq!(r[0].1.get("limit").map(String::as_str), Some("500"), "{:?}", r[0]);
        assert!(!r[0].1.contains_key("watch"), "a list first: {:?}", r[0]);
    }

    // MODIFIED: inferwatch-gateway-0 becomes not ready (terminating) and is dropped.
    let w1_events: Vec<Value> = serde_json::from_value(fixture(WATCH_1)).unwrap();
    w1.send(&w1_events[..1]).await;
    let second = next(&mut run.rx, "the MODIFIED slice").await;
    assert_eq!(
        second,
        strings(&[
            "10.244.2.31:4317",
            "10.244.2.31:4318",
            "10.244.4.12:4317",
            "10.244.4.12:4318",
            "10.244.5.5:4317",
            "10.244.5.5:4318",
            "[fd00:10:244:1::11]:4317",
            "[fd00:10:244:1::11]:4318",
        ])
    );

    // A MODIFIED that changes nothing the resolver uses, then a BOOKMARK and the end of the
    // stream: the watch resumes from the bookmark and nothing is published.
    w1.send(&w1_events[1..]).await;
    drop(w1);
    until("the watch resumed from the bookmark", || api.watch_versions().len() >= 2).await;
    assert_eq!(api.watch_versions(), ["48213", "48300"], "from the list's version, then the bookmark's");
    assert!(!run.rx.has_changed().unwrap(), "published without a change: {:?}", *run.rx.borrow());
    assert_eq!(api.lists(), 1, "an ended stream is resumed, not listed again");

    // DELETED: the slice's endpoints go, but 10.244.2.31 stays (it is in the other slice too).
    let w2_events: Vec<Value> = serde_json::from_value(fixture(WATCH_2)).unwrap();
    w2.send(&w2_events[..1]).await;
    let third = next(&mut run.rx, "the DELETED slice").await;
    assert_eq!(
        third,
        strings(&["10.244.2.31:4317", "10.244.2.31:4318", "[fd00:10:244:1::11]:4317", "[fd00:10:244:1::11]:4318"])
    );

    // 410 Gone: listed again; the new list replaces everything (the IPv6 slice deleted while the
    // watch was gone disappears, a new slice appears).
    *api.list.lock() = fixture(RELIST);
    w2.send(&w2_events[1..]).await;
    let fourth = next(&mut run.rx, "the relist after 410").await;
    assert_eq!(
        fourth,
        strings(&[
            "10.244.1.17:4317",
            "10.244.1.17:4318",
            "10.244.2.31:4317",
            "10.244.2.31:4318",
            "10.244.6.3:4317",
            "10.244.6.3:4318"
        ])
    );
    assert_eq!(api.lists(), 2);
    until("the watch from the new list", || api.watch_versions().len() >= 3).await;
    assert_eq!(api.watch_versions()[2], "48400");
    let r = api.requests.lock().clone();
    for (_, q) in r.iter().filter(|(_, q)| q.contains_key("watch")) {
        assert_eq!(q.get("watch").map(String::as_str), Some("1"), "{q:?}");
        assert_eq!(q.get("allowWatchBookmarks").map(String::as_str), Some("true"), "{q:?}");
    }
    assert_requests_scoped(&api);

    assert_eq!(run.resolutions("false"), 0);
    assert!(run.resolutions("true") >= 4, "{}", run.resolutions("true"));
    let text = run.telemetry.render();
    assert!(
        text.contains(
            r#"otelcol_loadbalancer_num_resolutions_total{exporter="loadbalancing/gateway",resolver="k8s",success="false"} 0"#
        ),
        "{text}"
    );
    run.stop().await;
}

/// Counts the WARN events of the k8s resolver on the thread it is set on.
struct Warnings(Arc<AtomicUsize>);

impl tracing::Subscriber for Warnings {
    fn register_callsite(&self, _: &'static tracing::Metadata<'static>) -> tracing::subscriber::Interest {
        tracing::subscriber::Interest::sometimes()
    }
    fn enabled(&self, m: &tracing::Metadata<'_>) -> bool {
        m.is_event() && *m.level() == tracing::Level::WARN
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, e: &tracing::Event<'_>) {
        if e.metadata().target().starts_with("inferwatch_exporters::loadbalancing::resolver::k8s") {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

#[tokio::test]
async fn a_failing_list_keeps_the_last_backends_counted_and_logged_once_per_reason() {
    let warnings = Arc::new(AtomicUsize::new(0));
    // The test's runtime is single-threaded: the resolver's task logs on this thread.
    let _log = tracing::subscriber::set_default(Warnings(warnings.clone()));
    let api = api::serve().await;
    *api.list.lock() = fixture(LIST);
    let w1 = api.script_watch();
    let mut run = start(&api, json!({"service": "inferwatch-gateway"}), Some("inferwatch"));
    let first = next(&mut run.rx, "the list").await;
    assert_eq!(
        first,
        strings(&[
            "10.244.1.17:4317",
            "10.244.2.31:4317",
            "10.244.4.12:4317",
            "10.244.5.5:4317",
            "[fd00:10:244:1::11]:4317"
        ])
    );

    // The watch is gone and every list now fails with 500: retried, counted each time, logged once.
    *api.list_status.lock() = Some(500);
    let w2_events: Vec<Value> = serde_json::from_value(fixture(WATCH_2)).unwrap();
    w1.send(&w2_events[1..]).await;
    until("three failed lists", || run.resolutions("false") >= 3).await;
    assert!(!run.rx.has_changed().unwrap(), "a failure published {:?}", *run.rx.borrow());
    assert_eq!(*run.rx.borrow(), first, "the last backends are kept");
    assert_eq!(warnings.load(Ordering::SeqCst), 1, "one warning for one reason");

    // Another reason: logged once more.
    *api.list_status.lock() = Some(503);
    let failed = run.resolutions("false");
    until("a failure with the new reason", || run.resolutions("false") > failed).await;
    assert_eq!(warnings.load(Ordering::SeqCst), 2, "a new reason is logged");
    assert!(!run.rx.has_changed().unwrap());

    // The server answers again: the new list is published.
    *api.list.lock() = fixture(RELIST);
    *api.list_status.lock() = None;
    let after = next(&mut run.rx, "the list after the failures").await;
    assert_eq!(after, strings(&["10.244.1.17:4317", "10.244.2.31:4317", "10.244.6.3:4317"]));
    assert_eq!(warnings.load(Ordering::SeqCst), 2);
    assert_requests_scoped(&api);
    let text = run.telemetry.render();
    let failed = run.resolutions("false");
    assert!(
        text.contains(&format!(
            r#"otelcol_loadbalancer_num_resolutions_total{{exporter="loadbalancing/gateway",resolver="k8s",success="false"}} {failed}"#
        )),
        "{text}"
    );
    run.stop().await;
}

#[tokio::test]
async fn the_namespace_is_the_pods_own_and_hostnames_name_statefulset_pods() {
    // `service` without a namespace: the pod's own, from the service account's namespace file.
    let dir = std::env::temp_dir().join(format!("iw-lb-k8s-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("namespace"), "inferwatch").unwrap();
    let own = own_namespace(dir.to_str().unwrap());
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(own.as_deref(), Some("inferwatch"));

    let api = api::serve().await;
    *api.list.lock() = fixture(LIST);
    let mut run = start(&api, json!({"service": "inferwatch-gateway", "return_hostnames": true}), own.as_deref());
    let got = next(&mut run.rx, "the list").await;
    // Endpoints with a hostname by their StatefulSet DNS name; the one without keeps its IP.
    assert_eq!(
        got,
        strings(&[
            "10.244.5.5:4317",
            "inferwatch-gateway-0.inferwatch-gateway.inferwatch:4317",
            "inferwatch-gateway-1.inferwatch-gateway.inferwatch:4317",
            "inferwatch-gateway-3.inferwatch-gateway.inferwatch:4317",
        ])
    );
    assert_requests_scoped(&api);
    run.stop().await;

    // Another namespace: the server has no such path; nothing is published, failures counted.
    let api = api::serve().await;
    *api.list.lock() = fixture(LIST);
    let run = start(&api, json!({"service": "inferwatch-gateway"}), Some("ml"));
    until("a failed list", || run.resolutions("false") >= 1).await;
    assert!(!run.rx.has_changed().unwrap());
    let r = api.requests.lock().clone();
    assert_eq!(r[0].0, "/apis/discovery.k8s.io/v1/namespaces/ml/endpointslices");
    assert_eq!(r[0].1.get("labelSelector").map(String::as_str), Some(SELECTOR));
    run.stop().await;
}

//! An otelcol user's configuration: every error of a file in one run with "did you mean"
//! suggestions, `--set` overrides over the files, `print-config`'s redaction and round trip,
//! otelcol's component-name aliases (and the `logging` deprecation), and `service.telemetry`
//! keys that are either honoured or refused, never silently ignored.

use inferwatch_core::Signal;
use inferwatch_core::component::{
    ComponentError, CreateContext, ExporterFactory, FieldError, NodeRef, ProcessorFactory, Receiver, ReceiverFactory,
    parse_config,
};
use inferwatch_core::config::{self, ConfigError, MetricsLevel, REDACTED, load_all, load_str};
use inferwatch_core::consumer::ConsumerRef;
use inferwatch_core::registry::Registry;
use std::path::PathBuf;
use std::sync::Arc;

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct Settings {
    endpoint: Option<String>,
    timeout: Option<String>,
    port: Option<u16>,
    headers: Option<std::collections::BTreeMap<String, String>>,
    tls: Option<Tls>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct Tls {
    insecure: Option<bool>,
    ca_file: Option<String>,
}

/// A component of any kind taking [`Settings`].
struct Fake(&'static str);

const ALL: &[Signal] = &[Signal::Traces, Signal::Metrics, Signal::Logs];

fn nope<T>() -> Result<T, ComponentError> {
    Err(ComponentError::Start("fake".into()))
}

impl ReceiverFactory for Fake {
    fn type_name(&self) -> &'static str {
        self.0
    }
    fn signals(&self) -> &'static [Signal] {
        ALL
    }
    fn validate(&self, cfg: &serde_json::Value) -> Result<(), FieldError> {
        parse_config::<Settings>(cfg).map(|_| ())
    }
    fn create(&self, _: CreateContext, _: &serde_json::Value) -> Result<Box<dyn Receiver>, ComponentError> {
        nope()
    }
}

impl ProcessorFactory for Fake {
    fn type_name(&self) -> &'static str {
        self.0
    }
    fn signals(&self) -> &'static [Signal] {
        ALL
    }
    fn validate(&self, cfg: &serde_json::Value) -> Result<(), FieldError> {
        parse_config::<Settings>(cfg).map(|_| ())
    }
    fn create(
        &self,
        _: CreateContext,
        _: &serde_json::Value,
        _: Signal,
        _: ConsumerRef,
    ) -> Result<NodeRef, ComponentError> {
        nope()
    }
}

impl ExporterFactory for Fake {
    fn type_name(&self) -> &'static str {
        self.0
    }
    fn signals(&self) -> &'static [Signal] {
        ALL
    }
    fn validate(&self, cfg: &serde_json::Value) -> Result<(), FieldError> {
        parse_config::<Settings>(cfg).map(|_| ())
    }
    fn create(&self, _: CreateContext, _: &serde_json::Value, _: Signal) -> Result<NodeRef, ComponentError> {
        nope()
    }
}

fn registry() -> Registry {
    let mut r = Registry::new();
    r.add_receiver(Arc::new(Fake("otlp")));
    r.add_processor(Arc::new(Fake("batch")));
    r.add_exporter(Arc::new(Fake("otlp")));
    r.add_exporter(Arc::new(Fake("otlphttp")));
    r.add_exporter(Arc::new(Fake("debug")));
    r
}

fn id(s: &str) -> inferwatch_core::component::ComponentId {
    inferwatch_core::component::ComponentId::parse(s).unwrap()
}

fn no_env(_: &str) -> Option<String> {
    None
}

/// Writes `files` into a fresh directory; returns their paths.
fn files(tag: &str, files: &[(&str, &str)]) -> Vec<PathBuf> {
    let dir = std::env::temp_dir().join(format!("inferwatch-otelcol-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    files
        .iter()
        .map(|(name, text)| {
            let p = dir.join(name);
            std::fs::write(&p, text).unwrap();
            p
        })
        .collect()
}

/// `(key, line, column, message)` of every error `check` reports for one file.
fn check_errors(text: &str) -> Vec<(String, usize, usize, String)> {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let paths = files(&format!("check{n}"), &[("c.yaml", text)]);
    let errors = config::check(&paths, &[], &no_env, &registry()).err().unwrap_or_default();
    errors.into_iter().map(|e| located(&e)).collect()
}

fn located(e: &ConfigError) -> (String, usize, usize, String) {
    let l = e.location.clone().expect("located");
    (e.key.clone(), l.line, l.column, e.message.clone())
}

#[test]
fn five_errors_of_five_kinds_are_all_reported_in_one_run() {
    // A top-level typo and a bad service setting (structural, found while loading) must not hide
    // the component and pipeline errors (found by validation).
    let text = "\
receivers:
  otlp: {endpont: 0.0.0.0:4317}
exporters:
  debug: {}
  otlphtp: {endpoint: x}
procesors: {}
service:
  shutdown_timeout: soon
  pipelines:
    traces: {receivers: [otlp, jaeger], exporters: [debug]}
";
    let got = check_errors(text);
    let want: [(&str, usize, usize, &str); 5] = [
        (
            "procesors",
            6,
            1,
            "unknown key \"procesors\" (expected receivers, processors, exporters, connectors, extensions or service); did you mean \"processors\"?",
        ),
        ("service.shutdown_timeout", 8, 21, "soon"),
        ("receivers.otlp.endpont", 2, 10, "unknown field `endpont`, expected one of"),
        ("exporters.otlphtp", 5, 3, "unknown exporter type \"otlphtp\"; did you mean \"otlphttp\"?"),
        ("service.pipelines.traces.receivers[1]", 10, 32, "references receiver \"jaeger\" which is not defined"),
    ];
    assert_eq!(got.len(), 5, "{got:#?}");
    for w in want {
        let hit = got.iter().find(|g| (g.0.as_str(), g.1, g.2) == (w.0, w.1, w.2));
        let hit = hit.unwrap_or_else(|| panic!("missing {w:?} in {got:#?}"));
        assert!(hit.3.contains(w.3), "{hit:?} should contain {:?}", w.3);
    }
    let endpont = got.iter().find(|g| g.0 == "receivers.otlp.endpont").unwrap();
    assert!(endpont.3.ends_with("did you mean \"endpoint\"?"), "{endpont:?}");
}

#[test]
fn every_unknown_key_of_a_component_is_reported_with_suggestions() {
    let text = "\
receivers: {otlp: }
exporters:
  otlp:
    endpiont: tempo:4317
    timout: 5s
    port: not-a-port
    tls: {insecur: true, ca_fil: /ca.pem}
    zzzzzz: 1
service:
  pipelines:
    traces: {receivers: [otlp], exporters: [otlp]}
";
    let got = check_errors(text);
    let keys: Vec<&str> = got.iter().map(|g| g.0.as_str()).collect();
    assert_eq!(
        keys,
        [
            "exporters.otlp.endpiont",
            "exporters.otlp.timout",
            "exporters.otlp.port",
            "exporters.otlp.tls.insecur",
            "exporters.otlp.tls.ca_fil",
            "exporters.otlp.zzzzzz",
        ],
        "{got:#?}"
    );
    let msg = |k: &str| got.iter().find(|g| g.0 == k).map(|g| g.3.clone()).unwrap();
    assert!(msg("exporters.otlp.endpiont").ends_with("did you mean \"endpoint\"?"));
    assert!(msg("exporters.otlp.timout").ends_with("did you mean \"timeout\"?"));
    assert!(msg("exporters.otlp.tls.insecur").ends_with("did you mean \"insecure\"?"));
    assert!(msg("exporters.otlp.tls.ca_fil").ends_with("did you mean \"ca_file\"?"));
    assert!(msg("exporters.otlp.port").contains("invalid type"), "{}", msg("exporters.otlp.port"));
    // Nothing is close to `zzzzzz`: no guess.
    assert!(!msg("exporters.otlp.zzzzzz").contains("did you mean"));
    // Each is located at its own key.
    let lines: Vec<usize> = got.iter().map(|g| g.1).collect();
    assert_eq!(lines, [4, 5, 6, 7, 7, 8]);
}

#[test]
fn set_overrides_files_in_order_with_yaml_values() {
    let base = "\
receivers: {otlp: }
processors: {batch: {timeout: 1s}}
exporters:
  otlp: {endpoint: from-file:4317, headers: {a: '1'}}
service:
  pipelines:
    traces: {receivers: [otlp], processors: [batch, batch/x], exporters: [otlp]}
";
    let over = "exporters:\n  otlp: {endpoint: second-file:4317}\n";
    let paths = files("set", &[("a.yaml", base), ("b.yaml", over)]);
    let sets: Vec<String> = [
        "exporters.otlp.endpoint=from-set:4317",
        "--ignored-looking=but=fine",
        "processors::batch::timeout=2s",
        "service.pipelines.traces.processors=[batch]",
        "exporters.otlp.headers.b=${env:B}",
        "service::telemetry::resource::k8s.pod.name=pod-1",
        "exporters.otlp.port=4317",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let env = |k: &str| (k == "B").then(|| "two".to_string());
    let l = load_all(&paths, &sets, &env);
    // `--ignored-looking` is an unknown top-level key, located in the --set it came from.
    assert_eq!(l.errors.len(), 1, "{:?}", l.errors);
    assert!(
        l.errors[0].to_string().starts_with("--set=--ignored-looking=but=fine:1:1: --ignored-looking: unknown key")
    );
    let c = l.config.unwrap();
    let otlp = &c.exporters[&id("otlp")].settings;
    assert_eq!(otlp["endpoint"], "from-set:4317", "--set wins over both files");
    assert_eq!(otlp["headers"], serde_json::json!({"a": "1", "b": "two"}), "maps merge");
    assert_eq!(otlp["port"], 4317, "a YAML number");
    assert_eq!(c.processors[&id("batch")].settings["timeout"], "2s");
    let procs: Vec<String> = c.service.pipelines[0].processors.iter().map(|(i, _)| i.to_string()).collect();
    assert_eq!(procs, ["batch"], "a list is replaced, not merged");
    assert_eq!(c.service.telemetry.resource, [("k8s.pod.name".to_string(), Some("pod-1".to_string()))]);
    // Without the overrides, the later file wins.
    let plain = load_all(&paths, &[], &env).config.unwrap();
    assert_eq!(plain.exporters[&id("otlp")].settings["endpoint"], "second-file:4317");
    // A malformed --set is an error, not ignored.
    for bad in ["exporters.otlp.endpoint", "exporters..otlp=1", "a=[unclosed"] {
        let l = load_all(&paths, &[bad.to_string()], &env);
        assert!(l.config.is_none() && !l.errors.is_empty(), "{bad}: {:?}", l.errors);
    }
}

#[test]
fn print_config_redacts_secrets_and_round_trips() {
    let text = r#"
extensions:
  basicauth/client: {client_auth: {username: bob, password: hunter2-pass}}
  basicauth/server: {htpasswd: {inline: "bob:$$apr1$$secret-hash"}}
  bearertokenauth: {token: tok-secret-1}
  headers_setter: {headers: [{key: X-Scope-OrgID, value: tenant-secret}]}
receivers:
  prometheus:
    config:
      scrape_configs:
        - job_name: vllm
          authorization: {type: Bearer, credentials: cred-secret}
          basic_auth: {username: u, password: scrape-pass}
exporters:
  otlp:
    endpoint: "${env:HOST}:4317"
    headers: {authorization: "Bearer hdr-secret", x-tenant: t1}
    quoted: "true"
    number: 0x10
    text: "a: b # not a comment"
    dollars: "$${literal}"
    empty: {}
    list: [1, "2", [x, {y: z}]]
    nothing:
service:
  pipelines:
    traces: {receivers: [prometheus], exporters: [otlp]}
"#;
    let env = |k: &str| (k == "HOST").then(|| "tempo".to_string());
    let paths = files("print", &[("p.yaml", text)]);
    let l = load_all(&paths, &[], &env);
    let tree = l.tree.unwrap();
    // Unredacted, the YAML written loads back to the same settings (with `$` kept literal).
    let again = config::to_yaml(&tree);
    let reloaded = load_str("again.yaml", &again, &no_env).unwrap_or_else(|e| panic!("{e:?}\n{again}"));
    let original = l.config.unwrap();
    for (id, c) in &original.exporters {
        assert_eq!(reloaded.exporters[id].settings, c.settings, "{again}");
    }
    assert_eq!(reloaded.extensions.len(), 4);
    let otlp = &reloaded.exporters[&id("otlp")].settings;
    assert_eq!(otlp["quoted"], "true");
    assert_eq!(otlp["dollars"], "${literal}");
    assert_eq!(otlp["endpoint"], "tempo:4317");
    // Redacted: no secret left, each replaced by the marker.
    let mut redacted = tree.clone();
    config::redact(&mut redacted);
    let out = config::to_yaml(&redacted);
    for secret in [
        "hunter2-pass",
        "secret-hash",
        "tok-secret-1",
        "tenant-secret",
        "cred-secret",
        "scrape-pass",
        "hdr-secret",
        "t1",
    ] {
        assert!(!out.contains(secret), "{secret} leaked:\n{out}");
    }
    assert_eq!(out.matches(REDACTED).count(), 8, "{out}");
    // What is not a secret is kept.
    for kept in ["username: bob", "key: X-Scope-OrgID", "type: Bearer", "job_name: vllm", "endpoint: \"tempo:4317\""] {
        assert!(out.contains(kept), "{kept} missing:\n{out}");
    }
}

#[test]
fn otelcol_names_and_the_logging_alias() {
    let mut r = registry();
    let text = "\
receivers: {otlp: }
processors: {resource_detection: {}, k8s_attributes: {}}
exporters: {otlp_grpc: {endpoint: a:4317}, otlp_http/x: {endpoint: http://b}, logging: {}}
service:
  pipelines:
    traces: {receivers: [otlp], exporters: [otlp_grpc, otlp_http/x, logging]}
";
    let c = load_str("a.yaml", text, &no_env).unwrap();
    let errors = config::validate(&c, &r);
    // Neither snake_case processor is registered here: both unknown, with the hint.
    let mut keys: Vec<&str> = errors.iter().map(|e| e.key.as_str()).collect();
    keys.sort();
    assert_eq!(keys, ["processors.k8s_attributes", "processors.resource_detection"], "{errors:?}");
    let k8s = errors.iter().find(|e| e.key == "processors.k8s_attributes").unwrap();
    assert!(k8s.message.starts_with("unknown processor type \"k8s_attributes\""), "{}", k8s.message);
    assert!(k8s.message.contains("\"k8sattributes\", is not built into inferwatch"), "{}", k8s.message);
    // Once `resourcedetection` is registered, its otelcol name works too.
    r.add_processor(Arc::new(Fake("resourcedetection")));
    let errors = config::validate(&c, &r);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0].key, "processors.k8s_attributes");
    assert!(r.exporter("otlp_grpc").is_some_and(|f| f.type_name() == "otlp"));
    assert!(r.exporter("otlp_http").is_some_and(|f| f.type_name() == "otlphttp"));
    // The removed `logging` exporter: accepted as `debug`, with a deprecation warning; the
    // current names warn of nothing.
    let warnings = config::warnings(&c, &r);
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    let w = &warnings[0];
    assert_eq!((w.key.as_str(), w.location.as_ref().map(|l| (l.line, l.column))), ("exporters.logging", Some((3, 79))));
    assert!(w.message.contains("\"logging\" is a deprecated alias of \"debug\""), "{}", w.message);
    // Settings of an alias are checked by the target's factory.
    let bad = text.replace("logging: {}", "logging: {verbosity: detailed}");
    let c = load_str("b.yaml", &bad, &no_env).unwrap();
    let e = config::validate(&c, &r);
    assert!(e.iter().any(|e| e.key == "exporters.logging.verbosity"), "{e:?}");
}

#[test]
fn service_telemetry_is_honoured_or_refused() {
    let base = "receivers: {otlp: }\nexporters: {debug: }\nservice:\n  pipelines: {traces: {receivers: [otlp], exporters: [debug]}}\n  telemetry:\n";
    let load = |t: &str| load_str("t.yaml", &format!("{base}{t}"), &no_env);
    let ok = load(
        "    resource: {service.name: agent, host.name: }\n    logs: {level: WARN, encoding: console, development: false, disable_caller: true, output_paths: [stderr], sampling: {enabled: false}}\n    metrics: {level: detailed, readers: [{pull: {exporter: {prometheus: {host: 0.0.0.0, port: 9999}}}}]}\n    traces: {level: none}\n",
    )
    .unwrap();
    let t = &ok.service.telemetry;
    assert_eq!(t.logs_level.as_deref(), Some("warn"));
    assert_eq!(t.metrics_level, MetricsLevel::Detailed);
    assert_eq!(t.metrics_address.as_deref(), Some("0.0.0.0:9999"));
    assert_eq!(t.resource, [("service.name".to_string(), Some("agent".to_string())), ("host.name".to_string(), None)]);
    let json = load(
        "    logs: {encoding: json}\n    metrics: {readers: [{periodic: {exporter: {otlp: {protocol: grpc}}}}]}\n",
    );
    let json = json.unwrap().service.telemetry;
    assert_eq!(json.logs_encoding, inferwatch_core::config::LogEncoding::Json);
    assert_eq!(json.periodic_readers[0].exporter.endpoint, "http://localhost:4317");
    let off = load("    metrics: {level: none, readers: [{pull: {exporter: {prometheus: {port: 9999}}}}]}\n").unwrap();
    assert_eq!(off.service.telemetry.metrics_address, None, "level none turns the endpoint off");
    // What the agent cannot do is refused, each located and saying why.
    let refused = [
        ("    logs: {encoding: xml}\n", "service.telemetry.logs.encoding", "invalid encoding \"xml\""),
        ("    logs: {output_paths: []}\n", "service.telemetry.logs.output_paths", "name at least one destination"),
        ("    logs: {output_paths: [\"s3://bucket/x\"]}\n", "service.telemetry.logs.output_paths[0]", "scheme s3://"),
        (
            "    logs: {error_output_paths: [/var/log/x]}\n",
            "service.telemetry.logs.error_output_paths",
            "error_output_paths other than [stderr]",
        ),
        ("    logs: {processors: [{batch: {}}]}\n", "service.telemetry.logs.processors", "own logs through OTLP"),
        ("    logs: {levle: info}\n", "service.telemetry.logs.levle", "did you mean \"level\"?"),
        ("    metrics: {views: []}\n", "service.telemetry.metrics.views", "not supported by inferwatch: metric views"),
        (
            "    metrics: {readers: [{periodic: {exporter: {console: {}}}}]}\n",
            "service.telemetry.metrics.readers[0].periodic.exporter.console",
            "not supported by inferwatch: the console metric exporter",
        ),
        (
            "    metrics: {readers: [{pull: {exporter: {prometheus: {prot: 1}}}}]}\n",
            "service.telemetry.metrics.readers[0].pull.exporter.prometheus.prot",
            "did you mean \"port\"?",
        ),
        ("    traces: {processors: [{batch: {}}]}\n", "service.telemetry.traces.processors", "does not trace itself"),
        ("    resource: {a: [1]}\n", "service.telemetry.resource.a", "expected a string value"),
    ];
    for (t, key, frag) in refused {
        let e = load(t).err().unwrap_or_else(|| panic!("accepted: {t}"));
        assert_eq!(e.len(), 1, "{t}: {e:?}");
        assert_eq!(e[0].key, key, "{t}");
        assert!(e[0].message.contains(frag), "{t}: {}", e[0].message);
    }
    // Accepted settings that do less than in otelcol come back as warnings.
    let c = load("    resource: {a: b}\n    logs: {disable_stacktrace: false}\n    metrics: {readers: [{pull: {exporter: {prometheus: {without_units: true}}}}]}\n").unwrap();
    let w: Vec<String> = config::warnings(&c, &registry()).into_iter().map(|w| w.key).collect();
    assert_eq!(
        w,
        [
            "service.telemetry.logs.disable_stacktrace",
            "service.telemetry.metrics.readers[0].pull.exporter.prometheus.without_units",
        ]
    );
}

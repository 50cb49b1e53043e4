//! Loading: read each file, substitute `${env:...}`, merge the files in order, then read the
//! merged tree into a [`Config`], collecting every structural error.

use super::envsubst::{Env, substitute};
use super::yaml::{self, Key, Node, NodeKind};
use super::{
    ComponentConfig, Config, ConfigError, Location, LogEncoding, LogOutput, MetricsLevel, OtlpProtocol, OtlpPushConfig,
    PeriodicReaderConfig, PipelineConfig, PipelineId, ServiceConfig, TelemetryConfig, Temporality,
};
use crate::pdata::Signal;
use crate::settings::parse_go_duration;
use crate::vocab::{ComponentId, PathSeg};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// Loads and merges `paths` in order, substituting from the process environment.
pub fn load(paths: &[PathBuf]) -> Result<Config, Vec<ConfigError>> {
    load_with_env(paths, &|k| std::env::var(k).ok())
}

/// Loads and merges `paths` in order (later files win), looking variables up with `env`.
pub fn load_with_env(paths: &[PathBuf], env: &dyn Fn(&str) -> Option<String>) -> Result<Config, Vec<ConfigError>> {
    let l = load_all(paths, &[], env);
    match l.config {
        Some(c) if l.errors.is_empty() => Ok(c),
        _ => Err(l.errors),
    }
}

/// What [`load_all`] found.
#[derive(Debug, Clone)]
pub struct Loaded {
    /// The configuration as far as it could be read (`None` when a file did not parse).
    pub config: Option<Config>,
    /// The merged, substituted tree (`None` when a file did not parse).
    pub tree: Option<Node>,
    /// Every problem found while reading.
    pub errors: Vec<ConfigError>,
}

/// Loads and merges `paths` in order (later files win), then applies the `--set key=value`
/// overrides `sets` in order over them, looking variables up with `env`. A structural error
/// does not stop the reading: what could be read is in `config`, for validation to check too.
pub fn load_all(paths: &[PathBuf], sets: &[String], env: &dyn Fn(&str) -> Option<String>) -> Loaded {
    let mut errors = Vec::new();
    if paths.is_empty() {
        errors.push(ConfigError { location: None, key: String::new(), message: "no configuration file given".into() });
        return Loaded { config: None, tree: None, errors };
    }
    let mut root: Option<Node> = None;
    let mut parsed = true;
    let layer = |root: &mut Option<Node>, node: Node| match root {
        // An empty file changes nothing.
        Some(_) if node.kind == NodeKind::Null => {}
        Some(base) => merge(base, node),
        None => *root = Some(node),
    };
    for path in paths {
        let name = path.display().to_string();
        match read_bounded(path) {
            Ok(text) => match read(&name, &text, env, &mut errors) {
                Some(node) => layer(&mut root, node),
                None => parsed = false,
            },
            Err(message) => {
                parsed = false;
                errors.push(ConfigError { location: None, key: String::new(), message })
            }
        }
    }
    for spec in sets {
        match parse_set(spec, env) {
            Ok(node) => layer(&mut root, node),
            Err(e) => {
                parsed = false;
                errors.extend(e)
            }
        }
    }
    match root {
        Some(root) if parsed => {
            let (config, found) = build(&root);
            errors.extend(found);
            Loaded { config: Some(config), tree: Some(root), errors }
        }
        _ => Loaded { config: None, tree: None, errors },
    }
}

/// Reads one `--set` override, as otelcol's: `key=value`, the key a path of map keys joined by
/// `::` (or by `.` when the key has no `::`), the value YAML (`[batch]` is a list, `2s` a
/// string, `8` a number), `${env:...}` substituted. Returns a tree holding just that value.
pub fn parse_set(spec: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<Node, Vec<ConfigError>> {
    let name = format!("--set={spec}");
    let fail = |message: String| vec![ConfigError { location: None, key: String::new(), message }];
    let Some((key, value)) = spec.split_once('=') else {
        return Err(fail(format!("{name}: expected key=value (e.g. --set=processors::batch::timeout=2s)")));
    };
    let parts: Vec<&str> = if key.contains("::") { key.split("::").collect() } else { key.split('.').collect() };
    if parts.iter().any(|p| p.trim().is_empty()) {
        return Err(fail(format!("{name}: empty key segment in {key:?}")));
    }
    let mut errors = Vec::new();
    let node = read(&name, value, env, &mut errors).filter(|_| errors.is_empty()).ok_or(errors)?;
    let at = node.location.clone();
    Ok(parts.iter().rev().fold(node, |inner, part| Node {
        kind: NodeKind::Map(vec![(Key { text: part.to_string(), location: at.clone() }, inner)]),
        location: at.clone(),
    }))
}

/// Largest configuration file read (16 MiB); a larger file (or an endless one such as
/// `/dev/zero`) is refused after reading this much.
pub const MAX_CONFIG_BYTES: u64 = 16 * 1024 * 1024;

/// Reads a configuration file, at most [`MAX_CONFIG_BYTES`], as UTF-8. Non-regular files
/// (pipes, devices) are read through the same cap.
fn read_bounded(path: &std::path::Path) -> Result<String, String> {
    use std::io::Read;
    let name = path.display();
    let file = std::fs::File::open(path).map_err(|e| format!("cannot read {name}: {e}"))?;
    let mut bytes = Vec::new();
    file.take(MAX_CONFIG_BYTES + 1).read_to_end(&mut bytes).map_err(|e| format!("cannot read {name}: {e}"))?;
    if bytes.len() as u64 > MAX_CONFIG_BYTES {
        return Err(format!(
            "cannot read {name}: larger than the {} MiB a configuration file may have",
            MAX_CONFIG_BYTES >> 20
        ));
    }
    String::from_utf8(bytes).map_err(|e| {
        format!("cannot read {name}: not UTF-8 text (invalid byte at offset {})", e.utf8_error().valid_up_to())
    })
}

/// Loads one configuration given as text; `name` stands for the file in locations.
pub fn load_str(name: &str, text: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<Config, Vec<ConfigError>> {
    let mut errors = Vec::new();
    match read(name, text, env, &mut errors) {
        Some(root) if errors.is_empty() => {
            let (c, errors) = build(&root);
            if errors.is_empty() { Ok(c) } else { Err(errors) }
        }
        _ => Err(errors),
    }
}

/// Parses and substitutes one file; `None` if it does not parse.
fn read(name: &str, text: &str, env: Env<'_>, errors: &mut Vec<ConfigError>) -> Option<Node> {
    match yaml::parse(name, text) {
        Ok(mut node) => {
            substitute(&mut node, "", env, errors);
            Some(node)
        }
        Err(e) => {
            errors.extend(e);
            None
        }
    }
}

/// Merges `over` into `base` as otelcol does: maps recursively, anything else replaced.
fn merge(base: &mut Node, over: Node) {
    match (&mut base.kind, over.kind) {
        (NodeKind::Map(entries), NodeKind::Map(over_entries)) => {
            for (k, v) in over_entries {
                match entries.iter_mut().find(|(bk, _)| bk.text == k.text) {
                    Some((_, bv)) if matches!((&bv.kind, &v.kind), (NodeKind::Map(_), NodeKind::Map(_))) => {
                        merge(bv, v)
                    }
                    Some(entry) => *entry = (k, v),
                    None => entries.push((k, v)),
                }
            }
        }
        (_, kind) => *base = Node { kind, location: over.location },
    }
}

/// Reads a merged tree into a [`Config`], as far as it can, with every problem found.
fn build(root: &Node) -> (Config, Vec<ConfigError>) {
    let mut b = Build { errors: Vec::new(), warnings: Vec::new(), metrics_tls: None };
    let mut cfg = Config {
        receivers: BTreeMap::new(),
        processors: BTreeMap::new(),
        exporters: BTreeMap::new(),
        connectors: BTreeMap::new(),
        extensions: BTreeMap::new(),
        service: ServiceConfig {
            extensions: Vec::new(),
            pipelines: Vec::new(),
            telemetry: TelemetryConfig::default(),
            shutdown_timeout: Duration::from_secs(10),
        },
        load_warnings: Vec::new(),
    };
    let mut service_at = &root.location;
    for (k, v) in b.entries(root, "") {
        match k.text.as_str() {
            "receivers" => cfg.receivers = b.components(v, "receivers"),
            "processors" => cfg.processors = b.components(v, "processors"),
            "exporters" => cfg.exporters = b.components(v, "exporters"),
            "connectors" => cfg.connectors = b.components(v, "connectors"),
            "extensions" => cfg.extensions = b.components(v, "extensions"),
            "service" => {
                service_at = &k.location;
                b.service(v, &mut cfg.service);
            }
            other => {
                b.unknown(k, other, &["receivers", "processors", "exporters", "connectors", "extensions", "service"])
            }
        }
    }
    if cfg.service.pipelines.is_empty() {
        let at =
            root.get(&[PathSeg::Key("service".into())]).and_then(|s| s.entry("pipelines")).map(|(k, _)| &k.location);
        b.err(at.unwrap_or(service_at), "service.pipelines", "at least one pipeline is required");
    }
    cfg.load_warnings = std::mem::take(&mut b.warnings);
    (cfg, b.errors)
}

/// Error collection while reading the tree.
struct Build {
    errors: Vec<ConfigError>,
    /// Accepted settings that do not do all they would in otelcol.
    warnings: Vec<ConfigError>,
    /// TLS of the self-metrics reader, while `service.telemetry` is read.
    metrics_tls: Option<crate::tls::server::TlsServerSettings>,
}

impl Build {
    fn err(&mut self, at: &Location, key: impl Into<String>, message: impl Into<String>) {
        self.errors.push(ConfigError { location: Some(at.clone()), key: key.into(), message: message.into() });
    }

    fn warn(&mut self, at: &Location, key: impl Into<String>, message: impl Into<String>) {
        self.warnings.push(ConfigError { location: Some(at.clone()), key: key.into(), message: message.into() });
    }

    /// Reports an unknown key, with the expected ones and the closest of them if it is close.
    fn unknown(&mut self, k: &Key, key: &str, expected: &[&str]) {
        let list = match expected.split_last() {
            Some((last, [])) => last.to_string(),
            Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
            None => String::new(),
        };
        let mut msg = format!("unknown key {:?} (expected {list})", k.text);
        if let Some(s) = super::validate::suggest(&k.text, expected.iter().copied()) {
            msg.push_str(&format!("; did you mean {s:?}?"));
        }
        self.err(&k.location, key, msg);
    }

    /// Refuses a key inferwatch does not support, saying so.
    fn unsupported(&mut self, at: &Location, key: &str, why: &str) {
        self.err(at, key, format!("not supported by inferwatch: {why}"));
    }

    /// The entries of a map (`Null` is an empty map).
    fn entries<'n>(&mut self, node: &'n Node, key: &str) -> &'n [(Key, Node)] {
        match &node.kind {
            NodeKind::Map(entries) => entries,
            NodeKind::Null => &[],
            _ => {
                self.err(&node.location, key, "expected a map");
                &[]
            }
        }
    }

    /// A scalar's text.
    fn scalar<'n>(&mut self, node: &'n Node, key: &str) -> Option<&'n str> {
        let text = node.as_str();
        if text.is_none() {
            self.err(&node.location, key, "expected a single value");
        }
        text
    }

    /// One component section.
    fn components(&mut self, node: &Node, section: &str) -> BTreeMap<ComponentId, ComponentConfig> {
        let mut out = BTreeMap::new();
        for (k, v) in self.entries(node, section) {
            match ComponentId::parse(&k.text) {
                Ok(id) => {
                    let c = ComponentConfig {
                        id: id.clone(),
                        settings: v.to_json(),
                        location: k.location.clone(),
                        node: v.clone(),
                        parsed: Default::default(),
                    };
                    out.insert(id, c);
                }
                Err(e) => self.err(&k.location, format!("{section}.{}", k.text), e.to_string()),
            }
        }
        out
    }

    /// A list of component ids.
    fn ids(&mut self, node: &Node, key: &str) -> Vec<(ComponentId, Location)> {
        let items = match &node.kind {
            NodeKind::Seq(items) => items.as_slice(),
            NodeKind::Null => &[],
            _ => {
                self.err(&node.location, key, "expected a list of component ids");
                &[]
            }
        };
        let mut out = Vec::new();
        for (i, item) in items.iter().enumerate() {
            let key = format!("{key}[{i}]");
            match item.as_str().map(ComponentId::parse) {
                Some(Ok(id)) => out.push((id, item.location.clone())),
                Some(Err(e)) => self.err(&item.location, key, e.to_string()),
                None => self.err(&item.location, key, "expected a component id"),
            }
        }
        out
    }

    fn service(&mut self, node: &Node, svc: &mut ServiceConfig) {
        for (k, v) in self.entries(node, "service") {
            let key = format!("service.{}", k.text);
            match k.text.as_str() {
                "extensions" => svc.extensions = self.ids(v, &key),
                "pipelines" => svc.pipelines = self.pipelines(v),
                "telemetry" => svc.telemetry = self.telemetry(v),
                "shutdown_timeout" => {
                    if let Some(s) = self.scalar(v, &key) {
                        match parse_go_duration(s) {
                            Ok(d) => svc.shutdown_timeout = d,
                            Err(e) => self.err(&v.location, key, e.to_string()),
                        }
                    }
                }
                _ => self.unknown(k, &key, &["extensions", "pipelines", "telemetry", "shutdown_timeout"]),
            }
        }
    }

    fn pipelines(&mut self, node: &Node) -> Vec<PipelineConfig> {
        let mut out = Vec::new();
        for (k, v) in self.entries(node, "service.pipelines") {
            let key = format!("service.pipelines.{}", k.text);
            let (sig, name) = match k.text.split_once('/') {
                Some((s, n)) => (s, Some(n)),
                None => (k.text.as_str(), None),
            };
            let Some(signal) = Signal::parse(sig) else {
                let hint = if sig == "profiles" {
                    " (otelcol's experimental profiles signal is not supported by inferwatch)".to_string()
                } else {
                    super::validate::suggest(sig, ["traces", "metrics", "logs"])
                        .map(|s| format!("; did you mean {s:?}?"))
                        .unwrap_or_default()
                };
                let msg = format!("unknown pipeline type {sig:?}{hint} (expected traces, metrics or logs)");
                self.err(&k.location, key, msg);
                continue;
            };
            if name.is_some_and(|n| n.is_empty() || n.contains(char::is_whitespace)) {
                self.err(&k.location, key, format!("invalid pipeline id {:?}: expected type[/name]", k.text));
                continue;
            }
            let id = PipelineId { signal, name: name.map(str::to_string) };
            let mut p = PipelineConfig {
                id,
                receivers: Vec::new(),
                processors: Vec::new(),
                exporters: Vec::new(),
                location: k.location.clone(),
            };
            for (pk, pv) in self.entries(v, &key) {
                let list_key = format!("{key}.{}", pk.text);
                match pk.text.as_str() {
                    "receivers" => p.receivers = self.ids(pv, &list_key),
                    "processors" => p.processors = self.ids(pv, &list_key),
                    "exporters" => p.exporters = self.ids(pv, &list_key),
                    _ => self.unknown(pk, &list_key, &["receivers", "processors", "exporters"]),
                }
            }
            out.push(p);
        }
        out
    }

    /// `service.telemetry`, as otelcol has it; what inferwatch cannot do is refused, saying so.
    fn telemetry(&mut self, node: &Node) -> TelemetryConfig {
        let mut t = TelemetryConfig::default();
        let (mut address, mut from_readers) = (None, None);
        for (k, v) in self.entries(node, "service.telemetry") {
            let key = format!("service.telemetry.{}", k.text);
            match k.text.as_str() {
                "metrics" => {
                    for (mk, mv) in self.entries(v, &key) {
                        let mkey = format!("{key}.{}", mk.text);
                        match mk.text.as_str() {
                            "level" => match self.scalar(mv, &mkey).map(str::to_ascii_lowercase).as_deref() {
                                Some("none") => t.metrics_level = MetricsLevel::None,
                                Some("basic") => t.metrics_level = MetricsLevel::Basic,
                                Some("normal") => t.metrics_level = MetricsLevel::Normal,
                                Some("detailed") => t.metrics_level = MetricsLevel::Detailed,
                                None => {}
                                Some(other) => self.err(
                                    &mv.location,
                                    mkey,
                                    format!("invalid level {other:?} (expected none, basic, normal or detailed)"),
                                ),
                            },
                            "address" => address = self.scalar(mv, &mkey).map(str::to_string),
                            "readers" => from_readers = self.readers(mv, &mkey, &mut t),
                            "views" => self.unsupported(
                                &mk.location,
                                &mkey,
                                "metric views (the agent's own metrics have fixed names and attributes)",
                            ),
                            _ => self.unknown(mk, &mkey, &["level", "address", "readers", "views"]),
                        }
                    }
                    if let (Some(_), Some((_, mk))) = (&from_readers, v.entry("address")) {
                        self.err(&mk.location, format!("{key}.address"), "give either address or readers, not both");
                    }
                }
                "logs" => self.logs(v, &key, &mut t),
                "resource" => {
                    for (rk, rv) in self.entries(v, &key) {
                        let rkey = format!("{key}.{}", rk.text);
                        match &rv.kind {
                            NodeKind::Null => t.resource.push((rk.text.clone(), None)),
                            NodeKind::Scalar { text, .. } => t.resource.push((rk.text.clone(), Some(text.clone()))),
                            _ => self.err(&rv.location, rkey, "expected a string value (or null to remove it)"),
                        }
                    }
                }
                "traces" => {
                    for (tk, tv) in self.entries(v, &key) {
                        let tkey = format!("{key}.{}", tk.text);
                        let off = tk.text == "level" && tv.as_str().is_some_and(|l| l.eq_ignore_ascii_case("none"));
                        let empty =
                            matches!(&tv.kind, NodeKind::Null) || matches!(&tv.kind, NodeKind::Seq(i) if i.is_empty());
                        if !off && !empty {
                            self.unsupported(
                                &tk.location,
                                &tkey,
                                "inferwatch does not trace itself (only `level: none` is accepted here)",
                            );
                        }
                    }
                }
                _ => self.unknown(k, &key, &["metrics", "logs", "resource", "traces"]),
            }
        }
        let default = t.metrics_address.take();
        t.metrics_address =
            if t.metrics_level == MetricsLevel::None { None } else { from_readers.or(address).or(default) };
        t.metrics_tls = self.metrics_tls.take();
        t
    }

    /// `service.telemetry.logs`: the agent logs console text or JSON lines to stderr through `tracing`.
    fn logs(&mut self, node: &Node, key: &str, t: &mut TelemetryConfig) {
        for (lk, lv) in self.entries(node, key) {
            let lkey = format!("{key}.{}", lk.text);
            match lk.text.as_str() {
                "level" => {
                    let level = self.scalar(lv, &lkey).map(str::to_ascii_lowercase);
                    match level.as_deref() {
                        Some("debug" | "info" | "warn" | "error") => t.logs_level = level,
                        // zap's levels above error: tracing has none; they log errors only.
                        Some("dpanic" | "panic" | "fatal") => t.logs_level = Some("error".into()),
                        Some(other) => self.err(
                            &lv.location,
                            lkey,
                            format!("invalid level {other:?} (expected debug, info, warn or error)"),
                        ),
                        None => {}
                    }
                }
                "encoding" => match self.scalar(lv, &lkey) {
                    Some("console") | None => t.logs_encoding = LogEncoding::Console,
                    Some("json") => t.logs_encoding = LogEncoding::Json,
                    Some(other) => {
                        self.err(&lv.location, lkey, format!("invalid encoding {other:?} (expected console or json)"))
                    }
                },
                "development" => match lv.to_json() {
                    serde_json::Value::Bool(false) | serde_json::Value::Null => {}
                    serde_json::Value::Bool(true) => {
                        self.unsupported(&lv.location, &lkey, "zap's development mode (set it to false or remove it)")
                    }
                    _ => self.err(&lv.location, lkey, "expected true or false"),
                },
                "disable_caller" | "disable_stacktrace" => match lv.to_json() {
                    serde_json::Value::Bool(true) | serde_json::Value::Null => {}
                    serde_json::Value::Bool(false) => self.warn(
                        &lv.location,
                        lkey,
                        "the agent's log lines carry no caller or stack trace; this setting has no effect",
                    ),
                    _ => self.err(&lv.location, lkey, "expected true or false"),
                },
                "sampling" => {
                    let enabled = lv.get(&[PathSeg::Key("enabled".into())]).map(Node::to_json);
                    if enabled != Some(serde_json::Value::Bool(false)) && lv.kind != NodeKind::Null {
                        self.warn(
                            &lk.location,
                            lkey,
                            "the agent does not sample its logs (every line is written); this setting has no effect",
                        );
                    }
                }
                "output_paths" => {
                    if let Some(outputs) = self.log_outputs(lv, &lkey) {
                        t.logs_outputs = outputs;
                    }
                }
                "error_output_paths" => {
                    let ok = match lv.to_json() {
                        serde_json::Value::Array(a) => a.iter().all(|p| p == "stderr"),
                        serde_json::Value::Null => true,
                        _ => false,
                    };
                    if !ok {
                        self.unsupported(
                            &lv.location,
                            &lkey,
                            "error_output_paths other than [stderr] (zap's own errors; the agent has none apart from its log lines)",
                        );
                    }
                }
                "initial_fields" => match &lv.kind {
                    NodeKind::Map(entries) => {
                        for (k, _) in entries {
                            if matches!(k.text.as_str(), "timestamp" | "level" | "message" | "target") {
                                self.err(
                                    &k.location,
                                    format!("{lkey}.{}", k.text),
                                    "a reserved log field (timestamp, level, message, target): choose another name",
                                );
                            }
                        }
                        t.logs_initial_fields = entries.iter().map(|(k, v)| (k.text.clone(), v.to_json())).collect()
                    }
                    NodeKind::Null => {}
                    _ => self.err(&lv.location, lkey, "expected a map of field names to values"),
                },
                "processors" => {
                    let empty =
                        matches!(&lv.kind, NodeKind::Null) || matches!(&lv.kind, NodeKind::Seq(i) if i.is_empty());
                    if !empty {
                        self.unsupported(
                            &lk.location,
                            &lkey,
                            "exporting the agent's own logs through OTLP (its logs go to stderr)",
                        );
                    }
                }
                _ => self.unknown(
                    lk,
                    &lkey,
                    &[
                        "level",
                        "encoding",
                        "development",
                        "disable_caller",
                        "disable_stacktrace",
                        "sampling",
                        "output_paths",
                        "error_output_paths",
                        "initial_fields",
                        "processors",
                    ],
                ),
            }
        }
    }

    /// `logs.output_paths`: `stderr`, `stdout` or file paths (`file://` URLs too), as zap reads
    /// them; at least one. Other URL schemes are refused by name.
    fn log_outputs(&mut self, node: &Node, key: &str) -> Option<Vec<LogOutput>> {
        let NodeKind::Seq(items) = &node.kind else {
            if node.kind != NodeKind::Null {
                self.err(&node.location, key, "expected a list of destinations (stderr, stdout or file paths)");
            }
            return None;
        };
        if items.is_empty() {
            self.err(&node.location, key, "name at least one destination (stderr, stdout or a file path)");
            return None;
        }
        let mut out = Vec::new();
        for (i, item) in items.iter().enumerate() {
            let ikey = format!("{key}[{i}]");
            let Some(path) = self.scalar(item, &ikey) else { continue };
            let dest = match path {
                "stderr" => LogOutput::Stderr,
                "stdout" => LogOutput::Stdout,
                "" => {
                    self.err(&item.location, ikey, "empty destination");
                    continue;
                }
                p => match p.split_once("://") {
                    Some(("file", rest)) if !rest.is_empty() => LogOutput::File(PathBuf::from(rest)),
                    Some((scheme, _)) => {
                        self.unsupported(
                            &item.location,
                            &ikey,
                            &format!("log destination {p:?} (scheme {scheme}://; use stderr, stdout or a file path)"),
                        );
                        continue;
                    }
                    None => LogOutput::File(PathBuf::from(p)),
                },
            };
            if !out.contains(&dest) {
                out.push(dest);
            }
        }
        (!out.is_empty()).then_some(out)
    }

    /// The address of the first `pull.exporter.prometheus` reader; `periodic` readers go to
    /// `t.periodic_readers`.
    fn readers(&mut self, node: &Node, key: &str, t: &mut TelemetryConfig) -> Option<String> {
        let items = match &node.kind {
            NodeKind::Seq(items) => items.as_slice(),
            _ => {
                self.err(&node.location, key, "expected a list of readers");
                &[]
            }
        };
        let mut found = None;
        for (i, r) in items.iter().enumerate() {
            let rkey = format!("{key}[{i}]");
            let entries = self.entries(r, &rkey);
            if entries.len() != 1 {
                self.err(&r.location, &rkey, "a reader is exactly one of pull or periodic");
            }
            let mut prom = None;
            for (k, v) in entries {
                let kkey = format!("{rkey}.{}", k.text);
                match k.text.as_str() {
                    "periodic" => {
                        if let Some(p) = self.periodic(v, &kkey) {
                            t.periodic_readers.push(p);
                        }
                    }
                    "pull" => match v.get(&["exporter", "prometheus"].map(|s| PathSeg::Key(s.into()))) {
                        Some(p) => prom = Some(p),
                        None => self.err(
                            &v.location,
                            kkey,
                            "unsupported pull reader (only pull.exporter.prometheus is supported)",
                        ),
                    },
                    _ => self.unknown(k, &kkey, &["pull", "periodic"]),
                }
            }
            let Some(prom) = prom else { continue };
            if found.is_some() {
                self.err(&r.location, rkey, "only one prometheus reader is supported");
                continue;
            }
            let pkey = format!("{rkey}.pull.exporter.prometheus");
            let mut host = "127.0.0.1".to_string();
            let mut port = "8888".to_string();
            for (k, v) in self.entries(prom, &pkey) {
                let fkey = format!("{pkey}.{}", k.text);
                match k.text.as_str() {
                    "host" => host = self.scalar(v, &fkey).map_or(host, str::to_string),
                    "port" => match self.scalar(v, &fkey) {
                        Some(p) if p.parse::<u16>().is_ok() => port = p.to_string(),
                        Some(p) => self.err(&v.location, fkey, format!("invalid port {p:?}")),
                        None => {}
                    },
                    "tls" => match serde_json::from_value::<crate::tls::server::TlsServerSettings>(v.to_json()) {
                        Ok(tls) => self.metrics_tls = Some(tls),
                        Err(e) => self.err(&v.location, fkey, e.to_string()),
                    },
                    "without_units" | "without_type_suffix" | "without_scope_info" | "with_resource_constant_labels" => {
                        self.warn(
                            &k.location,
                            fkey,
                            "has no effect: the agent's own metrics have fixed otelcol names (units and type suffixes kept, no scope info)",
                        )
                    }
                    _ => self.unknown(
                        k,
                        &fkey,
                        &[
                            "host",
                            "port",
                            "tls",
                            "without_units",
                            "without_type_suffix",
                            "without_scope_info",
                            "with_resource_constant_labels",
                        ],
                    ),
                }
            }
            found = Some(if host.contains(':') && !host.starts_with('[') {
                format!("[{host}]:{port}")
            } else {
                format!("{host}:{port}")
            });
        }
        found
    }

    /// A duration given as otelcol's schema has it (an integer of milliseconds), or as a Go
    /// duration string (`10s`); it must be positive.
    fn millis(&mut self, node: &Node, key: &str) -> Option<Duration> {
        let text = self.scalar(node, key)?;
        let d = match text.parse::<u64>() {
            Ok(ms) => Ok(Duration::from_millis(ms)),
            Err(_) => parse_go_duration(text).map_err(|e| format!("{e} (expected milliseconds, e.g. 60000, or 60s)")),
        };
        match d {
            Ok(d) if !d.is_zero() => Some(d),
            Ok(_) => {
                self.err(&node.location, key, "must be greater than 0");
                None
            }
            Err(e) => {
                self.err(&node.location, key, e);
                None
            }
        }
    }

    /// `readers[].periodic`: `interval`, `timeout` and one push `exporter`.
    fn periodic(&mut self, node: &Node, key: &str) -> Option<PeriodicReaderConfig> {
        let (mut interval, mut timeout) = (Duration::from_secs(60), Duration::from_secs(30));
        let mut exporter = None;
        for (k, v) in self.entries(node, key) {
            let kkey = format!("{key}.{}", k.text);
            match k.text.as_str() {
                "interval" => interval = self.millis(v, &kkey).unwrap_or(interval),
                "timeout" => timeout = self.millis(v, &kkey).unwrap_or(timeout),
                "exporter" => {
                    let entries = self.entries(v, &kkey);
                    if entries.len() != 1 {
                        self.err(&v.location, &kkey, "expected exactly one exporter (otlp, otlp_http or otlp_grpc)");
                    }
                    for (ek, ev) in entries {
                        let ekey = format!("{kkey}.{}", ek.text);
                        match ek.text.as_str() {
                            "otlp" | "otlp_http" | "otlp_grpc" => exporter = self.otlp_push(ev, &ekey, &ek.text),
                            "console" => self.unsupported(
                                &ek.location,
                                &ekey,
                                "the console metric exporter (push with otlp, or scrape the pull reader)",
                            ),
                            "otlp_file/development" | "otlp_file" => {
                                self.unsupported(&ek.location, &ekey, "the otlp_file metric exporter (push with otlp)")
                            }
                            _ => self.unknown(ek, &ekey, &["otlp", "otlp_http", "otlp_grpc", "console"]),
                        }
                    }
                }
                "producers" => self.unsupported(
                    &k.location,
                    &kkey,
                    "metric producers (the reader pushes the agent's own metrics, nothing else)",
                ),
                "cardinality_limits" => self.unsupported(
                    &k.location,
                    &kkey,
                    "cardinality_limits (the SDK's default of 2000 series per metric applies)",
                ),
                _ => self.unknown(k, &kkey, &["interval", "timeout", "exporter", "producers", "cardinality_limits"]),
            }
        }
        if exporter.is_none() && node.entry("exporter").is_none() {
            self.err(&node.location, format!("{key}.exporter"), "a periodic reader needs an exporter (otlp)");
        }
        Some(PeriodicReaderConfig { interval, timeout, exporter: exporter? })
    }

    /// `exporter.otlp` (configuration schema 0.3: `protocol`, `certificate`, `insecure`, ...) or
    /// `exporter.otlp_http` / `exporter.otlp_grpc` (later schemas: `tls`, `encoding`).
    fn otlp_push(&mut self, node: &Node, key: &str, flavor: &str) -> Option<OtlpPushConfig> {
        let mut c = OtlpPushConfig {
            protocol: if flavor == "otlp_grpc" { OtlpProtocol::Grpc } else { OtlpProtocol::HttpProtobuf },
            endpoint: String::new(),
            headers: Vec::new(),
            gzip: false,
            timeout: Duration::from_secs(10),
            insecure: false,
            certificate: None,
            client_certificate: None,
            client_key: None,
            temporality: Temporality::Cumulative,
        };
        let errors = self.errors.len();
        let mut expected =
            vec!["endpoint", "headers", "headers_list", "compression", "timeout", "temporality_preference"];
        expected.push("default_histogram_aggregation");
        match flavor {
            "otlp" => expected.extend(["protocol", "insecure", "certificate", "client_certificate", "client_key"]),
            "otlp_http" => expected.extend(["encoding", "tls"]),
            _ => expected.push("tls"),
        }
        for (k, v) in self.entries(node, key) {
            let kkey = format!("{key}.{}", k.text);
            if !expected.contains(&k.text.as_str()) {
                self.unknown(k, &kkey, &expected);
                continue;
            }
            match k.text.as_str() {
                "protocol" => match self.scalar(v, &kkey) {
                    Some("grpc") => c.protocol = OtlpProtocol::Grpc,
                    Some("http/protobuf") => c.protocol = OtlpProtocol::HttpProtobuf,
                    Some("http/json") => c.protocol = OtlpProtocol::HttpJson,
                    Some(p) => self.err(
                        &v.location,
                        kkey,
                        format!("invalid protocol {p:?} (expected grpc, http/protobuf or http/json)"),
                    ),
                    None => {}
                },
                "encoding" => match self.scalar(v, &kkey) {
                    Some("protobuf") => c.protocol = OtlpProtocol::HttpProtobuf,
                    Some("json") => c.protocol = OtlpProtocol::HttpJson,
                    Some(e) => self.err(&v.location, kkey, format!("invalid encoding {e:?} (expected protobuf or json)")),
                    None => {}
                },
                "endpoint" => c.endpoint = self.scalar(v, &kkey).unwrap_or_default().to_string(),
                "headers" => self.push_headers(v, &kkey, &mut c.headers),
                "headers_list" => {
                    for pair in self.scalar(v, &kkey).unwrap_or_default().split(',').filter(|p| !p.trim().is_empty()) {
                        match pair.split_once('=') {
                            Some((n, val)) if !n.trim().is_empty() => {
                                c.headers.push((n.trim().to_string(), val.trim().to_string()))
                            }
                            _ => self.err(&v.location, &kkey, format!("expected name=value pairs, got {pair:?}")),
                        }
                    }
                }
                "compression" => match self.scalar(v, &kkey) {
                    Some("gzip") => c.gzip = true,
                    Some("none" | "") | None => c.gzip = false,
                    Some(o) => self.err(&v.location, kkey, format!("invalid compression {o:?} (expected gzip or none)")),
                },
                "timeout" => c.timeout = self.millis(v, &kkey).unwrap_or(c.timeout),
                "insecure" => c.insecure = self.boolean(v, &kkey),
                "certificate" => c.certificate = self.scalar(v, &kkey).map(str::to_string),
                "client_certificate" => c.client_certificate = self.scalar(v, &kkey).map(str::to_string),
                "client_key" => c.client_key = self.scalar(v, &kkey).map(str::to_string),
                "tls" => {
                    let mut known = vec!["ca_file", "cert_file", "key_file"];
                    if flavor == "otlp_grpc" {
                        known.push("insecure");
                    }
                    for (tk, tv) in self.entries(v, &kkey) {
                        let tkey = format!("{kkey}.{}", tk.text);
                        match tk.text.as_str() {
                            "ca_file" => c.certificate = self.scalar(tv, &tkey).map(str::to_string),
                            "cert_file" => c.client_certificate = self.scalar(tv, &tkey).map(str::to_string),
                            "key_file" => c.client_key = self.scalar(tv, &tkey).map(str::to_string),
                            "insecure" if flavor == "otlp_grpc" => c.insecure = self.boolean(tv, &tkey),
                            _ => self.unknown(tk, &tkey, &known),
                        }
                    }
                }
                "temporality_preference" => match self.scalar(v, &kkey) {
                    Some("cumulative") => c.temporality = Temporality::Cumulative,
                    Some("delta") => c.temporality = Temporality::Delta,
                    Some("low_memory" | "lowmemory") => c.temporality = Temporality::LowMemory,
                    Some(o) => self.err(
                        &v.location,
                        kkey,
                        format!("invalid temporality_preference {o:?} (expected cumulative, delta or low_memory)"),
                    ),
                    None => {}
                },
                // The only key left: default_histogram_aggregation.
                _ => match self.scalar(v, &kkey) {
                    Some("explicit_bucket_histogram" | "base2_exponential_bucket_histogram") => self.warn(
                        &k.location,
                        kkey,
                        "has no effect: the agent's own metrics are counters and gauges (no histograms)",
                    ),
                    Some(o) => self.err(
                        &v.location,
                        kkey,
                        format!(
                            "invalid default_histogram_aggregation {o:?} (expected explicit_bucket_histogram or base2_exponential_bucket_histogram)"
                        ),
                    ),
                    None => {}
                },
            }
        }
        let grpc = c.protocol == OtlpProtocol::Grpc;
        if c.endpoint.is_empty() {
            c.endpoint = if grpc { "http://localhost:4317" } else { "http://localhost:4318" }.into();
        }
        let at = node.entry("endpoint").map_or(&node.location, |(_, v)| &v.location);
        let scheme = c.endpoint.split_once("://").map(|(s, _)| s);
        match scheme {
            Some("http" | "https") => {}
            None if grpc => {}
            Some(s) => {
                self.err(at, format!("{key}.endpoint"), format!("unsupported scheme {s:?} (expected http or https)"))
            }
            None => self.err(
                at,
                format!("{key}.endpoint"),
                format!("an HTTP endpoint is a URL (http://host:port[/path]), got {:?}", c.endpoint),
            ),
        }
        if c.client_certificate.is_some() != c.client_key.is_some() {
            self.err(&node.location, key, "client_certificate and client_key (cert_file and key_file) go together");
        }
        if !c.use_tls() && (c.certificate.is_some() || c.client_certificate.is_some()) {
            self.err(
                &node.location,
                key,
                "TLS files are set but the connection is plain text (http:// endpoint or insecure: true)",
            );
        }
        (self.errors.len() == errors).then_some(c)
    }

    /// `headers`: otelcol's list of `{name, value}`, or a map of name to value.
    fn push_headers(&mut self, node: &Node, key: &str, out: &mut Vec<(String, String)>) {
        match &node.kind {
            NodeKind::Null => {}
            NodeKind::Map(entries) => {
                for (k, v) in entries {
                    let hkey = format!("{key}.{}", k.text);
                    if let Some(val) = self.scalar(v, &hkey) {
                        out.push((k.text.clone(), val.to_string()));
                    }
                }
            }
            NodeKind::Seq(items) => {
                for (i, item) in items.iter().enumerate() {
                    let ikey = format!("{key}[{i}]");
                    let name = item.get(&[PathSeg::Key("name".into())]).and_then(Node::as_str);
                    let value = item.get(&[PathSeg::Key("value".into())]).and_then(Node::as_str);
                    match (name, value) {
                        (Some(n), Some(v)) if !n.is_empty() => out.push((n.to_string(), v.to_string())),
                        _ => self.err(&item.location, ikey, "expected {name: ..., value: ...}"),
                    }
                }
            }
            _ => self.err(&node.location, key, "expected a list of {name, value} or a map"),
        }
    }

    /// A boolean scalar (`true` / `false`); anything else is an error and reads as false.
    fn boolean(&mut self, node: &Node, key: &str) -> bool {
        match node.to_json() {
            serde_json::Value::Bool(b) => b,
            serde_json::Value::Null => false,
            _ => {
                self.err(&node.location, key, "expected true or false");
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    /// `(key, line, column)` of each error, in order.
    fn errs(text: &str) -> Vec<(String, usize, usize, String)> {
        let e = load_str("c.yaml", text, &no_env).unwrap_err();
        e.into_iter()
            .map(|e| {
                let l = e.location.unwrap();
                (e.key, l.line, l.column, e.message)
            })
            .collect()
    }

    fn id(s: &str) -> ComponentId {
        ComponentId::parse(s).unwrap()
    }

    const PIPE: &str = "service:\n  pipelines:\n    traces: { receivers: [otlp], exporters: [debug] }\n";

    #[test]
    fn plain_otelcol_config_loads() {
        let text = r#"
receivers:  { otlp: { protocols: { grpc: { endpoint: 127.0.0.1:4317 }, http: {} } } }
processors: { batch: {}, memory_limiter: { limit_mib: 512 } }
exporters:  { otlp/tempo: { endpoint: tempo:4317, tls: { insecure: true } }, debug: {} }
service:
  pipelines:
    traces: { receivers: [otlp], processors: [memory_limiter, batch], exporters: [otlp/tempo] }
"#;
        let c = load_str("otelcol.yaml", text, &no_env).unwrap();
        assert_eq!(c.receivers[&id("otlp")].settings["protocols"]["grpc"]["endpoint"], "127.0.0.1:4317");
        assert_eq!(c.processors[&id("memory_limiter")].settings["limit_mib"], 512);
        let tempo = &c.exporters[&id("otlp/tempo")];
        assert_eq!(tempo.settings, serde_json::json!({"endpoint": "tempo:4317", "tls": {"insecure": true}}));
        assert_eq!((tempo.location.line, tempo.location.column), (4, 15));
        let tls = tempo.locate(&[PathSeg::Key("tls".into()), PathSeg::Key("insecure".into())]);
        assert_eq!((tls.line, tls.column), (4, 58));
        let p = &c.service.pipelines[0];
        assert_eq!(p.id.to_string(), "traces");
        let procs: Vec<String> = p.processors.iter().map(|(i, _)| i.to_string()).collect();
        assert_eq!(procs, ["memory_limiter", "batch"]);
        assert_eq!((p.exporters[0].1.line, p.exporters[0].1.column), (7, 83));
        assert_eq!(c.service.telemetry, TelemetryConfig::default());
        assert_eq!(c.service.shutdown_timeout, Duration::from_secs(10));
    }

    #[test]
    fn service_settings() {
        let env = |k: &str| (k == "PORT").then(|| "9999".to_string());
        let base = "receivers: {otlp: }\nexporters: {debug: }\n";
        let svc = "  pipelines: {traces: {receivers: [otlp], exporters: [debug]}, metrics/fast: {receivers: [otlp], exporters: [debug]}}\n";
        let load = |tail: &str| load_str("s.yaml", &format!("{base}service:\n{svc}{tail}"), &env).unwrap().service;
        let s = load(
            "  shutdown_timeout: 1m30s\n  extensions: [health_check]\n  telemetry:\n    metrics: {address: 0.0.0.0:9000}\n    logs: {level: DEBUG, encoding: console}\n    resource: {a: b, c: }\n",
        );
        assert_eq!(s.shutdown_timeout, Duration::from_secs(90));
        assert_eq!(s.extensions[0].0, id("health_check"));
        assert_eq!(s.pipelines[1].id.to_string(), "metrics/fast");
        assert_eq!(s.telemetry.metrics_address.as_deref(), Some("0.0.0.0:9000"));
        assert_eq!(s.telemetry.logs_level.as_deref(), Some("debug"));
        assert_eq!(s.telemetry.resource, [("a".to_string(), Some("b".to_string())), ("c".to_string(), None)]);
        assert_eq!(s.telemetry.metrics_level, MetricsLevel::Normal);
        let readers = "  telemetry:\n    metrics:\n      level: detailed\n      readers:\n        - pull:\n            exporter:\n              prometheus: {host: '::1', port: '${env:PORT}'}\n";
        assert_eq!(load(readers).telemetry.metrics_address.as_deref(), Some("[::1]:9999"));
        let none = "  telemetry: {metrics: {level: none, address: 1.2.3.4:5}}\n";
        let none = load(none).telemetry;
        assert_eq!((none.metrics_address, none.metrics_level), (None, MetricsLevel::None));
    }

    #[test]
    fn periodic_readers_and_json_logs() {
        let base = "receivers: {otlp: }\nexporters: {debug: }\nservice:\n  pipelines: {traces: {receivers: [otlp], exporters: [debug]}}\n  telemetry:\n";
        let text = format!(
            "{base}    logs: {{encoding: json, level: warn}}\n    resource: {{service.name: agent-7, service.version: }}\n    metrics:\n      readers:\n        - pull: {{exporter: {{prometheus: {{host: 0.0.0.0, port: 9464}}}}}}\n        - periodic:\n            interval: 1500\n            timeout: 5s\n            exporter:\n              otlp:\n                protocol: grpc\n                endpoint: 127.0.0.1:4317\n                insecure: true\n                headers: [{{name: x-tenant, value: a}}]\n                headers_list: 'k=v, k2=v2'\n                compression: gzip\n                timeout: 2000\n                temporality_preference: delta\n        - periodic:\n            exporter:\n              otlp_http: {{endpoint: 'https://otel.example:4318/custom', encoding: json, tls: {{ca_file: /ca.pem}}}}\n"
        );
        let c = load_str("t.yaml", &text, &no_env).unwrap();
        let t = &c.service.telemetry;
        assert_eq!(t.logs_encoding, LogEncoding::Json);
        assert_eq!(t.logs_level.as_deref(), Some("warn"));
        assert_eq!(t.metrics_address.as_deref(), Some("0.0.0.0:9464"));
        assert_eq!(t.resource, [("service.name".into(), Some("agent-7".into())), ("service.version".into(), None)]);
        assert!(c.load_warnings.is_empty(), "{:?}", c.load_warnings);
        let [g, h] = t.periodic_readers.as_slice() else { panic!("{:?}", t.periodic_readers) };
        assert_eq!((g.interval, g.timeout), (Duration::from_millis(1500), Duration::from_secs(5)));
        let e = &g.exporter;
        assert_eq!(
            (e.protocol, e.endpoint.as_str(), e.insecure, e.gzip),
            (OtlpProtocol::Grpc, "127.0.0.1:4317", true, true)
        );
        let headers: Vec<(&str, &str)> = e.headers.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(headers, [("x-tenant", "a"), ("k", "v"), ("k2", "v2")]);
        assert_eq!((e.timeout, e.temporality), (Duration::from_secs(2), Temporality::Delta));
        assert!(!e.use_tls());
        assert_eq!((h.interval, h.timeout), (Duration::from_secs(60), Duration::from_secs(30)));
        let e = &h.exporter;
        assert_eq!((e.protocol, e.certificate.as_deref()), (OtlpProtocol::HttpJson, Some("/ca.pem")));
        assert!(e.use_tls());
        // The default endpoint of an HTTP exporter is otelcol's.
        let dflt = format!(
            "{base}    metrics: {{readers: [{{periodic: {{exporter: {{otlp: {{protocol: http/protobuf}}}}}}}}]}}\n"
        );
        let d = load_str("t.yaml", &dflt, &no_env).unwrap();
        assert_eq!(d.service.telemetry.periodic_readers[0].exporter.endpoint, "http://localhost:4318");
        // The pull default stays when only periodic readers are given.
        assert_eq!(d.service.telemetry.metrics_address.as_deref(), Some("127.0.0.1:8888"));
    }

    #[test]
    fn log_outputs_and_initial_fields() {
        let base = "receivers: {otlp: }\nexporters: {debug: }\nservice:\n  pipelines: {traces: {receivers: [otlp], exporters: [debug]}}\n  telemetry:\n    logs:\n";
        let load = |logs: &str| load_str("t.yaml", &format!("{base}{logs}"), &no_env);
        let c = load(
            "      output_paths: [stdout, /var/log/iw.log, 'file:///tmp/a.log', stderr, stdout]\n      initial_fields: {service: edge, shard: 3, canary: true}\n",
        )
        .unwrap();
        let t = &c.service.telemetry;
        assert_eq!(
            t.logs_outputs,
            [
                LogOutput::Stdout,
                LogOutput::File("/var/log/iw.log".into()),
                LogOutput::File("/tmp/a.log".into()),
                LogOutput::Stderr,
            ]
        );
        let fields: Vec<(&str, serde_json::Value)> =
            t.logs_initial_fields.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
        assert_eq!(
            fields,
            [
                ("service", serde_json::json!("edge")),
                ("shard", serde_json::json!(3)),
                ("canary", serde_json::json!(true))
            ]
        );
        assert_eq!(TelemetryConfig::default().logs_outputs, [LogOutput::Stderr]);
        let errors = |logs: &str| {
            load(logs).unwrap_err().into_iter().map(|e| format!("{}: {}", e.key, e.message)).collect::<Vec<_>>()
        };
        let k = "service.telemetry.logs";
        for (logs, want) in [
            ("      output_paths: []\n", format!("{k}.output_paths: name at least one destination")),
            ("      output_paths: stderr\n", format!("{k}.output_paths: expected a list of destinations")),
            (
                "      output_paths: ['http://x/y']\n",
                format!("{k}.output_paths[0]: not supported by inferwatch: log destination \"http://x/y\""),
            ),
            ("      initial_fields: [a]\n", format!("{k}.initial_fields: expected a map")),
            ("      initial_fields: {level: x}\n", format!("{k}.initial_fields.level: a reserved log field")),
            (
                "      error_output_paths: [/tmp/e.log]\n",
                format!("{k}.error_output_paths: not supported by inferwatch"),
            ),
        ] {
            let got = errors(logs);
            assert!(got.len() == 1 && got[0].starts_with(&want), "{logs}: {got:?}");
        }
    }

    #[test]
    fn periodic_reader_errors_name_the_key() {
        let base = "receivers: {otlp: }\nexporters: {debug: }\nservice:\n  pipelines: {traces: {receivers: [otlp], exporters: [debug]}}\n  telemetry:\n    metrics:\n      readers:\n";
        let bad = |reader: &str| {
            let e = load_str("t.yaml", &format!("{base}        - {reader}\n"), &no_env).unwrap_err();
            e.into_iter().map(|e| format!("{}: {}", e.key, e.message)).collect::<Vec<_>>()
        };
        let k = "service.telemetry.metrics.readers[0]";
        let cases = [
            (
                "{periodic: {interval: 0, exporter: {otlp: {}}}}",
                format!("{k}.periodic.interval: must be greater than 0"),
            ),
            (
                "{periodic: {exporter: {console: {}}}}",
                format!("{k}.periodic.exporter.console: not supported by inferwatch"),
            ),
            (
                "{periodic: {producers: [], exporter: {otlp: {}}}}",
                format!("{k}.periodic.producers: not supported by inferwatch"),
            ),
            (
                "{periodic: {exporter: {otlp: {protocol: thrift}}}}",
                format!("{k}.periodic.exporter.otlp.protocol: invalid protocol"),
            ),
            (
                "{periodic: {exporter: {otlp: {endpointt: x}}}}",
                format!("{k}.periodic.exporter.otlp.endpointt: unknown key \"endpointt\""),
            ),
            (
                "{periodic: {exporter: {otlp_http: {insecure: true}}}}",
                format!("{k}.periodic.exporter.otlp_http.insecure: unknown key"),
            ),
            (
                "{periodic: {exporter: {otlp: {endpoint: 'http://h:1', certificate: /ca.pem}}}}",
                format!("{k}.periodic.exporter.otlp: TLS files are set but"),
            ),
            (
                "{periodic: {exporter: {otlp: {client_key: /k.pem}}}}",
                format!("{k}.periodic.exporter.otlp: client_certificate and client_key"),
            ),
            (
                "{periodic: {exporter: {otlp: {endpoint: 'h:4318'}}}}",
                format!("{k}.periodic.exporter.otlp.endpoint: an HTTP endpoint is a URL"),
            ),
            (
                "{periodic: {exporter: {otlp: {}}}, pull: {}}",
                format!("{k}: a reader is exactly one of pull or periodic"),
            ),
            ("{push: {}}", format!("{k}.push: unknown key \"push\" (expected pull or periodic)")),
        ];
        for (reader, want) in cases {
            let got = bad(reader);
            assert!(got.iter().any(|g| g.starts_with(&want)), "{reader}: {want:?} not in {got:#?}");
        }
        // A histogram setting is accepted with a warning (the agent has no histograms).
        let ok = format!(
            "{base}        - {{periodic: {{exporter: {{otlp: {{default_histogram_aggregation: explicit_bucket_histogram}}}}}}}}\n"
        );
        let c = load_str("t.yaml", &ok, &no_env).unwrap();
        assert!(c.load_warnings[0].message.contains("no histograms"), "{:?}", c.load_warnings);
    }

    #[test]
    fn env_substitution_types_values() {
        let env = |k: &str| match k {
            "PORT" => Some("4317".to_string()),
            "HOST" => Some("tempo".to_string()),
            _ => None,
        };
        let text = format!(
            "receivers:\n  otlp:\n    port: ${{env:PORT}}\n    endpoint: ${{HOST}}:${{env:PORT}}\n    t: ${{env:T:-1s}}\n    lit: $${{HOST}}\nexporters: {{debug: }}\n{PIPE}"
        );
        let c = load_str("e.yaml", &text, &env).unwrap();
        let s = &c.receivers[&id("otlp")].settings;
        assert_eq!(s, &serde_json::json!({"port": 4317, "endpoint": "tempo:4317", "t": "1s", "lit": "${HOST}"}));
        let e = load_str("e.yaml", "receivers:\n  otlp:\n    port: ${env:NOPE}\n", &env).unwrap_err();
        assert_eq!(e.len(), 1);
        assert_eq!(
            e[0].to_string(),
            "e.yaml:3:11: receivers.otlp.port: environment variable NOPE is not set (referenced as \"${env:NOPE}\"; give a default with ${env:NOPE:-value})"
        );
    }

    #[test]
    fn structural_errors_are_all_collected() {
        let text = "\
receivers:
  otlp: {}
  bad id: {}
exporters: [debug]
procesors: {}
service:
  extensions: health_check
  shutdown_timeout: 10 seconds
  pipelines:
    traces:
      receivers: [otlp, 'otlp/', {a: b}]
      exporter: [debug]
    spans: {}
    traces/: {}
  telemetry:
    metrics: {level: loud, readers: [{periodic: {}}]}
    logs: {level: trace, encoding: xml, development: true}
    tracez: {}
  extra: 1
";
        let got = errs(text);
        let want: Vec<(&str, usize, usize, &str)> = vec![
            ("receivers.bad id", 3, 3, "invalid component id"),
            ("exporters", 4, 12, "expected a map"),
            ("procesors", 5, 1, "unknown key \"procesors\" (expected receivers,"),
            ("service.extensions", 7, 15, "expected a list of component ids"),
            ("service.shutdown_timeout", 8, 21, "10 seconds"),
            ("service.pipelines.traces.receivers[1]", 11, 25, "invalid component id \"otlp/\""),
            ("service.pipelines.traces.receivers[2]", 11, 34, "expected a component id"),
            (
                "service.pipelines.traces.exporter",
                12,
                7,
                "unknown key \"exporter\" (expected receivers, processors or exporters)",
            ),
            ("service.pipelines.spans", 13, 5, "unknown pipeline type \"spans\""),
            ("service.pipelines.traces/", 14, 5, "invalid pipeline id"),
            ("service.telemetry.metrics.level", 16, 22, "invalid level \"loud\""),
            ("service.telemetry.metrics.readers[0].periodic.exporter", 16, 49, "needs an exporter (otlp)"),
            ("service.telemetry.logs.level", 17, 19, "invalid level \"trace\""),
            ("service.telemetry.logs.encoding", 17, 36, "invalid encoding \"xml\""),
            ("service.telemetry.logs.development", 17, 54, "not supported by inferwatch: zap's development mode"),
            ("service.telemetry.tracez", 18, 5, "unknown key \"tracez\""),
            ("service.extra", 19, 3, "unknown key \"extra\""),
        ];
        assert_eq!(got.len(), want.len(), "{got:#?}");
        for (g, w) in got.iter().zip(&want) {
            assert_eq!((g.0.as_str(), g.1, g.2), (w.0, w.1, w.2), "{g:?}");
            assert!(g.3.contains(w.3), "{g:?} should contain {:?}", w.3);
        }
    }

    #[test]
    fn pipelines_are_required() {
        assert_eq!(
            errs("receivers: {}\n"),
            [("service.pipelines".to_string(), 1, 1, "at least one pipeline is required".to_string())]
        );
        let got = errs("service:\n  pipelines: {}\n");
        assert_eq!((got[0].1, got[0].2), (2, 3));
    }

    #[test]
    fn files_merge_in_order() {
        let dir = std::env::temp_dir().join(format!("inferwatch-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (a, b, bad, empty) = (dir.join("a.yaml"), dir.join("b.yaml"), dir.join("bad.yaml"), dir.join("empty.yaml"));
        std::fs::write(&empty, "# nothing here\n").unwrap();
        std::fs::write(&a, format!("receivers: {{otlp: }}\nexporters:\n  debug: {{verbosity: basic, sampling: {{initial: 5, thereafter: 10}}, list: [1, 2]}}\n{PIPE}")).unwrap();
        std::fs::write(&b, "exporters:\n  debug:\n    sampling: {initial: 1}\n    list: [3]\n  otlp: {endpoint: x}\nservice:\n  pipelines:\n    traces: {exporters: [debug, otlp]}\n").unwrap();
        std::fs::write(&bad, "a: [\nb: ${env:NOPE}\n").unwrap();
        let c = load_with_env(&[a.clone(), b.clone(), empty], &no_env).unwrap();
        let debug = &c.exporters[&id("debug")];
        assert_eq!(
            debug.settings,
            serde_json::json!({"verbosity": "basic", "sampling": {"initial": 1, "thereafter": 10}, "list": [3]})
        );
        // A replaced value is located in the file that set it.
        let loc = debug.locate(&[PathSeg::Key("list".into())]);
        assert_eq!((loc.file.as_ref(), loc.line, loc.column), (b.display().to_string().as_str(), 4, 5));
        let p = &c.service.pipelines[0];
        assert_eq!((p.receivers.len(), p.exporters.len()), (1, 2));
        assert_eq!(c.exporters.len(), 2);
        // Errors from every file come back together; an unreadable file is reported too.
        let e = load_with_env(&[bad.clone(), dir.join("missing.yaml"), a], &no_env).unwrap_err();
        assert_eq!(e.len(), 2, "{e:?}");
        assert!(e[0].to_string().starts_with(&format!("{}:2:", bad.display())), "{}", e[0]);
        assert!(e[1].message.starts_with("cannot read"), "{}", e[1]);
        assert!(load_with_env(&[], &no_env).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

#[cfg(test)]
mod size_cap_tests {
    use super::*;

    #[test]
    fn endless_and_oversized_files_are_refused_after_the_cap() {
        let t0 = std::time::Instant::now();
        let e = load_with_env(&[PathBuf::from("/dev/zero")], &|_| None).unwrap_err();
        assert!(t0.elapsed() < std::time::Duration::from_secs(5), "{:?}", t0.elapsed());
        assert!(e[0].message.contains("larger than the 16 MiB"), "{}", e[0].message);
        assert!(e[0].message.contains("/dev/zero"), "{}", e[0].message);
        let dir = std::env::temp_dir().join(format!("inferwatch-config-cap-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let big = dir.join("big.yaml");
        std::fs::write(&big, vec![b'#'; MAX_CONFIG_BYTES as usize + 1]).unwrap();
        let e = load_with_env(std::slice::from_ref(&big), &|_| None).unwrap_err();
        assert!(e[0].message.contains("larger than"), "{}", e[0].message);
        // Exactly at the cap is read (and here parses as an empty document).
        std::fs::write(&big, vec![b'#'; MAX_CONFIG_BYTES as usize]).unwrap();
        assert_eq!(read_bounded(&big).unwrap().len() as u64, MAX_CONFIG_BYTES);
        std::fs::write(&big, [b'a', b':', 0xff]).unwrap();
        assert!(read_bounded(&big).unwrap_err().contains("not UTF-8"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

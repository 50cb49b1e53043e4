//! Settings of `k8sattributes` (otelcol-contrib's keys), checked into [`Checked`].

use inferwatch_core::component::{FieldError, PathSeg};
use inferwatch_core::settings::GoDuration;
use regex::Regex;
use serde::Deserialize;
use std::collections::BTreeSet;
use std::time::Duration;

/// Default of `max_pods`.
pub const DEFAULT_MAX_PODS: usize = 50_000;
/// otelcol's limit of sources in one association.
pub const MAX_SOURCES: usize = 4;

/// `k8sattributes` as written (otelcol's keys, plus `api_server` and `max_pods`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct K8sAttributesConfig {
    /// `serviceAccount` (default), `none`; `kubeConfig` is refused.
    pub auth_type: String,
    /// otelcol's kubeconfig path (`auth_type: kubeConfig`); refused.
    pub kube_config_path: Option<String>,
    /// otelcol's kubeconfig context; refused.
    pub context: Option<String>,
    /// Only add `k8s.pod.ip` from the connection; no API access.
    pub passthrough: bool,
    /// What to extract.
    pub extract: ExtractConfig,
    /// Which pods to watch.
    pub filter: FilterConfig,
    /// How to find the pod of a resource (first rule that has all its values wins).
    pub pod_association: Vec<AssociationConfig>,
    /// Pods to ignore (default: `jaeger-agent`, `jaeger-collector`).
    pub exclude: Option<ExcludeConfig>,
    /// Hold the pipeline's start until the pods are listed.
    pub wait_for_metadata: bool,
    /// How long to wait for them (default 10s).
    pub wait_for_metadata_timeout: GoDuration,
    /// inferwatch: the API server URL instead of the in-cluster one (`kubectl proxy`'s
    /// `http://127.0.0.1:8001` with `auth_type: none`; the tests' fixture server).
    pub api_server: Option<String>,
    /// inferwatch: most pods cached; more are not cached and counted.
    pub max_pods: usize,
}

impl Default for K8sAttributesConfig {
    fn default() -> Self {
        K8sAttributesConfig {
            auth_type: "serviceAccount".into(),
            kube_config_path: None,
            context: None,
            passthrough: false,
            extract: ExtractConfig::default(),
            filter: FilterConfig::default(),
            pod_association: Vec::new(),
            exclude: None,
            wait_for_metadata: false,
            wait_for_metadata_timeout: GoDuration(Duration::from_secs(10)),
            api_server: None,
            max_pods: DEFAULT_MAX_PODS,
        }
    }
}

/// `extract:`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ExtractConfig {
    /// Attributes to add (default: otelcol's six).
    pub metadata: Option<Vec<String>>,
    /// Annotation rules.
    pub annotations: Vec<FieldExtractConfig>,
    /// Label rules.
    pub labels: Vec<FieldExtractConfig>,
    /// `resource.opentelemetry.io/<key>` pod annotations become attribute `<key>`.
    pub otel_annotations: bool,
    /// Deployment name from the ReplicaSet's name (what inferwatch always does).
    pub deployment_name_from_replicaset: bool,
    /// otelcol's service attribute rules; refused.
    pub service_attributes: Option<serde_json::Value>,
}

/// One `labels` / `annotations` rule.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FieldExtractConfig {
    /// Attribute name (`$1` etc. refer to `key_regex` groups).
    pub tag_name: Option<String>,
    /// The exact label / annotation key.
    pub key: Option<String>,
    /// A regex matching whole keys.
    pub key_regex: Option<String>,
    /// otelcol's removed value regex; refused.
    pub regex: Option<String>,
    /// `pod` (default) or `namespace`.
    pub from: Option<String>,
}

/// `filter:`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FilterConfig {
    /// Only pods of this node.
    pub node: Option<String>,
    /// Only pods of the node named by this environment variable.
    pub node_from_env_var: Option<String>,
    /// Only pods of this namespace.
    pub namespace: Option<String>,
    /// Field selectors.
    pub fields: Vec<FieldFilterConfig>,
    /// Label selectors.
    pub labels: Vec<FieldFilterConfig>,
}

/// One field or label filter.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FieldFilterConfig {
    /// Field or label key.
    pub key: String,
    /// Value compared with.
    pub value: String,
    /// `equals` (default), `not-equals`, `exists`, `does-not-exist`.
    pub op: Option<String>,
}

/// One `pod_association` rule.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AssociationConfig {
    /// Sources, all of which must match.
    pub sources: Vec<SourceConfig>,
}

/// One association source.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SourceConfig {
    /// `connection` or `resource_attribute`.
    pub from: String,
    /// The resource attribute (`resource_attribute`).
    pub name: Option<String>,
}

/// `exclude:`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ExcludeConfig {
    /// Pods by name (regex).
    pub pods: Vec<ExcludePod>,
}

/// One excluded pod name.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ExcludePod {
    /// Regex on the pod name.
    pub name: String,
}

/// Where the processor reaches the API server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApiTarget {
    /// In-cluster URL, service-account token and CA.
    ServiceAccount(Option<String>),
    /// No credentials (the in-cluster URL or `api_server`).
    Anonymous(Option<String>),
}

/// One checked association source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// The client's peer IP.
    Connection,
    /// A resource attribute.
    Attribute(String),
}

/// Where a label / annotation rule reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum From {
    /// The pod's.
    Pod,
    /// Its namespace's.
    Namespace,
}

/// How a rule picks keys.
#[derive(Debug, Clone)]
pub enum KeyMatch {
    /// One key.
    Exact(String),
    /// Every key the (anchored) regex matches.
    Regex(Regex),
}

/// A checked label / annotation rule.
#[derive(Debug, Clone)]
pub struct Extract {
    /// Attribute name template (none: `k8s.<from>.<labels|annotations>.<key>`).
    pub tag: Option<String>,
    /// Keys read.
    pub key: KeyMatch,
    /// Where.
    pub from: From,
}

impl Extract {
    /// The attributes this rule makes of `map` (labels or annotations), `kind` `labels` / `annotations`.
    pub fn apply(&self, map: &serde_json::Map<String, serde_json::Value>, kind: &str) -> Vec<(String, String)> {
        let from = match self.from {
            From::Pod => "pod",
            From::Namespace => "namespace",
        };
        let mut out = Vec::new();
        for (k, v) in map {
            let Some(v) = v.as_str() else { continue };
            let name = match &self.key {
                KeyMatch::Exact(key) if key == k => {
                    self.tag.clone().unwrap_or_else(|| format!("k8s.{from}.{kind}.{k}"))
                }
                KeyMatch::Exact(_) => continue,
                KeyMatch::Regex(re) => {
                    let Some(caps) = re.captures(k) else { continue };
                    match &self.tag {
                        Some(t) => {
                            let mut dst = String::new();
                            caps.expand(t, &mut dst);
                            dst
                        }
                        None => format!("k8s.{from}.{kind}.{k}"),
                    }
                }
            };
            if !name.is_empty() {
                out.push((name, v.to_string()));
            }
        }
        out
    }
}

/// The checked settings.
#[derive(Debug, Clone)]
pub struct Checked {
    /// Where the API is (`None`: passthrough).
    pub api: Option<ApiTarget>,
    /// Attributes to add.
    pub metadata: BTreeSet<String>,
    /// Label rules.
    pub labels: Vec<Extract>,
    /// Annotation rules.
    pub annotations: Vec<Extract>,
    /// `otel_annotations`.
    pub otel_annotations: bool,
    /// Association rules (never empty: the default is the connection).
    pub associations: Vec<Vec<Source>>,
    /// Excluded pod names.
    pub exclude: Vec<Regex>,
    /// `filter.node` (or the variable named by `node_from_env_var`, read at start).
    pub node: Option<String>,
    /// `filter.node_from_env_var`.
    pub node_from_env_var: Option<String>,
    /// `filter.namespace`.
    pub namespace: Option<String>,
    /// Label selector of the pod watch.
    pub label_selector: Vec<String>,
    /// Field selectors of the pod watch (the node's added at start).
    pub field_selector: Vec<String>,
    /// `wait_for_metadata` with its timeout.
    pub wait: Option<Duration>,
    /// `max_pods`.
    pub max_pods: usize,
}

/// The default `extract.metadata`.
pub const DEFAULT_METADATA: [&str; 6] =
    ["k8s.namespace.name", "k8s.pod.name", "k8s.pod.uid", "k8s.pod.start_time", "k8s.deployment.name", "k8s.node.name"];

/// Pod-level attributes inferwatch extracts.
pub const POD_METADATA: [&str; 22] = [
    "k8s.namespace.name",
    "k8s.pod.name",
    "k8s.pod.uid",
    "k8s.pod.hostname",
    "k8s.pod.ip",
    "k8s.pod.start_time",
    "k8s.replicaset.name",
    "k8s.replicaset.uid",
    "k8s.deployment.name",
    "k8s.daemonset.name",
    "k8s.daemonset.uid",
    "k8s.statefulset.name",
    "k8s.statefulset.uid",
    "k8s.job.name",
    "k8s.job.uid",
    "k8s.cronjob.name",
    "k8s.node.name",
    "k8s.cluster.uid",
    "service.namespace",
    "service.name",
    "service.version",
    "service.instance.id",
];

/// Container-level attributes (the container named by `container.id` / `k8s.container.name`).
pub const CONTAINER_METADATA: [&str; 5] = [
    "k8s.container.name",
    "container.id",
    "container.image.name",
    "container.image.tag",
    "container.image.repo_digests",
];

/// otelcol fields inferwatch does not extract, with the reason.
const REFUSED_METADATA: [(&str, &str); 3] = [
    (
        "k8s.deployment.uid",
        "needs a ReplicaSet watch, which inferwatch does not run (k8s.deployment.name is derived from the ReplicaSet name)",
    ),
    (
        "k8s.cronjob.uid",
        "needs a Job watch, which inferwatch does not run (k8s.cronjob.name is derived from the Job name)",
    ),
    ("k8s.node.uid", "needs a Node watch, which inferwatch does not run"),
];

fn at(path: &[PathSeg], message: impl Into<String>) -> FieldError {
    FieldError { path: path.to_vec(), message: message.into() }
}

fn k(s: &str) -> PathSeg {
    PathSeg::Key(s.into())
}

fn refused(key: &str, why: &str) -> FieldError {
    FieldError::at(key, format!("not supported by inferwatch: {why}"))
}

impl K8sAttributesConfig {
    /// Checks the settings as otelcol does, refusing what inferwatch does not implement.
    pub fn check(&self) -> Result<Checked, FieldError> {
        if self.kube_config_path.is_some() || self.context.is_some() || self.auth_type == "kubeConfig" {
            let key = if self.auth_type == "kubeConfig" {
                "auth_type"
            } else if self.kube_config_path.is_some() {
                "kube_config_path"
            } else {
                "context"
            };
            return Err(refused(
                key,
                "kubeconfig files; run in the cluster (auth_type serviceAccount) or use auth_type none with \
                 api_server (e.g. kubectl proxy)",
            ));
        }
        let api = if self.passthrough {
            None
        } else {
            if let Some(a) = &self.api_server {
                match reqwest_like_url(a) {
                    true => {}
                    false => return Err(FieldError::at("api_server", format!("{a:?} is not an http(s) URL"))),
                }
            }
            match self.auth_type.as_str() {
                "serviceAccount" => Some(ApiTarget::ServiceAccount(self.api_server.clone())),
                "none" => Some(ApiTarget::Anonymous(self.api_server.clone())),
                other => {
                    return Err(FieldError::at(
                        "auth_type",
                        format!("unknown auth_type {other:?} (serviceAccount, kubeConfig or none)"),
                    ));
                }
            }
        };
        if let Some(s) = &self.extract.service_attributes {
            let _ = s;
            return Err(refused(
                "extract.service_attributes",
                "service attribute rules; list service.name / service.version / service.namespace / \
                 service.instance.id in extract.metadata instead",
            ));
        }
        let mut metadata = BTreeSet::new();
        match &self.extract.metadata {
            None => metadata.extend(DEFAULT_METADATA.iter().map(|s| s.to_string())),
            Some(list) => {
                for (i, m) in list.iter().enumerate() {
                    let path = [k("extract"), k("metadata"), PathSeg::Index(i)];
                    if let Some((_, why)) = REFUSED_METADATA.iter().find(|(n, _)| n == m) {
                        return Err(at(&path, format!("{m:?} is not supported by inferwatch: {why}")));
                    }
                    if !POD_METADATA.contains(&m.as_str()) && !CONTAINER_METADATA.contains(&m.as_str()) {
                        return Err(at(&path, format!("{m:?} is not a supported metadata field")));
                    }
                    metadata.insert(m.clone());
                }
            }
        }
        let rules = |list: &[FieldExtractConfig], section: &str| -> Result<Vec<Extract>, FieldError> {
            let mut out = Vec::new();
            for (i, r) in list.iter().enumerate() {
                let path = |f: &str| vec![k("extract"), k(section), PathSeg::Index(i), k(f)];
                if r.regex.is_some() {
                    return Err(at(
                        &path("regex"),
                        "not supported: otelcol removed the value regex (v0.122.0); use key_regex and tag_name",
                    ));
                }
                let from = match r.from.as_deref().unwrap_or("pod") {
                    "pod" | "" => From::Pod,
                    "namespace" => From::Namespace,
                    f @ ("node" | "deployment" | "statefulset" | "daemonset" | "job") => {
                        return Err(at(
                            &path("from"),
                            format!("{f:?} is not supported by inferwatch: it watches pods and namespaces only"),
                        ));
                    }
                    f => {
                        return Err(at(
                            &path("from"),
                            format!("{f} is not a valid choice for from. Must be one of: pod, namespace"),
                        ));
                    }
                };
                let key = match (&r.key, &r.key_regex) {
                    (Some(_), Some(_)) => {
                        return Err(at(&path("key_regex"), "only one of key and key_regex may be set"));
                    }
                    (Some(key), None) => KeyMatch::Exact(key.clone()),
                    (None, Some(re)) => KeyMatch::Regex(
                        Regex::new(&format!("^(?:{re})$"))
                            .map_err(|e| at(&path("key_regex"), format!("invalid regex: {e}")))?,
                    ),
                    (None, None) => return Err(at(&path("key"), "one of key and key_regex is required")),
                };
                // otelcol's configs write `$$1` (the `$` escape of its env expansion) for `$1`.
                let tag = r.tag_name.as_ref().filter(|t| !t.is_empty()).map(|t| t.replace("$$", "$"));
                out.push(Extract { tag, key, from });
            }
            Ok(out)
        };
        let labels = rules(&self.extract.labels, "labels")?;
        let annotations = rules(&self.extract.annotations, "annotations")?;

        let mut associations = Vec::new();
        for (i, a) in self.pod_association.iter().enumerate() {
            let base = [k("pod_association"), PathSeg::Index(i), k("sources")];
            if a.sources.is_empty() {
                return Err(at(&base, "an association needs at least one source"));
            }
            if a.sources.len() > MAX_SOURCES {
                return Err(at(&base, format!("too many association sources. limit is {MAX_SOURCES}")));
            }
            let mut rule = Vec::new();
            for (j, s) in a.sources.iter().enumerate() {
                let mut path = base.to_vec();
                path.push(PathSeg::Index(j));
                match (s.from.as_str(), &s.name) {
                    ("connection", _) => rule.push(Source::Connection),
                    ("resource_attribute", Some(n)) if !n.is_empty() => rule.push(Source::Attribute(n.clone())),
                    ("resource_attribute", _) => {
                        path.push(k("name"));
                        return Err(at(&path, "from: resource_attribute needs the attribute's name"));
                    }
                    (other, _) => {
                        path.push(k("from"));
                        return Err(at(&path, format!("unknown source {other:?} (connection, resource_attribute)")));
                    }
                }
            }
            associations.push(rule);
        }
        if associations.is_empty() {
            associations.push(vec![Source::Connection]);
        }
        let exclude_names: Vec<String> = match &self.exclude {
            Some(e) => e.pods.iter().map(|p| p.name.clone()).collect(),
            None => vec!["jaeger-agent".into(), "jaeger-collector".into()],
        };
        let mut exclude = Vec::new();
        for (i, n) in exclude_names.iter().enumerate() {
            exclude.push(Regex::new(n).map_err(|e| {
                at(&[k("exclude"), k("pods"), PathSeg::Index(i), k("name")], format!("invalid regex: {e}"))
            })?);
        }
        let f = &self.filter;
        if f.node.is_some() && f.node_from_env_var.is_some() {
            return Err(FieldError::at(
                "filter.node_from_env_var",
                "set filter.node or filter.node_from_env_var, not both",
            ));
        }
        let mut label_selector = Vec::new();
        for (i, l) in f.labels.iter().enumerate() {
            let path = |x: &str| vec![k("filter"), k("labels"), PathSeg::Index(i), k(x)];
            if l.key.is_empty() {
                return Err(at(&path("key"), "key is required"));
            }
            label_selector.push(match l.op.as_deref().unwrap_or("equals") {
                "equals" | "" => format!("{}={}", l.key, l.value),
                "not-equals" => format!("{}!={}", l.key, l.value),
                "exists" => l.key.clone(),
                "does-not-exist" => format!("!{}", l.key),
                op => {
                    return Err(at(
                        &path("op"),
                        format!("'{op}' is not a valid label filter operation for key={}, value={}", l.key, l.value),
                    ));
                }
            });
        }
        let mut field_selector = Vec::new();
        for (i, l) in f.fields.iter().enumerate() {
            let path = |x: &str| vec![k("filter"), k("fields"), PathSeg::Index(i), k(x)];
            if l.key.is_empty() {
                return Err(at(&path("key"), "key is required"));
            }
            field_selector.push(match l.op.as_deref().unwrap_or("equals") {
                "equals" | "" => format!("{}={}", l.key, l.value),
                "not-equals" => format!("{}!={}", l.key, l.value),
                op => {
                    return Err(at(
                        &path("op"),
                        format!("'{op}' is not a valid field filter operation for key={}, value={}", l.key, l.value),
                    ));
                }
            });
        }
        if self.max_pods == 0 {
            return Err(FieldError::at("max_pods", "must be at least 1"));
        }
        if self.wait_for_metadata && self.wait_for_metadata_timeout.0.is_zero() {
            return Err(FieldError::at("wait_for_metadata_timeout", "must be greater than zero"));
        }
        Ok(Checked {
            api,
            metadata,
            labels,
            annotations,
            otel_annotations: self.extract.otel_annotations,
            associations,
            exclude,
            node: f.node.clone().filter(|n| !n.is_empty()),
            node_from_env_var: f.node_from_env_var.clone().filter(|n| !n.is_empty()),
            namespace: f.namespace.clone().filter(|n| !n.is_empty()),
            label_selector,
            field_selector,
            wait: self.wait_for_metadata.then_some(self.wait_for_metadata_timeout.0),
            max_pods: self.max_pods,
        })
    }
}

fn reqwest_like_url(a: &str) -> bool {
    match a.split_once("://") {
        Some(("http" | "https", rest)) => !rest.is_empty() && !rest.starts_with('/'),
        _ => false,
    }
}

impl Checked {
    /// Whether namespaces must be watched (namespace rules, `k8s.cluster.uid`).
    pub fn needs_namespaces(&self) -> bool {
        self.metadata.contains("k8s.cluster.uid")
            || self.labels.iter().chain(&self.annotations).any(|r| r.from == From::Namespace)
    }

    /// Whether container-level attributes are asked for.
    pub fn needs_containers(&self) -> bool {
        CONTAINER_METADATA.iter().any(|m| self.metadata.contains(*m))
            || self.metadata.contains("service.version")
            || self.metadata.contains("service.instance.id")
    }
}

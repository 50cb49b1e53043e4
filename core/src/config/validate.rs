//! Validation of a loaded [`Config`] against the registry: component types and settings,
//! pipeline references and signals, connector use, extensions and cycles.

use super::{ComponentConfig, Config, ConfigError, Location, ParsedSettings, PipelineConfig};
use crate::component::Parsed;
use crate::pdata::Signal;
use crate::registry::Registry;
use crate::vocab::{ComponentId, ComponentKind, FieldError, PathSeg};
use serde_json::Value;
use std::collections::HashSet;

/// Checks `c` against the factories in `r`; returns every problem found (empty when valid).
pub fn validate(c: &Config, r: &Registry) -> Vec<ConfigError> {
    let mut v = Validator { c, r, errors: Vec::new() };
    v.components();
    for p in &c.service.pipelines {
        v.pipeline(p);
    }
    v.ids(&c.service.extensions, "service.extensions", "extension", |id| c.extensions.contains_key(id));
    v.cycles();
    v.errors
}

/// Valid settings of receivers, processors, exporters and connectors that cannot do what they seem to (the
/// factories' `warnings`), each located at the offending key; they never make a config invalid.
pub fn warnings(c: &Config, r: &Registry) -> Vec<ConfigError> {
    let mut out = c.load_warnings.clone();
    let sections = [
        (ComponentKind::Receiver, &c.receivers),
        (ComponentKind::Processor, &c.processors),
        (ComponentKind::Exporter, &c.exporters),
        (ComponentKind::Connector, &c.connectors),
        (ComponentKind::Extension, &c.extensions),
    ];
    for (kind, section) in sections {
        for comp in section.values() {
            let alias = r.alias(kind, &comp.id.type_name).filter(|a| r.has(kind, a.target));
            if let Some((a, why)) = alias.and_then(|a| a.deprecated.map(|why| (a, why))) {
                let key = format!("{}.{}", kind.section(), comp.id);
                let message = format!("{:?} is a deprecated alias of {:?}: {why}", a.name, a.target);
                out.push(ConfigError { location: Some(comp.location.clone()), key, message });
            }
        }
    }
    let mut add = |kind: ComponentKind, comp: &ComponentConfig, found: Vec<FieldError>| {
        for e in found {
            let key = format!("{}.{}{}", kind.section(), comp.id, suffix(&e.path));
            out.push(ConfigError { location: Some(comp.locate(&e.path)), key, message: e.message });
        }
    };
    for comp in c.receivers.values() {
        if let Some(f) = r.receiver(&comp.id.type_name) {
            add(ComponentKind::Receiver, comp, f.warnings(&comp.settings));
        }
    }
    for comp in c.processors.values() {
        if let Some(f) = r.processor(&comp.id.type_name) {
            add(ComponentKind::Processor, comp, f.warnings(&comp.settings));
        }
    }
    for comp in c.exporters.values() {
        if let Some(f) = r.exporter(&comp.id.type_name) {
            add(ComponentKind::Exporter, comp, f.warnings(&comp.settings));
        }
    }
    for comp in c.connectors.values() {
        if let Some(f) = r.connector(&comp.id.type_name) {
            add(ComponentKind::Connector, comp, f.warnings(&comp.settings));
        }
    }
    out
}

/// Joins signals for messages: `traces, metrics`.
fn names(signals: &[Signal]) -> String {
    signals.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
}

/// The dotted suffix for a settings path: `.protocols.grpc`, `.headers[0]`.
fn suffix(path: &[PathSeg]) -> String {
    path.iter()
        .map(|s| match s {
            PathSeg::Key(k) => format!(".{k}"),
            PathSeg::Index(i) => format!("[{i}]"),
        })
        .collect()
}

/// A factory's settings parse (with the factory's [`ParsedSettings::factory_key`]).
type Check<'a> = (usize, CheckFn<'a>);

/// See [`Check`].
type CheckFn<'a> = Box<dyn Fn(&Value) -> Result<Parsed, FieldError> + 'a>;

/// Most errors reported for one component's settings.
const MAX_ERRORS_PER_COMPONENT: usize = 32;

/// serde's messages for a value of the wrong type or form: the key can be taken out and the
/// rest of the settings checked.
const SERDE_VALUE_ERRORS: [&str; 4] = ["invalid type:", "invalid value:", "invalid length", "unknown variant `"];

/// The text between `prefix` and the next backquote, if `message` starts with `prefix`.
fn quoted_after(message: &str, prefix: &str) -> Option<String> {
    message.strip_prefix(prefix).and_then(|m| m.split_once('`')).map(|(f, _)| f.to_string())
}

/// For serde's "unknown field `x`, expected one of `a`, `b`" (and unknown variants): the
/// expected name closest to `x`, if one is close.
fn candidates_suggestion(message: &str) -> Option<String> {
    let word = quoted_after(message, "unknown field `").or_else(|| quoted_after(message, "unknown variant `"))?;
    let (_, expected) = message.split_once("expected ")?;
    let names: Vec<&str> = expected.split('`').skip(1).step_by(2).collect();
    suggest(&word, names).map(str::to_string)
}

/// The candidate closest to `word` by edit distance (case and `_`/`-` ignored), if close enough
/// to be a likely misspelling: at most one edit per three characters.
pub(crate) fn suggest<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let norm = |s: &str| s.chars().filter(|c| *c != '_' && *c != '-').flat_map(char::to_lowercase).collect::<Vec<_>>();
    let w = norm(word);
    let limit = (w.len().max(3)) / 3;
    candidates
        .into_iter()
        .filter(|c| *c != word)
        .map(|c| (edit_distance(&w, &norm(c)), c))
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

/// Edit distance counting insertions, deletions, substitutions and swaps of neighbours
/// (optimal string alignment).
fn edit_distance(a: &[char], b: &[char]) -> usize {
    let mut d = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in d[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut v = (d[i - 1][j] + 1).min(d[i][j - 1] + 1).min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                v = v.min(d[i - 2][j - 2] + 1);
            }
            d[i][j] = v;
        }
    }
    d[a.len()][b.len()]
}

/// The message for an unknown component type: a hint for otelcol names inferwatch knows but
/// does not have, a "did you mean" for a likely misspelling, and the known types.
fn unknown_type(r: &Registry, kind: ComponentKind, t: &str) -> String {
    let known = r.type_names(kind);
    let aliases: Vec<&str> = r.aliases().filter(|a| a.kind == kind && r.has(kind, a.target)).map(|a| a.name).collect();
    let mut msg = format!("unknown {} type {t:?}", kind.singular());
    if let Some(a) = r.alias(kind, t) {
        msg.push_str(&format!(" (otelcol's {t:?}, also known as {:?}, is not built into inferwatch)", a.target));
    } else if let Some(s) = suggest(t, known.iter().copied().chain(aliases.iter().copied())) {
        msg.push_str(&format!("; did you mean {s:?}?"));
    }
    let known = if known.is_empty() { "none".to_string() } else { known.join(", ") };
    msg.push_str(&format!(" (known: {known})"));
    msg
}

/// Takes the value at `path` out of `v`; whether there was one.
fn remove(v: &mut Value, path: &[PathSeg]) -> bool {
    let Some((last, parent)) = path.split_last() else { return false };
    let mut node = v;
    for seg in parent {
        node = match (seg, node) {
            (PathSeg::Key(k), Value::Object(m)) => match m.get_mut(k) {
                Some(n) => n,
                None => return false,
            },
            (PathSeg::Index(i), Value::Array(a)) => match a.get_mut(*i) {
                Some(n) => n,
                None => return false,
            },
            _ => return false,
        };
    }
    match (last, node) {
        (PathSeg::Key(k), Value::Object(m)) => m.remove(k).is_some(),
        // An item is replaced by null, keeping the indexes of the others.
        (PathSeg::Index(i), Value::Array(a)) if *i < a.len() => {
            a[*i] = Value::Null;
            true
        }
        _ => false,
    }
}

struct Validator<'a> {
    c: &'a Config,
    r: &'a Registry,
    errors: Vec<ConfigError>,
}

impl Validator<'_> {
    fn err(&mut self, at: &Location, key: impl Into<String>, message: impl Into<String>) {
        self.errors.push(ConfigError { location: Some(at.clone()), key: key.into(), message: message.into() });
    }

    fn components(&mut self) {
        let (c, r) = (self.c, self.r);
        for comp in c.receivers.values() {
            let f = r.receiver(&comp.id.type_name);
            self.component(
                ComponentKind::Receiver,
                comp,
                f.map(|f| (ParsedSettings::factory_key(f), Box::new(move |v: &Value| f.parse(v)) as CheckFn)),
            );
        }
        for comp in c.processors.values() {
            let f = r.processor(&comp.id.type_name);
            self.component(
                ComponentKind::Processor,
                comp,
                f.map(|f| (ParsedSettings::factory_key(f), Box::new(move |v: &Value| f.parse(v)) as CheckFn)),
            );
        }
        for comp in c.exporters.values() {
            let f = r.exporter(&comp.id.type_name);
            self.component(
                ComponentKind::Exporter,
                comp,
                f.map(|f| (ParsedSettings::factory_key(f), Box::new(move |v: &Value| f.parse(v)) as CheckFn)),
            );
        }
        for comp in c.connectors.values() {
            let f = r.connector(&comp.id.type_name);
            self.component(
                ComponentKind::Connector,
                comp,
                f.map(|f| (ParsedSettings::factory_key(f), Box::new(move |v: &Value| f.parse(v)) as CheckFn)),
            );
            for (other, section) in [("a receiver", &c.receivers), ("an exporter", &c.exporters)] {
                if section.contains_key(&comp.id) {
                    let msg = format!("connector id \"{}\" is also defined as {other}; ids must be distinct", comp.id);
                    self.err(&comp.location, format!("connectors.{}", comp.id), msg);
                }
            }
        }
        for comp in c.extensions.values() {
            let f = r.extension(&comp.id.type_name);
            self.component(
                ComponentKind::Extension,
                comp,
                f.map(|f| (ParsedSettings::factory_key(f), Box::new(move |v: &Value| f.parse(v)) as CheckFn)),
            );
        }
    }

    /// Reports an unknown type (`check` is `None`) or every problem the factory finds in the
    /// settings: after each unknown key (or ill-typed value) the offending key is taken out and
    /// the settings checked again, so that one run lists them all.
    fn component(&mut self, kind: ComponentKind, comp: &ComponentConfig, check: Option<Check<'_>>) {
        let key = format!("{}.{}", kind.section(), comp.id);
        let Some((factory, check)) = check else {
            let msg = unknown_type(self.r, kind, &comp.id.type_name);
            self.err(&comp.location, key, msg);
            return;
        };
        let mut settings = comp.settings.clone();
        let mut removed: Vec<Vec<PathSeg>> = Vec::new();
        let mut meant: Vec<Vec<PathSeg>> = Vec::new();
        let first = self.errors.len();
        for _ in 0..MAX_ERRORS_PER_COMPONENT {
            let e = match check(&settings) {
                Ok(parsed) => {
                    // Valid as written: kept, so that building the graph does not parse again.
                    if removed.is_empty() {
                        comp.parsed.set(factory, &comp.settings, parsed);
                    }
                    break;
                }
                Err(e) => e,
            };
            let mut path = e.path.clone();
            // serde's path ends at the map holding an unknown field: point at the field itself.
            let unknown = quoted_after(&e.message, "unknown field `");
            if let Some(field) = unknown.as_ref().filter(|f| path.last() != Some(&PathSeg::Key(f.to_string()))) {
                path.push(PathSeg::Key(field.clone()));
            }
            // A follow-up of a key taken out here (`missing field`, or the same key again): stop.
            let missing = quoted_after(&e.message, "missing field `").map(|f| {
                let mut p = e.path.clone();
                p.push(PathSeg::Key(f));
                p
            });
            let retry = unknown.is_some() || SERDE_VALUE_ERRORS.iter().any(|p| e.message.starts_with(p));
            // Once a key is taken out, what is left may fail only because it is missing (a
            // misspelled required key): a follow-up about a key taken out, or about the key a
            // misspelling was taken for, is not reported.
            let follow_up = |p: &Vec<PathSeg>| removed.contains(p) || meant.contains(p);
            if follow_up(&path) || follow_up(&e.path) || missing.as_ref().is_some_and(follow_up) {
                break;
            }
            let mut message = e.message.clone();
            if let Some(s) = candidates_suggestion(&e.message) {
                message.push_str(&format!("; did you mean {s:?}?"));
                let mut m = path.clone();
                m.pop();
                m.push(PathSeg::Key(s));
                meant.push(m);
            }
            let at = if comp.node.get(&path).is_some() { comp.locate(&path) } else { comp.locate(&e.path) };
            let shown = if comp.node.get(&path).is_some() { &path } else { &e.path };
            self.err(&at, format!("{key}{}", suffix(shown)), message);
            if !retry || path.is_empty() || !remove(&mut settings, &path) {
                break;
            }
            removed.push(path);
        }
        // serde visits the keys in sorted order: list them in file order.
        self.errors[first..].sort_by_key(|e| e.location.as_ref().map(|l| (l.line, l.column)));
    }

    /// Checks a list of ids: each defined (per `defined`) and listed once.
    fn ids(&mut self, list: &[(ComponentId, Location)], key: &str, what: &str, defined: impl Fn(&ComponentId) -> bool) {
        let mut seen = HashSet::new();
        for (i, (id, at)) in list.iter().enumerate() {
            let key = format!("{key}[{i}]");
            if !seen.insert(id) {
                self.err(at, key, format!("{what} \"{id}\" is listed more than once"));
            } else if !defined(id) {
                self.err(at, key, format!("references {what} \"{id}\" which is not defined"));
            }
        }
    }

    fn pipeline(&mut self, p: &PipelineConfig) {
        let (c, r, s) = (self.c, self.r, p.id.signal);
        let pkey = format!("service.pipelines.{}", p.id);
        if p.receivers.is_empty() {
            self.err(&p.location, &pkey, "a pipeline needs at least one receiver");
        }
        if p.exporters.is_empty() {
            self.err(&p.location, &pkey, "a pipeline needs at least one exporter");
        }
        let is_conn = |id: &ComponentId| c.connectors.contains_key(id);
        self.ids(&p.receivers, &format!("{pkey}.receivers"), "receiver", |id| {
            c.receivers.contains_key(id) || is_conn(id)
        });
        self.ids(&p.processors, &format!("{pkey}.processors"), "processor", |id| c.processors.contains_key(id));
        self.ids(&p.exporters, &format!("{pkey}.exporters"), "exporter", |id| {
            c.exporters.contains_key(id) || is_conn(id)
        });
        for (i, (id, at)) in p.receivers.iter().enumerate() {
            let key = format!("{pkey}.receivers[{i}]");
            if c.receivers.contains_key(id) {
                let signals = r.receiver(&id.type_name).map(|f| f.signals());
                self.supports("receiver", id, signals, s, at, &key);
            } else if is_conn(id) {
                self.connector(id, p, false, at, &key);
            }
        }
        let mut last_arrow: Option<usize> = None;
        for (i, (id, at)) in p.processors.iter().enumerate() {
            if c.processors.contains_key(id) {
                let signals = r.processor(&id.type_name).map(|f| f.signals());
                self.supports("processor", id, signals, s, at, &format!("{pkey}.processors[{i}]"));
                if r.processor(&id.type_name).is_some_and(|f| f.arrow().is_some()) {
                    if let Some(prev) = last_arrow.filter(|prev| prev + 1 != i) {
                        let prev_id = &p.processors[prev].0;
                        self.err(
                            at,
                            format!("{pkey}.processors[{i}]"),
                            format!(
                                "Arrow processor \"{id}\" must be adjacent to Arrow processor \"{prev_id}\" \
                                 (adjacent Arrow processors share one conversion per batch; move the others before or after them)"
                            ),
                        );
                    }
                    last_arrow = Some(i);
                }
            }
        }
        for (i, (id, at)) in p.exporters.iter().enumerate() {
            let key = format!("{pkey}.exporters[{i}]");
            if c.exporters.contains_key(id) {
                let signals = r.exporter(&id.type_name).map(|f| f.signals());
                self.supports("exporter", id, signals, s, at, &key);
            } else if is_conn(id) {
                self.connector(id, p, true, at, &key);
            }
        }
    }

    /// Reports a component that does not take signal `s` (`None`: unknown type, reported already).
    fn supports(
        &mut self,
        what: &str,
        id: &ComponentId,
        signals: Option<&[Signal]>,
        s: Signal,
        at: &Location,
        key: &str,
    ) {
        if let Some(signals) = signals.filter(|sig| !sig.contains(&s)) {
            self.err(at, key, format!("{what} \"{id}\" does not support {s} (supports: {})", names(signals)));
        }
    }

    /// Checks connector `id` used in `p` as an exporter (or a receiver): it must be used on the
    /// other side too, in a pipeline whose signal pairs with this one.
    fn connector(&mut self, id: &ComponentId, p: &PipelineConfig, as_exporter: bool, at: &Location, key: &str) {
        let Some(f) = self.r.connector(&id.type_name) else { return };
        let s = p.id.signal;
        let others: Vec<Signal> = (self.c.service.pipelines.iter())
            .filter(|q| (if as_exporter { &q.receivers } else { &q.exporters }).iter().any(|(x, _)| x == id))
            .map(|q| q.id.signal)
            .collect();
        let (role, other) = if as_exporter { ("an exporter", "a receiver") } else { ("a receiver", "an exporter") };
        if others.is_empty() {
            self.err(at, key, format!("connector \"{id}\" is used as {role} but not as {other} in any pipeline"));
            return;
        }
        let pair = |o: Signal| if as_exporter { (s, o) } else { (o, s) };
        if !others.iter().any(|&o| f.signal_pairs().contains(&pair(o))) {
            let pairs: Vec<String> = f.signal_pairs().iter().map(|(a, b)| format!("{a}->{b}")).collect();
            let msg = format!(
                "connector \"{id}\" is used as {role} in a {s} pipeline but as {other} in no pipeline it can pair with (supports: {})",
                pairs.join(", ")
            );
            self.err(at, key, msg);
        }
    }

    /// Reports cycles between pipelines through connectors, at the exporter entry closing each.
    fn cycles(&mut self) {
        let c = self.c;
        let ps = &c.service.pipelines;
        // edges[p] = (exporter entry index, downstream pipeline index)
        let edges: Vec<Vec<(usize, usize)>> = ps
            .iter()
            .map(|p| {
                let conns = p
                    .exporters
                    .iter()
                    .enumerate()
                    .filter(|(_, (id, _))| c.connectors.contains_key(id) && !c.exporters.contains_key(id));
                conns
                    .flat_map(|(i, (id, _))| {
                        ps.iter()
                            .enumerate()
                            .filter(move |(_, q)| q.receivers.iter().any(|(r, _)| r == id))
                            .map(move |(j, _)| (i, j))
                    })
                    .collect()
            })
            .collect();
        let mut state = vec![Visit::New; ps.len()];
        for start in 0..ps.len() {
            self.dfs(start, &edges, &mut state, &mut Vec::new());
        }
    }

    fn dfs(&mut self, p: usize, edges: &[Vec<(usize, usize)>], state: &mut [Visit], stack: &mut Vec<usize>) {
        if state[p] != Visit::New {
            return;
        }
        let ps = &self.c.service.pipelines;
        state[p] = Visit::OnStack;
        stack.push(p);
        for &(entry, q) in &edges[p] {
            match state[q] {
                Visit::New => self.dfs(q, edges, state, stack),
                Visit::OnStack => {
                    let from = stack.iter().position(|&x| x == q).unwrap_or(0);
                    let path: Vec<String> = stack[from..].iter().chain([&q]).map(|&i| ps[i].id.to_string()).collect();
                    let (id, at) = &ps[p].exporters[entry];
                    let msg = format!("connector \"{id}\" closes a cycle: {}", path.join(" -> "));
                    self.err(at, format!("service.pipelines.{}.exporters[{entry}]", ps[p].id), msg);
                }
                Visit::Done => {}
            }
        }
        stack.pop();
        state[p] = Visit::Done;
    }
}

/// Depth-first search marks.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Visit {
    New,
    OnStack,
    Done,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::component::{
        ConnectorFactory, ExporterFactory, Extension, ExtensionFactory, NodeRef, ProcessorFactory, Receiver,
        ReceiverFactory,
    };
    use crate::config::load_str;
    use crate::consumer::ConsumerRef;
    use crate::host::CreateContext;
    use crate::vocab::{ComponentError, parse_config};
    use Signal::{Logs, Metrics, Traces};
    use std::sync::Arc;

    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct FakeCfg {
        endpoint: Option<String>,
        port: Option<u16>,
        tls: Option<Tls>,
    }

    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Tls {
        insecure: bool,
    }

    /// A factory of any kind, with the settings schema above.
    struct Fake(&'static str, &'static [Signal], &'static [(Signal, Signal)]);

    fn check(cfg: &serde_json::Value) -> Result<(), FieldError> {
        let c: FakeCfg = parse_config(cfg)?;
        match c.endpoint.as_deref() {
            Some("bad") => Err(FieldError::at("endpoint", "endpoint must be host:port")),
            _ => Ok(()),
        }
    }

    fn nope<T>() -> Result<T, ComponentError> {
        Err(ComponentError::Start("fake".into()))
    }

    impl ReceiverFactory for Fake {
        fn type_name(&self) -> &'static str {
            self.0
        }
        fn signals(&self) -> &'static [Signal] {
            self.1
        }
        fn validate(&self, cfg: &serde_json::Value) -> Result<(), FieldError> {
            check(cfg)
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
            self.1
        }
        fn validate(&self, cfg: &serde_json::Value) -> Result<(), FieldError> {
            check(cfg)
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
            self.1
        }
        fn validate(&self, cfg: &serde_json::Value) -> Result<(), FieldError> {
            check(cfg)
        }
        fn create(&self, _: CreateContext, _: &serde_json::Value, _: Signal) -> Result<NodeRef, ComponentError> {
            nope()
        }
    }

    impl ConnectorFactory for Fake {
        fn type_name(&self) -> &'static str {
            self.0
        }
        fn signal_pairs(&self) -> &'static [(Signal, Signal)] {
            self.2
        }
        fn validate(&self, cfg: &serde_json::Value) -> Result<(), FieldError> {
            check(cfg)
        }
        fn create(
            &self,
            _: CreateContext,
            _: &serde_json::Value,
            _: Signal,
            _: Signal,
            _: ConsumerRef,
        ) -> Result<NodeRef, ComponentError> {
            nope()
        }
    }

    impl ExtensionFactory for Fake {
        fn type_name(&self) -> &'static str {
            self.0
        }
        fn validate(&self, cfg: &serde_json::Value) -> Result<(), FieldError> {
            check(cfg)
        }
        fn create(&self, _: CreateContext, _: &serde_json::Value) -> Result<Box<dyn Extension>, ComponentError> {
            nope()
        }
    }

    const ALL: &[Signal] = &[Traces, Metrics, Logs];

    fn registry() -> Registry {
        let mut r = Registry::new();
        r.add_receiver(Arc::new(Fake("otlp", ALL, &[])));
        r.add_receiver(Arc::new(Fake("prometheus", &[Metrics], &[])));
        r.add_processor(Arc::new(Fake("batch", ALL, &[])));
        r.add_processor(Arc::new(Fake("spanonly", &[Traces], &[])));
        r.add_exporter(Arc::new(Fake("debug", ALL, &[])));
        r.add_exporter(Arc::new(Fake("otlp", ALL, &[])));
        r.add_exporter(Arc::new(Fake("prom", &[Metrics], &[])));
        r.add_connector(Arc::new(Fake("count", &[], &[(Traces, Metrics)])));
        r.add_connector(Arc::new(Fake("forward", &[], &[(Traces, Traces), (Metrics, Metrics), (Logs, Logs)])));
        r.add_extension(Arc::new(Fake("health_check", &[], &[])));
        r
    }

    /// `(key, line, column, message)` of each validation error.
    fn errs(text: &str) -> Vec<(String, usize, usize, String)> {
        let c = load_str("v.yaml", text, &|_| None).unwrap();
        validate(&c, &registry())
            .into_iter()
            .map(|e| {
                let l = e.location.unwrap();
                (e.key, l.line, l.column, e.message)
            })
            .collect()
    }

    fn assert_errs(text: &str, want: &[(&str, usize, usize, &str)]) {
        let got = errs(text);
        assert_eq!(got.len(), want.len(), "{got:#?}");
        for (g, w) in got.iter().zip(want) {
            assert_eq!((g.0.as_str(), g.1, g.2), (w.0, w.1, w.2), "{g:?}");
            assert!(g.3.contains(w.3), "{g:?} should contain {:?}", w.3);
        }
    }

    #[test]
    fn valid_configs_pass() {
        let text = "\
receivers: { otlp: { endpoint: 127.0.0.1:4317 } }
processors: { batch: {} }
exporters: { otlp/tempo: { endpoint: tempo:4317, tls: { insecure: true } }, debug: {}, prom: }
connectors: { count: }
extensions: { health_check: }
service:
  extensions: [health_check]
  pipelines:
    traces: { receivers: [otlp], processors: [batch], exporters: [otlp/tempo, count] }
    metrics: { receivers: [otlp, count], exporters: [prom, debug] }
";
        assert_errs(text, &[]);
    }

    #[test]
    fn component_errors() {
        let text = "\
receivers:
  otlp:
    port: 99999
  zipkin: {}
processors:
  batch:
    tls:
      insecure: true
      insecur: false
exporters:
  otlp:
    endpoint: bad
  debug:
    nope: 1
connectors:
  otlp: {}
  spanmetrics: {}
extensions:
  pprof: {}
service:
  pipelines:
    traces: { receivers: [otlp], exporters: [debug] }
";
        assert_errs(
            text,
            &[
                ("receivers.otlp.port", 3, 5, "invalid value: integer `99999`"),
                ("receivers.zipkin", 4, 3, "unknown receiver type \"zipkin\" (known: otlp, prometheus)"),
                ("processors.batch.tls.insecur", 9, 7, "unknown field `insecur`"),
                ("exporters.debug.nope", 14, 5, "unknown field `nope`"),
                ("exporters.otlp.endpoint", 12, 5, "endpoint must be host:port"),
                ("connectors.otlp", 16, 3, "unknown connector type \"otlp\" (known: count, forward)"),
                ("connectors.otlp", 16, 3, "connector id \"otlp\" is also defined as a receiver"),
                ("connectors.otlp", 16, 3, "connector id \"otlp\" is also defined as an exporter"),
                ("connectors.spanmetrics", 17, 3, "unknown connector type"),
                ("extensions.pprof", 19, 3, "unknown extension type \"pprof\" (known: health_check)"),
            ],
        );
    }

    #[test]
    fn pipeline_errors() {
        let text = "\
receivers: { otlp: , prometheus: }
processors: { batch: , spanonly: }
exporters: { debug: , prom: }
connectors: { count: , forward: }
extensions: { health_check: }
service:
  extensions: [health_check, pprof, health_check]
  pipelines:
    traces:
      receivers:
        - otlp
        - prometheus
        - jaeger
      processors: [batch, spanonly, batch, memory_limiter]
      exporters: [prom, forward, count, otlp]
    metrics:
      receivers: [count, forward]
      processors: [spanonly]
    logs:
      exporters: [debug]
";
        assert_errs(
            text,
            &[
                (
                    "service.pipelines.traces.receivers[2]",
                    13,
                    11,
                    "references receiver \"jaeger\" which is not defined",
                ),
                ("service.pipelines.traces.processors[2]", 14, 37, "processor \"batch\" is listed more than once"),
                (
                    "service.pipelines.traces.processors[3]",
                    14,
                    44,
                    "references processor \"memory_limiter\" which is not",
                ),
                ("service.pipelines.traces.exporters[3]", 15, 41, "references exporter \"otlp\" which is not defined"),
                (
                    "service.pipelines.traces.receivers[1]",
                    12,
                    11,
                    "receiver \"prometheus\" does not support traces (supports: metrics)",
                ),
                ("service.pipelines.traces.exporters[0]", 15, 19, "exporter \"prom\" does not support traces"),
                (
                    "service.pipelines.traces.exporters[1]",
                    15,
                    25,
                    "connector \"forward\" is used as an exporter in a traces pipeline but as a receiver in no pipeline it can pair with (supports: traces->traces, metrics->metrics, logs->logs)",
                ),
                ("service.pipelines.metrics", 16, 5, "at least one exporter"),
                (
                    "service.pipelines.metrics.receivers[1]",
                    17,
                    26,
                    "connector \"forward\" is used as a receiver in a metrics pipeline but as an exporter in no pipeline",
                ),
                ("service.pipelines.metrics.processors[0]", 18, 20, "processor \"spanonly\" does not support metrics"),
                ("service.pipelines.logs", 19, 5, "at least one receiver"),
                ("service.extensions[1]", 7, 30, "references extension \"pprof\" which is not defined"),
                ("service.extensions[2]", 7, 37, "extension \"health_check\" is listed more than once"),
            ],
        );
    }

    #[test]
    fn connectors_need_both_sides() {
        let text = "\
receivers: { otlp: }
exporters: { debug: }
connectors: { count: , forward: }
service:
  pipelines:
    traces: { receivers: [otlp], exporters: [count] }
    logs: { receivers: [forward], exporters: [debug] }
";
        assert_errs(
            text,
            &[
                (
                    "service.pipelines.traces.exporters[0]",
                    6,
                    46,
                    "connector \"count\" is used as an exporter but not as a receiver in any pipeline",
                ),
                (
                    "service.pipelines.logs.receivers[0]",
                    7,
                    25,
                    "connector \"forward\" is used as a receiver but not as an exporter in any pipeline",
                ),
            ],
        );
    }

    #[test]
    fn cycles_through_connectors() {
        let text = "\
receivers: { otlp: }
exporters: { debug: }
connectors: { forward/a: , forward/b: , forward/self: }
service:
  pipelines:
    traces/in: { receivers: [otlp], exporters: [forward/a] }
    traces/x: { receivers: [forward/a, forward/b], exporters: [forward/b, debug] }
    logs: { receivers: [otlp, forward/self], exporters: [debug, forward/self] }
";
        assert_errs(
            text,
            &[
                (
                    "service.pipelines.traces/x.exporters[0]",
                    7,
                    64,
                    "connector \"forward/b\" closes a cycle: traces/x -> traces/x",
                ),
                (
                    "service.pipelines.logs.exporters[1]",
                    8,
                    65,
                    "connector \"forward/self\" closes a cycle: logs -> logs",
                ),
            ],
        );
        let two = "\
receivers: { otlp: }
exporters: { debug: }
connectors: { forward/a: , forward/b: }
service:
  pipelines:
    traces/1: { receivers: [otlp, forward/b], exporters: [forward/a] }
    traces/2: { receivers: [forward/a], exporters: [forward/b, debug] }
";
        assert_errs(
            two,
            &[("service.pipelines.traces/2.exporters[0]", 7, 53, "closes a cycle: traces/1 -> traces/2 -> traces/1")],
        );
    }
}

//! YAML parsed into a tree that remembers where every key and value is.
//!
//! Built on saphyr-parser's event API. Anchors and aliases are expanded, `<<` merge keys are
//! applied (explicit keys win, then earlier merge sources), duplicate keys are refused, and
//! plain scalars resolve by the YAML 1.2 core schema when turned into JSON.

use super::{ConfigError, Location};
use crate::vocab::PathSeg;
use saphyr_parser::{Event, Marker, Parser, ScalarStyle, ScanError, Span, StrInput};
use std::collections::HashMap;
use std::sync::Arc;

/// Deepest nesting accepted, to keep recursion bounded: a map level costs two stack frames
/// of the builder, several KiB in a debug build, and 256 levels overflowed a 2 MiB thread stack.
const MAX_DEPTH: usize = 128;
/// Most nodes a document may expand to through aliases (guards against "billion laughs").
const MAX_NODES: usize = 1_000_000;
/// Most bytes of key and scalar text that aliases may add to a document (a large scalar
/// aliased many times): 16 MiB, as much as the largest configuration file read.
pub const MAX_ALIAS_BYTES: usize = 16 * 1024 * 1024;

/// A map key with its position.
#[derive(Debug, Clone, PartialEq)]
pub struct Key {
    /// The key as written (after unquoting).
    pub text: String,
    /// Where the key starts.
    pub location: Location,
}

/// What a node holds.
#[derive(Debug, Clone, PartialEq)]
pub enum NodeKind {
    /// A mapping, in file order, keys unique.
    Map(Vec<(Key, Node)>),
    /// A sequence.
    Seq(Vec<Node>),
    /// A scalar; `plain` is false when quoted, a block scalar or tagged `!!str`.
    Scalar {
        /// The scalar's text.
        text: String,
        /// Whether the scalar was plain (unquoted) and so resolves to a typed value.
        plain: bool,
    },
    /// An empty value, `~` or `null`.
    Null,
}

/// A YAML node with its position.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    /// Its content.
    pub kind: NodeKind,
    /// Where it starts.
    pub location: Location,
}

impl Node {
    /// The entry for `key` when this node is a map.
    pub fn entry(&self, key: &str) -> Option<(&Key, &Node)> {
        match &self.kind {
            NodeKind::Map(entries) => entries.iter().find(|(k, _)| k.text == key).map(|(k, v)| (k, v)),
            _ => None,
        }
    }

    /// The node at `path` below this one.
    pub fn get(&self, path: &[PathSeg]) -> Option<&Node> {
        path.iter().try_fold(self, |node, seg| match (seg, &node.kind) {
            (PathSeg::Key(k), _) => node.entry(k).map(|(_, v)| v),
            (PathSeg::Index(i), NodeKind::Seq(items)) => items.get(*i),
            _ => None,
        })
    }

    /// Location of `path` below this node: a key segment locates the key, an index the item;
    /// when the path leaves the tree, the deepest part that exists. `None` if nothing matches.
    pub fn locate(&self, path: &[PathSeg]) -> Option<Location> {
        let mut node = self;
        let mut found = None;
        for seg in path {
            let (loc, next) = match (seg, &node.kind) {
                (PathSeg::Key(k), _) => match node.entry(k) {
                    Some((key, v)) => (&key.location, v),
                    None => break,
                },
                (PathSeg::Index(i), NodeKind::Seq(items)) => match items.get(*i) {
                    Some(v) => (&v.location, v),
                    None => break,
                },
                _ => break,
            };
            found = Some(loc.clone());
            node = next;
        }
        found
    }

    /// The scalar text, if this is a scalar.
    pub fn as_str(&self) -> Option<&str> {
        match &self.kind {
            NodeKind::Scalar { text, .. } => Some(text),
            _ => None,
        }
    }

    /// Converts to JSON, resolving plain scalars by the YAML 1.2 core schema.
    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::Value;
        match &self.kind {
            NodeKind::Map(entries) => {
                Value::Object(entries.iter().map(|(k, v)| (k.text.clone(), v.to_json())).collect())
            }
            NodeKind::Seq(items) => Value::Array(items.iter().map(Node::to_json).collect()),
            NodeKind::Scalar { text, plain: true } => resolve_plain(text),
            NodeKind::Scalar { text, plain: false } => Value::String(text.clone()),
            NodeKind::Null => Value::Null,
        }
    }

    /// How many nodes this tree holds, and how many bytes of key and scalar text.
    fn size(&self) -> (usize, usize) {
        match &self.kind {
            NodeKind::Map(entries) => entries.iter().fold((1, 0), |(n, b), (k, v)| {
                let (vn, vb) = v.size();
                (n + vn, b + k.text.len() + vb)
            }),
            NodeKind::Seq(items) => items.iter().fold((1, 0), |(n, b), v| {
                let (vn, vb) = v.size();
                (n + vn, b + vb)
            }),
            NodeKind::Scalar { text, .. } => (1, text.len()),
            NodeKind::Null => (1, 0),
        }
    }
}

/// Resolves a plain scalar by the YAML 1.2 core schema.
///
/// JSON has no infinity or NaN: `.inf` becomes `±f64::MAX` and `.nan` stays the string `.nan`.
pub fn resolve_plain(text: &str) -> serde_json::Value {
    use serde_json::Value;
    match text {
        "" | "~" | "null" | "Null" | "NULL" => return Value::Null,
        "true" | "True" | "TRUE" => return Value::Bool(true),
        "false" | "False" | "FALSE" => return Value::Bool(false),
        ".inf" | ".Inf" | ".INF" | "+.inf" | "+.Inf" | "+.INF" => return f64::MAX.into(),
        "-.inf" | "-.Inf" | "-.INF" => return f64::MIN.into(),
        _ => {}
    }
    let radix = |prefix: &str, radix: u32| {
        let digits = text.strip_prefix(prefix)?;
        let ok = !digits.is_empty() && digits.chars().all(|c| c.is_digit(radix));
        if ok { u64::from_str_radix(digits, radix).ok().map(Value::from) } else { None }
    };
    if let Some(v) = radix("0x", 16).or_else(|| radix("0o", 8)) {
        return v;
    }
    let unsigned = text.strip_prefix(['-', '+']).unwrap_or(text);
    let all_digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if all_digits(unsigned) {
        if let Ok(i) = text.parse::<i64>() {
            return i.into();
        }
        if let (false, Ok(u)) = (text.starts_with('-'), unsigned.parse::<u64>()) {
            return u.into();
        }
    }
    if is_core_float(unsigned)
        && let Some(n) = text.parse::<f64>().ok().and_then(serde_json::Number::from_f64)
    {
        return Value::Number(n);
    }
    Value::String(text.to_string())
}

/// Whether `s` (sign removed) matches `( \. [0-9]+ | [0-9]+ ( \. [0-9]* )? ) ( [eE] [-+]? [0-9]+ )?`.
fn is_core_float(s: &str) -> bool {
    let (mantissa, exp) = match s.find(['e', 'E']) {
        Some(i) => (&s[..i], Some(&s[i + 1..])),
        None => (s, None),
    };
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    let mantissa_ok = match mantissa.split_once('.') {
        Some((int, frac)) => digits(int) && digits(frac) && (!int.is_empty() || !frac.is_empty()),
        None => !mantissa.is_empty() && digits(mantissa),
    };
    let exp_ok = exp.is_none_or(|e| {
        let e = e.strip_prefix(['-', '+']).unwrap_or(e);
        !e.is_empty() && digits(e)
    });
    mantissa_ok && exp_ok
}

/// Converts a parser marker (1-based line, 0-based column) to a location.
fn location(file: &Arc<str>, m: &Marker) -> Location {
    Location { file: file.clone(), line: m.line(), column: m.col() + 1 }
}

/// Parses one YAML document. An empty document is `Null`; a second document is an error.
pub fn parse(file: &str, text: &str) -> Result<Node, Vec<ConfigError>> {
    let mut b = Builder {
        file: Arc::from(file),
        parser: Parser::new_from_str(text),
        anchors: HashMap::new(),
        errors: Vec::new(),
        nodes: 0,
        alias_bytes: 0,
    };
    match b.document() {
        Ok(node) if b.errors.is_empty() => Ok(node),
        Ok(_) => Err(b.errors),
        Err(e) => {
            b.errors.push(e);
            Err(b.errors)
        }
    }
}

/// What a secret is replaced with by [`redact`].
pub const REDACTED: &str = "[REDACTED]";

/// Keys whose value is a secret wherever they appear (compared case-insensitively): otelcol's
/// `configopaque` settings (basic auth passwords, bearer tokens, client secrets, PEM keys) and
/// Prometheus' `credentials` / `bearer_token`.
const SECRET_KEYS: [&str; 13] = [
    "password",
    "token",
    "bearer_token",
    "client_secret",
    "secret",
    "api_key",
    "apikey",
    "credentials",
    "key_pem",
    "private_key",
    "authorization",
    "value",
    "default_value",
];

/// Replaces every secret below `node` with [`REDACTED`]: the values of [`SECRET_KEYS`] (`value`
/// and `default_value` only inside `headers`), every value of a `headers` map (otelcol's
/// opaque header values) and the inline `htpasswd` of basicauth.
pub fn redact(node: &mut Node) {
    redact_in(node, false)
}

fn redact_in(node: &mut Node, in_headers: bool) {
    let secret = |n: &mut Node| {
        if !matches!(n.kind, NodeKind::Null) {
            n.kind = NodeKind::Scalar { text: REDACTED.to_string(), plain: false };
        }
    };
    match &mut node.kind {
        NodeKind::Map(entries) => {
            for (k, v) in entries {
                let key = k.text.to_ascii_lowercase();
                let header_values = key == "headers" && matches!(v.kind, NodeKind::Map(_));
                if header_values {
                    if let NodeKind::Map(hs) = &mut v.kind {
                        hs.iter_mut().for_each(|(_, hv)| secret(hv));
                    }
                } else if key == "inline"
                    || (SECRET_KEYS.contains(&key.as_str())
                        && (in_headers || !matches!(key.as_str(), "value" | "default_value")))
                {
                    if matches!(v.kind, NodeKind::Scalar { .. }) {
                        secret(v)
                    } else {
                        redact_in(v, in_headers || key == "headers")
                    }
                } else {
                    redact_in(v, in_headers || key == "headers")
                }
            }
        }
        NodeKind::Seq(items) => items.iter_mut().for_each(|v| redact_in(v, in_headers)),
        NodeKind::Scalar { .. } | NodeKind::Null => {}
    }
}

/// Writes a tree as block-style YAML that loads back to the same configuration: plain scalars
/// stay plain when that keeps their meaning, others are double-quoted, and `$` is written `$$`
/// (the tree is already substituted).
pub fn to_yaml(node: &Node) -> String {
    let mut out = String::new();
    match &node.kind {
        NodeKind::Map(e) if !e.is_empty() => emit_map(e, 0, &mut out),
        NodeKind::Seq(i) if !i.is_empty() => emit_seq(i, 0, &mut out),
        _ => {
            out.push_str(&inline(node));
            out.push('\n');
        }
    }
    out
}

fn emit_map(entries: &[(Key, Node)], indent: usize, out: &mut String) {
    for (k, v) in entries {
        out.push_str(&" ".repeat(indent));
        out.push_str(&scalar_text(&k.text, true));
        out.push(':');
        emit_value(v, indent, out);
    }
}

fn emit_seq(items: &[Node], indent: usize, out: &mut String) {
    for v in items {
        out.push_str(&" ".repeat(indent));
        out.push('-');
        match &v.kind {
            NodeKind::Map(e) if !e.is_empty() => {
                let mut inner = String::new();
                emit_map(e, indent + 2, &mut inner);
                out.push(' ');
                out.push_str(&inner[indent + 2..]);
            }
            NodeKind::Seq(i) if !i.is_empty() => {
                let mut inner = String::new();
                emit_seq(i, indent + 2, &mut inner);
                out.push(' ');
                out.push_str(&inner[indent + 2..]);
            }
            _ => {
                out.push(' ');
                out.push_str(&inline(v));
                out.push('\n');
            }
        }
    }
}

fn emit_value(v: &Node, indent: usize, out: &mut String) {
    match &v.kind {
        NodeKind::Map(e) if !e.is_empty() => {
            out.push('\n');
            emit_map(e, indent + 2, out);
        }
        NodeKind::Seq(i) if !i.is_empty() => {
            out.push('\n');
            emit_seq(i, indent + 2, out);
        }
        NodeKind::Null => out.push('\n'),
        _ => {
            out.push(' ');
            out.push_str(&inline(v));
            out.push('\n');
        }
    }
}

/// A scalar, null or empty collection on one line.
fn inline(v: &Node) -> String {
    match &v.kind {
        NodeKind::Map(_) => "{}".into(),
        NodeKind::Seq(_) => "[]".into(),
        NodeKind::Null => "null".into(),
        NodeKind::Scalar { text, plain } => scalar_text(text, *plain),
    }
}

/// A scalar as written: plain when it was plain and reads back the same, else double-quoted.
fn scalar_text(text: &str, plain: bool) -> String {
    let text = text.replace('$', "$$");
    if plain && plain_safe(&text) { text } else { serde_json::to_string(&text).unwrap_or_else(|_| format!("{text:?}")) }
}

/// Whether `s` can be written as a plain block scalar and read back as the same text.
fn plain_safe(s: &str) -> bool {
    let Some(first) = s.chars().next() else { return false };
    let indicator =
        "?:,[]{}#&*!|>'\"%@`".contains(first) || (first == '-' && (s.len() == 1 || s[1..].starts_with(' ')));
    !indicator
        && s.trim() == s
        && !s.contains(": ")
        && !s.ends_with(':')
        && !s.contains(" #")
        && !s.contains(['\n', '\r', '\t'])
}

/// Turns parser events into a [`Node`] tree.
struct Builder<'a> {
    file: Arc<str>,
    parser: Parser<'a, StrInput<'a>>,
    /// Anchored nodes with their size (nodes, text bytes), so an alias is priced before it is copied.
    anchors: HashMap<usize, (Node, (usize, usize))>,
    /// Non-fatal problems (duplicate keys, bad merges); parsing goes on after them.
    errors: Vec<ConfigError>,
    nodes: usize,
    /// Bytes of text added by alias expansion so far.
    alias_bytes: usize,
}

impl<'a> Builder<'a> {
    fn error(&self, m: &Marker, key: &str, message: impl Into<String>) -> ConfigError {
        ConfigError { location: Some(location(&self.file, m)), key: key.to_string(), message: message.into() }
    }

    fn syntax(&self, e: ScanError, key: &str) -> ConfigError {
        self.error(e.marker(), key, format!("YAML syntax error: {}", e.info()))
    }

    fn next(&mut self, key: &str) -> Result<(Event<'a>, Span), ConfigError> {
        match self.parser.next_event() {
            Some(Ok(ev)) => Ok(ev),
            Some(Err(e)) => Err(self.syntax(e, key)),
            None => Err(self.error(&Marker::new(0, 1, 0), key, "unexpected end of YAML input")),
        }
    }

    fn document(&mut self) -> Result<Node, ConfigError> {
        let mut root = None;
        loop {
            let (ev, span) = self.next("")?;
            match ev {
                Event::StreamStart | Event::DocumentEnd | Event::Nothing => {}
                Event::DocumentStart(_) if root.is_some() => {
                    return Err(self.error(&span.start, "", "only one YAML document per file is supported"));
                }
                Event::DocumentStart(_) => {
                    let (ev, span) = self.next("")?;
                    root = Some(self.node(ev, span, "", 0)?);
                }
                Event::StreamEnd => {
                    let at = Location { file: self.file.clone(), line: 1, column: 1 };
                    return Ok(root.unwrap_or(Node { kind: NodeKind::Null, location: at }));
                }
                _ => return Err(self.error(&span.start, "", "unexpected YAML event")),
            }
        }
    }

    fn count(&mut self, n: usize, at: &Marker, key: &str) -> Result<(), ConfigError> {
        self.nodes += n;
        if self.nodes > MAX_NODES {
            return Err(self.error(at, key, "document too large after alias expansion"));
        }
        Ok(())
    }

    fn node(&mut self, ev: Event<'a>, span: Span, key: &str, depth: usize) -> Result<Node, ConfigError> {
        if depth > MAX_DEPTH {
            return Err(self.error(&span.start, key, "YAML nesting too deep"));
        }
        self.count(1, &span.start, key)?;
        let loc = location(&self.file, &span.start);
        let (kind, anchor) = match ev {
            Event::Alias(id) => {
                let Some(&(_, (nodes, bytes))) = self.anchors.get(&id) else {
                    return Err(self.error(&span.start, key, "unknown anchor"));
                };
                self.count(nodes, &span.start, key)?;
                self.alias_bytes = self.alias_bytes.saturating_add(bytes);
                if self.alias_bytes > MAX_ALIAS_BYTES {
                    return Err(self.error(
                        &span.start,
                        key,
                        format!(
                            "document too large after alias expansion: aliases add more than {} MiB of text",
                            MAX_ALIAS_BYTES >> 20
                        ),
                    ));
                }
                let Some((target, _)) = self.anchors.get(&id) else {
                    return Err(self.error(&span.start, key, "unknown anchor"));
                };
                return Ok(Node { location: loc, ..target.clone() });
            }
            Event::Scalar(text, style, anchor, tag) => {
                let is_str = tag.as_ref().is_some_and(|t| t.is_yaml_core_schema() && t.suffix == "str");
                let plain = style == ScalarStyle::Plain && !is_str;
                let kind = if plain && resolve_plain(&text).is_null() {
                    NodeKind::Null
                } else {
                    NodeKind::Scalar { text: text.into_owned(), plain }
                };
                (kind, anchor)
            }
            Event::SequenceStart(anchor, _) => {
                let mut items = Vec::new();
                loop {
                    let item_key = format!("{key}[{}]", items.len());
                    let (ev, span) = self.next(&item_key)?;
                    if matches!(ev, Event::SequenceEnd) {
                        break;
                    }
                    items.push(self.node(ev, span, &item_key, depth + 1)?);
                }
                (NodeKind::Seq(items), anchor)
            }
            Event::MappingStart(anchor, _) => (NodeKind::Map(self.map(key, depth)?), anchor),
            _ => return Err(self.error(&span.start, key, "unexpected YAML event")),
        };
        let node = Node { kind, location: loc };
        if anchor != 0 {
            let size = node.size();
            self.anchors.insert(anchor, (node.clone(), size));
        }
        Ok(node)
    }

    fn map(&mut self, path: &str, depth: usize) -> Result<Vec<(Key, Node)>, ConfigError> {
        let mut entries: Vec<(Key, Node)> = Vec::new();
        let mut merges: Vec<Node> = Vec::new();
        loop {
            let (ev, span) = self.next(path)?;
            if matches!(ev, Event::MappingEnd) {
                break;
            }
            let is_merge = matches!(&ev, Event::Scalar(t, ScalarStyle::Plain, _, None) if &**t == "<<");
            // A key keeps its text as written, even `null` or `~`.
            let raw = if let Event::Scalar(t, ..) = &ev { Some(t.to_string()) } else { None };
            let key_node = self.node(ev, span, path, depth + 1)?;
            let text = match (raw, key_node.kind) {
                (Some(text), _) | (None, NodeKind::Scalar { text, .. }) => text,
                (None, NodeKind::Null) => String::new(),
                _ => {
                    let e = self.error(&span.start, path, "map keys must be scalars");
                    self.errors.push(e);
                    String::new()
                }
            };
            let child = if path.is_empty() { text.clone() } else { format!("{path}.{text}") };
            let (ev, vspan) = self.next(&child)?;
            let value = self.node(ev, vspan, &child, depth + 1)?;
            if is_merge {
                match value.kind {
                    NodeKind::Map(_) => merges.push(value),
                    NodeKind::Seq(items) if items.iter().all(|i| matches!(i.kind, NodeKind::Map(_))) => {
                        merges.extend(items)
                    }
                    _ => {
                        self.errors.push(self.error(&vspan.start, path, "merge key `<<` needs a map or a list of maps"))
                    }
                }
                continue;
            }
            if let Some((first, _)) = entries.iter().find(|(k, _)| k.text == text) {
                let msg = format!(
                    "duplicate key {text:?} (first at line {}, column {})",
                    first.location.line, first.location.column
                );
                self.errors.push(self.error(&span.start, &child, msg));
                continue;
            }
            entries.push((Key { text, location: key_node.location }, value));
        }
        for source in merges {
            if let NodeKind::Map(src) = source.kind {
                for (k, v) in src {
                    if !entries.iter().any(|(e, _)| e.text == k.text) {
                        entries.push((k, v));
                    }
                }
            }
        }
        Ok(entries)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn at(n: &Node) -> (usize, usize) {
        (n.location.line, n.location.column)
    }

    fn lc(l: &Location) -> (usize, usize) {
        (l.line, l.column)
    }

    fn key(s: &str) -> PathSeg {
        PathSeg::Key(s.into())
    }

    #[test]
    fn positions_are_one_based() {
        let n = parse("f.yaml", "a:\n  b: 1\n  c: [x, \"y\"]\n~: 2\n").unwrap();
        assert_eq!(n.to_json()["~"], 2);
        assert_eq!(lc(&n.locate(&[key("a")]).unwrap()), (1, 1));
        assert_eq!(lc(&n.locate(&[key("a"), key("c")]).unwrap()), (3, 3));
        assert_eq!(lc(&n.locate(&[key("a"), key("c"), PathSeg::Index(1)]).unwrap()), (3, 10));
        // A path that leaves the tree stops at the deepest match.
        assert_eq!(lc(&n.locate(&[key("a"), key("zz"), key("q")]).unwrap()), (1, 1));
        assert_eq!(n.locate(&[key("nope")]), None);
        assert_eq!(at(n.get(&[key("a"), key("b")]).unwrap()), (2, 6));
        assert_eq!(n.locate(&[key("a")]).unwrap().to_string(), "f.yaml:1:1");
    }

    #[test]
    fn core_schema_resolution() {
        let n = parse(
            "f",
            "a: ~\nb:\nc: True\nd: 0x1F\ne: 0o17\nf: -12\ng: 1.5e3\nh: .inf\ni: .nan\nj: '12'\nk: 10s\nl: !!str 7\nm: |\n  x\nn: 1_000\no: 18446744073709551615\np: .5\n",
        )
        .unwrap();
        assert_eq!(
            n.to_json(),
            json!({"a": null, "b": null, "c": true, "d": 31, "e": 15, "f": -12, "g": 1500.0, "h": f64::MAX,
                   "i": ".nan", "j": "12", "k": "10s", "l": "7", "m": "x\n", "n": "1_000",
                   "o": 18446744073709551615u64, "p": 0.5})
        );
        assert_eq!(resolve_plain("-.INF"), json!(f64::MIN));
        for s in ["1.2.3", "e5", ".", "0x", "+", "1e", "inf", "nan", "0b101"] {
            assert_eq!(resolve_plain(s), json!(s), "{s}");
        }
    }

    #[test]
    fn anchors_and_merge_keys() {
        let text = "base: &b\n  x: 1\n  y: 2\nother: &o {z: 3}\nm:\n  <<: [*b, *o]\n  y: 20\nlist: &l [1, 2]\nr: *l\n";
        let n = parse("f", text).unwrap();
        assert_eq!(n.to_json()["m"], json!({"y": 20, "x": 1, "z": 3}));
        assert_eq!(n.to_json()["r"], json!([1, 2]));
        // An alias sits where it is used; keys inside keep the anchor's positions.
        assert_eq!(at(n.get(&[key("r")]).unwrap()), (9, 4));
        assert_eq!(lc(&n.locate(&[key("m"), key("x")]).unwrap()), (2, 3));
        let e = parse("f", "a: &a 1\nb:\n  <<: *a\n").unwrap_err();
        assert_eq!(lc(e[0].location.as_ref().unwrap()), (3, 7));
        assert!(e[0].message.contains("merge key"), "{}", e[0].message);
    }

    #[test]
    fn duplicate_keys_are_all_reported() {
        let e = parse("f.yaml", "a: 1\nb:\n  c: 1\n  c: 2\na: 3\n").unwrap_err();
        assert_eq!(e.len(), 2);
        assert_eq!(e[0].key, "b.c");
        assert_eq!(e[0].location.as_ref().unwrap().to_string(), "f.yaml:4:3");
        assert!(e[0].message.contains("first at line 3, column 3"), "{}", e[0].message);
        assert_eq!(e[1].key, "a");
        assert_eq!(lc(e[1].location.as_ref().unwrap()), (5, 1));
    }

    #[test]
    fn syntax_errors_have_positions() {
        let e = parse("bad.yaml", "a: 1\nb:\n\tc: 2\n").unwrap_err();
        assert_eq!(e[0].location.as_ref().unwrap().to_string(), "bad.yaml:3:2");
        assert!(e[0].message.starts_with("YAML syntax error"), "{}", e[0].message);
        let e = parse("bad.yaml", "a: *nope\n").unwrap_err();
        assert_eq!(lc(e[0].location.as_ref().unwrap()), (1, 4));
        let e = parse("bad.yaml", "a: 1\n---\nb: 2\n").unwrap_err();
        assert_eq!(lc(e[0].location.as_ref().unwrap()), (2, 1));
        let e = parse("bad.yaml", "[a, b]: 1\n").unwrap_err();
        assert_eq!(lc(e[0].location.as_ref().unwrap()), (1, 1));
    }

    #[test]
    fn empty_document_is_null_and_laughs_are_bounded() {
        assert_eq!(parse("f", "# nothing\n").unwrap().kind, NodeKind::Null);
        let mut text = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
        for i in 1..8 {
            let p = i - 1;
            text.push_str(&format!(
                "a{i}: &a{i} [*a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}]\n"
            ));
        }
        let e = parse("f", &text).unwrap_err();
        assert!(e[0].message.contains("too large"), "{}", e[0].message);
    }

    #[test]
    fn alias_text_is_budgeted_in_bytes() {
        // A 1 MiB scalar aliased 4,000 times: few nodes, 4 GiB of text. Refused at the alias
        // that crosses the budget, with its position, before the copies are made.
        let big = "x".repeat(1 << 20);
        let mut text = format!("a: &big {big}\nlist:\n");
        for _ in 0..4000 {
            text.push_str("  - *big\n");
        }
        let t0 = std::time::Instant::now();
        let e = parse("bomb.yaml", &text).unwrap_err();
        assert!(t0.elapsed() < std::time::Duration::from_secs(2), "{:?}", t0.elapsed());
        assert!(e[0].message.contains("MiB of text"), "{}", e[0].message);
        // The 17th alias crosses 16 MiB: line 2 + 17.
        assert_eq!(lc(e[0].location.as_ref().unwrap()), (19, 5));
        assert_eq!(e[0].location.as_ref().unwrap().file.as_ref(), "bomb.yaml");
        // Under the budget is fine.
        let mut ok = format!("a: &big {}\nlist:\n", "y".repeat(1 << 16));
        for _ in 0..200 {
            ok.push_str("  - *big\n");
        }
        assert!(parse("f", &ok).is_ok());
    }
}

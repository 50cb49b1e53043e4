//! `${env:VAR}` substitution in scalar values, with the OpenTelemetry Collector's syntax.
//!
//! `${env:VAR}`, `${env:VAR:-default}` and the short `${VAR}` (also `${VAR:-default}`) are
//! replaced; `$$` stands for one `$`; a `$` followed by anything else is kept. A default applies
//! only when the variable is unset. A plain scalar that is exactly one reference is re-resolved
//! as a YAML scalar (`port: ${env:P}` may become an int); any other result is a string.

use super::ConfigError;
use super::yaml::{Node, NodeKind, resolve_plain};

/// Looks up an environment variable.
pub(super) type Env<'a> = &'a dyn Fn(&str) -> Option<String>;

/// Substitutes every scalar value below `node` (keys are left alone); `key` is its dotted path.
pub(super) fn substitute(node: &mut Node, key: &str, env: Env<'_>, errors: &mut Vec<ConfigError>) {
    match &mut node.kind {
        NodeKind::Map(entries) => {
            for (k, v) in entries {
                let child = if key.is_empty() { k.text.clone() } else { format!("{key}.{}", k.text) };
                substitute(v, &child, env, errors);
            }
        }
        NodeKind::Seq(items) => {
            for (i, v) in items.iter_mut().enumerate() {
                substitute(v, &format!("{key}[{i}]"), env, errors);
            }
        }
        NodeKind::Scalar { text, plain } if text.contains('$') => match expand(text, env) {
            Ok((out, whole)) => {
                let plain = *plain && whole;
                node.kind = if plain && resolve_plain(&out).is_null() {
                    NodeKind::Null
                } else {
                    NodeKind::Scalar { text: out, plain }
                };
            }
            Err(message) => {
                errors.push(ConfigError { location: Some(node.location.clone()), key: key.to_string(), message })
            }
        },
        NodeKind::Scalar { .. } | NodeKind::Null => {}
    }
}

/// Expands `s`; returns the text and whether `s` was exactly one reference.
fn expand(s: &str, env: Env<'_>) -> Result<(String, bool), String> {
    let (mut out, mut rest, mut refs, mut literal) = (String::new(), s, 0, false);
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        literal |= i > 0;
        let after = &rest[i + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            literal = true;
            rest = tail;
        } else if let Some(body) = after.strip_prefix('{') {
            let end =
                body.find('}').ok_or_else(|| format!("unterminated \"${{\" in {s:?} (write $$ for a literal $)"))?;
            out.push_str(&lookup(&body[..end], env)?);
            refs += 1;
            rest = &body[end + 1..];
        } else {
            out.push('$');
            literal = true;
            rest = after;
        }
    }
    out.push_str(rest);
    Ok((out, refs == 1 && !literal && rest.is_empty()))
}

/// Resolves the inside of one `${...}`.
fn lookup(inner: &str, env: Env<'_>) -> Result<String, String> {
    let body = inner.strip_prefix("env:").unwrap_or(inner);
    let (name, default) = match body.split_once(":-") {
        Some((n, d)) => (n, Some(d)),
        None => (body, None),
    };
    if !valid_name(name) {
        if let Some((scheme, _)) = inner.split_once(':').filter(|(s, _)| *s != "env" && valid_name(s)) {
            return Err(format!("unsupported config provider {scheme:?} in \"${{{inner}}}\" (only env is supported)"));
        }
        return Err(format!("invalid environment variable name {name:?} in \"${{{inner}}}\""));
    }
    match (env(name), default) {
        (Some(v), _) => Ok(v),
        (None, Some(d)) => Ok(d.to_string()),
        (None, None) => Err(format!(
            "environment variable {name} is not set (referenced as \"${{{inner}}}\"; give a default with ${{env:{name}:-value}})"
        )),
    }
}

/// Whether `s` is a valid environment variable name: `[A-Za-z_][A-Za-z0-9_]*`.
fn valid_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::yaml::parse;
    use serde_json::json;

    fn env(k: &str) -> Option<String> {
        match k {
            "PORT" => Some("4317".into()),
            "HOST" => Some("tempo".into()),
            "EMPTY" => Some(String::new()),
            "FLAG" => Some("true".into()),
            _ => None,
        }
    }

    fn run(text: &str) -> Result<serde_json::Value, Vec<ConfigError>> {
        let mut node = parse("f.yaml", text).unwrap();
        let mut errors = Vec::new();
        substitute(&mut node, "", &env, &mut errors);
        if errors.is_empty() { Ok(node.to_json()) } else { Err(errors) }
    }

    #[test]
    fn substitutes_values() {
        let v = run(concat!(
            "a: ${env:PORT}\n",
            "b: ${PORT}\n",
            "c: ${env:HOST}:${env:PORT}\n",
            "d: \"${env:PORT}\"\n",
            "e: ${env:NOPE:-8080}\n",
            "f: ${env:NOPE:-}\n",
            "g: $${env:PORT}\n",
            "h: a$$b$c\n",
            "i:\n  - ${FLAG}\n  - x${FLAG}\n",
            "j: ${env:EMPTY:-default}\n",
            "k: ${NOPE:-a:-b}\n",
            "${PORT}: key\n",
        ))
        .unwrap();
        assert_eq!(
            v,
            json!({"a": 4317, "b": 4317, "c": "tempo:4317", "d": "4317", "e": 8080, "f": null,
                   "g": "${env:PORT}", "h": "a$b$c", "i": [true, "xtrue"], "j": null, "k": "a:-b", "${PORT}": "key"})
        );
    }

    #[test]
    fn errors_name_the_variable_and_the_scalar() {
        let e = run("a:\n  b: [x, \"pre-${env:MISSING}\"]\n  c: ${env:1BAD}\n  d: ${file:/etc/x}\n  e: ${env:PORT\n")
            .unwrap_err();
        assert_eq!(e.len(), 4);
        assert_eq!(
            (e[0].key.as_str(), e[0].location.as_ref().unwrap().to_string().as_str()),
            ("a.b[1]", "f.yaml:2:10")
        );
        assert!(e[0].message.contains("MISSING is not set"), "{}", e[0].message);
        assert_eq!((e[1].key.as_str(), e[1].location.as_ref().map(|l| (l.line, l.column))), ("a.c", Some((3, 6))));
        assert!(e[1].message.contains("invalid environment variable name \"1BAD\""), "{}", e[1].message);
        assert!(e[2].message.contains("unsupported config provider \"file\""), "{}", e[2].message);
        assert_eq!(e[2].location.as_ref().map(|l| (l.line, l.column)), Some((4, 6)));
        assert!(e[3].message.contains("unterminated"), "{}", e[3].message);
        assert_eq!(e[3].location.as_ref().map(|l| (l.line, l.column)), Some((5, 6)));
    }
}

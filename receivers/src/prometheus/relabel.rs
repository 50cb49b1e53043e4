//! Prometheus relabeling (`relabel_configs` on targets, `metric_relabel_configs` on samples),
//! with Prometheus 3's semantics (`model/relabel/relabel.go`): the regex is fully anchored
//! (`^(?s:<regex>)$`, so `.` matches a newline), `source_labels` are joined with `separator`
//! (default `;`), missing labels read as empty, a label set to the empty string is removed,
//! `replacement` (default `$1`) and a `replace` `target_label` are expanded as Go's
//! `Regexp.Expand` does (`$1`, `${1}`, `$name`, `${name}`, `$$`; an unknown or unmatched group is
//! empty; `$1x` is the group named `1x`), and label names are UTF-8 (any non-empty string).

use super::parse::{Exposition, Family, Kind, Label, Suffix};
use md5::{Digest, Md5};
use serde::Deserialize;
use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};

/// A label set, sorted by name (as Prometheus' `labels.Labels`).
pub type LabelSet = BTreeMap<String, String>;

/// A relabel action.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Sets `target_label` to the expanded `replacement` when the regex matches.
    Replace,
    /// Drops the set unless the regex matches.
    Keep,
    /// Drops the set when the regex matches.
    Drop,
    /// Drops the set unless `target_label`'s value equals the joined source values.
    KeepEqual,
    /// Drops the set when `target_label`'s value equals the joined source values.
    DropEqual,
    /// Sets `target_label` to the MD5 of the joined values modulo `modulus`.
    HashMod,
    /// Copies labels whose name matches to the expanded `replacement` name.
    LabelMap,
    /// Removes labels whose name matches.
    LabelDrop,
    /// Removes labels whose name does not match.
    LabelKeep,
    /// Sets `target_label` to the joined values in lower case.
    Lowercase,
    /// Sets `target_label` to the joined values in upper case.
    Uppercase,
}

impl Action {
    fn parse(s: &str) -> Option<Action> {
        Some(match s.to_ascii_lowercase().as_str() {
            "replace" => Action::Replace,
            "keep" => Action::Keep,
            "drop" => Action::Drop,
            "keepequal" => Action::KeepEqual,
            "dropequal" => Action::DropEqual,
            "hashmod" => Action::HashMod,
            "labelmap" => Action::LabelMap,
            "labeldrop" => Action::LabelDrop,
            "labelkeep" => Action::LabelKeep,
            "lowercase" => Action::Lowercase,
            "uppercase" => Action::Uppercase,
            _ => return None,
        })
    }

    fn name(self) -> &'static str {
        match self {
            Action::Replace => "replace",
            Action::Keep => "keep",
            Action::Drop => "drop",
            Action::KeepEqual => "keepequal",
            Action::DropEqual => "dropequal",
            Action::HashMod => "hashmod",
            Action::LabelMap => "labelmap",
            Action::LabelDrop => "labeldrop",
            Action::LabelKeep => "labelkeep",
            Action::Lowercase => "lowercase",
            Action::Uppercase => "uppercase",
        }
    }
}

/// Deserializes a field that may be `null` (kept apart from absent).
fn nullable<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Option<String>>, D::Error> {
    Option::<String>::deserialize(d).map(Some)
}

/// One `relabel_config` as written (Prometheus' names).
#[derive(Debug, Clone, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct RelabelConfig {
    /// Labels whose values are joined.
    #[serde(default)]
    pub source_labels: Option<Vec<String>>,
    /// Joins the source values (default `;`).
    #[serde(default)]
    pub separator: Option<String>,
    /// Matched against the joined value, anchored (default `(.*)`; `null` is the empty regex).
    #[serde(default, deserialize_with = "nullable")]
    pub regex: Option<Option<String>>,
    /// `hashmod`'s modulus.
    #[serde(default)]
    pub modulus: Option<u64>,
    /// The label written.
    #[serde(default)]
    pub target_label: Option<String>,
    /// What is written (default `$1`).
    #[serde(default)]
    pub replacement: Option<String>,
    /// The action (default `replace`).
    #[serde(default)]
    pub action: Option<String>,
}

/// Why a relabel config is refused: the field and the message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleError {
    /// The offending field (`regex`, `action`, `target_label`, ...).
    pub field: &'static str,
    /// What is wrong.
    pub message: String,
}

/// A checked relabel rule.
#[derive(Debug, Clone)]
pub struct Rule {
    action: Action,
    source_labels: Vec<String>,
    separator: String,
    regex: regex::Regex,
    default_regex: bool,
    modulus: u64,
    target_label: String,
    replacement: String,
}

impl PartialEq for Rule {
    fn eq(&self, o: &Rule) -> bool {
        self.action == o.action
            && self.source_labels == o.source_labels
            && self.separator == o.separator
            && self.regex.as_str() == o.regex.as_str()
            && self.modulus == o.modulus
            && self.target_label == o.target_label
            && self.replacement == o.replacement
    }
}

const DEFAULT_REGEX: &str = "(.*)";
const DEFAULT_REPLACEMENT: &str = "$1";
const DEFAULT_SEPARATOR: &str = ";";
/// Largest compiled regex (bytes of the automaton), so a config cannot take the agent's memory.
const REGEX_SIZE_LIMIT: usize = 1 << 20;

/// Compiles `s` fully anchored, as Prometheus does.
pub fn anchored(s: &str) -> Result<regex::Regex, String> {
    regex::RegexBuilder::new(&format!("^(?s:{s})$"))
        .size_limit(REGEX_SIZE_LIMIT)
        .build()
        .map_err(|e| format!("invalid regex {s:?}: {e}"))
}

impl RelabelConfig {
    /// Checks the config as Prometheus' `Config.Validate` does and compiles it.
    pub fn compile(&self) -> Result<Rule, RuleError> {
        let err = |field, message: String| RuleError { field, message };
        let action = match &self.action {
            None => Action::Replace,
            Some(a) => Action::parse(a).ok_or_else(|| {
                err(
                    "action",
                    format!(
                        "unknown relabel action {a:?} (replace, keep, drop, keepequal, dropequal, hashmod, \
                         labelmap, labeldrop, labelkeep, lowercase, uppercase)"
                    ),
                )
            })?,
        };
        let regex_text = match &self.regex {
            None => DEFAULT_REGEX,
            Some(None) => "",
            Some(Some(r)) => r.as_str(),
        };
        let regex = anchored(regex_text).map_err(|m| err("regex", m))?;
        let separator = self.separator.clone().unwrap_or_else(|| DEFAULT_SEPARATOR.into());
        let replacement = self.replacement.clone().unwrap_or_else(|| DEFAULT_REPLACEMENT.into());
        let target_label = self.target_label.clone().unwrap_or_default();
        let modulus = self.modulus.unwrap_or(0);
        let name = action.name();
        if action == Action::HashMod && modulus == 0 {
            return Err(err("modulus", "relabel configuration for hashmod requires non-zero modulus".into()));
        }
        let needs_target = matches!(
            action,
            Action::Replace
                | Action::HashMod
                | Action::Lowercase
                | Action::Uppercase
                | Action::KeepEqual
                | Action::DropEqual
        );
        if needs_target && target_label.is_empty() {
            return Err(err(
                "target_label",
                format!("relabel configuration for {name} action requires 'target_label' value"),
            ));
        }
        let no_replacement =
            matches!(action, Action::Lowercase | Action::Uppercase | Action::KeepEqual | Action::DropEqual);
        if no_replacement && replacement != DEFAULT_REPLACEMENT {
            return Err(err("replacement", format!("'replacement' can not be set for {name} action")));
        }
        if matches!(action, Action::KeepEqual | Action::DropEqual)
            && (regex_text != DEFAULT_REGEX || modulus != 0 || separator != DEFAULT_SEPARATOR)
        {
            let field = if regex_text != DEFAULT_REGEX {
                "regex"
            } else if modulus != 0 {
                "modulus"
            } else {
                "separator"
            };
            return Err(err(
                field,
                format!("{name} action requires only 'source_labels' and 'target_label', and no other fields"),
            ));
        }
        if matches!(action, Action::LabelDrop | Action::LabelKeep) {
            let field = if self.source_labels.is_some() {
                Some("source_labels")
            } else if !target_label.is_empty() {
                Some("target_label")
            } else if modulus != 0 {
                Some("modulus")
            } else if separator != DEFAULT_SEPARATOR {
                Some("separator")
            } else if replacement != DEFAULT_REPLACEMENT {
                Some("replacement")
            } else {
                None
            };
            if let Some(field) = field {
                return Err(err(field, format!("{name} action requires only 'regex', and no other fields")));
            }
        }
        Ok(Rule {
            action,
            source_labels: self.source_labels.clone().unwrap_or_default(),
            separator,
            default_regex: regex_text == DEFAULT_REGEX,
            regex,
            modulus,
            target_label,
            replacement,
        })
    }
}

/// Go's `Regexp.Expand`: `template` with `$n`, `${n}`, `$name`, `${name}` and `$$` replaced from
/// the match of `re` on `src`.
fn expand(re: &regex::Regex, caps: &regex::Captures<'_>, template: &str) -> String {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        rest = &rest[i..];
        if rest[1..].starts_with('$') {
            out.push('$');
            rest = &rest[2..];
            continue;
        }
        match extract(rest) {
            None => {
                out.push('$');
                rest = &rest[1..];
            }
            Some((name, after)) => {
                rest = after;
                let group = match group_number(name) {
                    Some(n) => caps.get(n),
                    None => re.capture_names().position(|c| c == Some(name)).and_then(|i| caps.get(i)),
                };
                if let Some(m) = group {
                    out.push_str(m.as_str());
                }
            }
        }
    }
    out.push_str(rest);
    out
}

/// `$name` / `${name}` at the start of `s` (which starts with `$`): the name and what follows.
fn extract(s: &str) -> Option<(&str, &str)> {
    let body = s.strip_prefix('$')?;
    let (brace, body) = match body.strip_prefix('{') {
        Some(b) => (true, b),
        None => (false, body),
    };
    let end = body.char_indices().find(|&(_, c)| !(c.is_alphanumeric() || c == '_')).map_or(body.len(), |(i, _)| i);
    if end == 0 {
        return None;
    }
    let name = &body[..end];
    let after = &body[end..];
    if brace {
        let after = after.strip_prefix('}')?;
        return Some((name, after));
    }
    Some((name, after))
}

/// A purely numeric name without a leading zero (Go's rule), as a group index.
fn group_number(name: &str) -> Option<usize> {
    if !name.bytes().all(|b| b.is_ascii_digit()) || (name.len() > 1 && name.starts_with('0')) {
        return None;
    }
    name.parse::<usize>().ok().filter(|&n| n < 100_000_000)
}

/// Sets a label; the empty value removes it (as Prometheus' `labels.Builder.Set`).
fn set(labels: &mut LabelSet, name: &str, value: String) {
    if value.is_empty() {
        labels.remove(name);
    } else {
        labels.insert(name.to_string(), value);
    }
}

impl Rule {
    /// Applies the rule; false when the label set is dropped.
    pub fn apply(&self, labels: &mut LabelSet) -> bool {
        let val = self
            .source_labels
            .iter()
            .map(|n| labels.get(n).map_or("", String::as_str))
            .collect::<Vec<_>>()
            .join(&self.separator);
        match self.action {
            Action::Drop => return !self.regex.is_match(&val),
            Action::Keep => return self.regex.is_match(&val),
            Action::DropEqual => return labels.get(&self.target_label).map_or("", String::as_str) != val,
            Action::KeepEqual => return labels.get(&self.target_label).map_or("", String::as_str) == val,
            Action::Replace => {
                if val.is_empty()
                    && self.default_regex
                    && !self.target_label.contains('$')
                    && !self.replacement.contains('$')
                {
                    set(labels, &self.target_label, self.replacement.clone());
                    return true;
                }
                let Some(caps) = self.regex.captures(&val) else { return true };
                let target = expand(&self.regex, &caps, &self.target_label);
                if target.is_empty() {
                    return true;
                }
                let res = expand(&self.regex, &caps, &self.replacement);
                set(labels, &target, res);
            }
            Action::Lowercase => set(labels, &self.target_label, val.to_lowercase()),
            Action::Uppercase => set(labels, &self.target_label, val.to_uppercase()),
            Action::HashMod => {
                let hash = Md5::digest(val.as_bytes());
                let mut last = [0u8; 8];
                last.copy_from_slice(&hash[8..16]);
                let m = u64::from_be_bytes(last) % self.modulus;
                set(labels, &self.target_label, m.to_string());
            }
            Action::LabelMap => {
                let snapshot: Vec<(String, String)> = labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
                for (name, value) in snapshot {
                    if let Some(caps) = self.regex.captures(&name) {
                        let to = expand(&self.regex, &caps, &self.replacement);
                        if !to.is_empty() {
                            set(labels, &to, value);
                        }
                    }
                }
            }
            Action::LabelDrop => labels.retain(|k, _| !self.regex.is_match(k)),
            Action::LabelKeep => labels.retain(|k, _| self.regex.is_match(k)),
        }
        true
    }
}

/// Applies `rules` in order; false when the label set is dropped.
pub fn process(labels: &mut LabelSet, rules: &[Rule]) -> bool {
    rules.iter().all(|r| r.apply(labels))
}

/// A bound as Prometheus writes it in `le` / `quantile`.
fn format_bound(v: f64) -> String {
    if v == f64::INFINITY {
        "+Inf".into()
    } else if v == f64::NEG_INFINITY {
        "-Inf".into()
    } else if v.is_nan() {
        "NaN".into()
    } else {
        format!("{v}")
    }
}

/// `metric_relabel_configs` on a parsed scrape: each sample's labels, with `__name__` (the full
/// sample name, e.g. `x_bucket`) and `le` / `quantile`, go through `rules`. Dropped samples
/// are removed; a renamed sample moves to the family of its new name (the same type when the
/// new name keeps the sample's suffix, else an untyped family). Returns how many samples were
/// dropped.
pub fn relabel_exposition(expo: &mut Exposition<'_>, rules: &[Rule]) -> usize {
    if rules.is_empty() {
        return 0;
    }
    let mut dropped = 0;
    let mut out: Vec<Family<'_>> = Vec::with_capacity(expo.families.len());
    let mut index: HashMap<(String, bool), usize> = HashMap::new();
    for mut family in std::mem::take(&mut expo.families) {
        let samples = std::mem::take(&mut family.samples);
        let original = family.name.to_string();
        for mut s in samples {
            let full = format!("{original}{}", s.suffix.as_str());
            let bound_label = match (s.bound, s.suffix) {
                (Some(_), Suffix::Bucket) => Some("le"),
                (Some(_), _) => Some("quantile"),
                (None, _) => None,
            };
            let mut set: LabelSet = s.labels.iter().map(|l| (l.name.to_string(), l.value.to_string())).collect();
            set.insert("__name__".into(), full.clone());
            if let (Some(b), Some(name)) = (s.bound, bound_label) {
                set.insert(name.into(), format_bound(b));
            }
            if !process(&mut set, rules) {
                dropped += 1;
                continue;
            }
            let Some(new_name) = set.remove("__name__") else {
                dropped += 1;
                continue;
            };
            if let Some(name) = bound_label
                && let Some(b) = set.remove(name).and_then(|v| parse_bound(&v))
            {
                s.bound = Some(b);
            }
            s.labels = set.into_iter().map(|(k, v)| Label { name: Cow::Owned(k), value: Cow::Owned(v) }).collect();
            let (fname, keeps_type) = if new_name == full {
                (original.clone(), true)
            } else if s.suffix != Suffix::None
                && new_name.ends_with(s.suffix.as_str())
                && new_name.len() > s.suffix.as_str().len()
            {
                (new_name[..new_name.len() - s.suffix.as_str().len()].to_string(), true)
            } else if s.suffix == Suffix::None {
                (new_name, true)
            } else {
                s.suffix = Suffix::None;
                s.bound = None;
                (new_name, false)
            };
            let key = (fname.clone(), keeps_type);
            let i = match index.get(&key) {
                Some(&i) => i,
                None => {
                    let mut f = family.clone();
                    f.name = Cow::Owned(fname);
                    if !keeps_type {
                        f.kind = Kind::Unknown;
                    }
                    out.push(f);
                    index.insert(key, out.len() - 1);
                    out.len() - 1
                }
            };
            out[i].samples.push(s);
        }
    }
    out.retain(|f| !f.samples.is_empty());
    expo.families = out;
    dropped
}

fn parse_bound(v: &str) -> Option<f64> {
    match v {
        "+Inf" | "Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        _ => v.parse().ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expand_follows_go() {
        let re = anchored("(?P<a>x)(y)?").unwrap();
        let caps = re.captures("x").unwrap();
        assert_eq!(expand(&re, &caps, "$1-${a}-$2-$$-${-$a_"), "x-x--$-${-");
        assert_eq!(expand(&re, &caps, "$1x"), "", "$1x is the group named 1x");
        assert_eq!(expand(&re, &caps, "$01"), "", "a leading zero makes a name");
        assert_eq!(expand(&re, &caps, "${1}x"), "xx");
    }

    #[test]
    fn anchoring_is_full() {
        let re = anchored("b").unwrap();
        assert!(!re.is_match("abc"));
        assert!(anchored("a|b").unwrap().is_match("b"));
        assert!(anchored("a.*b").unwrap().is_match("a\nb"));
    }
}

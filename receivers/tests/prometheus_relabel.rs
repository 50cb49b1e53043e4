//! Relabel semantics against a table of cases whose expected results are Prometheus' own:
//! the cases of `TestRelabel` in prometheus/prometheus `model/relabel/relabel_test.go`
//! (Prometheus 3, UTF-8 label names), plus its documented defaults (`separator: ;`,
//! `regex: (.*)`, `replacement: $1`, `action: replace`) and `Config.Validate`'s refusals.

use inferwatch_receivers::prometheus::relabel::{LabelSet, RelabelConfig, process};
use serde_json::json;

fn labels(pairs: &[(&str, &str)]) -> LabelSet {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

/// Applies the rules (JSON, Prometheus' names) to `input`: `None` when dropped.
fn run(input: &[(&str, &str)], rules: serde_json::Value) -> Option<LabelSet> {
    let raw: Vec<RelabelConfig> = serde_json::from_value(rules).unwrap();
    let rules: Vec<_> = raw.iter().map(|r| r.compile().unwrap()).collect();
    let mut l = labels(input);
    process(&mut l, &rules).then_some(l)
}

/// (name, input labels, rules, output labels or `None` when dropped).
type Case<'a> = (&'a str, Vec<(&'a str, &'a str)>, serde_json::Value, Option<Vec<(&'a str, &'a str)>>);

#[test]
fn prometheus_relabel_test_cases() {
    let abc = [("a", "foo"), ("b", "bar"), ("c", "baz")];
    let cases: Vec<Case<'_>> = vec![
        (
            "replace with ${1}",
            abc.to_vec(),
            json!([{"source_labels": ["a"], "regex": "f(.*)", "target_label": "d", "replacement": "ch${1}-ch${1}"}]),
            Some(vec![("a", "foo"), ("b", "bar"), ("c", "baz"), ("d", "choo-choo")]),
        ),
        (
            "two sources, two rules",
            abc.to_vec(),
            json!([{"source_labels": ["a", "b"], "regex": "f(.*);(.*)r", "target_label": "a", "replacement": "b${1}${2}m"},
                {"source_labels": ["c", "a"], "regex": "(b).*b(.*)ba(.*)", "target_label": "d", "replacement": "$1$2$2$3"}]),
            Some(vec![("a", "boobam"), ("b", "bar"), ("c", "baz"), ("d", "boooom")]),
        ),
        (
            "drop stops the rules",
            vec![("a", "foo")],
            json!([{"source_labels": ["a"], "regex": ".*o.*", "action": "drop"},
                {"source_labels": ["a"], "regex": "f(.*)", "target_label": "d", "replacement": "ch$1-ch$1"}]),
            None,
        ),
        (
            "group inside",
            vec![("a", "abc")],
            json!([{"source_labels": ["a"], "regex": ".*(b).*", "target_label": "d"}]),
            Some(vec![("a", "abc"), ("d", "b")]),
        ),
        (
            "drop without match keeps",
            vec![("a", "foo")],
            json!([{"source_labels": ["a"], "regex": "no-match", "action": "drop"}]),
            Some(vec![("a", "foo")]),
        ),
        (
            "the regex is anchored",
            vec![("a", "foo")],
            json!([{"source_labels": ["a"], "regex": "f|o", "action": "drop"}]),
            Some(vec![("a", "foo")]),
        ),
        (
            "keep without match drops",
            vec![("a", "foo")],
            json!([{"source_labels": ["a"], "regex": "no-match", "action": "keep"}]),
            None,
        ),
        (
            "keep with match",
            vec![("a", "foo")],
            json!([{"source_labels": ["a"], "regex": "f.*", "action": "keep"}]),
            Some(vec![("a", "foo")]),
        ),
        (
            "no match, no replacement",
            vec![("a", "boo")],
            json!([{"source_labels": ["a"], "regex": "f", "target_label": "b", "replacement": "bar"}]),
            Some(vec![("a", "boo")]),
        ),
        (
            "blank replacement deletes",
            vec![("a", "foo"), ("f", "baz")],
            json!([{"source_labels": ["a"], "regex": "(f).*", "target_label": "$1", "replacement": "$2"}]),
            Some(vec![("a", "foo")]),
        ),
        (
            "hashmod",
            abc.to_vec(),
            json!([{"source_labels": ["c"], "target_label": "d", "action": "hashmod", "modulus": 1000}]),
            Some(vec![("a", "foo"), ("b", "bar"), ("c", "baz"), ("d", "976")]),
        ),
        (
            "hashmod of a newline",
            vec![("a", "foo\nbar")],
            json!([{"source_labels": ["a"], "target_label": "b", "action": "hashmod", "modulus": 1000}]),
            Some(vec![("a", "foo\nbar"), ("b", "734")]),
        ),
        (
            "labelmap",
            vec![("a", "foo"), ("b1", "bar"), ("b2", "baz")],
            json!([{"regex": "(b.*)", "replacement": "bar_${1}", "action": "labelmap"}]),
            Some(vec![("a", "foo"), ("b1", "bar"), ("b2", "baz"), ("bar_b1", "bar"), ("bar_b2", "baz")]),
        ),
        (
            "labelmap of __meta",
            vec![("a", "foo"), ("__meta_my_bar", "aaa"), ("__meta_my_baz", "bbb"), ("__meta_other", "ccc")],
            json!([{"regex": "__meta_(my.*)", "replacement": "${1}", "action": "labelmap"}]),
            Some(vec![
                ("a", "foo"),
                ("__meta_my_bar", "aaa"),
                ("__meta_my_baz", "bbb"),
                ("__meta_other", "ccc"),
                ("my_bar", "aaa"),
                ("my_baz", "bbb"),
            ]),
        ),
        (
            "target from a group",
            vec![("a", "some-name-value")],
            json!([{"source_labels": ["a"], "regex": "some-([^-]+)-([^,]+)", "replacement": "${2}", "target_label": "${1}"}]),
            Some(vec![("a", "some-name-value"), ("name", "value")]),
        ),
        (
            "missing group in the replacement",
            vec![("a", "some-name-value")],
            json!([{"source_labels": ["a"], "regex": "some-([^-]+)-([^,]+)", "replacement": "${3}", "target_label": "${1}"}]),
            Some(vec![("a", "some-name-value")]),
        ),
        (
            "missing group in the target",
            vec![("a", "some-name-0")],
            json!([{"source_labels": ["a"], "regex": "some-([^-]+)-([^,]+)", "replacement": "${1}", "target_label": "${3}"},
                {"source_labels": ["a"], "regex": "some-([^-]+)(-[^,]+)", "replacement": "${1}", "target_label": "${3}"}]),
            Some(vec![("a", "some-name-0")]),
        ),
        (
            "real-life tags",
            vec![("__meta_sd_tags", "path:/secret,job:some-job,label:foo=bar")],
            json!([{"source_labels": ["__meta_sd_tags"], "regex": "(?:.+,|^)path:(/[^,]+).*", "replacement": "${1}", "target_label": "__metrics_path__"},
                {"source_labels": ["__meta_sd_tags"], "regex": "(?:.+,|^)job:([^,]+).*", "replacement": "${1}", "target_label": "job"},
                {"source_labels": ["__meta_sd_tags"], "regex": "(?:.+,|^)label:([^=]+)=([^,]+).*", "replacement": "${2}", "target_label": "${1}"}]),
            Some(vec![
                ("__meta_sd_tags", "path:/secret,job:some-job,label:foo=bar"),
                ("__metrics_path__", "/secret"),
                ("job", "some-job"),
                ("foo", "bar"),
            ]),
        ),
        (
            "issue 12283",
            vec![
                ("__meta_kubernetes_pod_container_port_name", "foo"),
                ("__meta_kubernetes_pod_annotation_XXX_metrics_port", "9091"),
            ],
            json!([{"regex": "^__meta_kubernetes_pod_container_port_name$", "action": "labeldrop"},
                {"source_labels": ["__meta_kubernetes_pod_annotation_XXX_metrics_port"], "regex": "(.+)", "replacement": "metrics", "target_label": "__meta_kubernetes_pod_container_port_name"},
                {"source_labels": ["__meta_kubernetes_pod_container_port_name"], "regex": "^metrics$", "action": "keep"}]),
            Some(vec![
                ("__meta_kubernetes_pod_annotation_XXX_metrics_port", "9091"),
                ("__meta_kubernetes_pod_container_port_name", "metrics"),
            ]),
        ),
        (
            "labelkeep",
            vec![("a", "foo"), ("b1", "bar"), ("b2", "baz")],
            json!([{"regex": "(b.*)", "action": "labelkeep"}]),
            Some(vec![("b1", "bar"), ("b2", "baz")]),
        ),
        (
            "labeldrop",
            vec![("a", "foo"), ("b1", "bar"), ("b2", "baz")],
            json!([{"regex": "(b.*)", "action": "labeldrop"}]),
            Some(vec![("a", "foo")]),
        ),
        (
            "upper and lower case",
            vec![("foo", "bAr123Foo")],
            json!([{"source_labels": ["foo"], "action": "uppercase", "target_label": "foo_uppercase"},
                {"source_labels": ["foo"], "action": "lowercase", "target_label": "foo_lowercase"}]),
            Some(vec![("foo", "bAr123Foo"), ("foo_lowercase", "bar123foo"), ("foo_uppercase", "BAR123FOO")]),
        ),
        (
            "keepequal keeps",
            vec![("__tmp_port", "1234"), ("__port1", "1234"), ("__port2", "5678")],
            json!([{"source_labels": ["__tmp_port"], "action": "keepequal", "target_label": "__port1"}]),
            Some(vec![("__tmp_port", "1234"), ("__port1", "1234"), ("__port2", "5678")]),
        ),
        (
            "dropequal drops",
            vec![("__tmp_port", "1234"), ("__port1", "1234"), ("__port2", "5678")],
            json!([{"source_labels": ["__tmp_port"], "action": "dropequal", "target_label": "__port1"}]),
            None,
        ),
        (
            "dropequal keeps",
            vec![("__tmp_port", "1234"), ("__port1", "1234"), ("__port2", "5678")],
            json!([{"source_labels": ["__tmp_port"], "action": "dropequal", "target_label": "__port2"}]),
            Some(vec![("__tmp_port", "1234"), ("__port1", "1234"), ("__port2", "5678")]),
        ),
        (
            "keepequal drops",
            vec![("__tmp_port", "1234"), ("__port1", "1234"), ("__port2", "5678")],
            json!([{"source_labels": ["__tmp_port"], "action": "keepequal", "target_label": "__port2"}]),
            None,
        ),
        (
            "dot matches a newline",
            vec![("a", "line1\nline2"), ("b", "bar"), ("c", "baz")],
            json!([{"source_labels": ["a"], "regex": "line1.*line2", "target_label": "d", "replacement": "match${1}"}]),
            Some(vec![("a", "line1\nline2"), ("b", "bar"), ("c", "baz"), ("d", "match")]),
        ),
        (
            "UTF-8 source label",
            vec![("utf-8.label", "line1\nline2"), ("b", "bar"), ("c", "baz")],
            json!([{"source_labels": ["utf-8.label"], "regex": "line1.*line2", "target_label": "d", "replacement": "match${1}"}]),
            Some(vec![("utf-8.label", "line1\nline2"), ("b", "bar"), ("c", "baz"), ("d", "match")]),
        ),
        (
            "UTF-8 target with a variable",
            vec![("a", "line1\nline2"), ("b", "bar"), ("c", "baz")],
            json!([{"source_labels": ["a"], "regex": "line1.*line2", "target_label": "utf-8.label${1}", "replacement": "match${1}"}]),
            Some(vec![("a", "line1\nline2"), ("b", "bar"), ("c", "baz"), ("utf-8.label", "match")]),
        ),
        (
            "named groups, both styles",
            vec![("a", "line1\nline2"), ("b", "bar"), ("c", "baz")],
            json!([{"source_labels": ["a"], "regex": "(line1).*(?<second>line2)", "target_label": "label1_${1}", "replacement": "val_${second}"},
                {"source_labels": ["a"], "regex": "(line1).*(?<second>line2)", "target_label": "label2_$1", "replacement": "val_$second"}]),
            Some(vec![
                ("a", "line1\nline2"),
                ("b", "bar"),
                ("c", "baz"),
                ("label1_line1", "val_line2"),
                ("label2_line1", "val_line2"),
            ]),
        ),
        (
            "__name__ to __type__",
            vec![("__name__", "http_requests_total")],
            json!([{"source_labels": ["__name__"], "regex": ".*_total$", "target_label": "__type__", "replacement": "counter"}]),
            Some(vec![("__name__", "http_requests_total"), ("__type__", "counter")]),
        ),
        // Documented defaults: a rule without source labels sets a static label.
        (
            "static label",
            vec![("job", "foo")],
            json!([{"replacement": "static", "target_label": "abc"}]),
            Some(vec![("job", "foo"), ("abc", "static")]),
        ),
        (
            "null regex is the empty regex",
            vec![("job", "foo")],
            json!([{"regex": null, "replacement": "static", "target_label": "abc"}]),
            Some(vec![("job", "foo"), ("abc", "static")]),
        ),
        (
            "the action is case-insensitive",
            vec![("a", "x")],
            json!([{"source_labels": ["a"], "regex": "y", "action": "Keep"}]),
            None,
        ),
    ];
    for (name, input, rules, want) in cases {
        let got = run(&input, rules);
        assert_eq!(got, want.map(|w| labels(&w)), "case {name:?}");
    }
}

#[test]
fn refusals_name_the_field() {
    let err = |v: serde_json::Value| serde_json::from_value::<RelabelConfig>(v).unwrap().compile().unwrap_err();
    assert_eq!(err(json!({"action": "replace"})).field, "target_label");
    assert_eq!(err(json!({"action": "hashmod", "target_label": "x"})).field, "modulus");
    assert_eq!(err(json!({"action": "frobnicate"})).field, "action");
    assert_eq!(err(json!({"regex": "(", "target_label": "x"})).field, "regex");
    assert_eq!(err(json!({"action": "labeldrop", "regex": "x", "source_labels": ["a"]})).field, "source_labels");
    assert_eq!(err(json!({"action": "keepequal", "target_label": "x", "regex": "y"})).field, "regex");
    assert_eq!(err(json!({"action": "lowercase", "target_label": "x", "replacement": "y"})).field, "replacement");
    assert!(
        serde_json::from_value::<RelabelConfig>(json!({"sourcelabels": ["a"]})).is_err(),
        "unknown keys are refused"
    );
}

//! Fuzz-style tests of the configuration loader: thousands of seeded mutations of the
//! repository's pipeline YAML. `load_str` must never panic, and every located error (and
//! every location in an accepted configuration) must have a line and a column of at least 1.

use inferwatch_core::config::{Config, ConfigError, Location, load_str};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::panic::{AssertUnwindSafe, catch_unwind};

/// The default pipeline shipped at the repository root.
const PIPELINE: &str = include_str!("../../pipeline.yaml");

/// A second seed using anchors, merge keys, flow style, block scalars, tags and named pipelines.
const FANCY: &str = r#"
receivers:
  otlp/in:
    protocols:
      grpc: {endpoint: "${env:GRPC:-127.0.0.1:4317}"}
      http: ~
processors:
  batch/fast: {send_batch_size: 0x10, timeout: 1.5e2ms}
  memory_limiter: &defaults {check_interval: 1s, limit_percentage: 80, spike_limit_percentage: 20}
exporters:
  otlp/tempo:
    <<: *defaults
    endpoint: ${env:TEMPO}
    headers:
      authorization: !!str ${TOKEN:-none}
      note: |
        literal $$ text
  debug: {verbosity: detailed}
connectors: {}
extensions:
  health_check: {endpoint: '127.0.0.1:13133'}
service:
  extensions: [health_check]
  shutdown_timeout: 30s
  telemetry:
    logs: {level: info, encoding: console}
    metrics: {level: detailed, address: "0.0.0.0:8888"}
  pipelines:
    traces/a: {receivers: [otlp/in], processors: [memory_limiter, batch/fast], exporters: [otlp/tempo, debug]}
    metrics:
      receivers: [otlp/in]
      exporters: [debug]
    logs: {receivers: [otlp/in], exporters: [debug]}
"#;

/// Fragments that YAML, the loader or substitution treat specially.
const FRAGMENTS: &[&str] = &[
    ":",
    ": ",
    "- ",
    "-",
    "? ",
    "[",
    "]",
    "{",
    "}",
    ",",
    "#",
    "&a ",
    "*a",
    "*nope",
    "<<: ",
    "<<: *a",
    "---\n",
    "...\n",
    "%YAML 1.2\n",
    "!!str ",
    "!!map ",
    "!!int ",
    "!custom ",
    "|",
    ">-",
    "|+9\n",
    "\"",
    "'",
    "\\",
    "\"\\x\"",
    "\"\\uD800\"",
    "\t",
    "\r",
    "\r\n",
    "\n",
    "\n  ",
    "\u{feff}",
    "\u{0}",
    "\u{85}",
    "\u{2028}",
    "é",
    "🦀",
    "~",
    "null",
    "0x",
    "0o9",
    "1e400",
    "-.inf",
    ".nan",
    "18446744073709551616",
    "${env:HOST}",
    "${env:PORT}",
    "${env:EMPTY}",
    "${env:YAML}",
    "${env:UNSET}",
    "${env:UNSET:-}",
    "${env:UNSET:-${x}}",
    "${HOST}",
    "${",
    "${}",
    "${env:}",
    "${file:/etc/x}",
    "${1BAD}",
    "$$",
    "$",
    "}",
    "receivers",
    "service",
    "pipelines",
    "traces/",
    "traces/ x",
    "metrics/a/b",
    "otlp/",
    "/x",
    "shutdown_timeout: 99999999999999h",
    "shutdown_timeout: -1s",
    "shutdown_timeout: 1.5.5s",
    "shutdown_timeout: µs",
    "telemetry: {metrics: {level: none}}",
    "telemetry: {metrics: {readers: [{pull: {}}], address: x}}",
];

/// Variables the fuzzed configurations may reference.
fn env(name: &str) -> Option<String> {
    match name {
        "HOST" => Some("tempo".into()),
        "PORT" => Some("4317".into()),
        "EMPTY" => Some(String::new()),
        "YAML" => Some("[a, {b: ${c}}]\n- x: &y".into()),
        "GRPC" => Some("0.0.0.0:0".into()),
        "TEMPO" => Some("tempo:4317".into()),
        _ => None,
    }
}

/// A random character boundary of `s`.
fn boundary(s: &str, rng: &mut StdRng) -> usize {
    let mut i = rng.random_range(0..=s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// One random edit of `s`.
fn edit(s: &mut String, rng: &mut StdRng) {
    let lines: Vec<&str> = s.split_inclusive('\n').collect();
    match rng.random_range(0..10) {
        // Insert a special fragment anywhere.
        0..=2 => {
            let i = boundary(s, rng);
            s.insert_str(i, FRAGMENTS[rng.random_range(0..FRAGMENTS.len())]);
        }
        // Delete a range of characters.
        3 => {
            let (a, b) = (boundary(s, rng), boundary(s, rng));
            s.replace_range(a.min(b)..a.max(b).min(a.min(b) + 16), "");
        }
        // Replace one character by a random one (ASCII or not).
        4 => {
            let i = boundary(s, rng);
            if let Some(c) = s[i..].chars().next() {
                let with = if rng.random_bool(0.7) {
                    char::from(rng.random_range(0x20u8..0x7f))
                } else {
                    char::from_u32(rng.random_range(0..0x11_0000)).unwrap_or('\u{fffd}')
                };
                s.replace_range(i..i + c.len_utf8(), with.encode_utf8(&mut [0; 4]));
            }
        }
        // Line-level: delete, duplicate, swap, re-indent.
        5 | 6 if !lines.is_empty() => {
            let mut lines: Vec<String> = lines.into_iter().map(str::to_string).collect();
            let i = rng.random_range(0..lines.len());
            match rng.random_range(0..4) {
                0 => {
                    lines.remove(i);
                }
                1 => {
                    let dup = lines[i].clone();
                    lines.insert(i, dup);
                }
                2 => {
                    let j = rng.random_range(0..lines.len());
                    lines.swap(i, j);
                }
                _ => {
                    let indent = " ".repeat(rng.random_range(0..9));
                    let trimmed = lines[i].trim_start().to_string();
                    lines[i] = indent + &trimmed;
                }
            }
            *s = lines.concat();
        }
        // Truncate.
        7 => {
            let i = boundary(s, rng);
            s.truncate(i);
        }
        // Deep nesting: flow sequences or maps, or indented block maps, up to several hundred levels.
        8 => {
            let depth = rng.random_range(1..600);
            let nested = match rng.random_range(0..3) {
                0 => format!("{}1{}", "[".repeat(depth), "]".repeat(depth)),
                1 => format!("{}1{}", "{a: ".repeat(depth), "}".repeat(depth)),
                _ => {
                    let mut t = String::new();
                    for d in 0..depth.min(200) {
                        t.push('\n');
                        t.push_str(&" ".repeat(2 * d + 2));
                        t.push_str("k:");
                    }
                    t.push_str(" 1");
                    t
                }
            };
            let at = s.find("verbosity:").or_else(|| s.find("endpoint:")).unwrap_or(0);
            s.insert_str(at, &format!("deep: {nested}\n"));
        }
        // Anchors and aliases, a small "billion laughs" or an alias loop attempt.
        _ => {
            let laughs =
                "l0: &l0 [x, x, x]\nl1: &l1 [*l0, *l0, *l0]\nl2: &l2 [*l1, *l1, *l1, *l1]\nl3: [*l2, *l2, *l2]\n";
            let extra = ["self: &s {a: *s}\n", laughs, "m: &m {a: 1}\nn: {<<: [*m, *m, 1]}\n"][rng.random_range(0..3)];
            let i = s.find('\n').map_or(0, |i| i + 1);
            s.insert_str(i, extra);
        }
    }
}

/// Asserts that a location is 1-based.
fn check_location(l: &Location, what: &str, text: &str) {
    assert!(l.line >= 1 && l.column >= 1, "{what} at {l} (line {}, column {}) for {text:?}", l.line, l.column);
}

/// Loads `text`; fails on a panic or a location below line or column 1. Returns whether it loaded.
fn check_one(text: &str) -> bool {
    let got = catch_unwind(AssertUnwindSafe(|| load_str("fuzz.yaml", text, &env)));
    let got: Result<Config, Vec<ConfigError>> = got.unwrap_or_else(|_| panic!("load_str panicked on {text:?}"));
    match got {
        Ok(cfg) => {
            let sections = [&cfg.receivers, &cfg.processors, &cfg.exporters, &cfg.connectors, &cfg.extensions];
            for c in sections.into_iter().flat_map(|s| s.values()) {
                check_location(&c.location, "component", text);
                check_location(&c.node.location, "component settings", text);
            }
            for p in &cfg.service.pipelines {
                check_location(&p.location, "pipeline", text);
                for (_, l) in p.receivers.iter().chain(&p.processors).chain(&p.exporters) {
                    check_location(l, "pipeline entry", text);
                }
            }
            for (_, l) in &cfg.service.extensions {
                check_location(l, "service extension", text);
            }
            true
        }
        Err(errors) => {
            assert!(!errors.is_empty(), "an Err without errors for {text:?}");
            for e in &errors {
                assert!(!e.message.is_empty(), "an error without a message for {text:?}");
                if let Some(l) = &e.location {
                    check_location(l, &format!("error {e}"), text);
                }
            }
            false
        }
    }
}

fn run(seed: u64, base: &str, cases: usize) {
    assert!(check_one(base), "the seed configuration must load");
    let mut rng = StdRng::seed_from_u64(seed);
    let mut loaded = 0;
    for _ in 0..cases {
        let mut text = base.to_string();
        for _ in 0..rng.random_range(1..4) {
            edit(&mut text, &mut rng);
        }
        loaded += usize::from(check_one(&text));
    }
    // The mutations must reach the loader's later stages, not only the YAML parser's errors.
    assert!(loaded > cases / 50, "only {loaded} of {cases} mutated configurations loaded");
}

#[test]
fn fuzz_pipeline_yaml() {
    run(11, PIPELINE, 3000);
}

#[test]
fn fuzz_fancy_yaml() {
    run(12, FANCY, 3000);
}

/// Inputs that are not mutations of a configuration at all.
#[test]
fn odd_whole_inputs() {
    let mut inputs: Vec<String> =
        ["", " ", "\n", "---", "...", "~", "[]", "{}", "- a", "a", ":", "? ", "&a", "*a", "!!map", "\u{feff}"]
            .into_iter()
            .map(String::from)
            .collect();
    for depth in [100, 255, 256, 257, 300, 1000, 5000] {
        inputs.push(format!("{}{}", "[".repeat(depth), "]".repeat(depth)));
        inputs.push("[".repeat(depth));
        inputs.push(format!("{}~{}", "{a: ".repeat(depth), "}".repeat(depth)));
        inputs.push(format!("{}x", "- ".repeat(depth)));
    }
    for text in &inputs {
        check_one(text);
    }
}

/// Regression: 255 levels of flow maps passed the old depth limit (256) and overflowed the
/// 2 MiB stack of a test thread (an abort, not even a panic) in a debug build.
#[test]
fn deep_nesting_is_an_error_not_a_stack_overflow() {
    for depth in [129, 200, 255, 256, 300] {
        for text in [format!("{}~{}", "{a: ".repeat(depth), "}".repeat(depth)), format!("{}: x", "? ".repeat(depth))] {
            let errors = load_str("deep.yaml", &text, &env).unwrap_err();
            // Ours, or saphyr-parser's own limit where it comes first.
            let deep = |m: &str| m.contains("nesting too deep") || m.contains("recursion limit exceeded");
            assert!(errors.iter().any(|e| deep(&e.message)), "{depth}: {errors:?}");
        }
    }
    // Configurations nest a dozen levels; well below the limit still loads as far as its keys allow.
    let text = format!("receivers: {{otlp: {}~{}}}\n", "{a: ".repeat(100), "}".repeat(100));
    let errors = load_str("deep.yaml", &text, &env).unwrap_err();
    assert!(errors.iter().all(|e| !e.message.contains("nesting too deep")), "{errors:?}");
}

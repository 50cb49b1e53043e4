//! `inferwatch replay` end to end: exit codes and the summary.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("iw-replay-cli-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn replay(args: &[&Path]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_inferwatch"));
    cmd.arg("replay").env_remove("INFERWATCH_LOG").env_remove("RUST_LOG");
    let mut flag = "--config";
    for a in args {
        if a.as_os_str() == "--input" {
            flag = "--input";
            continue;
        }
        cmd.arg(flag).arg(a);
    }
    cmd.output().unwrap()
}

const CONFIG: &str = "\
receivers:
  replay: {}
exporters:
  debug:
    verbosity: basic
service:
  telemetry:
    metrics:
      level: none
  pipelines:
    traces:
      receivers: [replay]
      exporters: [debug]
    logs:
      receivers: [replay]
      exporters: [debug]
";

fn spans(names: &[&str], t: u64) -> String {
    let spans: Vec<String> = names
        .iter()
        .enumerate()
        .map(|(i, n)| {
            format!(
                r#"{{"traceId":"{:032x}","spanId":"{:016x}","name":"{n}","startTimeUnixNano":"{}","endTimeUnixNano":"{t}"}}"#,
                t,
                i + 1,
                t - 1
            )
        })
        .collect();
    format!(r#"{{"resourceSpans":[{{"resource":{{}},"scopeSpans":[{{"spans":[{}]}}]}}]}}"#, spans.join(","))
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn a_small_replay_prints_the_summary() {
    let dir = tmpdir("ok");
    let cfg = dir.join("replay.yaml");
    std::fs::write(&cfg, CONFIG).unwrap();
    let logs = r#"{"resourceLogs":[{"scopeLogs":[{"logRecords":[{"timeUnixNano":"5","body":{"stringValue":"a"}},{"timeUnixNano":"6"}]}]}]}"#;
    let metrics = r#"{"resourceMetrics":[{"scopeMetrics":[{"metrics":[{"name":"m","gauge":{"dataPoints":[{"timeUnixNano":"7","asInt":"1"}]}}]}]}]}"#;
    let data = dir.join("in");
    std::fs::create_dir_all(data.join("sub")).unwrap();
    std::fs::write(data.join("a.jsonl"), format!("{}\n{}\n{logs}\n", spans(&["x", "y"], 10), spans(&["z"], 11)))
        .unwrap();
    std::fs::write(data.join("sub/b.json"), format!("{metrics}\n")).unwrap();
    let out = replay(&[&cfg, Path::new("--input"), &data]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "stdout: {stdout}\nstderr: {}", text(&out.stderr));
    assert!(stdout.contains("replay finished: 2 of 2 files"), "{stdout}");
    // Metrics have no pipeline here: skipped, not counted.
    assert!(stdout.contains("items:    5 (3 spans, 0 metric_points, 2 log_records)"), "{stdout}");
    assert!(stdout.contains("failed:   0 items"), "{stdout}");
    assert!(stdout.contains("delivery: complete"), "{stdout}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_input_lines_are_counted_and_exit_1() {
    let dir = tmpdir("badline");
    let cfg = dir.join("replay.yaml");
    std::fs::write(&cfg, CONFIG).unwrap();
    let data = dir.join("t.jsonl");
    std::fs::write(&data, format!("{}\n{{oops\n{}\n", spans(&["x"], 10), spans(&["y"], 11))).unwrap();
    let out = replay(&[&cfg, Path::new("--input"), &data]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "stdout: {stdout}\nstderr: {}", text(&out.stderr));
    assert!(stdout.contains("items:    2 (2 spans"), "{stdout}");
    assert!(stdout.contains("failed:   1 items"), "{stdout}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_bad_config_exits_2() {
    let dir = tmpdir("badcfg");
    let cfg = dir.join("bad.yaml");
    std::fs::write(&cfg, CONFIG.replace("replay: {}", "replay: {speed: -1}")).unwrap();
    let data = dir.join("t.jsonl");
    std::fs::write(&data, spans(&["x"], 10)).unwrap();
    let out = replay(&[&cfg, Path::new("--input"), &data]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("invalid configuration") && stderr.contains("speed"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_config_without_a_replay_receiver_exits_2() {
    let dir = tmpdir("norecv");
    let cfg = dir.join("otlp.yaml");
    let text_cfg = CONFIG
        .replace("replay: {}", "otlp: {protocols: {http: {endpoint: '127.0.0.1:0'}}}")
        .replace("[replay]", "[otlp]");
    std::fs::write(&cfg, text_cfg).unwrap();
    let data = dir.join("t.jsonl");
    std::fs::write(&data, spans(&["x"], 10)).unwrap();
    let out = replay(&[&cfg, Path::new("--input"), &data]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("no pipeline uses a `replay` receiver"), "{stderr}");
    // A missing input is a usage error too.
    std::fs::write(&cfg, CONFIG).unwrap();
    let out = replay(&[&cfg, Path::new("--input"), &dir.join("missing.jsonl")]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("missing.jsonl"));
    let _ = std::fs::remove_dir_all(&dir);
}

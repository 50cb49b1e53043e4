//! End-to-end tests of `inferwatch bench` against the OpenAI-compatible stub.

use crate::support;

use inferwatch_probe::arrivals::Arrivals;
use inferwatch_probe::{Api, ArrivalKind, BenchArgs, BenchError, ProbeKind, run, run_until};
use inferwatch_testkit::{attrs, capture};
use serde_json::Value;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;
use support::stub::{self, Flavor, Stub, StubConfig};

fn args(stub: &Stub) -> BenchArgs {
    let mut a = BenchArgs::new(&stub.url(), "m");
    a.quiet = true;
    a
}

/// A file in the temp directory, removed when dropped.
struct TempFile(PathBuf);

impl TempFile {
    fn path(&self) -> PathBuf {
        self.0.clone()
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn temp_path(name: &str) -> TempFile {
    static N: AtomicU32 = AtomicU32::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    TempFile(std::env::temp_dir().join(format!("iw-bench-{}-{n}-{name}", std::process::id())))
}

fn temp(name: &str, text: &str) -> TempFile {
    let f = temp_path(name);
    std::fs::write(&f.0, text).unwrap();
    f
}

fn dataset(prompts: &[&str]) -> TempFile {
    let lines: Vec<String> = prompts.iter().map(|p| serde_json::json!({ "prompt": p }).to_string()).collect();
    temp("ds.jsonl", &(lines.join("\n") + "\n"))
}

fn ms(v: Option<f64>) -> f64 {
    v.unwrap() * 1000.0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_chat_ttft_and_itl_match_the_scripted_delays() {
    let s = stub::start(StubConfig {
        ttft: Duration::from_millis(200),
        itl: Duration::from_millis(20),
        tokens: 5,
        ..StubConfig::default()
    })
    .await;
    let mut a = args(&s);
    a.concurrency = Some(1);
    a.requests = Some(3);
    let r = run(a).await.unwrap();
    let res = &r.results;
    assert_eq!((res.requests.sent, res.requests.completed, res.requests.failed), (3, 3, 0));
    // TTFT is measured at the first content token, not the role-only first chunk.
    assert_eq!(res.ttft.count, 3);
    let (lo, hi) = (ms(res.ttft.min), ms(res.ttft.max));
    eprintln!("measured ttft {lo:.2}..{hi:.2} ms (scripted 200), itl p50 {:.2} ms (scripted 20)", ms(res.itl.p50));
    // The lower bound is the real check (TTFT counted at the first content token); the upper
    // one only catches gross errors, as other processes share this machine.
    assert!(lo >= 199.0 && hi < 400.0, "ttft {lo}..{hi} ms, scripted 200 ms");
    assert_eq!(res.itl.count, 12);
    let (lo, hi) = (ms(res.itl.p50), ms(res.itl.max));
    assert!(lo >= 19.0 && hi < 200.0, "itl p50 {lo} max {hi} ms, scripted 20 ms");
    let tpot = ms(res.tpot.p50);
    assert!((19.0..100.0).contains(&tpot), "tpot {tpot}");
    let e2e = ms(res.e2e.p50);
    assert!((279.0..600.0).contains(&e2e), "e2e {e2e}");
    assert_eq!(res.tokens.output_total, 15);
    assert_eq!(res.tokens.usage_reported, 3);
    // Synthetic prompts of 128 words: the stub counts words as tokens.
    assert_eq!(res.tokens.input_total, 3 * 128);
    let b = &s.bodies()[0];
    assert_eq!(b["stream"], true);
    assert_eq!(b["stream_options"]["include_usage"], true);
    assert_eq!(b["max_tokens"], 128);
    assert_eq!(b["messages"][0]["role"], "user");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_streamed_and_completions_are_parsed() {
    let s = stub::start(StubConfig { tokens: 6, ..StubConfig::default() }).await;
    for (api, stream) in [(Api::Chat, false), (Api::Completions, false), (Api::Completions, true)] {
        let mut a = args(&s);
        a.api = api;
        a.no_stream = !stream;
        a.concurrency = Some(2);
        a.requests = Some(4);
        a.max_tokens = Some(5);
        let r = run(a).await.unwrap();
        let res = &r.results;
        assert_eq!(res.requests.completed, 4, "{api:?} stream {stream}: {:?}", res.errors);
        assert_eq!(res.tokens.output_total, 20, "{api:?} {stream}");
        assert_eq!(res.e2e.count, 4);
        assert_eq!(res.ttft.count, if stream { 4 } else { 0 });
        assert_eq!(r.stream, stream);
    }
    let bodies = s.bodies();
    assert!(bodies[0]["messages"].is_array() && bodies[0]["stream"] == false);
    assert!(bodies[0].get("stream_options").is_none());
    assert!(bodies[4]["prompt"].is_string() && bodies[4].get("messages").is_none());
    assert!(bodies[8]["prompt"].is_string() && bodies[8]["stream"] == true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tgi_like_streams_without_usage_are_counted() {
    let s = stub::start(StubConfig {
        ttft: Duration::from_millis(30),
        itl: Duration::from_millis(5),
        tokens: 7,
        flavor: Flavor::Minimal,
        ..StubConfig::default()
    })
    .await;
    for api in [Api::Chat, Api::Completions] {
        let mut a = args(&s);
        a.api = api;
        a.concurrency = Some(1);
        a.requests = Some(2);
        let r = run(a).await.unwrap();
        let res = &r.results;
        assert_eq!(res.requests.completed, 2, "{api:?}: {:?}", res.errors);
        assert_eq!(res.tokens.usage_reported, 0);
        assert_eq!(res.tokens.output_total, 14, "{api:?}: tokens counted from chunks with content");
        // Empty deltas are not tokens: 6 gaps per answer.
        assert_eq!(res.itl.count, 12);
        assert!(ms(res.ttft.min) >= 29.0);
        // Without usage the prompt tokens are estimated (about 4 characters a token).
        assert!(res.tokens.input_total > 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn constant_and_poisson_arrival_counts() {
    let s = stub::start(StubConfig::default()).await;
    let mut a = args(&s);
    a.rate = Some(40.0);
    a.arrivals = ArrivalKind::Constant;
    a.duration = Some(Duration::from_secs(1));
    let r = run(a).await.unwrap();
    assert_eq!(r.results.requests.sent, 40);
    assert_eq!(r.arrivals, Some(ArrivalKind::Constant));

    let mut a = args(&s);
    a.rate = Some(40.0);
    a.arrivals = ArrivalKind::Poisson;
    a.duration = Some(Duration::from_secs(1));
    a.seed = 11;
    let r = run(a).await.unwrap();
    // Exactly the arrivals of the seeded process within the second.
    let expected = Arrivals::new(ArrivalKind::Poisson, 40.0, 11).take_while(|d| *d < Duration::from_secs(1)).count();
    assert_eq!(r.results.requests.sent, expected as u64);
    assert_ne!(expected, 40, "seed 11 happens to give exactly 40; pick another");
    assert!((20..=60).contains(&expected));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_bound_is_respected() {
    let s = stub::start(StubConfig { ttft: Duration::from_millis(40), tokens: 2, ..StubConfig::default() }).await;
    let mut a = args(&s);
    a.concurrency = Some(4);
    a.requests = Some(20);
    let r = run(a).await.unwrap();
    assert_eq!(r.results.requests.completed, 20);
    assert_eq!(s.seen.max_inflight.load(Ordering::SeqCst), 4);
    assert_eq!(r.concurrency, Some(4));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_loop_overflow_is_counted() {
    let s = stub::start(StubConfig { ttft: Duration::from_millis(300), tokens: 1, ..StubConfig::default() }).await;
    let mut a = args(&s);
    a.rate = Some(100.0);
    a.arrivals = ArrivalKind::Constant;
    a.requests = Some(20);
    a.max_in_flight = 3;
    let r = run(a).await.unwrap();
    let q = &r.results.requests;
    assert_eq!(q.sent, 3, "{q:?}");
    assert_eq!(q.overflow, 17);
    assert_eq!(s.seen.max_inflight.load(Ordering::SeqCst), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_sweep_reports_each_step() {
    let s = stub::start(StubConfig::default()).await;
    let mut a = args(&s);
    a.rate_sweep = Some(vec![20.0, 40.0]);
    a.arrivals = ArrivalKind::Constant;
    a.duration = Some(Duration::from_millis(500));
    let r = run(a).await.unwrap();
    let steps = r.sweep.as_ref().unwrap();
    assert_eq!(steps.len(), 2);
    assert_eq!((steps[0].rate, steps[0].results.requests.sent), (20.0, 10));
    assert_eq!((steps[1].rate, steps[1].results.requests.sent), (40.0, 20));
    // Each step lasts its duration, so the throughput is the offered rate.
    for st in steps {
        let t = st.results.throughput.requests_per_s;
        assert!((t - st.rate).abs() < st.rate * 0.05, "{t} at {}", st.rate);
        assert!(st.results.duration_s >= 0.5);
    }
    assert_eq!(r.results.requests.sent, 30);
    assert_eq!(r.mode, "rate-sweep");
}

const FLOW3: &str = r#"dialogue_flow:
  start_state: greeting
  states:
    greeting: { next: ask, prompt: "hello there" }
    ask:      { next: recommend, prompt: "what do you suggest" }
    recommend: { next: end, prompt: "thanks, more please", max_tokens: 3 }
  qps_schedule:
    - { state: greeting, qps: 50 }
    - { state: ask, qps: 50 }
    - { state: recommend, qps: 50 }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flow_walks_the_states_with_growing_context() {
    let s = stub::start(StubConfig { tokens: 4, answer: Some("sure thing my friend".into()), ..StubConfig::default() })
        .await;
    let mut a = args(&s);
    let _f1 = temp("flow.yaml", FLOW3);
    a.flow = Some(_f1.path());
    a.max_users = Some(1);
    let r = run(a).await.unwrap();
    let bodies = s.bodies();
    assert_eq!(bodies.len(), 3);
    let lens: Vec<usize> = bodies.iter().map(|b| b["messages"].as_array().unwrap().len()).collect();
    assert_eq!(lens, vec![1, 3, 5]);
    // The whole conversation is sent, the answers included.
    assert_eq!(bodies[2]["messages"][0]["content"], "hello there");
    assert_eq!(bodies[2]["messages"][1]["role"], "assistant");
    assert_eq!(bodies[2]["messages"][1]["content"], "sure thing my friend");
    assert_eq!(bodies[2]["messages"][4]["content"], "thanks, more please");
    assert_eq!(bodies[2]["max_tokens"], 3);
    let f = r.flow.as_ref().unwrap();
    assert_eq!((f.users_started, f.users_completed, f.users_failed), (1, 1, 0));
    let ctx: Vec<f64> = ["greeting", "ask", "recommend"]
        .iter()
        .map(|n| f.states.iter().find(|s| s.state == *n).unwrap().mean_context_tokens.unwrap())
        .collect();
    // Prompt tokens as the stub counts them (words): 2, 2+4+4, 10+4+3.
    assert_eq!(ctx, vec![2.0, 10.0, 17.0]);
    assert_eq!(f.max_context_tokens, 17);
    assert_eq!(r.results.requests.completed, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flow_retries_errors_and_timeouts() {
    let s = stub::start(StubConfig { tokens: 2, ..StubConfig::default() }).await;
    let yaml = r#"dialogue_flow:
  start_state: a
  states:
    a: { next: b, prompt: "[fail-once] hi", max_retries: 1 }
    b: { next: end, prompt: "[hang] then", timeout: 0.2, max_retries: 2 }
  qps_schedule:
    - { state: a, qps: 20 }
"#;
    let mut a = args(&s);
    let _f2 = temp("retry.yaml", yaml);
    a.flow = Some(_f2.path());
    a.max_users = Some(1);
    let started = std::time::Instant::now();
    let r = run(a).await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(5));
    let f = r.flow.as_ref().unwrap();
    let st = |n: &str| f.states.iter().find(|s| s.state == n).unwrap().clone();
    let (sa, sb) = (st("a"), st("b"));
    assert_eq!((sa.attempts, sa.completed, sa.failed, sa.retries), (2, 1, 1, 1));
    assert_eq!((sb.attempts, sb.completed, sb.failed, sb.retries), (3, 0, 3, 2));
    assert_eq!(r.results.errors.get("http_500"), Some(&1));
    assert_eq!(r.results.errors.get("timeout"), Some(&3));
    assert_eq!(r.results.requests.retries, 3);
    assert_eq!((f.users_completed, f.users_failed), (0, 1));
    // State b's attempts resend the same conversation (a's answer included).
    let bodies = s.bodies();
    assert_eq!(bodies.len(), 5);
    assert_eq!(bodies[2]["messages"], bodies[4]["messages"]);
}

/// The study's example dialogue flow, exactly as the study gives it.
const STUDY: &str = r#"dialogue_flow:
  start_state: greeting
  states:
    greeting:                { next: ask_preference, timeout: 5, prompt: "..." }
    ask_preference:          { next: generate_recommendation, max_retries: 2, prompt: "..." }
    generate_recommendation: { next: end, prompt: "...", max_tokens: 512 }
  qps_schedule:
    - { state: greeting, qps: 50 }
    - { state: ask_preference, qps: 30 }
    - { state: generate_recommendation, qps: 15 }
  max_context_tokens: 8192      # above this, pacing backs off
  rtt_backoff_ratio: 0.6        # multiply the state's QPS by this ...
  rtt_backoff_threshold_s: 1.2  # ... when the previous turn's RTT exceeded this and context > max_context_tokens
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_studys_flow_runs_as_given() {
    let s = stub::start(StubConfig { tokens: 4, ..StubConfig::default() }).await;
    let mut a = args(&s);
    let _f3 = temp("study.yaml", STUDY);
    a.flow = Some(_f3.path());
    a.duration = Some(Duration::from_secs(2));
    a.arrivals = ArrivalKind::Constant;
    let r = run(a).await.unwrap();
    let f = r.flow.as_ref().unwrap();
    let st = |n: &str| f.states.iter().find(|s| s.state == n).unwrap().clone();
    // 2 s at 50 users/s; the later states are paced at 30 and 15 turns/s.
    assert!((88..=101).contains(&f.users_started), "{f:?}");
    assert!((48..=61).contains(&st("ask_preference").completed), "{:?}", st("ask_preference"));
    assert!((22..=31).contains(&st("generate_recommendation").completed));
    assert_eq!(r.results.requests.failed, 0);
    assert_eq!(f.users_completed, st("generate_recommendation").completed);
    assert_eq!(
        f.users_started,
        f.users_completed + f.users_failed + f.users_dropped + f.users_unfinished,
        "every user is accounted for: {f:?}"
    );
    assert!(s.bodies().iter().any(|b| b["max_tokens"] == 512));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backoff_rule_slows_users_with_long_context_and_slow_turns() {
    let s = stub::start(StubConfig { ttft: Duration::from_millis(30), tokens: 2, ..StubConfig::default() }).await;
    let yaml = |ratio: f64| {
        format!(
            "dialogue_flow:\n  start_state: a\n  states:\n    a: {{ next: b, prompt: \"one two three\" }}\n    \
             b: {{ next: end, prompt: \"four\" }}\n  qps_schedule:\n    - {{ state: a, qps: 20 }}\n    \
             - {{ state: b, qps: 20 }}\n  max_context_tokens: 4\n  rtt_backoff_ratio: {ratio}\n  \
             rtt_backoff_threshold_s: 0.01\n"
        )
    };
    let mut a = args(&s);
    let _f4 = temp("backoff.yaml", &yaml(0.25));
    a.flow = Some(_f4.path());
    a.max_users = Some(3);
    a.arrivals = ArrivalKind::Constant;
    let r = run(a).await.unwrap();
    let f = r.flow.unwrap();
    let b = f.states.iter().find(|s| s.state == "b").unwrap();
    // Context 3 + 2 = 5 > 4 and RTT 30 ms > 10 ms: every user backs off entering b.
    assert_eq!(b.backoffs, 3);
    assert_eq!(f.users_completed, 3);
    let mut a = args(&s);
    let _f5 = temp("nobackoff.yaml", &yaml(1.0));
    a.flow = Some(_f5.path());
    a.max_users = Some(3);
    let f = run(a).await.unwrap().flow.unwrap();
    assert_eq!(f.states.iter().map(|s| s.backoffs).sum::<u64>(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_flow_yaml_is_an_exit_2_error_with_line_numbers() {
    let s = stub::start(StubConfig::default()).await;
    let cases: Vec<(String, u64, &str)> = vec![
        (STUDY.replace("max_retries: 2,", "max_retries: 2, retry_delay: 3,"), 5, "retry_delay"),
        (STUDY.replace("  qps_schedule:", "    orphan: { next: end }\n  qps_schedule:"), 7, "unreachable"),
        (STUDY.replace("  start_state: greeting\n", ""), 2, "start_state"),
        (STUDY.replace("qps: 30", "qps: -30"), 9, "positive"),
        (STUDY.replace("next: generate_recommendation", "next: recommend"), 5, "recommend"),
    ];
    for (yaml, line, word) in cases {
        let mut a = args(&s);
        let _f6 = temp("bad.yaml", &yaml);
        a.flow = Some(_f6.path());
        let e = run(a).await.unwrap_err();
        assert_eq!(e.exit_code(), 2, "{e}");
        let BenchError::Flow(fe) = &e else { panic!("expected a flow error, got {e}") };
        assert!(fe.lines().contains(&line), "line {line} expected: {e}");
        let text = e.to_string();
        assert!(text.contains(word) && text.contains(&format!("bad.yaml:{line}:")), "{text}");
    }
    assert!(s.bodies().is_empty());
    // Other bad input is exit 2 too.
    let mut a = args(&s);
    a.concurrency = Some(1);
    let _f7 = temp("bad.jsonl", "{\"prompt\": \"x\"}\nnot json\n");
    a.dataset = Some(_f7.path());
    let e = run(a).await.unwrap_err();
    assert!(matches!(&e, BenchError::Dataset(d) if d.line == 2), "{e}");
    assert_eq!(e.exit_code(), 2);
    let a = args(&s);
    assert_eq!(run(a).await.unwrap_err().exit_code(), 2, "no load mode chosen");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_output_has_the_documented_shape() {
    let s = stub::start(StubConfig { itl: Duration::from_millis(1), tokens: 4, ..StubConfig::default() }).await;
    let mut a = args(&s);
    let out = temp_path("out.json");
    let path = out.path();
    a.json = Some(path.clone());
    a.concurrency = Some(2);
    a.requests = Some(6);
    a.slo = Some("ttft=1s,tpot=1s,e2e=10s".into());
    let _f8 = dataset(&["ok one", "[fail] two"]);
    a.dataset = Some(_f8.path());
    run(a).await.unwrap();
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    for m in ["ttft", "itl", "tpot", "e2e"] {
        for k in ["count", "p50", "p90", "p95", "p99", "p999", "mean", "max"] {
            assert!(v[m].get(k).is_some(), "{m}.{k} missing: {}", v[m]);
        }
        assert!(v[m]["p99"].as_f64().unwrap() > 0.0 && v[m]["p99"].as_f64().unwrap() < 1.0, "{m} in seconds");
    }
    assert_eq!(v["ttft"]["count"], 3);
    assert_eq!(v["schema"], "inferwatch.bench/v1");
    assert!(v["throughput"]["requests_per_s"].as_f64().unwrap() > 0.0);
    assert!(v["throughput"]["output_tokens_per_s"].as_f64().unwrap() > 0.0);
    assert_eq!(v["goodput"]["requests_met"], 3);
    assert_eq!(v["goodput"]["share"], 0.5);
    assert_eq!(v["errors"]["http_500"], 3);
    assert_eq!(v["requests"]["sent"], 6);
    assert_eq!(v["mode"], "concurrency");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn otlp_spans_and_metrics_reach_a_collector() {
    let s = stub::start(StubConfig { ttft: Duration::from_millis(5), tokens: 3, ..StubConfig::default() }).await;
    let (addr, captured) = capture::grpc().await;
    let mut a = args(&s);
    a.otlp_endpoint = Some(format!("http://{addr}"));
    a.concurrency = Some(2);
    a.requests = Some(5);
    let _f9 = dataset(&["a b c", "d e f", "[fail] x"]);
    a.dataset = Some(_f9.path());
    let r = run(a).await.unwrap();
    let o = r.otlp.unwrap();
    assert_eq!((o.spans_sent, o.spans_failed), (5, 0));
    assert!(o.metric_exports >= 1);
    let spans: Vec<_> = captured.spans().into_iter().map(|(_, _, s)| s).collect();
    assert_eq!(spans.len(), 5);
    let attr = |sp: &opentelemetry_proto::tonic::trace::v1::Span, k: &str| attrs::attr(&sp.attributes, k).cloned();
    use opentelemetry_proto::tonic::common::v1::any_value::Value as V;
    let mut ok = 0;
    for sp in &spans {
        assert_eq!(sp.name, "chat m");
        assert_eq!(sp.kind, 3, "CLIENT");
        assert_eq!(attr(sp, "gen_ai.operation.name"), Some(V::StringValue("chat".into())));
        assert_eq!(attr(sp, "gen_ai.request.model"), Some(V::StringValue("m".into())));
        assert_eq!(attr(sp, "gen_ai.provider.name"), Some(V::StringValue("openai".into())));
        assert_eq!(attr(sp, "server.port"), Some(V::IntValue(i64::from(s.addr.port()))));
        assert!(sp.end_time_unix_nano > sp.start_time_unix_nano);
        if attr(sp, "error.type").is_none() {
            ok += 1;
            assert_eq!(attr(sp, "gen_ai.usage.output_tokens"), Some(V::IntValue(3)));
            assert_eq!(attr(sp, "gen_ai.usage.input_tokens"), Some(V::IntValue(3)));
            assert!(matches!(attr(sp, "gen_ai.response.time_to_first_chunk"), Some(V::DoubleValue(t)) if t >= 0.005));
        } else {
            assert_eq!(attr(sp, "error.type"), Some(V::StringValue("http_500".into())));
        }
    }
    assert_eq!(ok, 4);
    // The requests carried W3C trace context naming the client spans.
    let tps = s.seen.traceparents.lock().unwrap().clone();
    assert_eq!(tps.len(), 5);
    for sp in &spans {
        let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
        let tp = format!("00-{}-{}-01", hex(&sp.trace_id), hex(&sp.span_id));
        assert!(tps.contains(&tp), "{tp} not among {tps:?}");
    }
    let metrics = captured.metrics();
    let last = metrics.last().unwrap();
    let names: Vec<String> = last.resource_metrics[0].scope_metrics[0].metrics.iter().map(|m| m.name.clone()).collect();
    for n in [
        "gen_ai.client.operation.duration",
        "gen_ai.client.token.usage",
        "gen_ai.client.operation.time_to_first_chunk",
        "gen_ai.client.operation.time_per_output_chunk",
    ] {
        assert!(names.iter().any(|x| x == n), "{n} missing from {names:?}");
    }
    use opentelemetry_proto::tonic::metrics::v1::metric::Data;
    let dur = last.resource_metrics[0].scope_metrics[0]
        .metrics
        .iter()
        .find(|m| m.name == "gen_ai.client.operation.duration")
        .unwrap();
    let Some(Data::Histogram(h)) = &dur.data else { panic!("not a histogram") };
    assert_eq!(h.data_points.iter().map(|p| p.count).sum::<u64>(), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tle_and_rci_quality_probes() {
    let answer = "paris is the capital of france";
    let s = stub::start(StubConfig { tokens: 6, answer: Some(answer.into()), ..StubConfig::default() }).await;
    for api in [Api::Chat, Api::Completions] {
        let mut a = args(&s);
        a.api = api;
        a.logprobs = Some(4);
        a.concurrency = Some(1);
        a.requests = Some(2);
        let lines = [
            serde_json::json!({"prompt": "capital of france?", "reference": answer}),
            serde_json::json!({"prompt": "something else", "reference": "a completely different reference text here"}),
        ];
        let _f10 = temp("q.jsonl", &lines.iter().map(|l| l.to_string() + "\n").collect::<String>());
        a.dataset = Some(_f10.path());
        let r = run(a).await.unwrap();
        let q = r.results.quality.as_ref().unwrap();
        let tle = q.tle.as_ref().unwrap();
        assert_eq!(tle.k, 4);
        assert_eq!(tle.bits.count, 2);
        assert!((tle.bits.mean.unwrap() - 2.0).abs() < 0.01, "{api:?}: uniform top-4 is 2 bits: {tle:?}");
        let rci = q.rci.as_ref().unwrap();
        assert_eq!(rci.rci.count, 2);
        assert!(rci.rci.min.unwrap() < 0.001, "identical answer: {rci:?}");
        assert!(rci.rci.max.unwrap() > 0.6, "unrelated reference: {rci:?}");
        assert_eq!(rci.weights.beta, 0.0);
    }
    let b = &s.bodies()[0];
    assert_eq!((b["logprobs"].clone(), b["top_logprobs"].clone()), (Value::Bool(true), Value::from(4)));
    assert_eq!(s.bodies()[2]["logprobs"], 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reference_file_and_perturbation_pairs() {
    let s = stub::start(StubConfig { tokens: 3, ..StubConfig::default() }).await;
    let mut a = args(&s);
    a.concurrency = Some(2);
    a.requests = Some(4);
    let _f11 = dataset(&["[echo-len] tell me about rivers", "[echo-len] and about lakes too"]);
    a.dataset = Some(_f11.path());
    let _f12 = temp("refs.jsonl", "{\"reference\": \"len5w0 len5w1 len5w2\"}\n");
    a.reference = Some(_f12.path());
    a.perturb = Some("medium".into());
    let r = run(a).await.unwrap();
    let p = r.perturb.as_ref().unwrap();
    assert_eq!(p.profile, "medium");
    assert_eq!(p.pairs, 4);
    assert_eq!(r.results.requests.completed, 8);
    // The stub's answer depends on the prompt's length: every perturbed answer differs.
    assert_eq!(p.answer_changed_share, 1.0);
    assert!(p.mean_answer_divergence.unwrap() > 0.9);
    assert!(p.mean_rci_delta.unwrap() > 0.5, "{p:?}");
    assert!(p.baseline_ttft.count == 4 && p.perturbed_ttft.count == 4);
    let bodies = s.bodies();
    assert_eq!(bodies[0]["temperature"], 0.0);
    let texts: Vec<String> = bodies.iter().map(|b| b["messages"][0]["content"].as_str().unwrap().to_string()).collect();
    let perturbed = texts.iter().filter(|t| t.len() > 60).count();
    assert_eq!(perturbed, 4, "{texts:?}");
    // Inserted mid-prompt, at a word boundary.
    assert!(texts.iter().any(|t| t.starts_with("[echo-len] tell ") && t.ends_with(" me about rivers") && t.len() > 60));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn study_probes() {
    let s = stub::start(StubConfig { ttft: Duration::from_millis(10), tokens: 200, ..StubConfig::default() }).await;
    let mut a = args(&s);
    a.probe = Some(ProbeKind::Ttft);
    a.requests = Some(4);
    let r = run(a).await.unwrap();
    let p = r.probe.as_ref().unwrap();
    let t = p.ttft.unwrap();
    assert_eq!(t.count, 4);
    assert!(ms(t.mean) >= 9.5);
    assert!(s.bodies().iter().all(|b| b["max_tokens"] == 1));
    assert_eq!(s.seen.max_inflight.load(Ordering::SeqCst), 1, "one request at a time");
    assert_eq!(r.mode, "probe-ttft");

    let s = stub::start(StubConfig { itl: Duration::from_millis(1), tokens: 200, ..StubConfig::default() }).await;
    let mut a = args(&s);
    a.probe = Some(ProbeKind::Tps);
    a.requests = Some(2);
    let r = run(a).await.unwrap();
    let p = r.probe.as_ref().unwrap();
    assert_eq!(p.mean_output_tokens, Some(128.0));
    let tps = p.tps.unwrap().mean.unwrap();
    assert!(tps > 50.0 && tps < 1100.0, "{tps}");
    assert!(s.bodies().iter().all(|b| b["max_tokens"] == 128 && b["ignore_eos"] == true));

    let s = stub::start(StubConfig { tokens: 2, ..StubConfig::default() }).await;
    let mut a = args(&s);
    a.probe = Some(ProbeKind::P99Drift);
    a.rate = Some(100.0);
    a.duration = Some(Duration::from_secs(2));
    a.window = Duration::from_millis(400);
    let r = run(a).await.unwrap();
    let d = r.probe.as_ref().unwrap().drift.as_ref().unwrap();
    assert!((4..=6).contains(&d.windows.len()), "{d:?}");
    assert!(d.e2e.is_some() && d.ttft.is_some());
    assert_eq!(r.rate, Some(100.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_and_http_errors_by_kind_and_cancellation() {
    let s = stub::start(StubConfig { tokens: 3, ..StubConfig::default() }).await;
    let mut a = args(&s);
    a.concurrency = Some(1);
    a.requests = Some(3);
    let _f13 = dataset(&["[stream-error] a", "[fail] b", "fine c"]);
    a.dataset = Some(_f13.path());
    let r = run(a).await.unwrap();
    let e = &r.results.errors;
    assert_eq!((e.get("stream_error"), e.get("http_500")), (Some(&1), Some(&1)), "{e:?}");
    assert_eq!(r.results.requests.completed, 1);

    // Cancelling stops at once and reports what was measured.
    let mut a = args(&s);
    a.concurrency = Some(2);
    a.duration = Some(Duration::from_secs(60));
    let _f14 = dataset(&["[hang] forever"]);
    a.dataset = Some(_f14.path());
    let stop = tokio_util::sync::CancellationToken::new();
    let st = stop.clone();
    let s2 = s.seen.clone();
    tokio::spawn(async move {
        // Cancel once both requests are in flight at the stub.
        while s2.inflight.load(Ordering::SeqCst) < 2 {
            tokio::task::yield_now().await;
        }
        st.cancel();
    });
    let started = std::time::Instant::now();
    let r = run_until(a, stop).await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(r.interrupted);
    assert_eq!(r.results.requests.sent, 0, "cancelled requests are not counted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_server_is_a_connect_error() {
    let mut a = BenchArgs::new("http://127.0.0.1:9", "m");
    a.quiet = true;
    a.concurrency = Some(1);
    a.requests = Some(2);
    let r = run(a).await.unwrap();
    assert_eq!(r.results.errors.get("connect"), Some(&2), "{:?}", r.results.errors);
    assert!(r.render_table().contains("connect 2"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn canned_ceiling_stream_parses() {
    let s = stub::start(StubConfig { tokens: 16, canned: true, ..StubConfig::default() }).await;
    let mut a = args(&s);
    a.concurrency = Some(2);
    a.requests = Some(6);
    let r = run(a).await.unwrap();
    assert_eq!(r.results.requests.completed, 6);
    assert_eq!(r.results.tokens.output_total, 96);
    assert_eq!(r.results.tokens.usage_reported, 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn otlp_over_http_protobuf_and_conversation_traces() {
    let s = stub::start(StubConfig { tokens: 2, ..StubConfig::default() }).await;
    let (addr, captured) = capture::http().await;
    let mut a = args(&s);
    a.otlp_endpoint = Some(format!("http://{addr}"));
    a.otlp_protocol = inferwatch_probe::OtlpProtocol::HttpProtobuf;
    let _f15 = temp("otlp-flow.yaml", FLOW3);
    a.flow = Some(_f15.path());
    a.max_users = Some(2);
    let r = run(a).await.unwrap();
    assert_eq!(r.flow.as_ref().unwrap().users_completed, 2);
    let spans: Vec<_> = captured.spans().into_iter().map(|(_, _, s)| s).collect();
    // Three turns and one conversation span per user, one trace per conversation.
    assert_eq!(spans.len(), 8, "{:?}", spans.iter().map(|s| &s.name).collect::<Vec<_>>());
    let roots: Vec<_> = spans.iter().filter(|s| s.name == "invoke_workflow m").collect();
    assert_eq!(roots.len(), 2);
    for root in roots {
        let turns: Vec<_> = spans.iter().filter(|s| s.parent_span_id == root.span_id).collect();
        assert_eq!(turns.len(), 3);
        assert!(turns.iter().all(|t| t.trace_id == root.trace_id && t.name == "chat m"));
    }
    assert!(!captured.metrics().is_empty());
}

/// TLE and RCI leave the bench as OTLP histograms beside the span attributes (issue 20, item 7),
/// and the report's uncertain share uses the threshold of the K the server returned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tle_and_rci_leave_as_otlp_histograms() {
    use opentelemetry_proto::tonic::common::v1::any_value::Value as V;
    use opentelemetry_proto::tonic::metrics::v1::metric::Data;
    let answer = "paris is the capital of france";
    let s = stub::start(StubConfig { tokens: 6, answer: Some(answer.into()), ..StubConfig::default() }).await;
    let (addr, captured) = capture::grpc().await;
    let mut a = args(&s);
    a.otlp_endpoint = Some(format!("http://{addr}"));
    a.logprobs = Some(4);
    a.concurrency = Some(1);
    a.requests = Some(2);
    let lines = [
        serde_json::json!({"prompt": "capital of france?", "reference": answer}),
        serde_json::json!({"prompt": "something else", "reference": "a completely different reference text here"}),
    ];
    let _f = temp("q-otlp.jsonl", &lines.iter().map(|l| l.to_string() + "\n").collect::<String>());
    a.dataset = Some(_f.path());
    let r = run(a).await.unwrap();
    let tle = r.results.quality.as_ref().and_then(|q| q.tle.clone()).unwrap();
    // Uniform top 4: 2 bits, above the K = 4 threshold of 0.5 · log2 4 = 1 bit.
    assert_eq!((tle.k, tle.threshold_bits, tle.share_uncertain), (4, 1.0, 1.0), "{tle:?}");
    let spans: Vec<_> = captured.spans().into_iter().map(|(_, _, s)| s).collect();
    assert_eq!(spans.len(), 2);
    for sp in &spans {
        assert_eq!(attrs::attr(&sp.attributes, "inferwatch.bench.top_k"), Some(&V::IntValue(4)));
        assert!(
            matches!(attrs::attr(&sp.attributes, "inferwatch.bench.tle_bits"), Some(V::DoubleValue(t)) if (t - 2.0).abs() < 1e-9)
        );
    }
    let last = captured.metrics().last().cloned().unwrap();
    let metrics = &last.resource_metrics[0].scope_metrics[0].metrics;
    let hist = |name: &str| {
        let m = metrics.iter().find(|m| m.name == name).unwrap_or_else(|| panic!("{name} missing"));
        let Some(Data::Histogram(h)) = &m.data else { panic!("{name}: not a histogram") };
        (m.unit.clone(), h.clone())
    };
    let (unit, h) = hist("inferwatch.bench.tle_bits");
    assert_eq!(unit, "bit");
    assert_eq!(h.data_points.len(), 1, "one series: one model, one version");
    let p = &h.data_points[0];
    assert_eq!(p.count, 2);
    assert!((p.sum.unwrap_or(0.0) - 4.0).abs() < 1e-9, "{p:?}");
    assert_eq!(attrs::attr(&p.attributes, "gen_ai.request.model"), Some(&V::StringValue("m".into())));
    // 2 bits falls in the bucket (1.75, 2.0].
    let i = inferwatch_probe::otlp::TLE_BOUNDS.iter().position(|b| *b == 2.0).unwrap();
    assert_eq!(p.bucket_counts[i], 2);
    let (unit, h) = hist("inferwatch.bench.rci");
    assert_eq!(unit, "1");
    let p = &h.data_points[0];
    assert_eq!(p.count, 2);
    assert_eq!(p.bucket_counts[0], 1, "the identical answer: RCI ≈ 0");
    assert!(p.max.unwrap_or(0.0) > 0.6, "{p:?}");
}

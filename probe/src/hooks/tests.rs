//! Unit tests of the hook chain and the external-process protocol (external hooks are `sh`
//! scripts here; the e2e test drives a Python one).

use super::builtin::{PerturbHook, RciHook, TleHook};
use super::*;
use crate::client::{ErrorKind, Message, Outcome, Prompt, RequestError};
use crate::perturb::Profile;
use crate::quality::{Rci, RciWeights};
use std::borrow::Cow;
use std::time::{Duration, Instant, SystemTime};

fn req(id: u64) -> HookRequest<'static> {
    HookRequest {
        id,
        attempt: 1,
        index: Some(3),
        variant: None,
        state: None,
        api: Api::Chat,
        prompt: Cow::Owned(Prompt::Text("what is the capital of France".into())),
        max_tokens: 16,
        params: Map::new(),
        metadata: Map::new(),
        reference: None,
    }
}

fn outcome(text: &str) -> Outcome {
    let mut o = blank_outcome();
    o.text = text.into();
    o.output_tokens = 4;
    o.e2e = Duration::from_millis(40);
    o.ttft = Some(Duration::from_millis(10));
    o
}

fn blank_outcome() -> Outcome {
    Outcome::new(Instant::now(), SystemTime::now())
}

/// A test hook that appends its tag to the prompt and logs the order of its calls.
struct Tag {
    tag: &'static str,
    log: Arc<Mutex<Vec<String>>>,
    fail: bool,
}

impl Hook for Tag {
    fn name(&self) -> &str {
        self.tag
    }

    fn points(&self) -> Points {
        Points::ALL
    }

    fn pre_inference<'a>(&'a self, req: &'a mut HookRequest<'_>) -> BoxFuture<'a, Result<(), HookError>> {
        Box::pin(async move {
            lock(&self.log).push(format!("pre:{}", self.tag));
            if self.fail {
                return Err(HookError::Failed("refused".into()));
            }
            if let Prompt::Text(t) = req.prompt.to_mut() {
                t.push_str(&format!(" [{}]", self.tag));
            }
            req.metadata.insert("last".into(), Value::from(self.tag));
            Ok(())
        })
    }

    fn post_decode<'a>(
        &'a self,
        _req: &'a HookRequest<'_>,
        tokens: &'a [TokenEvent],
    ) -> BoxFuture<'a, Result<(), HookError>> {
        Box::pin(async move {
            lock(&self.log).push(format!("decode:{}:{}", self.tag, tokens.len()));
            Ok(())
        })
    }

    fn metric_finalize<'a>(
        &'a self,
        _req: &'a HookRequest<'_>,
        _tokens: &'a [TokenEvent],
        _o: &'a mut Outcome,
        out: &'a mut Finalized,
    ) -> BoxFuture<'a, Result<(), HookError>> {
        Box::pin(async move {
            lock(&self.log).push(format!("finalize:{}:{}", self.tag, out.metrics.len()));
            out.metrics.push(HookMetric { hook: Arc::from("?"), name: "seen".into(), value: out.metrics.len() as f64 });
            Ok(())
        })
    }
}

fn token(text: &str, ms: u64) -> TokenEvent {
    TokenEvent { at: Duration::from_millis(ms), text: text.into(), reasoning: String::new(), tokens: 1 }
}

#[tokio::test]
async fn chain_runs_in_order_and_each_sees_the_rewrites_before_it() {
    let log = Arc::new(Mutex::new(Vec::new()));
    let a: Arc<dyn Hook> = Arc::new(Tag { tag: "a", log: log.clone(), fail: false });
    let b: Arc<dyn Hook> = Arc::new(Tag { tag: "b", log: log.clone(), fail: true });
    let c: Arc<dyn Hook> = Arc::new(Tag { tag: "c", log: log.clone(), fail: false });
    let chain = Chain::new(vec![a, b, c]);
    let mut r = req(1);
    chain.pre_inference(&mut r).await;
    assert_eq!(*r.prompt, Prompt::Text("what is the capital of France [a] [c]".into()));
    assert_eq!(r.metadata["last"], "c");
    let toks = [token("Pa", 10), token("ris", 20)];
    let mut o = outcome("Paris");
    let fin = chain.finish(&r, &toks, &mut o).await;
    assert_eq!(
        *lock(&log),
        [
            "pre:a",
            "pre:b",
            "pre:c",
            "decode:a:2",
            "decode:b:2",
            "decode:c:2",
            "finalize:a:0",
            "finalize:b:1",
            "finalize:c:2"
        ]
    );
    // Metrics are attributed to the hook that added them, in chain order.
    let got: Vec<(&str, f64)> = fin.metrics.iter().map(|m| (&*m.hook, m.value)).collect();
    assert_eq!(got, [("a", 0.0), ("b", 1.0), ("c", 2.0)]);
    let rep = chain.report();
    assert_eq!(rep.failures, 1);
    let b = &rep.chain[1];
    assert_eq!(b.pre_inference, Some(PointStats { calls: 1, failures: 1, timeouts: 0 }));
    assert!(b.last_error.as_deref().is_some_and(|e| e.contains("refused")), "{b:?}");
    assert_eq!(rep.chain[2].metrics["seen"].count, 1);
    assert_eq!(rep.metadata["last"]["c"], 1);
}

#[tokio::test]
async fn builtins_perturb_the_twin_and_compute_tle_and_rci() {
    let profile = Profile::parse("light").unwrap();
    let chain = Chain::new(vec![
        Arc::new(PerturbHook::new(profile.clone(), 9)),
        Arc::new(TleHook),
        Arc::new(RciHook::new(RciWeights::default())),
    ]);
    let mut base = req(1);
    base.variant = Some("baseline".into());
    chain.pre_inference(&mut base).await;
    assert_eq!(base.prompt, req(1).prompt, "the baseline is sent as is");
    let mut twin = req(2);
    twin.variant = Some("light".into());
    twin.prompt = Cow::Owned(Prompt::Messages(vec![
        Message::new("system", "s"),
        Message::new("user", "what is the capital of France"),
    ]));
    chain.pre_inference(&mut twin).await;
    let Prompt::Messages(m) = &*twin.prompt else { panic!("{:?}", twin.prompt) };
    assert_eq!(m[0].content, "s");
    let distractor = profile.distractor(9, 3);
    assert!(m[1].content.contains(&distractor) && m[1].content.len() > distractor.len(), "{m:?}");

    let reference = crate::quality::Reference::new("the capital of France is Paris");
    let mut r = req(3);
    r.reference = Some(reference.clone());
    assert!(chain.wants_tokens(&r) && !chain.wants_tokens(&req(4)));
    let toks = [token("the capi", 5), token("tal of France ", 9), token("is Paris", 12)];
    let mut o = outcome("the capital of France is Paris");
    o.first_top_logprobs = Some(vec![(0.5f64).ln(), (0.5f64).ln()]);
    let fin = chain.finish(&r, &toks, &mut o).await;
    assert!((fin.tle_bits.unwrap() - 1.0).abs() < 1e-9, "{fin:?}");
    let mut whole = Rci::new(reference);
    whole.push("the capital of France is Paris");
    assert_eq!(o.rci, Some(whole.finish(RciWeights::default())));
    // A failed request gets no RCI.
    let mut failed = outcome("");
    failed.error = Some(RequestError { kind: ErrorKind::Http(503), message: "busy".into() });
    chain.finish(&r, &[], &mut failed).await;
    assert_eq!(failed.rci, None);
}

fn sh(script: &str, timeout: Duration) -> ExternalSpec {
    ExternalSpec { name: None, argv: vec!["sh".into(), "-c".into(), script.into()], timeout }
}

fn info() -> external::BenchInfo {
    external::BenchInfo {
        model: "m".into(),
        url: "http://127.0.0.1:1/v1/chat/completions".into(),
        api: Api::Chat,
        stream: true,
    }
}

/// Answers hello, rewrites max_tokens to 3 and adds a metric; ids are read from the JSON
/// (serde_json writes keys sorted, so `"id":"N"` has this form).
const GOOD: &str = r#"
id_of() { printf '%s' "$1" | sed 's/.*"id":"\([0-9]*\)".*/\1/'; }
while IFS= read -r line; do
  case "$line" in
    *'"type":"hello"'*) echo '{"type":"hello","name":"good","wants":["pre_inference","metric_finalize"]}' ;;
    *'"type":"pre_inference"'*) echo "{\"type\":\"pre_inference\",\"id\":\"$(id_of "$line")\",\"request\":{\"max_tokens\":3},\"metadata\":{\"hook\":\"sh\"}}" ;;
    *'"type":"metric_finalize"'*) echo "{\"type\":\"metric_finalize\",\"id\":\"$(id_of "$line")\",\"metrics\":{\"answer_chars\":5}}" ;;
    *'"type":"shutdown"'*) exit 0 ;;
  esac
done
"#;

#[tokio::test]
async fn external_hook_rewrites_and_adds_metrics() {
    let h = ExternalHook::start(&sh(GOOD, Duration::from_secs(5)), &info()).await.unwrap();
    assert_eq!(h.name(), "good");
    assert_eq!(h.points(), Points { pre_inference: true, post_decode: false, metric_finalize: true });
    let chain = Chain::new(vec![Arc::new(h)]);
    for id in 1..=3 {
        let mut r = req(id);
        chain.pre_inference(&mut r).await;
        assert_eq!(r.max_tokens, 3);
        let mut o = outcome("Paris");
        let fin = chain.finish(&r, &[], &mut o).await;
        assert_eq!(fin.metrics, vec![HookMetric { hook: Arc::from("good"), name: "answer_chars".into(), value: 5.0 }]);
    }
    chain.shutdown().await;
    let rep = chain.report();
    assert_eq!(rep.failures, 0, "{rep:?}");
    let h = &rep.chain[0];
    assert_eq!((h.state, h.kind, h.protocol_errors), ("ok", "external", 0));
    assert_eq!(h.detail, None, "{h:?}");
    assert_eq!(h.metrics["answer_chars"].count, 3);
    assert_eq!(rep.metadata["hook"]["sh"], 3);
}

#[tokio::test]
async fn a_hook_that_answers_garbage_and_dies_is_reported_not_fatal() {
    let script = r#"read -r l; echo '{"type":"hello"}'; read -r l; echo 'this is not json'; echo 'boom' >&2; exit 3"#;
    let h = ExternalHook::start(&sh(script, Duration::from_secs(5)), &info()).await.unwrap();
    let chain = Chain::new(vec![Arc::new(h)]);
    let mut r = req(1);
    let t = Instant::now();
    chain.pre_inference(&mut r).await;
    assert!(t.elapsed() < Duration::from_secs(4), "the death is seen at once, not at the timeout");
    assert_eq!(r.prompt, req(1).prompt, "the request goes on unchanged");
    assert_eq!(r.max_tokens, 16);
    // Later calls fail at once.
    let mut o = outcome("x");
    let fin = chain.finish(&r, &[], &mut o).await;
    assert!(fin.metrics.is_empty());
    let rep = chain.report();
    let h = &rep.chain[0];
    assert_eq!(h.state, "failed", "{h:?}");
    let detail = h.detail.as_deref().unwrap_or_default();
    assert!(detail.contains("exit status: 3") && detail.contains("boom"), "{detail}");
    assert_eq!(h.protocol_errors, 1, "{h:?}");
    assert_eq!(rep.failures, 3, "pre_inference, post_decode and metric_finalize each failed: {rep:?}");
    assert_eq!(h.pre_inference.map(|p| p.timeouts), Some(0));
    chain.shutdown().await;
}

#[tokio::test]
async fn a_silent_hook_times_out_then_is_given_up() {
    // Says hello, then reads everything and answers nothing.
    let script = r#"read -r l; echo '{"type":"hello","wants":["pre_inference"]}'; cat > /dev/null"#;
    let timeout = Duration::from_millis(200);
    let h = ExternalHook::start(&sh(script, timeout), &info()).await.unwrap();
    let direct = Arc::new(h);
    let chain = Chain::new(vec![direct.clone()]);
    for i in 1..=3 {
        let t = Instant::now();
        let mut r = req(i);
        chain.pre_inference(&mut r).await;
        assert!(t.elapsed() >= timeout, "call {i} waited its timeout");
        assert_eq!(r.max_tokens, 16);
    }
    let mut r = req(4);
    let err = direct.pre_inference(&mut r).await.unwrap_err();
    assert!(matches!(&err, HookError::Dead(why) if why.contains("3 calls in a row")), "{err:?}");
    let rep = chain.report();
    let h = &rep.chain[0];
    assert_eq!(h.state, "unresponsive");
    assert_eq!(h.pre_inference, Some(PointStats { calls: 3, failures: 3, timeouts: 3 }));
    chain.shutdown().await;
}

#[tokio::test]
async fn a_missing_program_is_an_error_at_start() {
    let spec =
        ExternalSpec { name: None, argv: vec!["/nonexistent/hook-binary".into()], timeout: Duration::from_secs(1) };
    let e = ExternalHook::start(&spec, &info()).await.err().unwrap_or_default();
    assert!(e.contains("cannot start hook"), "{e}");
}

#[test]
fn config_file_and_flags() {
    let dir = std::env::temp_dir().join(format!("inferwatch-hooks-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("bench.yaml");
    std::fs::write(
        &p,
        "hooks:\n  - command: python3 -u hook.py --system 'Be brief.'\n    timeout: 2s\n  - command: [./other, x]\n    name: other\n",
    )
    .unwrap();
    let specs = external_specs(Some(&p), &["node h.js".to_string()], Duration::from_secs(5)).unwrap();
    assert_eq!(specs.len(), 3);
    assert_eq!(specs[0].argv, ["python3", "-u", "hook.py", "--system", "Be brief."]);
    assert_eq!(specs[0].timeout, Duration::from_secs(2));
    assert_eq!((specs[1].name.as_deref(), specs[1].timeout), (Some("other"), Duration::from_secs(5)));
    assert_eq!(specs[2].argv, ["node", "h.js"]);
    std::fs::write(&p, "hooks:\n  - commnd: x\n").unwrap();
    let e = external_specs(Some(&p), &[], Duration::from_secs(5)).unwrap_err();
    assert!(e.contains("commnd"), "{e}");
    std::fs::write(&p, "hooks:\n  - command: x\n    timeout: 0s\n").unwrap();
    assert!(external_specs(Some(&p), &[], Duration::from_secs(5)).is_err());
    let _ = std::fs::remove_dir_all(&dir);
}

//! Dialogue flows: the YAML file (`dialogue_flow:`), its validation with line numbers, and
//! the validated state machine the flow runner walks.

use serde::Deserialize;
use serde_saphyr::Spanned;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// One problem found in a flow file, with its 1-based position (0 when unknown).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlowProblem {
    /// 1-based line of the offending node (0 when unknown).
    pub line: u64,
    /// 1-based column of the offending node (0 when unknown).
    pub column: u64,
    /// What is wrong.
    pub message: String,
}

/// A flow file that cannot be used: every problem found, each with its line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct FlowError {
    /// The file (empty when the flow came from a string).
    pub path: PathBuf,
    /// Problems in file order.
    pub problems: Vec<FlowProblem>,
}

impl fmt::Display for FlowError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name =
            if self.path.as_os_str().is_empty() { "<flow>".to_string() } else { self.path.display().to_string() };
        for (i, p) in self.problems.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            if p.line > 0 {
                write!(f, "{name}:{}:{}: {}", p.line, p.column, p.message)?;
            } else {
                write!(f, "{name}: {}", p.message)?;
            }
        }
        Ok(())
    }
}

impl FlowError {
    /// The lines of all problems, in order (0 for a problem without a position).
    pub fn lines(&self) -> Vec<u64> {
        self.problems.iter().map(|p| p.line).collect()
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileRaw {
    dialogue_flow: Spanned<FlowRaw>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FlowRaw {
    #[serde(default)]
    start_state: Option<Spanned<String>>,
    states: BTreeMap<String, Spanned<StateRaw>>,
    #[serde(default)]
    qps_schedule: Vec<Spanned<QpsRaw>>,
    #[serde(default)]
    max_context_tokens: Option<Spanned<f64>>,
    #[serde(default)]
    rtt_backoff_ratio: Option<Spanned<f64>>,
    #[serde(default)]
    rtt_backoff_threshold_s: Option<Spanned<f64>>,
    /// Extension: most turns one user takes (bounds flows with cycles).
    #[serde(default)]
    max_turns: Option<Spanned<u32>>,
    /// Extension: a system message opening every conversation.
    #[serde(default)]
    system: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct StateRaw {
    #[serde(default)]
    next: Option<Spanned<String>>,
    #[serde(default)]
    timeout: Option<Spanned<f64>>,
    #[serde(default)]
    max_retries: Option<u32>,
    #[serde(default)]
    prompt: Option<String>,
    #[serde(default)]
    max_tokens: Option<u32>,
    /// Extension: a reference answer for RCI.
    #[serde(default)]
    reference: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct QpsRaw {
    state: Spanned<String>,
    qps: Spanned<f64>,
}

/// One validated state of a dialogue flow.
#[derive(Debug, Clone, PartialEq)]
pub struct State {
    /// The state's name.
    pub name: String,
    /// Index of the next state; `None` ends the conversation.
    pub next: Option<usize>,
    /// Deadline of one turn (attempt).
    pub timeout: Option<Duration>,
    /// Attempts after the first on error or timeout.
    pub max_retries: Option<u32>,
    /// The user message of this turn (else one from the dataset).
    pub prompt: Option<String>,
    /// Output limit of this turn.
    pub max_tokens: Option<u32>,
    /// Reference answer for RCI.
    pub reference: Option<String>,
    /// Turns per second dispatched into this state; `None`: sent as soon as the user gets here.
    pub qps: Option<f64>,
}

/// A validated dialogue flow.
#[derive(Debug, Clone, PartialEq)]
pub struct Flow {
    /// Index of the start state.
    pub start: usize,
    /// The states, sorted by name.
    pub states: Vec<State>,
    /// Context size above which pacing backs off.
    pub max_context_tokens: f64,
    /// Factor applied to a state's QPS for a user that backs off (1: never).
    pub rtt_backoff_ratio: f64,
    /// Previous-turn RTT above which a user backs off (with the context condition).
    pub rtt_backoff_threshold: Duration,
    /// Most turns per user.
    pub max_turns: u32,
    /// System message opening every conversation.
    pub system: Option<String>,
}

/// The name `next` uses to end a conversation when no state of that name exists.
pub const END: &str = "end";

impl Flow {
    /// Reads and validates a flow file.
    pub fn load(path: &Path) -> Result<Flow, FlowError> {
        let text = std::fs::read_to_string(path).map_err(|e| FlowError {
            path: path.to_path_buf(),
            problems: vec![FlowProblem { line: 0, column: 0, message: format!("cannot read the file: {e}") }],
        })?;
        Flow::parse(&text).map_err(|mut e| {
            e.path = path.to_path_buf();
            e
        })
    }

    /// Parses and validates flow YAML.
    pub fn parse(text: &str) -> Result<Flow, FlowError> {
        let raw: FileRaw = serde_saphyr::from_str(text).map_err(|e| {
            let (line, column) = e.location().map_or((0, 0), |l| (l.line(), l.column()));
            FlowError { path: PathBuf::new(), problems: vec![FlowProblem { line, column, message: first_line(&e) }] }
        })?;
        validate(raw.dialogue_flow)
    }

    /// The index of a state by name.
    pub fn index(&self, name: &str) -> Option<usize> {
        self.states.iter().position(|s| s.name == name)
    }
}

/// The YAML error's message without the source snippet serde-saphyr appends.
fn first_line(e: &serde_saphyr::Error) -> String {
    let s = e.to_string();
    let line = s.lines().find(|l| !l.trim().is_empty()).unwrap_or("invalid YAML").trim();
    // serde-saphyr prefixes "error: " in its rendered form; keep just the message.
    let line = line.strip_prefix("error: ").unwrap_or(line);
    // Drop "line X column Y: ": the position is reported separately.
    let line = match line.strip_prefix("line ").and_then(|r| r.split_once(": ")) {
        Some((pos, rest)) if pos.contains(" column ") => rest,
        _ => line,
    };
    line.to_string()
}

struct Problems(Vec<FlowProblem>);

impl Problems {
    fn at<T>(&mut self, s: &Spanned<T>, message: impl Into<String>) {
        let l = s.referenced;
        self.0.push(FlowProblem { line: l.line(), column: l.column(), message: message.into() });
    }
}

fn validate(flow: Spanned<FlowRaw>) -> Result<Flow, FlowError> {
    let mut p = Problems(Vec::new());
    let f = &flow.value;
    let names: Vec<String> = f.states.keys().cloned().collect();
    let index: HashMap<&str, usize> = names.iter().enumerate().map(|(i, n)| (n.as_str(), i)).collect();
    if names.is_empty() {
        p.at(&flow, "`states` is empty: a flow needs at least one state");
    }

    let start = match &f.start_state {
        None => {
            p.at(&flow, "missing `start_state`");
            None
        }
        Some(s) => match index.get(s.value.as_str()) {
            Some(&i) => Some(i),
            None => {
                p.at(s, format!("start_state {:?} is not a state (states: {})", s.value, names.join(", ")));
                None
            }
        },
    };

    let mut states = Vec::with_capacity(names.len());
    for (name, st) in &f.states {
        let s = &st.value;
        let next = match &s.next {
            None => None,
            Some(n) => match index.get(n.value.as_str()) {
                Some(&i) => Some(i),
                None if n.value == END => None,
                None => {
                    p.at(
                        n,
                        format!(
                            "state {name:?}: next {:?} is not a state (use `{END}` to finish the dialogue)",
                            n.value
                        ),
                    );
                    None
                }
            },
        };
        let timeout = match &s.timeout {
            None => None,
            Some(t) if t.value.is_finite() && t.value > 0.0 && t.value < 1e9 => Some(Duration::from_secs_f64(t.value)),
            Some(t) => {
                p.at(t, format!("state {name:?}: timeout must be a positive number of seconds, got {}", t.value));
                None
            }
        };
        states.push(State {
            name: name.clone(),
            next,
            timeout,
            max_retries: s.max_retries,
            prompt: s.prompt.clone(),
            max_tokens: s.max_tokens,
            reference: s.reference.clone(),
            qps: None,
        });
    }

    let mut scheduled: HashMap<usize, &Spanned<QpsRaw>> = HashMap::new();
    for q in &f.qps_schedule {
        let Some(&i) = index.get(q.value.state.value.as_str()) else {
            p.at(&q.value.state, format!("qps_schedule names {:?}, which is not a state", q.value.state.value));
            continue;
        };
        let qps = q.value.qps.value;
        if !qps.is_finite() || qps <= 0.0 {
            p.at(&q.value.qps, format!("qps for state {:?} must be a positive number, got {qps}", q.value.state.value));
            continue;
        }
        if let Some(prev) = scheduled.insert(i, q) {
            let l = prev.referenced.line();
            p.at(&q.value.state, format!("state {:?} is scheduled twice (also on line {l})", q.value.state.value));
            continue;
        }
        states[i].qps = Some(qps);
    }

    if let Some(s) = start {
        if states[s].qps.is_none() {
            let at = f.start_state.as_ref().map_or(&flow.referenced, |x| &x.referenced);
            p.0.push(FlowProblem {
                line: at.line(),
                column: at.column(),
                message: format!(
                    "the start state {:?} has no qps in qps_schedule: it sets the rate at which users arrive",
                    states[s].name
                ),
            });
        }
        // Reachability from the start state along `next`.
        let mut seen = vec![false; states.len()];
        let mut cur = Some(s);
        while let Some(i) = cur {
            if seen[i] {
                break;
            }
            seen[i] = true;
            cur = states[i].next;
        }
        for (i, name) in names.iter().enumerate() {
            if !seen[i]
                && let Some(st) = f.states.get(name)
            {
                p.at(st, format!("state {name:?} is unreachable from start_state {:?}", states[s].name));
            }
        }
    }

    let mut number = |v: &Option<Spanned<f64>>, field: &str, ok: fn(f64) -> bool, want: &str| -> Option<f64> {
        let x = v.as_ref()?;
        if x.value.is_finite() && ok(x.value) {
            Some(x.value)
        } else {
            p.at(x, format!("{field} must be {want}, got {}", x.value));
            None
        }
    };
    let max_context_tokens = number(&f.max_context_tokens, "max_context_tokens", |x| x >= 0.0, "≥ 0").unwrap_or(0.0);
    let ratio = number(&f.rtt_backoff_ratio, "rtt_backoff_ratio", |x| x > 0.0 && x <= 1.0, "in (0, 1]").unwrap_or(1.0);
    let threshold =
        number(&f.rtt_backoff_threshold_s, "rtt_backoff_threshold_s", |x| (0.0..1e9).contains(&x), "≥ 0 seconds")
            .unwrap_or(0.0);
    let max_turns = match &f.max_turns {
        Some(m) if m.value == 0 => {
            p.at(m, "max_turns must be at least 1");
            1
        }
        Some(m) => m.value,
        None => 1000,
    };

    p.0.sort_by_key(|x| (x.line, x.column));
    match (p.0.is_empty(), start) {
        (true, Some(start)) => Ok(Flow {
            start,
            states,
            max_context_tokens,
            rtt_backoff_ratio: ratio,
            rtt_backoff_threshold: Duration::from_secs_f64(threshold),
            max_turns,
            system: f.system.clone(),
        }),
        _ => Err(FlowError { path: PathBuf::new(), problems: p.0 }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The study's example dialogue flow, verbatim.
    pub const STUDY: &str = r#"dialogue_flow:
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

    fn err(text: &str) -> FlowError {
        match Flow::parse(text) {
            Ok(f) => panic!("expected an error, got {f:?}"),
            Err(e) => e,
        }
    }

    #[test]
    fn study_example_parses() {
        let f = Flow::parse(STUDY).unwrap();
        assert_eq!(f.states.len(), 3);
        let g = &f.states[f.start];
        assert_eq!(g.name, "greeting");
        assert_eq!(g.timeout, Some(Duration::from_secs(5)));
        assert_eq!(g.qps, Some(50.0));
        let a = f.index("ask_preference").unwrap();
        assert_eq!(g.next, Some(a));
        assert_eq!(f.states[a].max_retries, Some(2));
        let r = f.index("generate_recommendation").unwrap();
        assert_eq!(f.states[a].next, Some(r));
        assert_eq!(f.states[r].next, None);
        assert_eq!(f.states[r].max_tokens, Some(512));
        assert_eq!(f.states[r].qps, Some(15.0));
        assert_eq!(f.max_context_tokens, 8192.0);
        assert_eq!(f.rtt_backoff_ratio, 0.6);
        assert_eq!(f.rtt_backoff_threshold, Duration::from_millis(1200));
    }

    #[test]
    fn unknown_key_has_its_line() {
        let text = STUDY.replace("max_retries: 2,", "max_retries: 2, retry_delay: 3,");
        let e = err(&text);
        assert_eq!(e.lines(), vec![5], "{e}");
        assert!(e.to_string().contains("retry_delay"), "{e}");
        let text = STUDY.replace("  max_context_tokens: 8192", "  max_ctx: 8192");
        let e = err(&text);
        assert_eq!(e.lines(), vec![11], "{e}");
    }

    #[test]
    fn unreachable_state_has_its_line() {
        let text = STUDY.replace("  qps_schedule:", "    orphan: { next: end, prompt: \"x\" }\n  qps_schedule:");
        let e = err(&text);
        assert_eq!(e.lines(), vec![7], "{e}");
        assert!(e.to_string().contains("unreachable"), "{e}");
    }

    #[test]
    fn missing_start_state() {
        let text = STUDY.replace("  start_state: greeting\n", "");
        let e = err(&text);
        assert!(e.to_string().contains("missing `start_state`"), "{e}");
        assert!(e.problems[0].line >= 1, "{e}");
        let text = STUDY.replace("start_state: greeting", "start_state: hello");
        let e = err(&text);
        assert_eq!(e.lines(), vec![2], "{e}");
    }

    #[test]
    fn next_names_unknown_state() {
        let text = STUDY.replace("next: generate_recommendation", "next: recommend");
        let e = err(&text);
        assert!(e.lines().contains(&5), "{e}");
        assert!(e.to_string().contains("\"recommend\""), "{e}");
    }

    #[test]
    fn negative_qps() {
        let text = STUDY.replace("qps: 30", "qps: -30");
        let e = err(&text);
        assert_eq!(e.lines(), vec![9], "{e}");
        assert!(e.to_string().contains("positive"), "{e}");
    }

    #[test]
    fn syntax_error_has_a_line() {
        let text = STUDY.replace("    greeting:  ", "    greeting: [ ");
        let e = err(&text);
        assert!(e.problems[0].line >= 4, "{e}");
    }

    #[test]
    fn several_problems_reported_in_order() {
        let text = STUDY.replace("qps: 15", "qps: -1").replace("rtt_backoff_ratio: 0.6", "rtt_backoff_ratio: 1.6");
        let e = err(&text);
        assert_eq!(e.lines(), vec![10, 12], "{e}");
    }

    #[test]
    fn cycles_are_allowed() {
        let text = STUDY.replace("next: end", "next: greeting");
        let f = Flow::parse(&text).unwrap();
        let r = f.index("generate_recommendation").unwrap();
        assert_eq!(f.states[r].next, Some(f.start));
    }
}

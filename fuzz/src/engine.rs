//! The fuzz loop: run the seeds, then mutate corpus entries; each input runs under
//! `catch_unwind` with a time and a heap budget. Inputs with a new outcome signature join
//! the working corpus (outcome feedback, the stable toolchain's stand-in for coverage).

use crate::mutate::{self, InputKind};
use crate::{Rng, alloc};
use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashSet};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, Once, OnceLock};
use std::time::{Duration, Instant};

/// What a target reports for one input: an outcome signature, or an invariant violation.
pub type Outcome = Result<u64, String>;

/// One fuzz target.
#[derive(Clone, Copy)]
pub struct Target {
    /// Name (also the corpus folder).
    pub name: &'static str,
    /// What the inputs are.
    pub kind: InputKind,
    /// Tokens for text mutations.
    pub dict: &'static [&'static [u8]],
    /// Runs one input.
    pub run: fn(&[u8]) -> Outcome,
    /// Executions of the short run in the test suite.
    pub short_execs: u64,
    /// Time one input may take before it is a finding.
    pub budget: Duration,
}

/// Settings of one run.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Seed of the mutations.
    pub seed: u64,
    /// Stop after this many executions (seeds included).
    pub max_execs: Option<u64>,
    /// Stop after this long.
    pub max_time: Option<Duration>,
    /// Largest mutated input.
    pub max_len: usize,
    /// Peak heap growth one input may cause before it is a finding.
    pub mem_budget: usize,
    /// Where minimised findings are written (`<dir>/<target>/`); none: not written.
    pub findings_dir: Option<PathBuf>,
    /// Scales every target's time budget (debug builds are slower).
    pub budget_scale: u32,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            seed: 0x1f_2026,
            max_execs: None,
            max_time: None,
            max_len: 64 * 1024,
            mem_budget: 256 << 20,
            findings_dir: None,
            budget_scale: if cfg!(debug_assertions) { 4 } else { 1 },
        }
    }
}

/// The kind of a finding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum FindingKind {
    /// The input panicked.
    Crash,
    /// The input took longer than the target's budget.
    Hang,
    /// The input made the heap grow past the memory budget.
    Memory,
    /// The target's own check failed (e.g. accepted input that does not round-trip).
    Invariant,
}

/// A distinct finding with its minimised input.
#[derive(Debug, Clone)]
pub struct Finding {
    /// What went wrong.
    pub kind: FindingKind,
    /// The panic message and location, or the violated check.
    pub message: String,
    /// The smallest input found that shows it.
    pub input: Vec<u8>,
    /// How many executions showed it.
    pub hits: u64,
}

/// The figures of one run.
#[derive(Debug, Clone)]
pub struct Report {
    /// Target name.
    pub target: &'static str,
    /// Inputs run.
    pub execs: u64,
    /// Wall time.
    pub elapsed: Duration,
    /// Executions that panicked.
    pub crashes: u64,
    /// Executions over the time budget.
    pub hangs: u64,
    /// Executions over the memory budget.
    pub memory: u64,
    /// Executions that broke an invariant.
    pub invariant: u64,
    /// Distinct findings, minimised.
    pub findings: Vec<Finding>,
    /// Seeds loaded.
    pub seeds: usize,
    /// Working corpus at the end.
    pub corpus: usize,
    /// Distinct outcome signatures seen.
    pub signatures: usize,
    /// Slowest input.
    pub slowest: Duration,
    /// Largest peak heap growth of one input.
    pub max_alloc: usize,
    /// Heap in use before and after (leak check).
    pub heap: (usize, usize),
    /// RSS before and after.
    pub rss: (usize, usize),
}

impl Report {
    /// Executions per second.
    pub fn rate(&self) -> f64 {
        self.execs as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// One line of figures.
    pub fn line(&self) -> String {
        format!(
            "{:<26} execs {:>9}  {:>8.0}/s  crashes {}  hangs {}  memory {}  invariant {}  distinct findings {}  \
             corpus {}->{}  signatures {}  slowest {:.1} ms  max alloc {:.1} MiB  rss {:.0}->{:.0} MiB",
            self.target,
            self.execs,
            self.rate(),
            self.crashes,
            self.hangs,
            self.memory,
            self.invariant,
            self.findings.len(),
            self.seeds,
            self.corpus,
            self.signatures,
            self.slowest.as_secs_f64() * 1e3,
            self.max_alloc as f64 / 1048576.0,
            self.rss.0 as f64 / 1048576.0,
            self.rss.1 as f64 / 1048576.0,
        )
    }
}

thread_local! {
    static CATCHING: Cell<bool> = const { Cell::new(false) };
    static LAST_PANIC: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Panics on other threads (a server task) while an input ran.
static OTHER_PANICS: Mutex<Vec<String>> = Mutex::new(Vec::new());
/// The input being run, for the allocator's cap and the watchdog.
pub(crate) static CURRENT_INPUT: Mutex<Vec<u8>> = Mutex::new(Vec::new());
/// When the current input started (ms since [`epoch`]); 0 when idle.
static STARTED_MS: AtomicU64 = AtomicU64::new(0);
/// Hard limit of one input for the watchdog (ms).
static HARD_LIMIT_MS: AtomicU64 = AtomicU64::new(60_000);
/// Where the watchdog writes the input that hung (the current target's findings folder).
static HANG_FILE: Mutex<Option<PathBuf>> = Mutex::new(None);

fn epoch() -> Instant {
    static E: OnceLock<Instant> = OnceLock::new();
    *E.get_or_init(Instant::now)
}

fn now_ms() -> u64 {
    epoch().elapsed().as_millis() as u64 + 1
}

/// Installs the panic hook (records the message and location of a panic caught here; other
/// threads' panics are recorded too) and the watchdog thread, once per process.
pub fn install() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let _ = epoch();
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let msg = info
                .payload()
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| info.payload().downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "non-string panic".into());
            let loc = info.location().map(|l| format!("{}:{}", l.file(), l.line())).unwrap_or_default();
            let text = format!("{msg} at {loc}");
            if CATCHING.with(Cell::get) {
                LAST_PANIC.with(|p| *p.borrow_mut() = Some(text));
            } else if STARTED_MS.load(Ordering::Relaxed) != 0 {
                if let Ok(mut v) = OTHER_PANICS.lock() {
                    v.push(text);
                }
                prev(info);
            } else {
                prev(info);
            }
        }));
        std::thread::Builder::new()
            .name("fuzz-watchdog".into())
            .spawn(|| {
                loop {
                    std::thread::sleep(Duration::from_millis(200));
                    let started = STARTED_MS.load(Ordering::Relaxed);
                    if started != 0 && now_ms().saturating_sub(started) > HARD_LIMIT_MS.load(Ordering::Relaxed) {
                        let input = CURRENT_INPUT.lock().map(|v| v.clone()).unwrap_or_default();
                        let path = HANG_FILE
                            .lock()
                            .ok()
                            .and_then(|p| p.clone())
                            .unwrap_or_else(|| std::env::temp_dir().join("fuzz-hang.bin"));
                        let _ = std::fs::write(&path, &input);
                        eprintln!(
                            "fuzz: an input ran past the hard limit; it is in {} ({} bytes): {}",
                            path.display(),
                            input.len(),
                            escape(&input, 400)
                        );
                        std::process::exit(70);
                    }
                }
            })
            .ok();
    });
}

/// The result of one execution.
enum Exec {
    Ok(u64),
    Found(FindingKind, String),
}

fn exec(t: &Target, input: &[u8], s: &Settings, slowest: &mut Duration, max_alloc: &mut usize) -> Exec {
    if let Ok(mut cur) = CURRENT_INPUT.lock() {
        cur.clear();
        cur.extend_from_slice(input);
    }
    let base = alloc::reset_peak();
    let t0 = Instant::now();
    STARTED_MS.store(now_ms(), Ordering::Relaxed);
    CATCHING.with(|c| c.set(true));
    let r = catch_unwind(AssertUnwindSafe(|| (t.run)(input)));
    CATCHING.with(|c| c.set(false));
    STARTED_MS.store(0, Ordering::Relaxed);
    let took = t0.elapsed();
    let grew = alloc::peak().saturating_sub(base);
    *slowest = (*slowest).max(took);
    *max_alloc = (*max_alloc).max(grew);
    let other = OTHER_PANICS.lock().map(|mut v| std::mem::take(&mut *v)).unwrap_or_default();
    match r {
        Err(_) => {
            let msg = LAST_PANIC.with(|p| p.borrow_mut().take()).unwrap_or_else(|| "panic".into());
            Exec::Found(FindingKind::Crash, msg)
        }
        Ok(_) if !other.is_empty() => Exec::Found(FindingKind::Crash, format!("on another thread: {}", other[0])),
        Ok(_) if grew > s.mem_budget => {
            Exec::Found(FindingKind::Memory, format!("heap grew {} MiB for {} input bytes", grew >> 20, input.len()))
        }
        Ok(_) if took > t.budget * s.budget_scale => Exec::Found(
            FindingKind::Hang,
            format!("took {} ms (budget {} ms)", took.as_millis(), (t.budget * s.budget_scale).as_millis()),
        ),
        Ok(Err(msg)) => Exec::Found(FindingKind::Invariant, msg),
        Ok(Ok(sig)) => Exec::Ok(sig),
    }
}

/// The key findings are told apart by: kind and the message's first line with digits folded.
fn finding_key(kind: FindingKind, msg: &str) -> (FindingKind, u64) {
    (kind, crate::sig(msg.lines().next().unwrap_or_default()))
}

/// Shrinks `input` while it still shows the finding `key` (at most `budget` executions).
fn minimise(t: &Target, input: &[u8], key: (FindingKind, u64), s: &Settings, budget: usize) -> Vec<u8> {
    let mut best = input.to_vec();
    let (mut slow, mut alloc) = (Duration::ZERO, 0);
    let mut tries = 0;
    let mut chunk = best.len().div_ceil(2).max(1);
    while chunk >= 1 && tries < budget {
        let mut i = 0;
        let mut shrunk = false;
        while i < best.len() && tries < budget {
            let mut cand = best.clone();
            cand.drain(i..(i + chunk).min(best.len()));
            tries += 1;
            let same =
                matches!(exec(t, &cand, s, &mut slow, &mut alloc), Exec::Found(k, m) if finding_key(k, &m) == key);
            if same {
                best = cand;
                shrunk = true;
            } else {
                i += chunk;
            }
        }
        if !shrunk {
            if chunk == 1 {
                break;
            }
            chunk /= 2;
        }
    }
    best
}

/// Runs `t` from `seeds` under `s` and reports the figures.
pub fn run(t: &Target, seeds: &[Vec<u8>], s: &Settings) -> Report {
    install();
    HARD_LIMIT_MS.store((t.budget * s.budget_scale * 20).as_millis().max(10_000) as u64, Ordering::Relaxed);
    if let Some(dir) = &s.findings_dir {
        let d = dir.join(t.name);
        let _ = std::fs::create_dir_all(&d);
        if let Ok(mut h) = HANG_FILE.lock() {
            *h = Some(d.join("hang-input.bin"));
        }
        let _ = alloc::set_dump_file(&d.join("oom-input.bin"));
    }
    let mut rng = Rng::new(s.seed ^ crate::hash64(t.name.as_bytes()));
    let heap0 = alloc::current();
    let rss0 = alloc::rss();
    let t0 = Instant::now();
    let mut corpus: Vec<Vec<u8>> = seeds.to_vec();
    if corpus.is_empty() {
        corpus.push(Vec::new());
    }
    let mut sigs = HashSet::new();
    let mut found: BTreeMap<(FindingKind, u64), Finding> = BTreeMap::new();
    let mut counts = [0u64; 4];
    let (mut slowest, mut max_alloc) = (Duration::ZERO, 0usize);
    let mut execs = 0u64;
    let mut queue: std::collections::VecDeque<Vec<u8>> = corpus.iter().cloned().collect();
    let done = |execs: u64| s.max_execs.is_some_and(|m| execs >= m) || s.max_time.is_some_and(|d| t0.elapsed() >= d);
    while !done(execs) {
        let input = match queue.pop_front() {
            Some(seed) => seed,
            None => {
                let parent = &corpus[rng.below(corpus.len())];
                let other = &corpus[rng.below(corpus.len())];
                let mut child = parent.clone();
                mutate::mutate(&mut child, other, t.kind, t.dict, &mut rng, s.max_len);
                child
            }
        };
        execs += 1;
        match exec(t, &input, s, &mut slowest, &mut max_alloc) {
            Exec::Ok(sig) => {
                if sigs.insert(sig) && corpus.len() < 20_000 {
                    corpus.push(input);
                }
            }
            Exec::Found(kind, message) => {
                counts[kind as usize] += 1;
                let key = finding_key(kind, &message);
                found
                    .entry(key)
                    .and_modify(|f| {
                        f.hits += 1;
                        if input.len() < f.input.len() {
                            f.input = input.clone();
                        }
                    })
                    .or_insert(Finding { kind, message, input, hits: 1 });
            }
        }
    }
    let elapsed = t0.elapsed();
    let mut findings: Vec<Finding> = found
        .into_iter()
        .map(|(key, mut f)| {
            if f.kind != FindingKind::Hang {
                f.input = minimise(t, &f.input, key, s, 2000);
            }
            f
        })
        .collect();
    if let Some(dir) = &s.findings_dir {
        for f in &mut findings {
            let name = format!("{:?}-{:016x}.bin", f.kind, crate::hash64(&f.input)).to_lowercase();
            let _ = std::fs::write(dir.join(t.name).join(name), &f.input);
        }
    }
    Report {
        target: t.name,
        execs,
        elapsed,
        crashes: counts[FindingKind::Crash as usize],
        hangs: counts[FindingKind::Hang as usize],
        memory: counts[FindingKind::Memory as usize],
        invariant: counts[FindingKind::Invariant as usize],
        findings,
        seeds: seeds.len(),
        corpus: corpus.len(),
        signatures: sigs.len(),
        slowest,
        max_alloc,
        heap: (heap0, alloc::current()),
        rss: (rss0, alloc::rss()),
    }
}

/// `b` as printable text (escapes for the rest), cut to `max` bytes.
pub fn escape(b: &[u8], max: usize) -> String {
    let mut s: String = b.iter().take(max).flat_map(|c| std::ascii::escape_default(*c)).map(char::from).collect();
    if b.len() > max {
        s.push_str("...");
    }
    s
}

/// Runs one input through `t` as the loop does and describes the result and its time.
pub fn repro(t: &Target, input: &[u8]) -> String {
    install();
    let s = Settings::default();
    let (mut slow, mut alloc) = (Duration::ZERO, 0);
    let r = exec(t, input, &s, &mut slow, &mut alloc);
    let what = match r {
        Exec::Ok(sig) => format!("ok (signature {sig:016x})"),
        Exec::Found(k, m) => format!("{k:?}: {m}"),
    };
    format!("{what}; took {:.1} ms, heap grew {:.1} MiB", slow.as_secs_f64() * 1e3, alloc as f64 / 1048576.0)
}

/// The seed corpus of `target` in `dir` (`<dir>/<target>/*`, sorted by name).
pub fn load_corpus(dir: &std::path::Path, target: &str) -> std::io::Result<Vec<Vec<u8>>> {
    let mut paths: Vec<_> =
        std::fs::read_dir(dir.join(target))?.filter_map(Result::ok).map(|e| e.path()).filter(|p| p.is_file()).collect();
    paths.sort();
    paths.iter().map(std::fs::read).collect()
}

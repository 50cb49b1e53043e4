//! The short fuzz run of the test suite: every target, from its checked-in seed corpus, for
//! a fixed number of executions from a fixed seed. Any crash, hang, runaway allocation or
//! broken invariant fails the test with the minimised input (add it to `corpus/<target>/`
//! once the bug is fixed, as a regression input). The long run is `scripts/fuzz.sh`.

use inferwatch_fuzz::engine::{self, FindingKind, Settings};
use inferwatch_fuzz::targets;
use std::path::PathBuf;

fn corpus_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("corpus")
}

#[test]
fn every_target_survives_its_short_run() {
    let settings = Settings { seed: 15, ..Settings::default() };
    let mut failures = Vec::new();
    let started = std::time::Instant::now();
    for t in targets::all() {
        let seeds = engine::load_corpus(&corpus_dir(), t.name).unwrap_or_else(|e| panic!("{}: no corpus: {e}", t.name));
        assert!(seeds.len() >= 3, "{}: {} seeds", t.name, seeds.len());
        let r = engine::run(&t, &seeds, &Settings { max_execs: Some(t.short_execs), ..settings.clone() });
        println!("{}", r.line());
        assert_eq!(r.execs, t.short_execs, "{}", t.name);
        // The mutations must reach more than one behaviour, or the run tests nothing.
        assert!(r.signatures >= 3, "{}: only {} distinct outcomes", t.name, r.signatures);
        for f in &r.findings {
            if let Some(note) = targets::known(t.name, &f.message) {
                println!("  KNOWN (not failing): {:?} x{}: {}\n    {note}", f.kind, f.hits, f.message);
                continue;
            }
            failures.push(format!(
                "{}: {:?} x{}: {}\n  minimised input ({} bytes): {}",
                t.name,
                f.kind,
                f.hits,
                f.message,
                f.input.len(),
                engine::escape(&f.input, 2000)
            ));
        }
    }
    println!("short run took {:.1} s", started.elapsed().as_secs_f64());
    assert!(failures.is_empty(), "fuzz findings:\n{}", failures.join("\n"));
}

/// The harness itself finds what it is meant to find: a panic, a hang, a runaway allocation
/// and a broken invariant, each minimised to the bytes that matter.
#[test]
fn the_harness_catches_and_minimises_each_kind_of_finding() {
    use inferwatch_fuzz::engine::Target;
    use inferwatch_fuzz::mutate::InputKind;
    use std::time::Duration;
    let t = |name, run: fn(&[u8]) -> engine::Outcome| Target {
        name,
        kind: InputKind::Text,
        dict: &[b"BOOM", b"SLOW", b"HUGE", b"LIE"],
        run,
        short_execs: 300,
        budget: Duration::from_millis(50),
    };
    let cases: [(Target, FindingKind, &[u8]); 4] = [
        (
            t("panic", |d| if d.windows(4).any(|w| w == b"BOOM") { panic!("boom") } else { Ok(d.len() as u64 % 7) }),
            FindingKind::Crash,
            b"BOOM",
        ),
        (
            t("hang", |d| {
                if d.windows(4).any(|w| w == b"SLOW") {
                    std::thread::sleep(Duration::from_millis(400));
                }
                Ok(d.len() as u64 % 7)
            }),
            FindingKind::Hang,
            b"SLOW",
        ),
        (
            t("memory", |d| {
                if d.windows(4).any(|w| w == b"HUGE") {
                    let v = vec![0u8; 300 << 20];
                    std::hint::black_box(&v);
                }
                Ok(d.len() as u64 % 7)
            }),
            FindingKind::Memory,
            b"HUGE",
        ),
        (
            t(
                "invariant",
                |d| if d.windows(3).any(|w| w == b"LIE") { Err("lied".into()) } else { Ok(d.len() as u64 % 7) },
            ),
            FindingKind::Invariant,
            b"LIE",
        ),
    ];
    for (target, kind, needle) in cases {
        let seeds = vec![b"hello world, a harmless seed".to_vec()];
        let s = Settings { seed: 1, max_execs: Some(300), budget_scale: 1, ..Settings::default() };
        let r = engine::run(&target, &seeds, &s);
        let f = r
            .findings
            .iter()
            .find(|f| f.kind == kind)
            .unwrap_or_else(|| panic!("{}: nothing found: {r:?}", target.name));
        if kind == FindingKind::Hang {
            // Hangs are not minimised (each try takes the budget); the input shows it.
            assert!(f.input.windows(needle.len()).any(|w| w == needle), "{}", target.name);
        } else {
            assert_eq!(f.input, needle, "{}: not minimised", target.name);
        }
    }
}

#[test]
fn the_checked_in_corpus_is_small_and_covers_every_target() {
    let mut total = 0u64;
    for t in targets::all() {
        for e in std::fs::read_dir(corpus_dir().join(t.name)).unwrap_or_else(|e| panic!("{}: {e}", t.name)) {
            total += e.unwrap().metadata().unwrap().len();
        }
    }
    assert!(total < 1 << 20, "corpus is {total} bytes");
}

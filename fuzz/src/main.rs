//! `inferwatch-fuzz`: the long run of the mutation fuzzer, and the seed corpus generator.
//!
//! ```text
//! inferwatch-fuzz [--secs N] [--target T]... [--seed S] [--corpus DIR] [--findings DIR]
//! inferwatch-fuzz gen-corpus [--corpus DIR]
//! inferwatch-fuzz list
//! inferwatch-fuzz --target T repro FILE
//! ```
//!
//! Each target runs for `--secs` seconds (default 60); one line of figures per target; the
//! exit status is 1 when any target had a finding (crash, hang, memory, invariant).

use inferwatch_fuzz::engine::{self, Settings};
use inferwatch_fuzz::{alloc, seeds, targets};
use std::path::PathBuf;
use std::time::Duration;

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1).peekable();
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let mut corpus = root.join("corpus");
    let mut findings = root.join("findings");
    let mut secs = 60u64;
    let mut only: Vec<String> = Vec::new();
    let mut seed = Settings::default().seed;
    let mut command = None;
    let mut files: Vec<PathBuf> = Vec::new();
    while let Some(a) = args.next() {
        let mut val = || args.next().ok_or_else(|| anyhow::anyhow!("{a} needs a value"));
        match a.as_str() {
            "--secs" => secs = val()?.parse()?,
            "--target" => only.push(val()?),
            "--seed" => seed = val()?.parse()?,
            "--corpus" => corpus = PathBuf::from(val()?),
            "--findings" => findings = PathBuf::from(val()?),
            "gen-corpus" | "list" => command = Some(a.clone()),
            "repro" => {
                command = Some(a.clone());
                files.push(PathBuf::from(val()?));
            }
            "-h" | "--help" => {
                println!(
                    "usage: inferwatch-fuzz [--secs N] [--target T]... [--seed S] [--corpus DIR] [--findings DIR] | gen-corpus | list"
                );
                return Ok(());
            }
            other => anyhow::bail!("unknown argument {other:?} (see --help)"),
        }
    }
    let all = targets::all();
    match command.as_deref() {
        Some("list") => {
            for t in &all {
                println!("{}", t.name);
            }
            return Ok(());
        }
        Some("repro") => {
            let t = only
                .first()
                .and_then(|o| all.iter().find(|t| t.name == o))
                .ok_or_else(|| anyhow::anyhow!("repro needs --target T (before repro)"))?;
            for f in &files {
                println!("{}: {}", f.display(), engine::escape(engine::repro(t, &std::fs::read(f)?).as_bytes(), 2000));
            }
            return Ok(());
        }
        Some("gen-corpus") => {
            for (t, name, bytes) in seeds::generate() {
                let d = corpus.join(t);
                std::fs::create_dir_all(&d)?;
                std::fs::write(d.join(name), bytes)?;
            }
            println!("seed corpus written to {}", corpus.display());
            return Ok(());
        }
        _ => {}
    }
    for o in &only {
        if !all.iter().any(|t| t.name == o) {
            anyhow::bail!("no target {o:?} (see `inferwatch-fuzz list`)");
        }
    }
    // A runaway allocation stops the process with the input saved (findings/<target>/oom-input.bin).
    alloc::set_cap(alloc::current() + (4usize << 30));
    let settings = Settings {
        seed,
        max_time: Some(Duration::from_secs(secs)),
        findings_dir: Some(findings.clone()),
        ..Settings::default()
    };
    let mut bad = 0;
    for t in all.iter().filter(|t| only.is_empty() || only.iter().any(|o| o == t.name)) {
        let seeds = engine::load_corpus(&corpus, t.name).unwrap_or_default();
        let r = engine::run(t, &seeds, &settings);
        println!("{}", r.line());
        for f in &r.findings {
            if let Some(note) = targets::known(t.name, &f.message) {
                println!(
                    "  KNOWN {:?} x{}: {}\n    {note}",
                    f.kind,
                    f.hits,
                    f.message.lines().next().unwrap_or_default()
                );
                continue;
            }
            bad += 1;
            println!(
                "  {:?} x{}: {}\n    input ({} bytes, in {}): {}",
                f.kind,
                f.hits,
                f.message.lines().next().unwrap_or_default(),
                f.input.len(),
                findings.join(t.name).display(),
                engine::escape(&f.input, 300)
            );
        }
    }
    if bad > 0 {
        std::process::exit(1);
    }
    Ok(())
}

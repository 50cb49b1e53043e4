//! `inferwatch eval`: the scenario library (or the NAB corpus) through the detectors, scored.

use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use inferwatch::components::registry;
use inferwatch_eval::scenario::{self, ScenarioRun};
use inferwatch_eval::{chart, report, series};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Exit code for a bad command line or unreadable input.
const EXIT_USAGE: u8 = 2;

/// Options of `inferwatch eval`.
#[derive(Debug, Args)]
pub struct EvalArgs {
    /// Folder of scenario files (`*.yaml`, scenarios/README.md) to simulate and score.
    #[arg(long, value_name = "DIR", conflicts_with = "nab")]
    pub scenarios: Option<PathBuf>,
    /// Only these scenarios (file stems); repeat.
    #[arg(long, value_name = "NAME")]
    pub only: Vec<String>,
    /// Detector pipeline template replacing the default (may use ${env:SLO_SIGNAL}, ${env:SLO_THRESHOLD}, ${env:BASELINE}, ${env:CANDIDATE}).
    #[arg(long, short = 'c', value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Write the full report as JSON.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Write one SVG chart per scenario into this folder.
    #[arg(long, value_name = "DIR")]
    pub charts: Option<PathBuf>,
    /// Where simulated scenario output is cached.
    #[arg(long, value_name = "DIR", default_value = "target/eval-cache")]
    pub cache: PathBuf,
    /// Score the Numenta Anomaly Benchmark in DIR (with data/ and labels/) instead.
    #[arg(long, value_name = "DIR")]
    pub nab: Option<PathBuf>,
    /// Detector for --nab and --series.
    #[arg(long, default_value = "zscore_skew")]
    pub detector: String,
    /// Score labelled series in DIR (NAB's layout: data/**.csv + labels/combined_windows.json,
    /// optional labels/truth.json): the trade-off curve of false alarms against delay and lead.
    #[arg(long, value_name = "DIR", conflicts_with_all = ["nab", "scenarios"])]
    pub series: Option<PathBuf>,
    /// Write a held-out family of series into DIR (with --family and --seed) and exit.
    #[arg(long, value_name = "DIR", conflicts_with_all = ["nab", "scenarios", "series"])]
    pub generate: Option<PathBuf>,
    /// Family for --generate: a (tuning) or b (held-out).
    #[arg(long, default_value = "a")]
    pub family: String,
    /// Seed for --generate.
    #[arg(long, default_value_t = 17)]
    pub seed: u64,
}

/// `inferwatch eval`.
pub fn run(args: EvalArgs) -> ExitCode {
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Some(dir) = &args.nab {
        return rt.block_on(nab(dir, &args));
    }
    if let Some(dir) = &args.generate {
        return generate(dir, &args);
    }
    if let Some(dir) = &args.series {
        return rt.block_on(series(dir, &args));
    }
    let Some(dir) = &args.scenarios else {
        eprintln!("error: give --scenarios DIR (e.g. scenarios/), --nab DIR, --series DIR or --generate DIR");
        return ExitCode::from(EXIT_USAGE);
    };
    rt.block_on(scenarios(dir, &args))
}

async fn scenarios(dir: &Path, args: &EvalArgs) -> ExitCode {
    let mut files = match scenario::list(dir) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    if !args.only.is_empty() {
        files.retain(|f| f.file_stem().is_some_and(|s| args.only.iter().any(|o| o.as_str() == s)));
    }
    if files.is_empty() {
        eprintln!("error: no scenario files (*.yaml) in {}", dir.display());
        return ExitCode::from(EXIT_USAGE);
    }
    let template = match &args.config {
        Some(p) => match std::fs::read_to_string(p) {
            Ok(t) => Some(t),
            Err(e) => {
                eprintln!("error: {}: {e}", p.display());
                return ExitCode::from(EXIT_USAGE);
            }
        },
        None => None,
    };
    if let Some(c) = &args.charts
        && let Err(e) = std::fs::create_dir_all(c)
    {
        eprintln!("error: {}: {e}", c.display());
        return ExitCode::from(EXIT_USAGE);
    }
    let bar = ProgressBar::new(files.len() as u64);
    if let Ok(style) = ProgressStyle::with_template("{spinner} {elapsed_precise} [{wide_bar}] {pos}/{len} {msg}") {
        bar.set_style(style.progress_chars("=> "));
    }
    let mut runs: Vec<ScenarioRun> = Vec::new();
    let mut failed = false;
    for f in &files {
        let name = f.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        bar.set_message(format!("{name}: simulating"));
        let one = async {
            let (out, sim_s) = scenario::simulate(f, &args.cache).await?;
            bar.set_message(format!("{name}: detecting"));
            let mut run = scenario::evaluate(&out, template.as_deref(), registry()).await?;
            run.wall_sim_s = sim_s;
            Ok::<_, inferwatch_eval::EvalError>(run)
        };
        match one.await {
            Ok(run) => {
                if let Some(c) = &args.charts
                    && let Err(e) = chart::draw(&run, &c.join(format!("{name}.svg")))
                {
                    bar.suspend(|| eprintln!("warning: {e}"));
                }
                runs.push(run);
            }
            Err(e) => {
                bar.suspend(|| eprintln!("error: {name}: {e}"));
                failed = true;
            }
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    println!("{}", report::table(&runs));
    let per_detector = report::detector_table(&runs);
    if !per_detector.is_empty() {
        println!("Per detector (first alert after the onset: +delay, or lead before the breach; FA = false alarms):\n");
        println!("{per_detector}");
    }
    if let Some(p) = &args.json {
        let text = serde_json::to_string_pretty(&report::json(&runs)).unwrap_or_default();
        if let Err(e) = std::fs::write(p, text) {
            eprintln!("error: {}: {e}", p.display());
            return ExitCode::FAILURE;
        }
    }
    if failed { ExitCode::FAILURE } else { ExitCode::SUCCESS }
}

fn generate(dir: &Path, args: &EvalArgs) -> ExitCode {
    let Some(family) = series::families::Family::parse(&args.family) else {
        eprintln!("error: --family must be a or b, got {:?}", args.family);
        return ExitCode::from(EXIT_USAGE);
    };
    match series::families::generate(dir, family, args.seed) {
        Ok(g) => {
            println!(
                "family {} (seed {}): {} files, {} rows in {}",
                args.family,
                args.seed,
                g.files,
                g.rows,
                dir.display()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn series(dir: &Path, args: &EvalArgs) -> ExitCode {
    let bar = files_bar(&args.detector);
    let progress = |done: usize, total: usize| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
    };
    let result = series::run_series(dir, &args.detector, args.config.as_deref(), registry(), &progress).await;
    bar.finish_and_clear();
    finish(result, args.json.as_deref(), |r| print!("{}", r.table()))
}

/// Prints a report (`show`), writes it as JSON to `json` when given; the exit code.
fn finish<T: serde::Serialize>(
    result: Result<T, inferwatch_eval::EvalError>,
    json: Option<&Path>,
    show: impl FnOnce(&T),
) -> ExitCode {
    match result {
        Ok(report) => {
            show(&report);
            if let Some(p) = json {
                let text = serde_json::to_string_pretty(&report).unwrap_or_default();
                if let Err(e) = std::fs::write(p, text) {
                    eprintln!("error: {}: {e}", p.display());
                    return ExitCode::FAILURE;
                }
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// A progress bar over files, labelled with the detector.
fn files_bar(detector: &str) -> ProgressBar {
    let bar = ProgressBar::new(0);
    if let Ok(style) = ProgressStyle::with_template("{spinner} {elapsed_precise} [{wide_bar}] {pos}/{len} files {msg}")
    {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_message(detector.to_string());
    bar
}

async fn nab(dir: &Path, args: &EvalArgs) -> ExitCode {
    let bar = files_bar(&args.detector);
    let progress = |done: usize, total: usize| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
    };
    let result =
        inferwatch_eval::nab::run_nab(dir, &args.detector, args.config.as_deref(), registry(), &progress).await;
    bar.finish_and_clear();
    finish(result, args.json.as_deref(), |r| r.print_table())
}

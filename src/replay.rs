//! `inferwatch replay`: feeds recordings through the pipelines of a configuration, shows
//! progress, drains everything and prints a summary.

use crate::run::{load_checked, report, wait_for_signal};
use anyhow::Context;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use inferwatch::components::registry;
use inferwatch_core::component::ComponentId;
use inferwatch_core::config::Config;
use inferwatch_core::graph::{Service, ShutdownReport};
use inferwatch_core::host::{Host, RunValues};
use inferwatch_core::pdata::Signal;
use inferwatch_core::state::StateRegistry;
use inferwatch_receivers::replay::{REPLAY_ITEMS, ReplayControl};
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// Exit code for an invalid configuration or command line.
const EXIT_CONFIG: u8 = 2;
/// How often the progress bar is refreshed.
const TICK: Duration = Duration::from_millis(200);

/// Options of `inferwatch replay`.
#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// Configuration file (with a `replay` receiver in its pipelines); repeat to merge files.
    #[arg(long, short = 'c', required = true, num_args = 1..)]
    pub config: Vec<PathBuf>,
    /// Recording to replay: a file or a directory (read recursively); repeat for more.
    #[arg(long, short = 'i', required = true, num_args = 1..)]
    pub input: Vec<PathBuf>,
    /// Pace at N times real time by the data's timestamps (default: as fast as possible).
    #[arg(long, value_name = "N", value_parser = parse_speed)]
    pub speed: Option<f64>,
}

/// Parses `--speed`: a finite number, 0 or more.
fn parse_speed(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err(format!("{s:?} is not a speed (0 = as fast as possible, or a positive factor)")),
    }
}

/// The `replay` receivers the pipelines use.
fn replay_receivers(cfg: &Config) -> BTreeSet<ComponentId> {
    cfg.service
        .pipelines
        .iter()
        .flat_map(|p| p.receivers.iter().map(|(r, _)| r))
        .filter(|r| r.type_name == "replay" && cfg.receivers.contains_key(r))
        .cloned()
        .collect()
}

/// `inferwatch replay`.
pub fn run(args: &ReplayArgs, log_level: Option<&str>) -> ExitCode {
    let cfg = match load_checked(&args.config) {
        Ok(c) => c,
        Err(errors) => {
            report(&errors);
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    let ids = replay_receivers(&cfg);
    let id = match (ids.first(), ids.len()) {
        (Some(id), 1) => id.clone(),
        (None, _) => {
            eprintln!(
                "error: no pipeline uses a `replay` receiver; define one (e.g. `receivers: {{replay: {{}}}}`) \
                 and list it in the receivers of the pipelines to feed"
            );
            return ExitCode::from(EXIT_CONFIG);
        }
        _ => {
            let names: Vec<String> = ids.iter().map(ToString::to_string).collect();
            eprintln!(
                "error: several replay receivers are used ({}); `inferwatch replay` feeds one: \
                 list the same receiver in every pipeline that should get the data",
                names.join(", ")
            );
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    for p in &args.input {
        if let Err(e) = std::fs::metadata(p) {
            eprintln!("error: input {}: {e}", p.display());
            return ExitCode::from(EXIT_CONFIG);
        }
    }
    let t = &cfg.service.telemetry;
    if let Err(e) = crate::cli::init_logging_with(Some(log_level.or(t.logs_level.as_deref()).unwrap_or("warn")), t) {
        eprintln!("error: {e}");
        return ExitCode::from(EXIT_CONFIG);
    }
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().thread_name("inferwatch").build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(replay(cfg, id, args)) {
        Ok(outcome) => {
            outcome.print();
            if outcome.success() { ExitCode::SUCCESS } else { ExitCode::FAILURE }
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// What a replay achieved.
struct Outcome {
    interrupted: bool,
    files_done: u64,
    files_total: u64,
    by_signal: Vec<(Signal, u64)>,
    failed: u64,
    wall: Duration,
    shutdown: ShutdownReport,
}

impl Outcome {
    fn success(&self) -> bool {
        !self.interrupted && self.failed == 0 && self.shutdown.undelivered == 0
    }

    fn print(&self) {
        let items: u64 = self.by_signal.iter().map(|(_, n)| n).sum();
        let secs = self.wall.as_secs_f64();
        let rate = if secs > 0.0 { items as f64 / secs } else { 0.0 };
        let by: Vec<String> = self.by_signal.iter().map(|(s, n)| format!("{n} {}", s.item_noun())).collect();
        let state = if self.interrupted { "interrupted" } else { "finished" };
        println!("replay {state}: {} of {} files", self.files_done, self.files_total);
        println!("  items:    {items} ({})", by.join(", "));
        println!("  failed:   {} items", self.failed);
        println!("  wall:     {secs:.2} s ({rate:.0} items/s)");
        if self.shutdown.undelivered == 0 {
            println!("  delivery: complete (everything accepted was delivered)");
        } else {
            println!(
                "  delivery: incomplete ({} items not delivered before the shutdown timeout)",
                self.shutdown.undelivered
            );
        }
    }
}

async fn replay(cfg: Config, id: ComponentId, args: &ReplayArgs) -> anyhow::Result<Outcome> {
    let (telemetry, stop_telemetry) = crate::run::start_self_metrics(&cfg).await?;
    let control =
        Arc::new(ReplayControl { inputs: args.input.clone(), speed: args.speed, progress: Default::default() });
    let host = Arc::new(Host {
        state: StateRegistry::new(),
        run: RunValues::default().with(control.clone()),
        ..Default::default()
    });
    let mut service =
        Service::build_with_host(&cfg, &registry(), telemetry.clone(), host).context("cannot build the pipelines")?;
    if let Err(e) = service.start().await {
        tracing::error!(error = %e, "start failed; shutting down");
        service.shutdown(cfg.service.shutdown_timeout).await;
        stop_telemetry.stop().await;
        return Err(anyhow::Error::new(e).context("cannot start the pipelines"));
    }
    let started = Instant::now();
    let stop_bar = CancellationToken::new();
    let bar = tokio::spawn(show_progress(control.clone(), stop_bar.clone()));
    let interrupted = tokio::select! {
        _ = control.progress.wait_finished() => false,
        _ = wait_for_signal() => true,
    };
    stop_bar.cancel();
    let _ = bar.await;
    if interrupted {
        tracing::info!("replay interrupted; shutting down without ending the input");
    } else {
        // The input ended: let Arrow stages emit the windows event time still holds open.
        service.end_of_input().await;
    }
    tracing::info!(timeout = ?cfg.service.shutdown_timeout, "shutting down: receivers first, then draining");
    let shutdown = service.shutdown(cfg.service.shutdown_timeout).await;
    stop_telemetry.stop().await;
    let p = &control.progress;
    Ok(Outcome {
        interrupted,
        files_done: p.files_done.load(Ordering::SeqCst),
        files_total: p.files_total.load(Ordering::SeqCst),
        by_signal: Signal::ALL
            .iter()
            .map(|&s| (s, REPLAY_ITEMS.get(&telemetry, [&id.to_string(), s.as_str()]).get()))
            .collect(),
        failed: p.failed_items.load(Ordering::SeqCst),
        wall: started.elapsed(),
        shutdown,
    })
}

/// Draws a progress bar on stderr (hidden when stderr is not a terminal) until `stop`.
async fn show_progress(control: Arc<ReplayControl>, stop: CancellationToken) {
    let bar = ProgressBar::new(0);
    let style =
        ProgressStyle::with_template("{spinner} {elapsed_precise} [{wide_bar}] {bytes}/{total_bytes} {msg} ETA {eta}")
            .map(|s| s.progress_chars("=> "))
            .unwrap_or_else(|_| ProgressStyle::default_bar());
    bar.set_style(style);
    let started = Instant::now();
    let p = &control.progress;
    loop {
        bar.set_length(p.total_bytes.load(Ordering::Relaxed));
        bar.set_position(p.done_bytes.load(Ordering::Relaxed));
        let items = p.items.load(Ordering::Relaxed);
        let secs = started.elapsed().as_secs_f64();
        let rate = if secs > 0.0 { items as f64 / secs } else { 0.0 };
        bar.set_message(format!("{items} items, {rate:.0} items/s"));
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep(TICK) => {}
        }
    }
    bar.finish_and_clear();
}

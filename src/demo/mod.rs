//! `inferwatch demo`: the early-warning agent in about a minute, with no setup.
//!
//! * **Live**: the simulator with a fault that starts after a while, the agent on a demo pipeline
//!   receiving the simulator's spans, and the bench client driving load; the golden signals print
//!   live with the alerts as they fire and resolve ([`live`]).
//! * **Drift**: 30 simulated days of a slow drift (`scenarios/slow_drift_30d.yaml`) replayed in
//!   seconds through eval's default pipeline; the first forecast warning against the actual SLO
//!   breach, drawn in the terminal and as an SVG ([`drift`]).
//!
//! Both run at once: the drift replay on its own thread, its result printed between two live lines
//! when it is ready.

pub mod drift;
pub mod live;

use clap::Args;
use std::path::PathBuf;
use std::process::ExitCode;

/// Options of `inferwatch demo`.
#[derive(Debug, Clone, Args)]
pub struct DemoArgs {
    /// Fault to inject: queue_blocking, context_collapse, batch_saturation, kv_pressure, cold_start, slow_drift.
    #[arg(long, default_value = "queue_blocking")]
    pub fault: String,
    /// Seconds before the fault starts.
    #[arg(long, default_value_t = 10)]
    pub fault_after: u64,
    /// Seconds the fault lasts (0: until the end), so the alert is seen to resolve.
    #[arg(long, default_value_t = 15)]
    pub fault_for: u64,
    /// Fault strength (see the simulator's fault table).
    #[arg(long)]
    pub strength: Option<f64>,
    /// Requests per second of the bench client.
    #[arg(long, default_value_t = 3.0)]
    pub rate: f64,
    /// Stop the live part after this many seconds (default: a few seconds after the alerts
    /// resolved once the fault ended, at most 30 s after it ended; until Ctrl-C with --fault-for 0).
    #[arg(long)]
    pub duration: Option<u64>,
    /// Seconds between two lines of the live view.
    #[arg(long, default_value_t = 2)]
    pub every: u64,
    /// Sliding window of the live percentiles, in seconds.
    #[arg(long, default_value_t = 10)]
    pub window: u64,
    /// Skip the 30-day slow-drift replay (live part only).
    #[arg(long, conflicts_with = "drift_only")]
    pub no_drift: bool,
    /// Only the 30-day slow-drift replay (no live part).
    #[arg(long)]
    pub drift_only: bool,
    /// Folder of the drift replay's chart (slow_drift_30d.svg) and its simulation cache
    /// (default: inferwatch-demo in the system's temporary folder).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Detector pipeline template of the drift replay instead of eval's default (as `inferwatch eval --config`).
    #[arg(long, value_name = "FILE")]
    pub drift_config: Option<PathBuf>,
}

impl DemoArgs {
    /// The drift replay's folder.
    fn out_dir(&self) -> PathBuf {
        self.out.clone().unwrap_or_else(|| std::env::temp_dir().join("inferwatch-demo"))
    }

    /// The drift replay's pipeline template, if one was given.
    fn drift_template(&self) -> anyhow::Result<Option<String>> {
        use anyhow::Context;
        self.drift_config
            .as_ref()
            .map(|p| std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display())))
            .transpose()
    }
}

/// `inferwatch demo`.
pub fn run(args: DemoArgs) -> ExitCode {
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("inferwatch demo: {e}");
            return ExitCode::FAILURE;
        }
    };
    let _ = rustls::crypto::ring::default_provider().install_default();
    let result = if args.drift_only {
        args.drift_template()
            .and_then(|template| rt.block_on(drift::replay(&args.out_dir(), template.as_deref())))
            .map(|text| println!("{text}"))
    } else {
        rt.block_on(demo(&args))
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("inferwatch demo: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The live part, with the drift replay on its own thread meanwhile.
async fn demo(args: &DemoArgs) -> anyhow::Result<()> {
    let mut replay = if args.no_drift {
        None
    } else {
        println!("DRIFT: replaying 30 simulated days of a slow drift in the background (result below when ready)");
        Some(drift::spawn(args.out_dir(), args.drift_template()?)?)
    };
    let mut failed = None;
    let interrupted = live::run(args, || {
        if let Err(e) = show(&mut replay, false) {
            failed = Some(e);
        }
    })
    .await?;
    if let Some(e) = failed {
        return Err(e);
    }
    if interrupted {
        return Ok(());
    }
    if replay.is_some() {
        println!("(waiting for the drift replay)");
    }
    show(&mut replay, true)
}

/// Prints the drift replay's result once it is ready (or, with `wait`, when it is).
fn show(handle: &mut Option<std::thread::JoinHandle<anyhow::Result<String>>>, wait: bool) -> anyhow::Result<()> {
    if !handle.as_ref().is_some_and(|h| wait || h.is_finished()) {
        return Ok(());
    }
    let Some(h) = handle.take() else { return Ok(()) };
    match h.join() {
        Ok(Ok(text)) => {
            println!("{text}");
            Ok(())
        }
        Ok(Err(e)) => Err(e.context("drift replay")),
        Err(_) => Err(anyhow::anyhow!("the drift replay panicked")),
    }
}

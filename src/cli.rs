//! Command-line interface (clap) and logging setup.

use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;

/// inferwatch: an OpenTelemetry-Collector-style telemetry agent for LLM inference services.
#[derive(Debug, Parser)]
#[command(name = "inferwatch", version, about, long_about = None)]
pub struct Cli {
    /// Log level: error, warn, info, debug, trace (or a tracing filter such as `inferwatch=debug`).
    #[arg(long, global = true, env = "INFERWATCH_LOG")]
    pub log_level: Option<String>,
    /// What to do (default: run).
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the agent on a pipeline configuration.
    Run(ConfigArgs),
    /// Check a configuration and list every error (exit 0 when valid, 2 otherwise).
    Validate(ConfigArgs),
    /// Replay recordings (Parquet, Arrow IPC, OTLP/JSON lines) through the pipelines, then exit.
    Replay(crate::replay::ReplayArgs),
    /// List every component type with the signals it takes.
    Components,
    /// Run the simulated vLLM server, or a scenario on a simulated clock with --scenario FILE --out DIR.
    Sim(Box<inferwatch_sim::server::SimArgs>),
    /// Load an OpenAI-compatible endpoint and measure TTFT, ITL, TPOT, e2e, goodput.
    Bench(Box<inferwatch_probe::BenchArgs>),
    /// Simulator + fault + agent + bench client, with the golden signals live.
    Demo(crate::demo::DemoArgs),
    /// Score the detectors on the scenario library (--scenarios DIR) or the NAB corpus (--nab DIR).
    Eval(Box<crate::eval::EvalArgs>),
    /// Train the lstm_ae model from recorded Parquet (runs scripts/lstm_ae/train.py); writes NAME.onnx + NAME.json.
    TrainLstmAe(Box<crate::train::TrainArgs>),
}

impl Default for Command {
    fn default() -> Self {
        Command::Run(ConfigArgs { config: vec![PathBuf::from("pipeline.yaml")] })
    }
}

/// Options naming the configuration files.
#[derive(Debug, Args)]
pub struct ConfigArgs {
    /// Configuration file; repeat to merge later files over earlier ones.
    #[arg(long, short = 'c', default_value = "pipeline.yaml")]
    pub config: Vec<PathBuf>,
}

/// Sets up `tracing` output on stderr.
pub fn init_logging(level: Option<&str>) {
    let filter =
        level.map(str::to_string).or_else(|| std::env::var("RUST_LOG").ok()).unwrap_or_else(|| "info".to_string());
    let filter = tracing_subscriber::EnvFilter::try_new(&filter).unwrap_or_else(|e| {
        eprintln!("invalid --log-level {filter:?}: {e}; using info");
        tracing_subscriber::EnvFilter::new("info")
    });
    use std::io::IsTerminal;
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false)
        .init();
}

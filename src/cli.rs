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
    /// Print the merged, env-substituted configuration (files, then --set) with secrets redacted.
    PrintConfig(PrintConfigArgs),
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
        Command::Run(ConfigArgs { config: vec![PathBuf::from("pipeline.yaml")], set: Vec::new() })
    }
}

/// Options naming the configuration files.
#[derive(Debug, Args)]
pub struct ConfigArgs {
    /// Configuration file; repeat to merge later files over earlier ones.
    #[arg(long, short = 'c', default_value = "pipeline.yaml")]
    pub config: Vec<PathBuf>,
    /// Override one setting over the files, as otelcol's --set: KEY=VALUE, the key's map keys
    /// joined by `::` (or `.`), the value YAML, e.g. --set=processors::batch::timeout=2s; repeatable.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
}

/// Options of `print-config`.
#[derive(Debug, Args)]
pub struct PrintConfigArgs {
    /// The configuration files and overrides.
    #[command(flatten)]
    pub config: ConfigArgs,
    /// `redacted` (default) replaces secrets with [REDACTED]; `unredacted` prints them.
    #[arg(long, value_enum, default_value_t = PrintMode::Redacted)]
    pub mode: PrintMode,
    /// Output format.
    #[arg(long, value_enum, default_value_t = PrintFormat::Yaml)]
    pub format: PrintFormat,
}

/// Whether `print-config` hides secrets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PrintMode {
    /// Secrets replaced with [REDACTED].
    Redacted,
    /// Secrets shown.
    Unredacted,
}

/// `print-config`'s output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PrintFormat {
    /// Block-style YAML that loads back to the same configuration.
    Yaml,
    /// JSON (also valid YAML).
    Json,
}

/// `inferwatch print-config`: the merged tree, printed even when it does not validate (the
/// problems go to stderr and the exit code is 2); a file that does not parse prints nothing.
pub fn print_config(args: &PrintConfigArgs) -> std::process::ExitCode {
    use inferwatch_core::config;
    let loaded = config::load_all(&args.config.config, &args.config.set, &|k| std::env::var(k).ok());
    let Some(mut tree) = loaded.tree else {
        crate::run::report(&loaded.errors);
        return std::process::ExitCode::from(2);
    };
    if args.mode == PrintMode::Redacted {
        config::redact(&mut tree);
    }
    match args.format {
        PrintFormat::Yaml => print!("{}", config::to_yaml(&tree)),
        PrintFormat::Json => match serde_json::to_string_pretty(&tree.to_json()) {
            Ok(s) => println!("{s}"),
            Err(e) => {
                eprintln!("error: {e}");
                return std::process::ExitCode::FAILURE;
            }
        },
    }
    if loaded.errors.is_empty() {
        std::process::ExitCode::SUCCESS
    } else {
        crate::run::report(&loaded.errors);
        std::process::ExitCode::from(2)
    }
}

/// Sets up `tracing` output on stderr, as console text.
pub fn init_logging(level: Option<&str>) {
    init_logging_as(level, inferwatch_core::config::LogEncoding::Console);
}

/// Sets up `tracing` output on stderr in `encoding` (`service.telemetry.logs.encoding`): console
/// text, or one JSON object per line (`timestamp`, `level`, `fields.message` and the event's fields).
pub fn init_logging_as(level: Option<&str>, encoding: inferwatch_core::config::LogEncoding) {
    let filter =
        level.map(str::to_string).or_else(|| std::env::var("RUST_LOG").ok()).unwrap_or_else(|| "info".to_string());
    let filter = tracing_subscriber::EnvFilter::try_new(&filter).unwrap_or_else(|e| {
        eprintln!("invalid --log-level {filter:?}: {e}; using info");
        tracing_subscriber::EnvFilter::new("info")
    });
    use std::io::IsTerminal;
    let fmt = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_target(false);
    match encoding {
        inferwatch_core::config::LogEncoding::Console => fmt.with_ansi(std::io::stderr().is_terminal()).init(),
        inferwatch_core::config::LogEncoding::Json => {
            fmt.json().with_ansi(false).with_current_span(false).with_span_list(false).init()
        }
    }
}

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
    let t = inferwatch_core::config::TelemetryConfig::default();
    if let Err(e) = init_logging_with(level, &t) {
        eprintln!("error: {e}");
    }
}

/// Sets up `tracing` as `service.telemetry.logs` asks: `encoding` console text or one JSON
/// object per line (`timestamp`, `level`, `message` and the event's fields at the top level),
/// written to every `output_paths` destination (stderr, stdout, files opened for appending),
/// with the `initial_fields` on every line. `level` (`--log-level`, else `logs.level`) wins
/// over `RUST_LOG`. Fails, naming the path, when a log file cannot be opened.
pub fn init_logging_with(level: Option<&str>, t: &inferwatch_core::config::TelemetryConfig) -> Result<(), String> {
    use inferwatch_core::config::{LogEncoding, LogOutput};
    use std::io::IsTerminal;
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::fmt::writer::{BoxMakeWriter, MakeWriterExt};
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;

    let filter =
        level.map(str::to_string).or_else(|| std::env::var("RUST_LOG").ok()).unwrap_or_else(|| "info".to_string());
    let filter = tracing_subscriber::EnvFilter::try_new(&filter).unwrap_or_else(|e| {
        eprintln!("invalid --log-level {filter:?}: {e}; using info");
        tracing_subscriber::EnvFilter::new("info")
    });
    let mut writer: Option<BoxMakeWriter> = None;
    for out in &t.logs_outputs {
        let next = match out {
            LogOutput::Stderr => BoxMakeWriter::new(std::io::stderr),
            LogOutput::Stdout => BoxMakeWriter::new(std::io::stdout),
            LogOutput::File(path) => {
                let file =
                    std::fs::OpenOptions::new().create(true).append(true).open(path).map_err(|e| {
                        format!("service.telemetry.logs.output_paths: cannot open {}: {e}", path.display())
                    })?;
                BoxMakeWriter::new(std::sync::Arc::new(file))
            }
        };
        writer = Some(match writer {
            Some(w) => BoxMakeWriter::new(w.and(next)),
            None => next,
        });
    }
    let writer = writer.unwrap_or_else(|| BoxMakeWriter::new(std::io::stderr));
    let ansi = t.logs_outputs == [LogOutput::Stderr] && std::io::stderr().is_terminal();
    let fields = &t.logs_initial_fields;
    type Boxed = Box<dyn tracing_subscriber::Layer<tracing_subscriber::Registry> + Send + Sync>;
    let layer: Boxed = match t.logs_encoding {
        LogEncoding::Console => {
            let l = tracing_subscriber::fmt::layer().with_writer(writer).with_target(false);
            if fields.is_empty() {
                l.with_ansi(ansi).boxed()
            } else {
                let format = tracing_subscriber::fmt::format().with_target(false);
                l.with_ansi(false).event_format(InitialFields::console(format, fields)).boxed()
            }
        }
        LogEncoding::Json => {
            let format = tracing_subscriber::fmt::format()
                .json()
                .flatten_event(true)
                .with_current_span(false)
                .with_span_list(false)
                .with_target(false);
            let l = tracing_subscriber::fmt::layer().json().with_writer(writer).with_ansi(false);
            if fields.is_empty() {
                l.event_format(format).boxed()
            } else {
                l.event_format(InitialFields::json(format, fields)).boxed()
            }
        }
    };
    tracing_subscriber::registry().with(layer.with_filter(filter)).try_init().map_err(|e| e.to_string())
}

/// `logs.initial_fields` on every line: spliced after a JSON line's opening brace, or appended
/// to a console line as `key=value` (values in JSON).
struct InitialFields<F> {
    inner: F,
    json: bool,
    /// `"k":v,` for JSON, ` k=v` for console.
    rendered: String,
}

impl<F> InitialFields<F> {
    fn json(inner: F, fields: &[(String, serde_json::Value)]) -> Self {
        let mut rendered = String::new();
        for (k, v) in fields {
            rendered.push_str(&serde_json::Value::String(k.clone()).to_string());
            rendered.push(':');
            rendered.push_str(&v.to_string());
            rendered.push(',');
        }
        InitialFields { inner, json: true, rendered }
    }

    fn console(inner: F, fields: &[(String, serde_json::Value)]) -> Self {
        let rendered = fields.iter().map(|(k, v)| format!(" {k}={v}")).collect();
        InitialFields { inner, json: false, rendered }
    }
}

impl<S, N, F> tracing_subscriber::fmt::FormatEvent<S, N> for InitialFields<F>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    N: for<'a> tracing_subscriber::fmt::FormatFields<'a> + 'static,
    F: tracing_subscriber::fmt::FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &tracing_subscriber::fmt::FmtContext<'_, S, N>,
        mut writer: tracing_subscriber::fmt::format::Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        let mut line = String::new();
        self.inner.format_event(ctx, tracing_subscriber::fmt::format::Writer::new(&mut line), event)?;
        let body = line.strip_suffix('\n').unwrap_or(&line);
        match body.strip_prefix('{') {
            Some(rest) if self.json => writeln!(writer, "{{{}{rest}", self.rendered),
            _ => writeln!(writer, "{body}{}", self.rendered),
        }
    }
}

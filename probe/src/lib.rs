//! inferwatch bench: load generator and probe for OpenAI-compatible endpoints.
//!
//! The binary adds `inferwatch bench` by flattening [`BenchArgs`] into a subcommand and
//! calling [`main_entry`] (or [`run`] from its own runtime). See `probe/README.md`.

pub mod args;
pub mod arrivals;
pub mod client;
pub mod config;
pub mod dataset;
mod flows;
pub mod hooks;
pub mod images;
pub mod metrics;
pub mod otlp;
pub mod perturb;
pub mod probes;
pub mod quality;
pub mod report;
mod runner;
pub mod trace;

pub use args::BenchArgs;
pub use arrivals::ArrivalKind;
pub use client::Api;
pub use config::{Flow, FlowError, FlowProblem};
pub use dataset::DatasetError;
pub use otlp::OtlpProtocol;
pub use probes::ProbeKind;
pub use report::Report;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Why a bench run could not start or finish.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// Invalid or contradictory options (exit code 2).
    #[error("{0}")]
    Usage(String),
    /// The dialogue flow file is invalid (exit code 2); every problem has its line.
    #[error("{0}")]
    Flow(#[from] FlowError),
    /// The dataset or reference file is invalid (exit code 2).
    #[error("{0}")]
    Dataset(#[from] DatasetError),
    /// The OTLP destination is invalid (exit code 2).
    #[error("{0}")]
    Otlp(String),
    /// The results could not be written (exit code 1).
    #[error("cannot write {}: {source}", path.display())]
    Output {
        /// The file.
        path: PathBuf,
        /// What failed.
        source: std::io::Error,
    },
    /// The runtime or HTTP client could not start (exit code 1).
    #[error("{0}")]
    Runtime(String),
}

impl BenchError {
    /// The process exit code for this error: 2 for bad input, 1 otherwise.
    pub fn exit_code(&self) -> u8 {
        match self {
            BenchError::Usage(_) | BenchError::Flow(_) | BenchError::Dataset(_) | BenchError::Otlp(_) => 2,
            BenchError::Output { .. } | BenchError::Runtime(_) => 1,
        }
    }
}

/// Parses a duration: the workspace's syntax (Go's, plus `d` and `w`: `500ms`, `5s`, `1m30s`,
/// `7d`) or plain seconds (`2.5`); see [`inferwatch_core::settings::parse_duration_or_secs`].
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    inferwatch_core::settings::parse_duration_or_secs(s).map_err(|e| e.to_string())
}

/// Runs a benchmark and returns its report (also written to `--json` when given).
pub async fn run(args: BenchArgs) -> Result<Report, BenchError> {
    run_until(args, CancellationToken::new()).await
}

/// Like [`run`]; cancelling `stop` (e.g. on Ctrl-C) aborts in-flight requests and reports
/// what was measured so far.
pub async fn run_until(args: BenchArgs, stop: CancellationToken) -> Result<Report, BenchError> {
    let plan = runner::Plan::from_args(&args)?;
    let report = runner::execute(plan, stop).await?;
    if let Some(path) = &args.json {
        report.write_json(path).map_err(|source| BenchError::Output { path: path.clone(), source })?;
    }
    Ok(report)
}

/// The whole `inferwatch bench` command: builds a runtime, stops on Ctrl-C, prints the final
/// table on stdout and errors on stderr. Exit code 0, 1 (run failed) or 2 (bad input).
pub fn main_entry(args: BenchArgs) -> ExitCode {
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    rt.enable_all();
    if let Some(n) = args.client_threads.filter(|&n| n > 0) {
        rt.worker_threads(n);
    }
    let rt = match rt.build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("inferwatch bench: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let result = rt.block_on(async {
        let stop = CancellationToken::new();
        let s = stop.clone();
        tokio::spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                eprintln!("\ninferwatch bench: interrupted; reporting what was measured");
                s.cancel();
            }
        });
        run_until(args, stop).await
    });
    match result {
        Ok(report) => {
            print!("{}", report.render_table());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("inferwatch bench: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("2.5").unwrap(), Duration::from_millis(2500));
        assert_eq!(parse_duration("1m30s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert!(parse_duration("-1").is_err());
        assert!(parse_duration("abc").is_err());
    }

    #[test]
    fn durations_take_days_and_weeks() {
        assert_eq!(parse_duration("7d").unwrap(), Duration::from_secs(7 * 86_400));
        assert_eq!(parse_duration("1w2d").unwrap(), Duration::from_secs(9 * 86_400));
        assert!(parse_duration("1e30").is_err());
    }
}

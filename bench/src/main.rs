//! `otlp-load`: a neutral OTLP trace load generator and counting sink, for measuring an OTLP
//! collector (inferwatch, Rotel, otelcol ...) in pass-through: generator → collector → sink.
//! See bench/README.md.

mod codec;
mod costs;
mod load;
mod procstat;
mod scan;
mod seqset;
mod sink;
mod template;

use clap::{Parser, Subcommand};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

/// Parses `20s`, `500ms`, `1.5m`, `2h`, `1m30s`, `7d` (the workspace's syntax: Go's plus `d`
/// and `w`) or a bare number of seconds.
fn parse_duration(s: &str) -> Result<Duration, String> {
    inferwatch_core::settings::parse_duration_or_secs(s).map_err(|e| e.to_string())
}

#[derive(Debug, Parser)]
#[command(name = "otlp-load", version, about = "OTLP trace load generator and counting sink")]
struct Cli {
    /// Tokio worker threads (default: one per CPU this process may use).
    #[arg(long, global = true)]
    threads: Option<usize>,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Send OTLP trace exports; print a JSON summary on stdout.
    Gen {
        /// Receiver URL, e.g. http://127.0.0.1:4317 (gRPC) or http://127.0.0.1:4318 (HTTP; /v1/traces is added).
        #[arg(long)]
        endpoint: String,
        #[arg(long, value_enum, default_value = "grpc")]
        protocol: load::Protocol,
        /// Concurrent streams, each with its own connection and one request in flight.
        #[arg(long, short = 'c', default_value_t = 4)]
        streams: usize,
        /// Spans per request.
        #[arg(long, short = 'b', default_value_t = 512)]
        batch: usize,
        /// How long to send.
        #[arg(long, default_value = "20s", value_parser = parse_duration)]
        duration: Duration,
        /// Target spans per second over all streams (default: closed loop, as fast as answered).
        #[arg(long)]
        rate: Option<f64>,
        /// Gzip the requests.
        #[arg(long)]
        gzip: bool,
        /// Per-request timeout.
        #[arg(long, default_value = "10s", value_parser = parse_duration)]
        timeout: Duration,
        /// Keep retrying the first connection this long.
        #[arg(long, default_value = "10s", value_parser = parse_duration)]
        connect_timeout: Duration,
        /// Write the seqs of fully acknowledged requests here (ranges, one per line).
        #[arg(long)]
        acked_out: Option<PathBuf>,
        /// Sample this process's CPU and RSS during the run (repeatable).
        #[arg(long = "watch-pid")]
        watch_pid: Vec<u32>,
        /// First blast.seq.
        #[arg(long, default_value_t = 0)]
        seq_start: u64,
    },
    /// Receive OTLP traces, count spans and seqs; print a JSON summary on exit.
    Sink {
        /// OTLP/gRPC listen address.
        #[arg(long)]
        grpc: Option<SocketAddr>,
        /// OTLP/HTTP listen address (also serves GET /stats).
        #[arg(long)]
        http: Option<SocketAddr>,
        /// Exit after this long without a request, once one has arrived.
        #[arg(long, value_parser = parse_duration)]
        idle_exit: Option<Duration>,
        /// Write the seqs seen here (ranges, one per line).
        #[arg(long)]
        seqs_out: Option<PathBuf>,
        /// Refuse every Nth export with UNAVAILABLE / 503 (to test retries); 0 never.
        #[arg(long, default_value_t = 0)]
        fail_every: u64,
    },
    /// Compare acknowledged seqs with delivered seqs; exit 3 when some acked seq is missing.
    Check {
        /// The generator's --acked-out file.
        #[arg(long)]
        acked: PathBuf,
        /// The sink's --seqs-out file.
        #[arg(long)]
        delivered: PathBuf,
    },
    /// Wait until a running sink has received everything (or stopped receiving); print its stats.
    Settle {
        /// The sink's HTTP address, e.g. http://127.0.0.1:14318.
        #[arg(long)]
        sink: String,
        /// Stop as soon as the sink holds as many unique seqs as this file (the generator's --acked-out) lists.
        #[arg(long)]
        acked: Option<PathBuf>,
        /// Stop when the sink's count has not changed for this long.
        #[arg(long, default_value = "3s", value_parser = parse_duration)]
        quiet_for: Duration,
        /// Stop after this long in any case.
        #[arg(long, default_value = "30s", value_parser = parse_duration)]
        max: Duration,
    },
    /// Measure per-span cost of decode, encode and gzip (levels 6 and 1) in this process.
    Costs {
        /// Spans per request.
        #[arg(long, default_value_t = 512)]
        batch: usize,
        /// Iterations per step.
        #[arg(long, default_value_t = 200)]
        iters: usize,
    },
    /// Sample processes' CPU and RSS for a while (e.g. an idle collector); print JSON.
    Watch {
        /// Process to watch (repeatable).
        #[arg(long = "pid", required = true)]
        pids: Vec<u32>,
        #[arg(long, default_value = "20s", value_parser = parse_duration)]
        duration: Duration,
    },
}

fn runtime(threads: Option<usize>) -> std::io::Result<tokio::runtime::Runtime> {
    let mut b = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = threads {
        b.worker_threads(n.max(1));
    }
    b.enable_all().build()
}

fn sample(r: &[seqset::Range]) -> Vec<String> {
    r.iter().take(10).map(|(a, b)| if a == b { a.to_string() } else { format!("{a}-{b}") }).collect()
}

fn check(acked: &Path, delivered: &Path) -> anyhow::Result<(serde_json::Value, bool)> {
    let a = seqset::read_ranges(acked)?;
    let d = seqset::read_ranges(delivered)?;
    let missing = seqset::subtract(&a, &d);
    let extra = seqset::subtract(&d, &a);
    let n_missing = seqset::count(&missing);
    let v = serde_json::json!({
        "acked": seqset::count(&a),
        "delivered": seqset::count(&d),
        "missing": n_missing,
        "missing_sample": sample(&missing),
        "extra": seqset::count(&extra),
        "extra_sample": sample(&extra),
        "ok": n_missing == 0,
    });
    Ok((v, n_missing == 0))
}

/// Polls the sink's /stats until it holds `acked`'s count of unique seqs, stops changing for
/// `quiet_for`, or `max` passes. Returns the last stats with `reached` and `waited_s`.
async fn settle(
    sink: &str,
    acked: Option<&Path>,
    quiet_for: Duration,
    max: Duration,
) -> anyhow::Result<(serde_json::Value, bool)> {
    let expect = match acked {
        Some(p) => Some(seqset::count(&seqset::read_ranges(p)?)),
        None => None,
    };
    let url = format!("{}/stats", sink.trim_end_matches('/'));
    let client = reqwest::Client::builder().no_proxy().timeout(Duration::from_secs(2)).build()?;
    let t0 = std::time::Instant::now();
    let (mut last, mut last_change) = (None::<u64>, t0);
    let mut stats;
    let reached = loop {
        stats = match client.get(&url).send().await {
            Ok(r) => match r.bytes().await.map(|b| serde_json::from_slice::<serde_json::Value>(&b)) {
                Ok(Ok(v)) => v,
                _ => anyhow::bail!("{url}: not a stats answer"),
            },
            Err(e) => anyhow::bail!("{url}: {e}"),
        };
        let n = stats["unique_seqs"].as_u64().unwrap_or(0);
        if last != Some(n) {
            last = Some(n);
            last_change = std::time::Instant::now();
        }
        if expect.is_some_and(|e| n >= e) {
            break true;
        }
        if last_change.elapsed() >= quiet_for || t0.elapsed() >= max {
            break expect.is_none();
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    stats["expected"] = serde_json::json!(expect);
    stats["reached"] = serde_json::json!(reached);
    stats["waited_s"] = serde_json::json!(procstat::round3(t0.elapsed().as_secs_f64()));
    Ok((stats, true))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // reqwest is built without a bundled crypto provider; plain-HTTP clients still need one installed.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let result: anyhow::Result<(serde_json::Value, bool)> = match cli.command {
        Cmd::Gen {
            endpoint,
            protocol,
            streams,
            batch,
            duration,
            rate,
            gzip,
            timeout,
            connect_timeout,
            acked_out,
            watch_pid,
            seq_start,
        } => {
            let opts = load::GenOpts {
                endpoint,
                protocol,
                streams,
                batch,
                duration,
                rate,
                gzip,
                timeout,
                connect_timeout,
                acked_out,
                watch: watch_pid,
                seq_start,
            };
            runtime(cli.threads)
                .map_err(anyhow::Error::from)
                .and_then(|rt| rt.block_on(load::run(opts)))
                .map(|v| (v, true))
        }
        Cmd::Costs { batch, iters } => Ok((costs::run(batch, iters), true)),
        Cmd::Sink { grpc, http, idle_exit, seqs_out, fail_every } => {
            let opts = sink::SinkOpts { grpc, http, idle_exit, seqs_out, fail_every };
            runtime(cli.threads)
                .map_err(anyhow::Error::from)
                .and_then(|rt| rt.block_on(sink::run(opts)))
                .map(|v| (v, true))
        }
        Cmd::Check { acked, delivered } => check(&acked, &delivered),
        Cmd::Settle { sink, acked, quiet_for, max } => runtime(cli.threads)
            .map_err(anyhow::Error::from)
            .and_then(|rt| rt.block_on(settle(&sink, acked.as_deref(), quiet_for, max))),
        Cmd::Watch { pids, duration } => {
            let w = procstat::Watcher::start(&pids);
            std::thread::sleep(duration);
            Ok((w.stop(), true))
        }
    };
    match result {
        Ok((v, ok)) => {
            println!("{v}");
            if ok { ExitCode::SUCCESS } else { ExitCode::from(3) }
        }
        Err(e) => {
            eprintln!("otlp-load: {e:#}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("20s"), Ok(Duration::from_secs(20)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("5"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert!(parse_duration("x").is_err());
        assert!(parse_duration("-1s").is_err());
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("1d"), Ok(Duration::from_secs(86_400)));
    }
}

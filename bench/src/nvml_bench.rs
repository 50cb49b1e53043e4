//! `nvml-bench`: CPU cost of the `nvml` receiver per GPU per sample, on the scripted fake source
//! (no driver time: what the agent adds on top of NVML's own calls). One round = XID poll, one
//! sample of each GPU, conversion to OTLP, the export request and its protobuf encoding. The
//! median and 99th percentile of `--rounds` rounds, divided by the GPU count, for both naming
//! modes; then the same round through `spawn_blocking` as the receiver runs it.

use clap::Parser;
use inferwatch_receivers::nvml::convert::{ConvertOptions, Converter};
use inferwatch_receivers::nvml::fake::{FakeDevice, FakeSource, Script, h100_sample};
use inferwatch_receivers::nvml::names::Naming;
use inferwatch_receivers::nvml::sample_round;
use inferwatch_receivers::nvml::source::{DeviceInfo, GpuSource};
use prost::Message;
use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Debug, Parser)]
#[command(name = "nvml-bench", about = "nvml receiver: sampling + conversion cost per GPU per sample (fake source)")]
struct Cli {
    /// GPUs of the fake host.
    #[arg(long, default_value_t = 8)]
    gpus: u32,
    /// Rounds measured (after 100 warm-up rounds).
    #[arg(long, default_value_t = 5000)]
    rounds: usize,
}

fn source(gpus: u32) -> (Box<dyn GpuSource>, Vec<DeviceInfo>) {
    let devices: Vec<FakeDevice> = (0..gpus)
        .map(|i| {
            let script = Script::MemoryCreep { base: h100_sample(), step_bytes: 1 << 20 };
            FakeDevice::new(i, &format!("GPU-{i:08x}-0000-0000-0000-000000000000"), "NVIDIA H100 80GB HBM3", script)
        })
        .collect();
    let mut src = FakeSource::new(devices);
    let infos = src.devices().unwrap_or_default();
    (Box::new(src), infos)
}

/// µs per GPU: (median, p99).
fn quantiles(mut per_round: Vec<Duration>, gpus: u32) -> (f64, f64) {
    per_round.sort();
    let q = |f: f64| {
        let i = ((per_round.len() as f64 - 1.0) * f).round() as usize;
        per_round.get(i).map_or(0.0, |d| d.as_secs_f64() * 1e6 / f64::from(gpus))
    };
    (q(0.5), q(0.99))
}

/// One round: sample every GPU, convert, build and encode the request.
fn round(src: Box<dyn GpuSource>, devices: &[DeviceInfo], conv: &mut Converter, t: u64) -> (Box<dyn GpuSource>, usize) {
    let (src, xid, results) = sample_round(src, devices);
    if let Some(x) = xid {
        conv.record_xid(&x);
    }
    let mut metrics = Vec::new();
    for (d, (_, r)) in devices.iter().zip(results) {
        if let Ok(s) = r {
            metrics.extend(conv.convert(d, &s, t));
        }
    }
    let bytes = conv.request(metrics).encode_to_vec().len();
    (src, bytes)
}

fn measure(naming: Naming, cli: &Cli) -> (f64, f64, usize) {
    let (mut src, devices) = source(cli.gpus);
    let mut conv = Converter::new(ConvertOptions {
        naming,
        host: "bench-host".into(),
        hostname_label: "Hostname".into(),
        peak_window: Duration::from_secs(60),
        process_metrics: true,
    });
    let mut t = 1_800_000_000_000_000_000u64;
    let mut bytes = 0;
    let mut times = Vec::with_capacity(cli.rounds);
    for i in 0..cli.rounds + 100 {
        t += 200_000_000;
        let start = Instant::now();
        let (s, b) = round(src, &devices, &mut conv, t);
        let el = start.elapsed();
        src = black_box(s);
        bytes = b;
        if i >= 100 {
            times.push(el);
        }
    }
    let (med, p99) = quantiles(times, cli.gpus);
    (med, p99, bytes)
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    anyhow::ensure!(cli.gpus > 0 && cli.rounds > 0, "--gpus and --rounds must be positive");
    let (otel_med, otel_p99, otel_bytes) = measure(Naming::Otel, &cli);
    let (dcgm_med, dcgm_p99, dcgm_bytes) = measure(Naming::Dcgm, &cli);

    // The receiver's hop: the source moves to a blocking thread and back each round.
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build()?;
    let (hop_med, hop_p99) = rt.block_on(async {
        let (mut src, devices) = source(cli.gpus);
        let devices = Arc::new(devices);
        let mut times = Vec::with_capacity(cli.rounds);
        for i in 0..cli.rounds + 100 {
            let d = devices.clone();
            let start = Instant::now();
            let joined = tokio::task::spawn_blocking(move || sample_round(src, &d)).await;
            let el = start.elapsed();
            let Ok((s, _, _)) = joined else { anyhow::bail!("the sampling thread failed") };
            src = s;
            if i >= 100 {
                times.push(el);
            }
        }
        Ok(quantiles(times, cli.gpus))
    })?;

    eprintln!(
        "nvml-bench: {} GPUs, {} rounds: otel {otel_med:.2} µs/GPU/sample (p99 {otel_p99:.2}), \
         dcgm {dcgm_med:.2} µs (p99 {dcgm_p99:.2}); sampling through spawn_blocking {hop_med:.2} µs (p99 {hop_p99:.2})",
        cli.gpus, cli.rounds
    );
    let v = serde_json::json!({
        "gpus": cli.gpus,
        "rounds": cli.rounds,
        "otel_us_per_gpu_sample_median": otel_med,
        "otel_us_per_gpu_sample_p99": otel_p99,
        "otel_request_bytes": otel_bytes,
        "dcgm_us_per_gpu_sample_median": dcgm_med,
        "dcgm_us_per_gpu_sample_p99": dcgm_p99,
        "dcgm_request_bytes": dcgm_bytes,
        "spawn_blocking_sampling_us_per_gpu_median": hop_med,
        "spawn_blocking_sampling_us_per_gpu_p99": hop_p99,
    });
    println!("{}", serde_json::to_string_pretty(&v)?);
    Ok(())
}

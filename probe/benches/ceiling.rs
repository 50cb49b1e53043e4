//! The bench client's own ceiling: requests/s it drives against a zero-latency stub from one
//! core, and the TTFT it adds.
//!
//! `cargo bench -p inferwatch-probe --bench ceiling`. The stub runs in a child process on the
//! other cores (pinned with `taskset` when available); the client runs on a current-thread
//! runtime pinned to CPU 0. Environment: CEILING_SECS (default 5), CEILING_CONC (default
//! 1,4,16,64,256), CEILING_TOKENS (default 16 tokens per answer), CEILING_STUB_THREADS.

#[path = "../tests/support/stub.rs"]
mod stub;

// As in the `inferwatch` binary.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use inferwatch_probe::{BenchArgs, run};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn env_or<T: std::str::FromStr>(k: &str, d: T) -> T {
    std::env::var(k).ok().and_then(|v| v.parse().ok()).unwrap_or(d)
}

/// CPU seconds (user + system) a process has used, from /proc (Linux); 0 elsewhere.
fn cpu_secs(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return 0.0 };
    // Fields after the command name (which may contain spaces) start after the last ')'.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|x| x.parse::<f64>().ok()).unwrap_or(0.0);
    // utime and stime are fields 14 and 15 of stat, i.e. 11 and 12 after the state field.
    (ticks(11) + ticks(12)) / 100.0
}

fn cpus() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get())
}

fn stub_role() {
    let tokens = env_or("CEILING_TOKENS", 16usize);
    let threads = env_or("CEILING_STUB_THREADS", cpus().saturating_sub(1).max(1));
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(threads).enable_all().build().unwrap();
    rt.block_on(async move {
        let s = stub::start(stub::StubConfig { tokens, canned: true, ..stub::StubConfig::default() }).await;
        println!("PORT {}", s.addr.port());
        std::future::pending::<()>().await;
    });
}

/// Raw time to the first body byte with a bare reqwest client: the floor the bench's TTFT is
/// compared with.
async fn raw_first_byte(url: &str, n: usize) -> Vec<f64> {
    inferwatch_probe::client::install_crypto_provider();
    let c = reqwest::Client::new();
    let body = format!(
        r#"{{"model":"m","messages":[{{"role":"user","content":"{}"}}],"max_tokens":16,"stream":true}}"#,
        "word ".repeat(126)
    );
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let mut r = c.post(format!("{url}/v1/chat/completions")).body(body.clone()).send().await.unwrap();
        let _ = r.chunk().await.unwrap();
        v.push(t.elapsed().as_secs_f64());
        while r.chunk().await.unwrap().is_some() {}
    }
    v.sort_by(f64::total_cmp);
    v
}

fn main() {
    if std::env::var_os("CEILING_STUB").is_some() {
        return stub_role();
    }
    // `cargo bench` passes --bench; `cargo test --all-targets` runs this binary without it.
    if !std::env::args().any(|a| a == "--bench") {
        println!("ceiling: run with `cargo bench -p inferwatch-probe --bench ceiling`");
        return;
    }
    let secs = env_or("CEILING_SECS", 5u64);
    let conc: Vec<usize> = std::env::var("CEILING_CONC")
        .unwrap_or_else(|_| "1,4,16,64,256".into())
        .split(',')
        .filter_map(|x| x.trim().parse().ok())
        .collect();
    let exe = std::env::current_exe().unwrap();
    let n = cpus();
    let have_taskset = Command::new("taskset").arg("-V").output().is_ok();
    let mut cmd = if have_taskset && n > 1 {
        let mut c = Command::new("taskset");
        c.arg("-c").arg(format!("1-{}", n - 1)).arg(&exe);
        c
    } else {
        Command::new(&exe)
    };
    let mut child = cmd.env("CEILING_STUB", "1").stdout(Stdio::piped()).spawn().unwrap();
    // With taskset the child is taskset, which execs the stub: the same pid.
    let child_pid = child.id();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let port: u16 = line.trim().strip_prefix("PORT ").unwrap().parse().unwrap();
    let url = format!("http://127.0.0.1:{port}");
    if have_taskset && n > 1 {
        let _ = Command::new("taskset").args(["-a", "-p", "-c", "0"]).arg(std::process::id().to_string()).output();
    }
    println!(
        "# ceiling: client on 1 core (current-thread runtime, CPU 0), stub on {} core(s), {secs}s per step",
        n.max(2) - 1
    );
    println!(
        "# zero-latency stub: vLLM chat stream, {} tokens, usage chunk, [DONE]",
        env_or("CEILING_TOKENS", 16usize)
    );
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        // TTFT added: the bench's TTFT against a bare reqwest client's time to the first body
        // byte, one request at a time, interleaved in rounds so that both see the same noise.
        let q = |v: &[f64], p: f64| v[((v.len() - 1) as f64 * p) as usize] * 1e6;
        let (mut raw, mut ours) = (Vec::new(), Vec::new());
        for _ in 0..5 {
            raw.extend(raw_first_byte(&url, 500).await);
            let mut a = BenchArgs::new(&url, "m");
            a.quiet = true;
            a.concurrency = Some(1);
            a.requests = Some(500);
            let r = run(a).await.unwrap();
            ours.push((r.results.ttft.p50.unwrap_or(0.0), r.results.ttft.p90.unwrap_or(0.0)));
        }
        raw.sort_by(f64::total_cmp);
        ours.sort_by(|a, b| a.0.total_cmp(&b.0));
        let (b50, b90) = ours[ours.len() / 2];
        println!(
            "TTFT at c=1: bare reqwest first byte p50 {:.1} us p90 {:.1} us; bench TTFT p50 {:.1} us p90 {:.1} us (median of 5 rounds)",
            q(&raw, 0.5),
            q(&raw, 0.9),
            b50 * 1e6,
            b90 * 1e6
        );
        println!(
            "{:>6} {:>10} {:>10} {:>12} {:>12} {:>11} {:>10} {:>13} {:>14}",
            "conc", "req/s", "tok/s", "ttft p50 us", "ttft p99 us", "client cpu", "stub cpu", "cpu us/req", "req/s per core"
        );
        let me = std::process::id();
        for c in conc {
            let (c0, s0, w0) = (cpu_secs(me), cpu_secs(child_pid), Instant::now());
            let mut a = BenchArgs::new(&url, "m");
            a.quiet = true;
            a.concurrency = Some(c);
            a.duration = Some(Duration::from_secs(secs));
            let r = run(a).await.unwrap();
            let res = &r.results;
            assert_eq!(res.requests.failed, 0, "{:?}", res.errors);
            let wall = w0.elapsed().as_secs_f64();
            let cpu = cpu_secs(me) - c0;
            // CPU per request is what bounds one dedicated core, whatever else shares the machine.
            let per_req = cpu / res.requests.completed.max(1) as f64;
            println!(
                "{:>6} {:>10.0} {:>10.0} {:>12.1} {:>12.1} {:>10.0}% {:>9.0}% {:>13.1} {:>14.0}",
                c,
                res.throughput.requests_per_s,
                res.throughput.output_tokens_per_s,
                res.ttft.p50.unwrap_or(0.0) * 1e6,
                res.ttft.p99.unwrap_or(0.0) * 1e6,
                cpu / wall * 100.0,
                (cpu_secs(child_pid) - s0) / wall * 100.0,
                per_req * 1e6,
                if per_req > 0.0 { 1.0 / per_req } else { 0.0 },
            );
        }
        // Open loop: the highest rate offered without falling behind.
        for rate in [2000.0, 5000.0, 10000.0, 20000.0] {
            let mut a = BenchArgs::new(&url, "m");
            a.quiet = true;
            a.rate = Some(rate);
            a.arrivals = inferwatch_probe::ArrivalKind::Constant;
            a.duration = Some(Duration::from_secs(secs.min(3)));
            let t = Instant::now();
            let r = run(a).await.unwrap();
            let res = &r.results;
            println!(
                "open loop {rate:>6}/s: sent {} in {:.2}s wall ({:.0}/s achieved), overflow {}, ttft p50 {:.1} us p99 {:.1} us",
                res.requests.sent,
                t.elapsed().as_secs_f64(),
                res.requests.completed as f64 / res.duration_s.max(1e-9),
                res.requests.overflow,
                res.ttft.p50.unwrap_or(0.0) * 1e6,
                res.ttft.p99.unwrap_or(0.0) * 1e6,
            );
        }
    });
    let _ = child.kill();
    let _ = child.wait();
}

//! CPU and memory of other processes, from /proc (Linux only).
//!
//! CPU % is a share of one core: (utime + stime) ticks over the window, divided by the
//! window. Peak RSS is the largest VmRSS seen every 100 ms, reported with VmHWM (the
//! kernel's own high-water mark) read at the end.

use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Kernel clock ticks per second.
fn clk_tck() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 { t as f64 } else { 100.0 }
}

/// utime + stime of `pid` (`"self"` for this process), in ticks.
pub fn cpu_ticks(pid: &str) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may contain spaces; fields after it follow the last ')'.
    let rest = &s[s.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest[0] is field 3 (state); utime is field 14, stime field 15.
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

/// A `Vm*:` line of /proc/PID/status, in KiB.
pub fn status_kib(pid: &str, key: &str) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines().find_map(|l| l.strip_prefix(key)?.trim().strip_suffix("kB")?.trim().parse().ok())
}

/// (busy, total, cores) ticks of the whole machine, summed over all online cores.
fn host_ticks() -> Option<(u64, u64, usize)> {
    let s = std::fs::read_to_string("/proc/stat").ok()?;
    // Per-core lines, not available_parallelism(): that one follows this process's affinity.
    let cores =
        s.lines().filter(|l| l.starts_with("cpu") && l.as_bytes().get(3).is_some_and(u8::is_ascii_digit)).count();
    let line = s.lines().next()?;
    let v: Vec<u64> = line.split_whitespace().skip(1).filter_map(|x| x.parse().ok()).collect();
    // user nice system idle iowait irq softirq steal (guest time is already in user).
    let total: u64 = v.iter().take(8).sum();
    let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
    Some((total.saturating_sub(idle), total, cores.max(1)))
}

struct Sampled {
    pid: u32,
    ticks0: Option<u64>,
    rss_peak_kib: u64,
    samples: u64,
}

/// Samples processes every 100 ms on its own thread, between [`Watcher::start`] and [`Watcher::stop`].
pub struct Watcher {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Vec<Sampled>>>,
    t0: Instant,
    self_ticks0: Option<u64>,
    host0: Option<(u64, u64, usize)>,
}

impl Watcher {
    /// Records the starting CPU counters of `pids`, this process and the machine, and starts sampling RSS.
    pub fn start(pids: &[u32]) -> Watcher {
        let stop = Arc::new(AtomicBool::new(false));
        let mut procs: Vec<Sampled> = pids
            .iter()
            .map(|&pid| Sampled { pid, ticks0: cpu_ticks(&pid.to_string()), rss_peak_kib: 0, samples: 0 })
            .collect();
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            loop {
                for p in procs.iter_mut() {
                    if let Some(kib) = status_kib(&p.pid.to_string(), "VmRSS:") {
                        p.rss_peak_kib = p.rss_peak_kib.max(kib);
                        p.samples += 1;
                    }
                }
                if flag.load(Ordering::Relaxed) {
                    return procs;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        Watcher { stop, thread: Some(thread), t0: Instant::now(), self_ticks0: cpu_ticks("self"), host0: host_ticks() }
    }

    /// Stops sampling; returns the per-process figures and the machine's.
    pub fn stop(mut self) -> Value {
        let wall = self.t0.elapsed().as_secs_f64().max(1e-9);
        let tck = clk_tck();
        let pct = |t0: Option<u64>, t1: Option<u64>| match (t0, t1) {
            (Some(a), Some(b)) => Some(b.saturating_sub(a) as f64 / tck / wall * 100.0),
            _ => None,
        };
        let self_pct = pct(self.self_ticks0, cpu_ticks("self"));
        let host1 = host_ticks();
        self.stop.store(true, Ordering::Relaxed);
        let procs = self.thread.take().and_then(|t| t.join().ok()).unwrap_or_default();
        let mut watched_sum = 0.0;
        let per: Vec<Value> = procs
            .iter()
            .map(|p| {
                let id = p.pid.to_string();
                let cpu = pct(p.ticks0, cpu_ticks(&id));
                watched_sum += cpu.unwrap_or(0.0);
                let hwm = status_kib(&id, "VmHWM:");
                let peak = p.rss_peak_kib.max(hwm.unwrap_or(0));
                json!({
                    "pid": p.pid,
                    "alive": cpu.is_some(),
                    "cpu_pct": cpu.map(round1),
                    "rss_peak_mib": round1(peak as f64 / 1024.0),
                    "rss_sampled_peak_mib": round1(p.rss_peak_kib as f64 / 1024.0),
                    "vmhwm_mib": hwm.map(|k| round1(k as f64 / 1024.0)),
                    "rss_samples": p.samples,
                })
            })
            .collect();
        let host = match (self.host0, host1) {
            (Some((b0, t0, _)), Some((b1, t1, cores))) if t1 > t0 => {
                let cores = cores as f64;
                // Busy share of all cores, expressed in "% of one core" like the others.
                let busy = b1.saturating_sub(b0) as f64 / (t1 - t0) as f64 * cores * 100.0;
                json!({
                    "cores": cores,
                    "busy_pct": round1(busy),
                    "other_pct": round1(busy - watched_sum - self_pct.unwrap_or(0.0)),
                })
            }
            _ => Value::Null,
        };
        json!({ "window_s": round3(wall), "procs": per, "self_cpu_pct": self_pct.map(round1), "host": host })
    }
}

/// Rounds to one decimal.
pub fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

/// Rounds to three decimals.
pub fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_own_process() {
        assert!(cpu_ticks("self").is_some());
        assert!(status_kib("self", "VmRSS:").unwrap_or(0) > 0);
        let me = std::process::id();
        let w = Watcher::start(&[me]);
        let mut x = 0u64;
        for i in 0..5_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        let v = w.stop();
        assert_eq!(v["procs"][0]["alive"], true);
        assert!(v["procs"][0]["rss_peak_mib"].as_f64().unwrap_or(0.0) > 0.0);
    }
}

//! `trend_forecast` driven through the ArrowProcessor trait with batches from `metrics::to_batch`, and its
//! statistics checked against brute-force references.

use inferwatch_core::pdata::Signal;
use inferwatch_processors::detect::{BREACH_ETA, LEVEL, SCORE};
use inferwatch_processors::trend_forecast::{TrendForecastFactory, mann_kendall, normal, theil_sen};
use inferwatch_testkit::attrs::{pairs, resource_attrs};
use inferwatch_testkit::harness::Harness;
use inferwatch_testkit::otlp::{gauge, kv, metrics_request, point, scope};
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::metrics::v1::{Histogram, HistogramDataPoint, Metric, metric, number_data_point};
use proptest::prelude::*;
use serde_json::json;

const S: u64 = 1_000_000_000;
const HOUR: u64 = 3600 * S;
const DAY: u64 = 24 * HOUR;
/// Monday 2024-01-01 00:00:00 UTC.
const BASE: u64 = 1_704_067_200 * S;

// ---- a small deterministic RNG ------------------------------------------------------------------

struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        // SplitMix64
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    fn normal(&mut self) -> f64 {
        let u1 = self.uniform().max(1e-300);
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }
}

// ---- building input and reading output ----------------------------------------------------------

/// One request: resource (service `svc`, instance `i-<instance>`), one gauge per metric name with the
/// points (time ns, value) and point attribute `model`.
fn request(metric_name: &str, instance: &str, points: &[(u64, f64)]) -> ExportMetricsServiceRequest {
    let data_points = points.iter().map(|&(t, v)| point(vec![kv("model", "m1")], t, v)).collect();
    metrics_request(
        vec![kv("service.name", "svc"), kv("service.instance.id", instance)],
        scope("sim", ""),
        vec![gauge(metric_name, "1", data_points)],
    )
}

/// One output point.
#[derive(Debug, Clone, PartialEq)]
struct Out {
    name: String,
    unit: String,
    time: u64,
    value: f64,
    resource: Vec<(String, String)>,
    attrs: Vec<(String, String)>,
}

impl Out {
    fn attr(&self, k: &str) -> Option<&str> {
        self.attrs.iter().find(|(key, _)| key == k).map(|(_, v)| v.as_str())
    }
    fn num(&self, k: &str) -> Option<f64> {
        self.attr(k).and_then(|v| v.parse().ok())
    }
}

fn flatten(req: &ExportMetricsServiceRequest) -> Vec<Out> {
    let mut out = Vec::new();
    for rm in &req.resource_metrics {
        let resource = pairs(resource_attrs(rm.resource.as_ref()));
        for sm in &rm.scope_metrics {
            for m in &sm.metrics {
                let Some(metric::Data::Gauge(g)) = &m.data else { panic!("{} is not a gauge", m.name) };
                for p in &g.data_points {
                    let Some(number_data_point::Value::AsDouble(value)) = p.value else { panic!("not a double") };
                    out.push(Out {
                        name: m.name.clone(),
                        unit: m.unit.clone(),
                        time: p.time_unix_nano,
                        value,
                        resource: resource.clone(),
                        attrs: pairs(&p.attributes),
                    });
                }
            }
        }
    }
    out
}

/// The kit's harness on this file's requests.
trait Trend {
    fn new(cfg: serde_json::Value) -> Self;
    fn feed(&mut self, req: &ExportMetricsServiceRequest, watermark: u64) -> Vec<Out>;
}

impl Trend for Harness {
    fn new(cfg: serde_json::Value) -> Self {
        Harness::create(&TrendForecastFactory, "trend_forecast/test", &cfg, Signal::Metrics)
    }

    /// Feeds one request and advances the watermark to its newest point; returns what came out.
    fn feed(&mut self, req: &ExportMetricsServiceRequest, watermark: u64) -> Vec<Out> {
        assert!(self.process_metrics(req).is_empty(), "outputs come only on advance");
        self.advance_metrics(watermark).iter().flat_map(flatten).collect()
    }
}

// ---- synthetic scenarios --------------------------------------------------------------------------

/// A KV-usage-like series sampled every 15 minutes: base 0.5, a daily swing of ±0.08 peaking at
/// 14:00 UTC, a weekend dip of 0.05 and a weekly wave of ±0.02, AR(1) noise on the hourly scale
/// (φ = 0.7, σ = 0.015) plus white noise per sample (σ = 0.02), and optionally a linear drift from
/// `onset_day` whose slope is set so that the noise-free series first reaches the threshold 0.8 at
/// `breach_day`.
#[derive(Clone, Copy, Debug)]
struct Scenario {
    days: f64,
    onset_day: f64,
    breach_day: Option<f64>,
    /// Shifts the series' start by this many days (changes the weekday of onset).
    start_shift_days: u64,
    seed: u64,
    /// Drift per day (0 without a breach).
    slope: f64,
}

const THRESHOLD: f64 = 0.8;
const AR_PHI: f64 = 0.7;
const AR_SIGMA: f64 = 0.015;
const WHITE_SIGMA: f64 = 0.02;

impl Scenario {
    fn healthy(days: f64, start_shift_days: u64, seed: u64) -> Self {
        Scenario { days, onset_day: 0.0, breach_day: None, start_shift_days, seed, slope: 0.0 }
    }

    /// A drift from `onset_day` that first crosses the threshold `breach_after` days later; the run
    /// ends a day after the crossing.
    fn drift(onset_day: f64, breach_after: f64, start_shift_days: u64, seed: u64) -> Self {
        let breach = onset_day + breach_after;
        let mut sc =
            Scenario { days: breach + 8.0, onset_day, breach_day: Some(breach), start_shift_days, seed, slope: 0.0 };
        // The steepest drift whose first crossing is not before `breach` (the crossing jumps from one
        // daily peak to the next as the slope changes, so it lands at or a little after it).
        let (mut lo, mut hi) = (0.0, 1.0);
        for _ in 0..50 {
            sc.slope = 0.5 * (lo + hi);
            match sc.first_crossing_day() {
                Some(d) if d < breach => hi = sc.slope,
                _ => lo = sc.slope,
            }
        }
        sc.slope = lo;
        sc.days = sc.first_crossing_day().unwrap_or(breach) + 1.0;
        sc
    }

    fn start(&self) -> u64 {
        BASE + self.start_shift_days * DAY
    }

    /// Noise-free seasonal level at absolute time `t` (ns).
    fn seasonal(t: u64) -> f64 {
        let hour = ((t / HOUR) % 24) as f64 + ((t % HOUR) as f64 / HOUR as f64);
        let week_h = ((t - BASE) % (7 * DAY)) as f64 / HOUR as f64;
        let dow = (week_h / 24.0) as u64; // 0 = Monday
        let daily = 0.08 * (2.0 * std::f64::consts::PI * (hour - 8.0) / 24.0).sin();
        let weekend = if dow >= 5 { -0.05 } else { 0.0 };
        let wave = 0.02 * (2.0 * std::f64::consts::PI * week_h / 168.0).sin();
        0.5 + daily + weekend + wave
    }

    /// Largest noise-free seasonal level over a week.
    fn seasonal_peak() -> f64 {
        (0..7 * 24 * 60).map(|m| Self::seasonal(BASE + m * 60 * S)).fold(f64::NEG_INFINITY, f64::max)
    }

    /// Noise-free value at absolute time `t`.
    fn clean(&self, t: u64) -> f64 {
        let day = (t - self.start()) as f64 / DAY as f64;
        Self::seasonal(t) + self.slope * (day - self.onset_day).max(0.0)
    }

    /// First time (days from start, 10-minute resolution) the noise-free series reaches the threshold.
    fn first_crossing_day(&self) -> Option<f64> {
        (0..(self.days * 144.0) as u64)
            .map(|m| self.start() + m * 600 * S)
            .find(|&t| self.clean(t) >= THRESHOLD)
            .map(|t| (t - self.start()) as f64 / DAY as f64)
    }

    /// Per day, the samples (time, value).
    fn days_of_samples(&self) -> Vec<Vec<(u64, f64)>> {
        let mut rng = Rng(self.seed);
        let mut ar = 0.0;
        let step = 15 * 60 * S;
        let n_days = self.days.ceil() as u64;
        (0..n_days)
            .map(|d| {
                (0..96)
                    .map(|k| {
                        let t = self.start() + d * DAY + k * step;
                        if k % 4 == 0 {
                            ar = AR_PHI * ar + AR_SIGMA * (1.0 - AR_PHI * AR_PHI).sqrt() * rng.normal();
                        }
                        (t, self.clean(t) + ar + WHITE_SIGMA * rng.normal())
                    })
                    .collect()
            })
            .collect()
    }
}

/// Per closed aggregate: (time, level, eta).
#[derive(Debug, Clone, Copy)]
struct Step {
    day: f64,
    level: f64,
    eta_days: Option<f64>,
}

fn config() -> serde_json::Value {
    json!({"metric": "kv.usage", "threshold": THRESHOLD, "horizon": "21d", "aggregate": "1h"})
}

/// Runs a scenario day by day; returns the level (and eta) at every closed aggregate.
fn run(sc: &Scenario) -> Vec<Step> {
    let mut h = Harness::new(config());
    let mut steps = Vec::new();
    let mut eta_at = std::collections::HashMap::new();
    for day in sc.days_of_samples() {
        let wm = day.last().unwrap().0;
        for o in h.feed(&request("kv.usage", "a", &day), wm) {
            let d = (o.time - sc.start()) as f64 / DAY as f64;
            match o.name.as_str() {
                LEVEL => steps.push(Step { day: d, level: o.value, eta_days: None }),
                BREACH_ETA => {
                    eta_at.insert(o.time, o.value / 86_400.0);
                }
                _ => {}
            }
        }
    }
    for s in &mut steps {
        let t = sc.start() + (s.day * DAY as f64).round() as u64;
        s.eta_days = eta_at.get(&t).copied();
    }
    steps
}

/// Number of separate episodes with level ≥ `at` (rising edges).
fn episodes(steps: &[Step], at: f64) -> usize {
    let mut n = 0;
    let mut on = false;
    for s in steps {
        let now = s.level >= at;
        if now && !on {
            n += 1;
        }
        on = now;
    }
    n
}

fn first_at(steps: &[Step], at: f64) -> Option<f64> {
    steps.iter().find(|s| s.level >= at).map(|s| s.day)
}

#[test]
#[ignore = "measurement run: prints lead times and false alarms over many seeds"]
fn trend_report_lead_times_and_false_alarms() {
    let seeds: u64 = std::env::var("TF_SEEDS").ok().and_then(|v| v.parse().ok()).unwrap_or(3);
    let which = std::env::var("TF_WHICH").unwrap_or_else(|_| "healthy,b,c,c0".into());
    println!("seasonal peak {:.4}, headroom {:.4}", Scenario::seasonal_peak(), THRESHOLD - Scenario::seasonal_peak());
    if which.contains("healthy") {
        for seed in 1..=seeds {
            let sc = Scenario::healthy(90.0, seed % 7, seed);
            let steps = run(&sc);
            let max = steps.iter().map(|s| s.level).fold(0.0, f64::max);
            println!(
                "healthy seed {seed}: warnings {} criticals {} hours≥0.6 {} max level {max:.3}",
                episodes(&steps, 0.6),
                episodes(&steps, 0.8),
                steps.iter().filter(|s| s.level >= 0.6).count(),
            );
            for s in steps.iter().filter(|s| s.level >= 0.6).take(3) {
                println!("   day {:.2} level {:.3} eta {:?}", s.day, s.level, s.eta_days);
            }
        }
    }
    for (name, onset, breach_after) in [("b", 14.0, 30.0), ("c", 14.0, 21.0), ("b0", 0.0, 30.0), ("c0", 0.0, 21.0)] {
        if !which.split(',').any(|w| w == name) {
            continue;
        }
        for seed in 1..=seeds {
            let sc = Scenario::drift(onset, breach_after, seed % 7, seed);
            let steps = run(&sc);
            let cross = sc.first_crossing_day().unwrap_or(f64::NAN);
            let after: Vec<Step> = steps.iter().copied().filter(|s| s.day >= onset).collect();
            let w = first_at(&after, 0.6);
            let c = first_at(&after, 0.8);
            let pre = steps.iter().filter(|s| s.day < onset && s.level >= 0.6).count();
            println!(
                "{name} seed {seed}: slope/d {:.4} crossing {cross:.2} warning {:.2} (lead {:.2}) critical {:.2} (lead {:.2}) pre-onset hours≥0.6 {pre}",
                sc.slope,
                w.unwrap_or(f64::NAN),
                cross - w.unwrap_or(f64::NAN),
                c.unwrap_or(f64::NAN),
                cross - c.unwrap_or(f64::NAN),
            );
        }
    }
}

// ---- statistics against brute-force references --------------------------------------------------

fn sign(x: f64) -> i64 {
    if x > 0.0 {
        1
    } else if x < 0.0 {
        -1
    } else {
        0
    }
}

/// S and Var(S) with ties, straight from the definitions, O(n²).
fn brute_mk(y: &[f64]) -> (i64, f64) {
    let n = y.len();
    let mut s = 0;
    for i in 0..n {
        for j in i + 1..n {
            s += sign(y[j] - y[i]);
        }
    }
    let f = |t: f64| t * (t - 1.0) * (2.0 * t + 5.0);
    let mut ties = 0.0;
    for i in 0..n {
        if (0..i).any(|k| y[k] == y[i]) {
            continue;
        }
        let t = y.iter().filter(|&&v| v == y[i]).count() as f64;
        ties += f(t);
    }
    (s, (f(n as f64) - ties) / 18.0)
}

/// The Hamed-Rao factor from its formula, with ranks counted pairwise.
fn brute_hamed_rao(t: &[f64], y: &[f64], slope: f64) -> f64 {
    let n = y.len();
    let d: Vec<f64> = (0..n).map(|i| y[i] - slope * t[i]).collect();
    let r: Vec<f64> = (0..n)
        .map(|i| {
            let below = d.iter().filter(|&&x| x < d[i]).count() as f64;
            let equal = d.iter().filter(|&&x| x == d[i]).count() as f64;
            below + (equal + 1.0) / 2.0
        })
        .collect();
    let mean = r.iter().sum::<f64>() / n as f64;
    let c: Vec<f64> = r.iter().map(|x| x - mean).collect();
    let denom: f64 = c.iter().map(|x| x * x).sum();
    if n < 3 || denom == 0.0 {
        return 1.0;
    }
    let nf = n as f64;
    let rho = |k: usize| (0..n - k).map(|i| c[i] * c[i + k]).sum::<f64>() / denom;
    let weight = |k: usize| {
        let m = nf - k as f64;
        m * (m - 1.0) * (m - 2.0)
    };
    let norm = 2.0 / (nf * (nf - 1.0) * (nf - 2.0));
    // Screened empirical autocorrelations (Hamed & Rao 1998) ...
    let screened: f64 = (1..n)
        .map(|k| (k, rho(k)))
        .filter(|(_, r)| r.abs() > 1.959_963_984_540_054 / nf.sqrt())
        .map(|(k, r)| weight(k) * r)
        .sum();
    // ... and the AR(1) model ρ_k = ρ_1^k (terms below 1e-6 dropped, as the implementation does).
    let r1 = rho(1);
    let ar: f64 = if r1 > 0.0 {
        (1..n).map(|k| (k, r1.powi(k as i32))).take_while(|(_, r)| *r >= 1e-6).map(|(k, r)| weight(k) * r).sum()
    } else {
        0.0
    };
    (1.0 + norm * screened).max(1.0 + norm * ar).max(1.0)
}

/// Value at a 1-based real rank of a sorted slice (clamped, interpolated).
fn sorted_at(v: &[f64], r: f64) -> f64 {
    let r = r.clamp(1.0, v.len() as f64);
    let k = r.floor() as usize;
    let frac = r - k as f64;
    if k == v.len() { v[k - 1] } else { v[k - 1] + frac * (v[k] - v[k - 1]) }
}

/// Values with many ties (small integers) or continuous ones.
fn series() -> impl Strategy<Value = Vec<f64>> {
    prop_oneof![prop::collection::vec((0i32..6).prop_map(f64::from), 3..60), prop::collection::vec(-1e3f64..1e3, 3..60),]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn trend_mann_kendall_matches_brute_force(y in series(), corr in 1.0f64..4.0) {
        let (s, var) = brute_mk(&y);
        let t = mann_kendall::test(&y, corr);
        prop_assert_eq!(t.s, s);
        prop_assert!((t.var_s - var).abs() <= 1e-9 * var.max(1.0), "{} vs {}", t.var_s, var);
        let sd = (var * corr).sqrt();
        let z = if sd > 0.0 && s != 0 { (s - sign(s as f64)) as f64 / sd } else { 0.0 };
        let p = 2.0 * (1.0 - normal::cdf(z.abs()));
        prop_assert!((t.p - p).abs() <= 1e-12, "p {} vs {}", t.p, p);
    }

    #[test]
    fn trend_hamed_rao_matches_its_formula(y in series(), slope in -2.0f64..2.0) {
        let t: Vec<f64> = (0..y.len()).map(|i| i as f64).collect();
        let got = mann_kendall::hamed_rao_factor(&t, &y, slope);
        let want = brute_hamed_rao(&t, &y, slope);
        prop_assert!((got - want).abs() <= 1e-9 * want, "{got} vs {want}");
    }

    #[test]
    fn trend_theil_sen_matches_the_sorted_pairwise_slopes(
        y in series(),
        gaps in prop::collection::vec(1u32..4, 60),
        var_s in 0.0f64..5000.0,
        z in 0.5f64..3.0,
    ) {
        let mut t = Vec::with_capacity(y.len());
        let mut acc = 0.0;
        for g in gaps.iter().take(y.len()) {
            acc += f64::from(*g);
            t.push(acc);
        }
        let mut slopes = Vec::new();
        for i in 0..y.len() {
            for j in i + 1..y.len() {
                slopes.push((y[j] - y[i]) / (t[j] - t[i]));
            }
        }
        slopes.sort_by(f64::total_cmp);
        let n = slopes.len() as f64;
        let median = sorted_at(&slopes, (n + 1.0) / 2.0);
        let fit = theil_sen::fit(&t, &y, var_s, z).unwrap();
        prop_assert_eq!(fit.slope, median);
        let c = z * var_s.sqrt();
        prop_assert_eq!(fit.lo, sorted_at(&slopes, (n - c) / 2.0));
        prop_assert_eq!(fit.hi, sorted_at(&slopes, (n + c) / 2.0 + 1.0));
        let mut resid: Vec<f64> = t.iter().zip(&y).map(|(t, y)| y - median * t).collect();
        resid.sort_by(f64::total_cmp);
        prop_assert_eq!(fit.intercept, sorted_at(&resid, (resid.len() as f64 + 1.0) / 2.0));
    }
}

#[test]
fn trend_hamed_rao_correction_removes_false_trends_from_ar1_noise() {
    // 200 AR(1) series (φ = 0.8) of two weeks of hours, no trend: the classic test calls a large share
    // of them significant at 1 %, the corrected one close to the nominal rate.
    let mut rng = Rng(42);
    let (mut classic, mut corrected, mut factors) = (0, 0, Vec::new());
    let n = 336;
    let t: Vec<f64> = (0..n).map(|i| i as f64).collect();
    for _ in 0..200 {
        let mut x = 0.0;
        let y: Vec<f64> = (0..n)
            .map(|_| {
                x = 0.8 * x + rng.normal();
                x
            })
            .collect();
        let slope = theil_sen::slope(&t, &y).unwrap();
        let f = mann_kendall::hamed_rao_factor(&t, &y, slope);
        factors.push(f);
        classic += usize::from(mann_kendall::test(&y, 1.0).p <= 0.01);
        let c = mann_kendall::test(&y, f);
        corrected += usize::from(c.p <= 0.01);
        assert!(c.p >= mann_kendall::test(&y, 1.0).p);
    }
    factors.sort_by(f64::total_cmp);
    let median_factor = factors[100];
    println!(
        "AR(1) φ=0.8: classic {classic}/200 significant, corrected {corrected}/200, median n/n* {median_factor:.2}"
    );
    assert!(classic >= 60, "the uncorrected test is fooled by autocorrelation: {classic}/200");
    assert!(corrected <= 10, "the corrected test stays near 1 %: {corrected}/200");
    assert!(median_factor > 3.0, "n/n* {median_factor}");

    // Independent noise with a real trend: the correction keeps the power.
    let mut detected = 0;
    for _ in 0..50 {
        let y: Vec<f64> = (0..n).map(|i| 0.004 * i as f64 + rng.normal()).collect();
        let slope = theil_sen::slope(&t, &y).unwrap();
        let f = mann_kendall::hamed_rao_factor(&t, &y, slope);
        detected += usize::from(mann_kendall::test(&y, f).p <= 0.01);
    }
    assert!(detected >= 40, "trend of 1.3 σ over the window still found: {detected}/50");
}

// ---- the processor on hand-made input -------------------------------------------------------------

/// A small configuration for exact checks: hourly aggregates, no seasons, 10 hours of history needed.
fn small(extra: serde_json::Value) -> serde_json::Value {
    let mut cfg = json!({
        "metric": "kv.usage", "threshold": 1.0, "horizon": "7d", "aggregate": "1h",
        "history": "2d", "min_history": "10h", "recent": [], "seasonality": []
    });
    if let (Some(c), Some(e)) = (cfg.as_object_mut(), extra.as_object()) {
        c.extend(e.clone());
    }
    cfg
}

/// One point per hour at the start of the hour, value 0.01·hour.
fn ramp(hours: std::ops::Range<u64>) -> Vec<(u64, f64)> {
    hours.map(|h| (BASE + h * HOUR, 0.01 * h as f64)).collect()
}

#[test]
fn trend_a_clean_ramp_gives_the_exact_forecast_and_the_documented_outputs() {
    let mut h = Harness::new(small(json!({})));
    assert!(h.feed(&request("kv.usage", "a", &ramp(0..10)), BASE + 9 * HOUR).is_empty(), "9 closed: below 10h");
    let out = h.feed(&request("kv.usage", "a", &ramp(10..20)), BASE + 19 * HOUR);
    // Buckets 9 ..= 18 close (bucket 19 is open); the first assessment is at the end of bucket 9.
    let levels: Vec<&Out> = out.iter().filter(|o| o.name == LEVEL).collect();
    assert_eq!(levels.len(), 10);
    assert_eq!(levels[0].time, BASE + 10 * HOUR);
    let last = out.iter().filter(|o| o.time == BASE + 19 * HOUR).collect::<Vec<_>>();
    let names: Vec<&str> = last.iter().map(|o| o.name.as_str()).collect();
    assert_eq!(names, vec![SCORE, LEVEL, BREACH_ETA]);
    // 0.01 per hour, level at the end of bucket 18 = 0.185 → (1 − 0.185)/0.01 = 81.5 h.
    let eta = last[2];
    assert!((eta.value - 81.5 * 3600.0).abs() < 1e-6, "eta {}", eta.value);
    assert_eq!(eta.unit, "s");
    assert_eq!(eta.attr("detector"), Some("trend_forecast"));
    assert_eq!(eta.attr("metric"), Some("kv.usage"));
    assert_eq!(eta.attr("model"), Some("m1"));
    assert!((eta.num("slope_per_day").unwrap() - 0.24).abs() < 1e-9);
    assert!((eta.num("eta_low").unwrap() - eta.value).abs() < 1e-6, "an exact line has no spread");
    assert!(eta.num("p_value").unwrap() < 1e-6);
    assert!(eta.resource.contains(&("service.instance.id".into(), "a".into())));
    let level = last[1];
    // 81.5 h = 3.4 d, inside 7d but beyond 7d/3: between 0.6 and 0.8 by the documented mapping.
    let want = 0.8 - 0.2 * (81.5 / 24.0 - 7.0 / 3.0) / (14.0 / 3.0);
    assert!((level.value - want).abs() < 1e-9, "level {} want {want}", level.value);
    let keys: Vec<&str> = level.attrs.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(&keys[..3], &["detector", "metric", "model"]);
    for k in ["threshold", "value", "p_value", "slope_per_day", "window", "points", "eta", "eta_low", "eta_high"] {
        assert!(keys.contains(&k), "{k} in {keys:?}");
    }
    assert!(last[0].value > 0.0 && last[0].value <= level.value, "score = urgency × (1 − p)");
}

#[test]
fn trend_direction_below_and_breach_give_level_one() {
    // Falling to the threshold 0.5 from 1.0: with direction below this is the trend to warn of.
    let falling: Vec<(u64, f64)> = (0..20).map(|h| (BASE + h * HOUR, 1.0 - 0.01 * h as f64)).collect();
    let mut h = Harness::new(small(json!({"threshold": 0.5, "direction": "below"})));
    let out = h.feed(&request("kv.usage", "a", &falling), BASE + 19 * HOUR);
    let eta = out.iter().rfind(|o| o.name == BREACH_ETA).unwrap();
    assert!((eta.value - (0.815 - 0.5) / 0.01 * 3600.0).abs() < 1e-6, "eta {}", eta.value);
    assert!((eta.num("slope_per_day").unwrap() + 0.24).abs() < 1e-9);
    // The same data with direction above: moving away, no forecast, level 0.
    let mut h = Harness::new(small(json!({"threshold": 1.5})));
    let out = h.feed(&request("kv.usage", "a", &falling), BASE + 19 * HOUR);
    assert!(out.iter().all(|o| o.name != BREACH_ETA));
    assert!(out.iter().filter(|o| o.name == LEVEL).all(|o| o.value == 0.0));
    // Already past the threshold: level 1, eta 0.
    let high: Vec<(u64, f64)> = (0..12).map(|h| (BASE + h * HOUR, 1.2 + 0.001 * (h % 3) as f64)).collect();
    let mut h = Harness::new(small(json!({})));
    let out = h.feed(&request("kv.usage", "a", &high), BASE + 11 * HOUR);
    let last: Vec<&Out> = out.iter().filter(|o| o.time == BASE + 11 * HOUR).collect();
    assert_eq!(
        last.iter().map(|o| (o.name.as_str(), o.value)).collect::<Vec<_>>(),
        vec![(SCORE, 1.0), (LEVEL, 1.0), (BREACH_ETA, 0.0)]
    );
}

#[test]
fn trend_the_statistic_chooses_what_a_bucket_reports() {
    // Each hour: eight points at 0.2 and two at 0.9. The mean 0.34 stays below 0.8; the max 0.9 and the
    // p95 (rank ⌊0.95·9⌋ = 8 of 10: 0.9) are past it.
    let hour = [0.2, 0.9, 0.2, 0.2, 0.2, 0.2, 0.9, 0.2, 0.2, 0.2];
    let pts: Vec<(u64, f64)> = (0..12)
        .flat_map(|h| hour.into_iter().enumerate().map(move |(i, v)| (BASE + h * HOUR + i as u64 * 300 * S, v)))
        .collect();
    for (stat, want) in [("mean", 0.0), ("max", 1.0), ("p95", 1.0)] {
        let mut h = Harness::new(small(json!({"threshold": 0.8, "statistic": stat})));
        let out = h.feed(&request("kv.usage", "a", &pts), BASE + 12 * HOUR);
        let level = out.iter().rfind(|o| o.name == LEVEL).unwrap();
        assert_eq!(level.value, want, "{stat}");
        let value = level.num("value").unwrap();
        let expect = if stat == "mean" { 0.34 } else { 0.9 };
        assert!((value - expect).abs() < 0.01, "{stat}: value {value}");
    }
}

#[test]
fn trend_other_metrics_histograms_and_non_finite_values_are_ignored() {
    let mut h = Harness::new(small(json!({})));
    let mut req = request("kv.usage", "a", &ramp(0..12));
    let other = request("other", "a", &ramp(0..12)).resource_metrics[0].scope_metrics[0].metrics[0].clone();
    let hist = Metric {
        name: "kv.usage".into(),
        data: Some(metric::Data::Histogram(Histogram {
            data_points: vec![HistogramDataPoint {
                time_unix_nano: BASE,
                count: 1,
                sum: Some(1e9),
                ..Default::default()
            }],
            aggregation_temporality: 2,
        })),
        ..Default::default()
    };
    let sm = &mut req.resource_metrics[0].scope_metrics[0];
    sm.metrics.push(other);
    sm.metrics.push(hist);
    if let Some(metric::Data::Gauge(g)) = &mut sm.metrics[0].data {
        g.data_points.push(point(vec![kv("model", "m1")], BASE + 3 * HOUR, f64::NAN));
    }
    let out = h.feed(&req, BASE + 12 * HOUR);
    assert_eq!(h.proc.series_count(), 1, "only kv.usage's number points");
    let last = out.iter().rfind(|o| o.name == BREACH_ETA).unwrap();
    assert!((last.value - (1.0 - 0.115) / 0.01 * 3600.0).abs() < 1e-6, "the ramp alone: {}", last.value);
}

#[test]
fn trend_series_are_capped_and_expire_when_idle() {
    let mut h = Harness::new(small(json!({"max_series": 10, "idle_timeout": "1d"})));
    for i in 0..10 {
        h.feed(&request("kv.usage", &format!("i{i}"), &[(BASE, 0.1)]), BASE);
    }
    assert_eq!((h.proc.series_count(), h.evicted("max_series")), (10, 0));
    h.feed(&request("kv.usage", "new", &[(BASE + 1, 0.1)]), BASE + 1);
    assert_eq!((h.proc.series_count(), h.evicted("max_series")), (10, 1), "least recently seen 10 % evicted");
    h.feed(&request("kv.usage", "new", &[(BASE + DAY, 0.1)]), BASE + DAY + 2);
    assert_eq!(h.proc.series_count(), 1, "the others were idle for a day");
    assert_eq!((h.evicted("idle"), h.evicted("max_series")), (9, 1));
}

#[test]
fn trend_snapshot_restore_continue_equals_never_stopping() {
    let cfg = json!({
        "metric": "kv.usage", "threshold": 0.8, "horizon": "7d", "history": "4d", "min_history": "1d",
        "seasonality": ["daily"], "statistic": "p95"
    });
    let sc = Scenario::drift(1.0, 6.0, 0, 9);
    // Feed in 10-hour chunks so that the snapshot falls inside an open bucket.
    let samples: Vec<(u64, f64)> = sc.days_of_samples().into_iter().flatten().collect();
    let chunks: Vec<&[(u64, f64)]> = samples.chunks(37).collect();
    let cut = chunks.len() / 2;
    let mut straight = Harness::new(cfg.clone());
    let mut resumed = Harness::new(cfg.clone());
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for (i, c) in chunks.iter().enumerate() {
        let wm = c.last().unwrap().0;
        a.extend(straight.feed(&request("kv.usage", "a", c), wm));
        if i < cut {
            b.extend(resumed.feed(&request("kv.usage", "a", c), wm));
        }
        if i + 1 == cut {
            let bytes = resumed.proc.snapshot().unwrap();
            let mut fresh = Harness::new(cfg.clone());
            fresh.proc.restore(&bytes).unwrap();
            assert_eq!(fresh.proc.snapshot().unwrap(), bytes, "restore is lossless");
            assert!(fresh.proc.restore(&bytes[..bytes.len() / 2]).is_err());
            resumed = fresh;
        } else if i >= cut {
            b.extend(resumed.feed(&request("kv.usage", "a", c), wm));
        }
    }
    assert!(a.iter().any(|o| o.name == LEVEL && o.value >= 0.6), "the drift is flagged");
    assert!(a.len() > 200);
    assert_eq!(a, b);
}

#[test]
fn trend_configuration_errors_are_refused() {
    use inferwatch_core::component::ProcessorFactory;
    let f = TrendForecastFactory;
    assert!(f.validate(&json!({"metric": "m"})).is_ok());
    assert!(f.validate(&json!({"metric": "m", "horizon": "21d", "history": "14d", "aggregate": "1h"})).is_ok());
    for bad in [
        json!({}),
        json!({"metric": "m", "direction": "sideways"}),
        json!({"metric": "m", "aggregate": "0s"}),
        json!({"metric": "m", "recent": ["1d"]}),
        json!({"metric": "m", "confidence": 1.0}),
        json!({"metric": "m", "unknown": true}),
    ] {
        assert!(f.validate(&bad).is_err(), "{bad}");
    }
}

// ---- synthetic seasonal scenarios ------------------------------------------------------------------

#[test]
fn trend_healthy_seasonal_series_90_days_raises_no_critical_and_few_warnings() {
    // Starts on a Saturday: the weekend dip followed by the weekdays looks like a rise until two weeks of
    // history let the weekly season be removed (the worst cold start of the week; without the
    // provisional cap this series raised a warning on day 3).
    let sc = Scenario::healthy(90.0, 5, 5);
    let steps = run(&sc);
    assert_eq!(steps.len(), 90 * 24 - 72 + 1 - 1, "one assessment per closed hour from 3 days on");
    let max = steps.iter().map(|s| s.level).fold(0.0, f64::max);
    let warnings = episodes(&steps, 0.6);
    println!("healthy 90 days: max level {max:.3}, warning episodes {warnings}");
    assert!(max < 0.8, "no critical: max level {max}");
    assert!(warnings <= 3, "{warnings} warnings");
    assert!(steps.iter().filter(|s| s.day < 14.0).all(|s| s.level <= 0.5), "provisional cap before two weeks");
}

#[test]
fn trend_drift_breaching_30_days_after_onset_warns_14_days_ahead() {
    let sc = Scenario::drift(14.0, 30.0, 2, 2);
    let steps = run(&sc);
    let cross = sc.first_crossing_day().unwrap();
    let warn = first_at(&steps, 0.6).unwrap();
    let nominal = sc.breach_day.unwrap();
    println!(
        "drift 30 d: crossing day {cross:.2} (nominal {nominal}), first warning day {warn:.2}, lead {:.2} d",
        cross - warn
    );
    assert!(warn >= sc.onset_day, "nothing before the onset (day {warn})");
    assert!(nominal - warn >= 14.0, "lead {:.2} days before the nominal breach", nominal - warn);
    let breached = steps.iter().rfind(|s| s.day <= cross + 1.0).unwrap();
    assert_eq!(breached.level, 1.0, "past the crossing the level is 1");
    assert_eq!(breached.eta_days, Some(0.0));
}

#[test]
fn trend_drift_breaching_21_days_after_onset_warns_14_days_ahead() {
    let sc = Scenario::drift(14.0, 21.0, 3, 3);
    let steps = run(&sc);
    let cross = sc.first_crossing_day().unwrap();
    let warn = first_at(&steps, 0.6).unwrap();
    let crit = first_at(&steps, 0.8).unwrap();
    let nominal = sc.breach_day.unwrap();
    println!(
        "drift 21 d: crossing {cross:.2} (nominal {nominal}), warning {warn:.2} (lead {:.2}), critical {crit:.2}",
        cross - warn
    );
    assert!(warn >= sc.onset_day);
    assert!(nominal - warn >= 14.0, "lead {:.2} days before the nominal breach", nominal - warn);
    assert!(crit > warn && cross - crit >= 1.0, "critical before the breach");
    let w = steps.iter().find(|s| s.level >= 0.6).unwrap();
    let eta = w.eta_days.unwrap();
    assert!(eta > 7.0 && eta < 30.0, "forecast at the first warning {eta} d (true {:.1})", cross - w.day);
}

#[test]
fn trend_drift_from_the_first_day_is_flagged_once_the_weekly_season_is_fitted() {
    // No healthy history before the onset: the level stays at most the provisional cap (0.5) until the
    // history spans two weeks, then the trend is flagged at once, 16 days before a breach on day 30.
    let sc = Scenario::drift(0.0, 30.0, 1, 1);
    let steps = run(&sc);
    let warn = first_at(&steps, 0.6).unwrap();
    println!("cold-start drift 30 d: warning day {warn:.2}, lead {:.2} d", 30.0 - warn);
    assert!(steps.iter().filter(|s| s.day < 14.0).all(|s| s.level <= 0.5));
    assert!((14.0..=16.0).contains(&warn), "warning on day {warn}");
}

//! The simulated-time runner: instances, segments, chunks of one metric interval.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::trace::v1::Span;
use serde::Serialize;

use super::calendar::parse_rfc3339_utc;
use super::load::LoadModel;
use super::otlp::{InstanceIdentity, VllmMetrics, request_span, resource_spans};
use super::slo::{AbTruth, DeployTruth, FaultTruth, GroundTruth, InstanceTruth, SloTracker, SloTruth};
use super::spec::Scenario;
use super::{ScenarioError, drift};
use crate::engine::tokens::{mix64, unit};
use crate::engine::{Engine, EngineConfig, EngineEvent, NANOS_PER_SEC, Nanos, RequestSpec};
use crate::faults::{ColdStart, Fault, FaultSet};

/// What a run did.
#[derive(Clone, Debug, Serialize)]
pub struct RunSummary {
    /// Requests submitted over all instances.
    pub requests: u64,
    /// Requests refused.
    pub rejected: u64,
    /// Spans written.
    pub spans_written: u64,
    /// Lines in traces.jsonl.
    pub trace_lines: u64,
    /// Lines in metrics.jsonl.
    pub metric_lines: u64,
    /// Simulated seconds (the scenario's duration).
    pub simulated_s: f64,
    /// Seconds actually simulated (sum of the segments).
    pub simulated_active_s: f64,
    /// The ground truth written.
    pub ground_truth: GroundTruth,
}

/// One instance's resolved plan.
#[derive(Clone, Debug)]
pub(super) struct InstPlan {
    pub name: String,
    pub version: String,
    pub faults: FaultSet,
    pub share: f64,
    pub stream: u64,
    /// Deploys of this instance: (time, version).
    pub deploys: Vec<(Nanos, String)>,
    /// The first `user_faults` faults come from the scenario (the rest are deploy cold starts).
    pub user_faults: usize,
}

/// A scenario resolved into times, instances and segments.
#[derive(Clone, Debug)]
pub(super) struct Prepared {
    pub sc: Scenario,
    pub start_unix: u64,
    pub duration: Nanos,
    pub slo_window: Nanos,
    pub interval: Nanos,
    pub load: LoadModel,
    pub insts: Vec<InstPlan>,
    pub segments: Vec<(Nanos, Nanos)>,
    pub model_name: String,
}

impl Prepared {
    fn new(sc: &Scenario) -> Result<Self, ScenarioError> {
        let invalid = |message: String| ScenarioError::Invalid { path: sc.name.clone(), message };
        let start_unix = parse_rfc3339_utc(&sc.start).map_err(invalid)?;
        let duration = sc.duration.nanos();
        let slo_window = sc.slo.window.nanos().max(NANOS_PER_SEC);
        let load = LoadModel::new(&sc.load, sc.seed, start_unix, duration, sc.engine.max_model_len);
        let specs = if sc.instances.is_empty() {
            vec![super::spec::InstanceSpec { name: "sim-0".into(), version: None, faults: Vec::new(), load_share: 1.0 }]
        } else {
            sc.instances.clone()
        };
        let mut insts = Vec::new();
        for (i, spec) in specs.iter().enumerate() {
            let mut faults: Vec<Fault> = sc.faults.iter().chain(spec.faults.iter()).cloned().collect();
            let user_faults = faults.len();
            let mut deploys = Vec::new();
            for d in &sc.deploys {
                if d.instances.as_ref().is_none_or(|l| l.contains(&spec.name)) {
                    deploys.push((d.at.nanos(), d.version.clone()));
                    if let Some(c) = &d.cold_start {
                        faults.push(Fault::ColdStart(ColdStart {
                            onset: d.at,
                            strength: c.strength,
                            warmup: c.warmup,
                        }));
                    }
                }
            }
            deploys.sort_by_key(|d| d.0);
            insts.push(InstPlan {
                name: spec.name.clone(),
                version: spec.version.clone().unwrap_or_else(|| sc.engine.version.clone()),
                faults: FaultSet { faults },
                share: spec.load_share,
                stream: if sc.load.mirror { 0 } else { i as u64 + 1 },
                deploys,
                user_faults,
            });
        }
        let mut p = Prepared {
            sc: sc.clone(),
            start_unix,
            duration,
            slo_window,
            interval: sc.output.metrics_interval.nanos().max(1),
            load,
            insts,
            segments: Vec::new(),
            model_name: sc.output.model_name.clone().unwrap_or_else(|| sc.engine.model().name.clone()),
        };
        p.segments = p.make_segments();
        Ok(p)
    }

    fn make_segments(&self) -> Vec<(Nanos, Nanos)> {
        let end = self.duration;
        let Some(d) = &self.sc.simulate else { return vec![(0, end)] };
        let (win, every, w) = (d.window.nanos(), d.every.nanos(), self.slo_window);
        let mut segs: Vec<(Nanos, Nanos)> = Vec::new();
        let mut t = 0;
        while t < end {
            segs.push((t, (t + win).min(end)));
            t += every;
        }
        // also the SLO windows at each deploy and fault onset, and the one after
        let mut marks: Vec<Nanos> = self.sc.deploys.iter().map(|d| d.at.nanos()).collect();
        for inst in &self.insts {
            marks.extend(inst.faults.faults.iter().map(|f| f.onset().nanos()));
        }
        for m in marks {
            let ws = m / w * w;
            if ws < end {
                segs.push((ws, (ws + 2 * w).min(end)));
            }
        }
        segs.sort_unstable();
        let mut merged: Vec<(Nanos, Nanos)> = Vec::new();
        for s in segs {
            match merged.last_mut() {
                Some(last) if s.0 <= last.1 => last.1 = last.1.max(s.1),
                _ => merged.push(s),
            }
        }
        merged
    }

    /// The engine configuration of one instance.
    pub fn engine_config(&self, inst: &InstPlan, version: &str) -> EngineConfig {
        let mut cfg = self.sc.engine.clone();
        cfg.token_events = false;
        cfg.step_events = true;
        cfg.version = version.to_string();
        cfg.seed = mix64(self.sc.seed ^ inst.stream);
        cfg
    }

    /// The version an instance runs at time `t`.
    pub fn version_at(&self, inst: &InstPlan, t: Nanos) -> String {
        inst.deploys.iter().rev().find(|d| d.0 <= t).map_or_else(|| inst.version.clone(), |d| d.1.clone())
    }
}

/// One instance while running.
pub(super) struct Live {
    pub engine: Engine,
    pub metrics: VllmMetrics,
    pub who: InstanceIdentity,
    pub slo: SloTracker,
    pub spans: Vec<Span>,
    events: Vec<EngineEvent>,
    window: Option<u64>,
    reqs: Vec<RequestSpec>,
    cursor: usize,
    next_deploy: usize,
    stream: u64,
    share: f64,
    span_sample: f64,
    pub requests: u64,
    pub rejected: u64,
    pub spans_written: u64,
}

impl Live {
    pub fn new(p: &Prepared, inst: &InstPlan, faults: FaultSet, at: Nanos) -> Result<Self, ScenarioError> {
        let version = p.version_at(inst, at);
        let mut engine = Engine::new(p.engine_config(inst, &version))?;
        engine.set_faults(faults)?;
        Ok(Live {
            engine,
            metrics: VllmMetrics::new(p.sc.engine.max_model_len, p.start_unix),
            who: InstanceIdentity {
                service_name: p.sc.output.service_name.clone(),
                instance: inst.name.clone(),
                model_name: p.model_name.clone(),
                scenario: p.sc.name.clone(),
                seed: p.sc.seed,
                stream: inst.stream,
            },
            slo: SloTracker::new(&p.sc.slo),
            spans: Vec::new(),
            events: Vec::new(),
            window: None,
            reqs: Vec::new(),
            cursor: 0,
            next_deploy: inst.deploys.iter().take_while(|d| d.0 <= at).count(),
            stream: inst.stream,
            share: inst.share,
            span_sample: p.sc.output.span_sample,
            requests: 0,
            rejected: 0,
            spans_written: 0,
        })
    }

    /// Applies deploys due by `t`.
    fn deploys(&mut self, p: &Prepared, inst: &InstPlan, t: Nanos) {
        while let Some((at, version)) = inst.deploys.get(self.next_deploy) {
            if *at > t {
                break;
            }
            self.engine.set_version(version.clone());
            self.engine.reset_prefix_cache();
            let stats = self.engine.stats().clone();
            self.metrics.reset(&stats, p.start_unix + *at);
            self.next_deploy += 1;
        }
    }

    /// Runs arrivals in `[t0, t1)` and advances the engine to `t1`.
    pub fn run_chunk(&mut self, p: &Prepared, inst: &InstPlan, t0: Nanos, t1: Nanos) {
        self.deploys(p, inst, t0);
        let w = p.slo_window;
        for win in t0 / w..=(t1.saturating_sub(1)) / w {
            if self.window != Some(win) {
                self.reqs = p.load.window_requests(self.stream, win, win * w, (win + 1) * w, self.share);
                self.window = Some(win);
                self.cursor = 0;
            }
            while let Some(r) = self.reqs.get(self.cursor) {
                if r.arrival >= t1 {
                    break;
                }
                self.cursor += 1;
                if r.arrival < t0 {
                    continue;
                }
                let r = r.clone();
                self.engine.advance_to(r.arrival, &mut self.events);
                self.requests += 1;
                if self.engine.submit(r).is_err() {
                    self.rejected += 1;
                }
            }
        }
        self.engine.advance_to(t1, &mut self.events);
        self.handle_events(p);
    }

    /// Runs until nothing is in flight; returns the time it reached.
    pub fn drain(&mut self, p: &Prepared) -> Nanos {
        let t = self.engine.run_until_idle(&mut self.events);
        self.handle_events(p);
        t
    }

    fn handle_events(&mut self, p: &Prepared) {
        for ev in self.events.drain(..) {
            match ev {
                EngineEvent::Finished { record } => {
                    self.metrics.observe_record(&record);
                    self.slo.add(&record);
                    if self.span_sample > 0.0 && unit(mix64(p.sc.seed ^ 0x5A3F ^ mix64(record.id))) < self.span_sample {
                        self.spans.push(request_span(&self.who, p.start_unix, &record));
                        self.spans_written += 1;
                    }
                }
                EngineEvent::Step(s) => self.metrics.observe_step(&s),
                _ => {}
            }
        }
    }
}

struct Writers {
    traces: BufWriter<File>,
    metrics: BufWriter<File>,
    trace_lines: u64,
    metric_lines: u64,
}

fn create(path: &Path) -> Result<BufWriter<File>, ScenarioError> {
    File::create(path)
        .map(|f| BufWriter::with_capacity(1 << 20, f))
        .map_err(|source| ScenarioError::Io { path: path.to_path_buf(), source })
}

impl Writers {
    fn line<T: Serialize>(w: &mut BufWriter<File>, v: &T, path: &Path) -> Result<(), ScenarioError> {
        let mut value = serde_json::to_value(v)?;
        super::otlp::compact(&mut value);
        serde_json::to_writer(&mut *w, &value)?;
        w.write_all(b"\n").map_err(|source| ScenarioError::Io { path: path.to_path_buf(), source })
    }
}

/// Runs a parsed scenario and writes `traces.jsonl`, `metrics.jsonl` and `ground_truth.json`
/// into `out_dir` (created if missing).
pub fn run(sc: &Scenario, out_dir: &Path) -> Result<RunSummary, ScenarioError> {
    super::validate(sc).map_err(|message| ScenarioError::Invalid { path: sc.name.clone(), message })?;
    let expanded =
        super::fleet::expand(sc).map_err(|message| ScenarioError::Invalid { path: sc.name.clone(), message })?;
    let mut p = Prepared::new(&expanded)?;
    let mut solved: Vec<Vec<FaultTruth>> = Vec::new();
    for i in 0..p.insts.len() {
        let truths = drift::solve_drifts(&mut p, i)?;
        solved.push(truths);
    }
    std::fs::create_dir_all(out_dir).map_err(|source| ScenarioError::Io { path: out_dir.to_path_buf(), source })?;
    let traces_path = out_dir.join("traces.jsonl");
    let metrics_path = out_dir.join("metrics.jsonl");
    let mut out =
        Writers { traces: create(&traces_path)?, metrics: create(&metrics_path)?, trace_lines: 0, metric_lines: 0 };
    let mut lives: Vec<Live> = Vec::new();
    for inst in &p.insts {
        lives.push(Live::new(&p, inst, inst.faults.clone(), 0)?);
    }
    let interval = p.interval;
    let mut active = 0;
    for &(a, b) in &p.segments.clone() {
        active += b - a;
        for live in &mut lives {
            // idle jump to the segment start (nothing in flight after the previous drain)
            let mut none = Vec::new();
            live.engine.advance_to(a, &mut none);
            let stats = live.engine.stats().clone();
            live.metrics.rebase_util(&stats, p.start_unix + a);
        }
        let mut t0 = a;
        while t0 < b {
            let t1 = (t0 + interval).min(b);
            for (live, inst) in lives.iter_mut().zip(&p.insts) {
                live.run_chunk(&p, inst, t0, t1);
            }
            emit(&p, &mut lives, &mut out, t1, &traces_path, &metrics_path)?;
            t0 = t1;
        }
        let mut end = b;
        for live in &mut lives {
            end = end.max(live.drain(&p));
        }
        if end > b {
            let t = b + (end - b).div_ceil(interval) * interval;
            for live in &mut lives {
                let mut none = Vec::new();
                live.engine.advance_to(t, &mut none);
            }
            emit(&p, &mut lives, &mut out, t, &traces_path, &metrics_path)?;
        }
    }
    out.traces.flush().map_err(|source| ScenarioError::Io { path: traces_path.clone(), source })?;
    out.metrics.flush().map_err(|source| ScenarioError::Io { path: metrics_path.clone(), source })?;
    let truth = ground_truth(&p, &mut lives, solved);
    let gt_path = out_dir.join("ground_truth.json");
    let mut text = serde_json::to_string_pretty(&truth)?;
    text.push('\n');
    std::fs::write(&gt_path, text).map_err(|source| ScenarioError::Io { path: gt_path, source })?;
    Ok(RunSummary {
        requests: lives.iter().map(|l| l.requests).sum(),
        rejected: lives.iter().map(|l| l.rejected).sum(),
        spans_written: lives.iter().map(|l| l.spans_written).sum(),
        trace_lines: out.trace_lines,
        metric_lines: out.metric_lines,
        simulated_s: p.duration as f64 / 1e9,
        simulated_active_s: active as f64 / 1e9,
        ground_truth: truth,
    })
}

fn emit(
    p: &Prepared,
    lives: &mut [Live],
    out: &mut Writers,
    t: Nanos,
    traces_path: &Path,
    metrics_path: &Path,
) -> Result<(), ScenarioError> {
    let unix = p.start_unix + t;
    let mut rs = Vec::new();
    for live in lives.iter_mut() {
        if !live.spans.is_empty() {
            let spans = std::mem::take(&mut live.spans);
            rs.push(resource_spans(&live.who, live.engine.version(), spans));
        }
    }
    if !rs.is_empty() {
        Writers::line(&mut out.traces, &ExportTraceServiceRequest { resource_spans: rs }, traces_path)?;
        out.trace_lines += 1;
    }
    let rm = lives.iter_mut().map(|l| l.metrics.scrape(&l.who, &l.engine, unix)).collect();
    Writers::line(&mut out.metrics, &ExportMetricsServiceRequest { resource_metrics: rm }, metrics_path)?;
    out.metric_lines += 1;
    Ok(())
}

fn ground_truth(p: &Prepared, lives: &mut [Live], solved: Vec<Vec<FaultTruth>>) -> GroundTruth {
    let sc = &p.sc;
    let w = p.slo_window;
    let mut instances = Vec::new();
    for ((live, inst), faults) in lives.iter_mut().zip(&p.insts).zip(solved) {
        let windows = live.slo.evaluate();
        let first = windows.iter().find(|r| r.breach);
        let onset = faults.iter().map(|f| f.onset_unix_nano).min();
        instances.push(InstanceTruth {
            name: inst.name.clone(),
            version: inst.version.clone(),
            fault_onset_unix_nano: onset,
            faults,
            first_breach_unix_nano: first.map(|r| p.start_unix + r.index * w),
            first_breach_value_s: first.map(|r| r.value),
            windows_evaluated: windows.iter().filter(|r| r.count >= sc.slo.min_requests.max(1) as usize).count() as u64,
            windows_breached: windows.iter().filter(|r| r.breach).count() as u64,
            requests: live.requests,
            rejected: live.rejected,
            slo_windows: windows.iter().map(|r| ((r.index * w) as f64 / 1e9, r.count as u64, r.value)).collect(),
        });
    }
    let fleet = sc.fleet.as_ref().map(|_| {
        let runs: Vec<super::fleet::ReplicaRun<'_>> = lives
            .iter()
            .zip(&p.insts)
            .map(|(live, inst)| super::fleet::ReplicaRun {
                version: &inst.version,
                deploys: &inst.deploys,
                share: inst.share,
                slo: &live.slo,
                faults: inst.faults.faults.get(..inst.user_faults).unwrap_or_default(),
            })
            .collect();
        super::fleet::truth(sc, p.start_unix, &p.model_name, &instances, &runs)
    });
    let ab = if lives.len() == 2 && sc.fleet.is_none() {
        let regression = p
            .insts
            .iter()
            .flat_map(|i| i.faults.faults.iter())
            .filter_map(|f| match f {
                Fault::VersionRegression(v) => Some((v.onset.nanos(), v.strength)),
                _ => None,
            })
            .max_by_key(|x| x.0);
        let from = regression.map_or(0, |r| r.0);
        let a = lives[0].slo.overall(0.95, from);
        let b = lives[1].slo.overall(0.95, from);
        match (a, b) {
            (Some(a), Some(b)) => Some(AbTruth {
                baseline: p.insts[0].name.clone(),
                candidate: p.insts[1].name.clone(),
                metric: sc.slo.metric.as_str(),
                quantile: 0.95,
                from_unix_nano: p.start_unix + from,
                baseline_s: a,
                candidate_s: b,
                delta_ms: (b - a) * 1e3,
                injected_ms: regression.map_or(0.0, |r| r.1),
            }),
            _ => None,
        }
    } else {
        None
    };
    let fault_onset = instances.iter().filter_map(|i| i.fault_onset_unix_nano).min();
    let first_breach = instances.iter().filter_map(|i| i.first_breach_unix_nano).min();
    GroundTruth {
        format: 1,
        scenario: sc.name.clone(),
        description: sc.description.clone(),
        seed: sc.seed,
        start: sc.start.clone(),
        start_time_unix_nano: p.start_unix,
        end_time_unix_nano: p.start_unix + p.duration,
        slo: SloTruth {
            metric: sc.slo.metric.as_str(),
            quantile: sc.slo.quantile,
            threshold_s: sc.slo.threshold.secs(),
            window_s: sc.slo.window.secs(),
            min_requests: sc.slo.min_requests,
        },
        healthy: instances.iter().all(|i| i.faults.is_empty()),
        fault_onset_unix_nano: fault_onset,
        first_breach_unix_nano: first_breach,
        sampling: sc.simulate.as_ref().map(|d| (d.window.secs(), d.every.secs())),
        segments: p.segments.iter().map(|&(a, b)| (a as f64 / 1e9, b as f64 / 1e9)).collect(),
        span_sample: sc.output.span_sample,
        metrics_interval_s: sc.output.metrics_interval.secs(),
        deploys: sc
            .deploys
            .iter()
            .map(|d| DeployTruth {
                at_unix_nano: p.start_unix + d.at.nanos(),
                version: d.version.clone(),
                instances: d.instances.clone().unwrap_or_else(|| p.insts.iter().map(|i| i.name.clone()).collect()),
            })
            .collect(),
        instances,
        ab,
        fleet,
    }
}

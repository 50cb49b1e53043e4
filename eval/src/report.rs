//! The scenario table `inferwatch eval` prints, and its JSON form.

use crate::scenario::ScenarioRun;
use crate::scenario::truth::Kind;
use serde::Serialize;

/// Totals over the library.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Totals {
    /// Scenarios evaluated.
    pub scenarios: usize,
    /// Scenarios that met their target.
    pub passed: usize,
    /// Faulty scenarios (fast, drift, A/B with a regression).
    pub faulty: usize,
    /// ... of which detected.
    pub detected: usize,
    /// False alarms over all scenarios (healthy runs and before onsets).
    pub false_alarms: usize,
    /// ... of which critical.
    pub false_criticals: usize,
    /// Simulated days in all.
    pub days: f64,
    /// Wall seconds simulating.
    pub wall_sim_s: f64,
    /// Wall seconds running the pipelines.
    pub wall_eval_s: f64,
}

/// Sums the runs.
pub fn totals(runs: &[ScenarioRun]) -> Totals {
    let o = runs.iter().map(|r| &r.outcome);
    Totals {
        scenarios: runs.len(),
        passed: o.clone().filter(|o| o.pass).count(),
        faulty: o.clone().filter(|o| o.detected.is_some()).count(),
        detected: o.clone().filter(|o| o.detected == Some(true)).count(),
        false_alarms: o.clone().map(|o| o.false_alarms).sum(),
        false_criticals: o.clone().map(|o| o.false_criticals).sum(),
        days: o.map(|o| o.days).sum::<f64>() + 0.0,
        wall_sim_s: runs.iter().map(|r| r.wall_sim_s).sum::<f64>() + 0.0,
        wall_eval_s: runs.iter().map(|r| r.wall_eval_s).sum::<f64>() + 0.0,
    }
}

/// A duration in the unit that reads best (s, min, h, d).
pub fn human(secs: f64) -> String {
    let a = secs.abs();
    let sign = if secs < 0.0 { "-" } else { "" };
    if a < 120.0 {
        format!("{sign}{a:.0} s")
    } else if a < 7200.0 {
        format!("{sign}{:.1} min", a / 60.0)
    } else if a < 2.0 * 86_400.0 {
        format!("{sign}{:.1} h", a / 3600.0)
    } else {
        format!("{sign}{:.1} d", a / 86_400.0)
    }
}

/// The table as Markdown (also readable on a terminal).
pub fn table(runs: &[ScenarioRun]) -> String {
    let mut s = String::new();
    s.push_str("| scenario | kind | days | detected | first alert (detector) | delay after onset | lead before breach | false alarms (warn/crit) | target | pass |\n");
    s.push_str("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
    for r in runs {
        let o = &r.outcome;
        let kind = match o.kind {
            Kind::Healthy => "healthy",
            Kind::Ab => "A/B",
            Kind::Drift => "drift",
            Kind::Fast => "fast",
            Kind::Fleet => "fleet",
        };
        let detected = match o.detected {
            Some(true) => "yes",
            Some(false) => "NO",
            None => "–",
        };
        let first = o
            .first_alert
            .as_ref()
            .map(|a| format!("{} {} ({})", a.severity, a.metric, a.detector))
            .unwrap_or_else(|| "–".into());
        let delay = o.delay_s.map(human).unwrap_or_else(|| "–".into());
        let lead = o.lead_s.map(human).unwrap_or_else(|| "–".into());
        s.push_str(&format!(
            "| {} | {kind} | {:.1} | {detected} | {first} | {delay} | {lead} | {} ({}/{}) | {} | {} |\n",
            o.scenario,
            o.days,
            o.false_alarms,
            o.false_warnings,
            o.false_criticals,
            o.target,
            if o.pass { "yes" } else { "**no**" }
        ));
    }
    let fleet = crate::scenario::fleet::table(&runs.iter().map(|r| &r.outcome).collect::<Vec<_>>());
    if !fleet.is_empty() {
        s.push('\n');
        s.push_str(&fleet);
    }
    let t = totals(runs);
    s.push_str(&format!(
        "\n{} of {} scenarios met their target; {} of {} faults detected; {} false alarms ({} critical) over {:.0} simulated days; wall {:.1} s simulating + {:.1} s evaluating.\n",
        t.passed, t.scenarios, t.detected, t.faulty, t.false_alarms, t.false_criticals, t.days, t.wall_sim_s, t.wall_eval_s
    ));
    s
}

/// Per scenario and detector: the first alert after the onset (delay, or lead before the breach
/// for drifts) and the false alarms, so detectors can be compared scenario by scenario.
pub fn detector_table(runs: &[ScenarioRun]) -> String {
    let mut names: Vec<String> = Vec::new();
    for o in runs.iter().map(|r| &r.outcome) {
        for d in o.detectors.iter().map(|(d, _)| d).chain(o.false_by_detector.iter().map(|(d, _)| d)) {
            if !names.contains(d) {
                names.push(d.clone());
            }
        }
    }
    names.sort();
    if names.is_empty() {
        return String::new();
    }
    let mut s = format!("| scenario | {} |\n", names.join(" | "));
    s.push_str(&format!("| --- |{}\n", " --- |".repeat(names.len())));
    for o in runs.iter().map(|r| &r.outcome) {
        let cells: Vec<String> = names
            .iter()
            .map(|d| {
                let hit =
                    o.detectors.iter().find(|(x, _)| x == d).map(|&(_, t)| match (o.kind, o.breach_ns, o.onset_ns) {
                        (Kind::Drift, Some(b), _) => format!("lead {}", human((b as f64 - t as f64) / 1e9)),
                        (_, _, Some(on)) => format!("+{}", human((t as f64 - on as f64) / 1e9)),
                        _ => "fired".to_string(),
                    });
                let fa = o.false_by_detector.iter().find(|(x, _)| x == d).map(|&(_, n)| format!("{n} FA"));
                match (hit, fa) {
                    (Some(h), Some(f)) => format!("{h}, {f}"),
                    (Some(h), None) => h,
                    (None, Some(f)) => f,
                    (None, None) => {
                        if o.detected.is_some() {
                            "–".into()
                        } else {
                            "quiet".into()
                        }
                    }
                }
            })
            .collect();
        s.push_str(&format!("| {} | {} |\n", o.scenario, cells.join(" | ")));
    }
    s
}

/// The JSON report: totals and one entry per scenario.
pub fn json(runs: &[ScenarioRun]) -> serde_json::Value {
    serde_json::json!({
        "totals": totals(runs),
        "scenarios": runs.iter().map(|r| serde_json::json!({
            "outcome": r.outcome,
            "alerts": r.firings,
            "lines": r.lines,
            "wall_sim_s": r.wall_sim_s,
            "wall_eval_s": r.wall_eval_s,
        })).collect::<Vec<_>>(),
    })
}

//! One SVG chart per scenario: the SLO's signal per instance and source (scraped histograms,
//! request spans) against its threshold, the fault
//! onset and the first breach, and every alert that fired.

use crate::error::EvalError;
use crate::scenario::ScenarioRun;
use plotters::prelude::*;
use std::collections::BTreeMap;
use std::path::Path;

const PALETTE: [RGBColor; 4] =
    [RGBColor(31, 119, 180), RGBColor(44, 160, 44), RGBColor(148, 103, 189), RGBColor(140, 86, 75)];

/// Draws `run` into `path` (SVG, 1000×420).
pub fn draw(run: &ScenarioRun, path: &Path) -> Result<(), EvalError> {
    draw_inner(run, path).map_err(|e| EvalError::Data(format!("chart {}: {e}", path.display())))
}

fn draw_inner(run: &ScenarioRun, path: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let t = &run.truth;
    let t0 = t.start_time_unix_nano;
    let days = |ns: u64| (ns as f64 - t0 as f64) / 86_400e9;
    let mut series: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for p in &run.signal {
        let inst = p.attrs.get("service.instance.id").cloned().unwrap_or_default();
        let source = p.attrs.get("source").cloned().unwrap_or_default();
        let key = if inst.is_empty() { source } else { format!("{inst}, {source}") };
        series.entry(key).or_default().push((days(p.time_ns), p.value * 1e3));
    }
    for v in series.values_mut() {
        v.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    let threshold_ms = t.slo.threshold_s * 1e3;
    let ymax = series.values().flatten().map(|p| p.1).fold(threshold_ms * 1.2, f64::max) * 1.05;
    let xmax = t.days().max(1e-6);
    let root = SVGBackend::new(path, (1000, 420)).into_drawing_area();
    root.fill(&WHITE)?;
    let caption = format!("{} — {} (ms) vs SLO {:.0} ms", t.scenario, t.slo_signal(), threshold_ms);
    let mut chart = ChartBuilder::on(&root)
        .caption(caption, ("sans-serif", 18))
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(55)
        .build_cartesian_2d(0.0..xmax, 0.0..ymax)?;
    chart.configure_mesh().x_desc("days since start").y_desc("ms").light_line_style(WHITE.mix(0.0)).draw()?;
    for (i, (inst, pts)) in series.iter().enumerate() {
        let color = PALETTE[i % PALETTE.len()];
        chart
            .draw_series(pts.iter().map(|&(x, y)| Circle::new((x, y), 1, color.filled())))?
            .label(format!("{} ({inst})", t.slo_signal()))
            .legend(move |(x, y)| Circle::new((x + 10, y), 3, color.filled()));
    }
    chart
        .draw_series(LineSeries::new([(0.0, threshold_ms), (xmax, threshold_ms)], RED.stroke_width(2)))?
        .label("SLO threshold")
        .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], RED.stroke_width(2)));
    if let Some(o) = t.fault_onset_unix_nano {
        let x = days(o);
        chart
            .draw_series(LineSeries::new([(x, 0.0), (x, ymax)], BLACK.stroke_width(1)))?
            .label("fault onset")
            .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], BLACK.stroke_width(1)));
    }
    if let Some(b) = t.first_breach_unix_nano {
        let x = days(b);
        chart
            .draw_series(LineSeries::new([(x, 0.0), (x, ymax)], RED.mix(0.6).stroke_width(1)))?
            .label("first SLO breach")
            .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], RED.mix(0.6).stroke_width(1)));
    }
    let orange = RGBColor(255, 140, 0);
    let warn: Vec<f64> = run.firings.iter().filter(|a| a.severity == "warning").map(|a| days(a.time_ns)).collect();
    let crit: Vec<f64> = run.firings.iter().filter(|a| a.severity != "warning").map(|a| days(a.time_ns)).collect();
    let y_mark = ymax * 0.97;
    if !warn.is_empty() {
        chart
            .draw_series(warn.iter().map(|&x| TriangleMarker::new((x, y_mark), 6, orange.filled())))?
            .label("warning fired")
            .legend(move |(x, y)| TriangleMarker::new((x + 10, y), 5, orange.filled()));
    }
    if !crit.is_empty() {
        chart
            .draw_series(crit.iter().map(|&x| TriangleMarker::new((x, y_mark * 0.94), 6, RED.filled())))?
            .label("critical fired")
            .legend(|(x, y)| TriangleMarker::new((x + 10, y), 5, RED.filled()));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()?;
    root.present()?;
    Ok(())
}

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

/// A mark under the day axis of [`text`].
#[derive(Debug, Clone, PartialEq)]
pub struct Mark {
    /// The character drawn at its day.
    pub symbol: char,
    /// Event time.
    pub time_ns: u64,
    /// Its legend entry (after the symbol).
    pub label: String,
}

/// Columns of [`text`] per simulated day.
const TEXT_COLS_PER_DAY: usize = 2;

/// The source [`daily_peaks_ms`] prefers: the request spans' exact values (the scraped
/// histograms' percentiles move in steps between bucket bounds).
const PEAK_SOURCE: &str = "spans";

/// Per simulated day from the start, the highest value of the SLO's signal in ms (from the
/// request spans when there are any, else every point); `None` for a day without points.
pub fn daily_peaks_ms(run: &ScenarioRun) -> Vec<Option<f64>> {
    let t = &run.truth;
    let n = t.days().ceil().max(1.0) as usize;
    let from_spans = run.signal.iter().any(|p| p.attrs.get("source").is_some_and(|s| s == PEAK_SOURCE));
    let mut peaks: Vec<Option<f64>> = vec![None; n];
    for p in &run.signal {
        if from_spans && p.attrs.get("source").is_none_or(|s| s != PEAK_SOURCE) {
            continue;
        }
        if p.time_ns < t.start_time_unix_nano || !p.value.is_finite() {
            continue;
        }
        let day = ((p.time_ns - t.start_time_unix_nano) / 86_400_000_000_000) as usize;
        if let Some(slot) = peaks.get_mut(day) {
            let v = p.value * 1e3;
            *slot = Some(slot.map_or(v, |s: f64| s.max(v)));
        }
    }
    peaks
}

/// A terminal picture of `run`: per simulated day a bar of the highest value of the SLO's signal
/// ([`daily_peaks_ms`]), `height` rows high, against the threshold line (`╌`); under the day axis
/// the fault onset `O`, the first SLO breach `B` and `marks`, then a legend.
pub fn text(run: &ScenarioRun, marks: &[Mark], height: usize) -> String {
    use std::fmt::Write;
    let t = &run.truth;
    let height = height.max(4);
    let peaks = daily_peaks_ms(run);
    let threshold = t.slo.threshold_s * 1e3;
    let known: Vec<f64> = peaks.iter().flatten().copied().collect();
    let top = known.iter().copied().fold(threshold * 1.1, f64::max);
    let low = known.iter().copied().fold(threshold, f64::min);
    // The bars start near the lowest day (not at 0) so that the drift shows; one row in `step` ms.
    let bottom = (low * 0.9 / 5.0).floor() * 5.0;
    let step = ((top - bottom) / height as f64).max(1e-9);
    let width = peaks.len() * TEXT_COLS_PER_DAY;
    let th_row = ((top - threshold) / step).floor().clamp(0.0, height as f64 - 1.0) as usize;
    let mut out = String::new();
    let _ = writeln!(out, "   ms  {} per day (its highest window)", t.slo_signal());
    for row in 0..height {
        let hi = top - row as f64 * step;
        let mid = hi - step / 2.0;
        let label = if row == th_row {
            format!("{threshold:>5.0}")
        } else if row % 3 == 0 && row + 1 != th_row && row != th_row + 1 {
            format!("{hi:>5.0}")
        } else {
            " ".repeat(5)
        };
        let mut line = format!("{label} ┤");
        for p in &peaks {
            let cell = match p {
                Some(v) if *v >= hi => '█',
                Some(v) if *v >= mid => '▄',
                _ if row == th_row => '╌',
                _ => ' ',
            };
            line.extend(std::iter::repeat_n(cell, TEXT_COLS_PER_DAY));
        }
        if row == th_row {
            let _ = write!(line, " SLO {threshold:.0} ms");
        }
        let _ = writeln!(out, "{}", line.trim_end());
    }
    let _ = writeln!(out, "{} └{}", " ".repeat(5), "─".repeat(width));
    let mut axis = vec![' '; width + 4];
    for d in (0..peaks.len()).step_by(5) {
        for (i, c) in d.to_string().chars().enumerate() {
            if let Some(slot) = axis.get_mut(d * TEXT_COLS_PER_DAY + i) {
                *slot = c;
            }
        }
    }
    let _ = writeln!(out, "{} {}  days", " ".repeat(6), axis.iter().collect::<String>().trim_end());
    let day = |ns: u64| (ns as f64 - t.start_time_unix_nano as f64) / 86_400e9;
    let mut all: Vec<Mark> = Vec::new();
    if let Some(o) = t.fault_onset_unix_nano {
        all.push(Mark { symbol: 'O', time_ns: o, label: format!("fault onset day {:.1}", day(o)) });
    }
    all.extend(marks.iter().cloned());
    if let Some(b) = t.first_breach_unix_nano {
        all.push(Mark { symbol: 'B', time_ns: b, label: format!("SLO breach day {:.1}", day(b)) });
    }
    let mut row = vec![' '; width + all.len() + 1];
    for m in &all {
        let mut col = (day(m.time_ns).max(0.0) * TEXT_COLS_PER_DAY as f64) as usize;
        while row.get(col).is_some_and(|c| *c != ' ') {
            col += 1;
        }
        if let Some(slot) = row.get_mut(col) {
            *slot = m.symbol;
        }
    }
    let _ = writeln!(out, "{} {}", " ".repeat(6), row.iter().collect::<String>().trim_end());
    let legend: Vec<String> = all.iter().map(|m| format!("{} {}", m.symbol, m.label)).collect();
    let _ = write!(out, "{} {}", " ".repeat(6), legend.join("   "));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::Point;
    use crate::scenario::score;
    use crate::scenario::truth::GroundTruth;

    const DAY: u64 = 86_400_000_000_000;
    const T0: u64 = 1_767_225_600_000_000_000;

    fn point(day: f64, source: &str, ms: f64) -> Point {
        let attrs = [("source".to_string(), source.to_string())].into_iter().collect();
        Point { time_ns: T0 + (day * DAY as f64) as u64, attrs, value: ms / 1e3 }
    }

    /// Ten days; the spans' signal climbs from 40 to 76 ms (4 ms a day), a scraped outlier of 500 ms
    /// on day 1; onset day 2, breach day 8.5.
    fn run() -> ScenarioRun {
        let truth: GroundTruth = serde_json::from_value(serde_json::json!({
            "scenario": "drift", "start_time_unix_nano": T0, "end_time_unix_nano": T0 + 10 * DAY,
            "slo": { "metric": "tpot", "quantile": 0.95, "threshold_s": 0.07, "window_s": 300.0 },
            "healthy": false, "fault_onset_unix_nano": T0 + 2 * DAY,
            "first_breach_unix_nano": T0 + 17 * DAY / 2,
            "instances": [{ "name": "a", "faults": [{ "kind": "slow_drift", "onset_unix_nano": T0 + 2 * DAY }] }],
        }))
        .unwrap_or_else(|e| panic!("truth: {e}"));
        let mut signal: Vec<Point> = (0..10).map(|d| point(d as f64 + 0.5, "spans", 40.0 + 4.0 * d as f64)).collect();
        signal.push(point(1.2, "scrape", 500.0));
        ScenarioRun {
            outcome: score::score(&truth, &[]),
            truth,
            firings: Vec::new(),
            signal,
            eta: Vec::new(),
            lines: 0,
            wall_sim_s: 0.0,
            wall_eval_s: 0.0,
        }
    }

    #[test]
    fn daily_peaks_come_from_the_spans() {
        let peaks = daily_peaks_ms(&run());
        assert_eq!(peaks.len(), 10);
        for (d, p) in peaks.iter().enumerate() {
            let want = 40.0 + 4.0 * d as f64;
            assert!(p.is_some_and(|v| (v - want).abs() < 1e-9), "day {d}: {p:?}");
        }
    }

    #[test]
    fn text_chart_draws_the_threshold_the_bars_and_the_marks() {
        let w = Mark { symbol: 'W', time_ns: T0 + 5 * DAY, label: "first warning day 5.0".into() };
        let text = text(&run(), &[w], 8);
        let lines: Vec<&str> = text.lines().collect();
        // The threshold row, labelled with the threshold, not the 500 ms scraped outlier's scale.
        let th = lines.iter().find(|l| l.ends_with("SLO 70 ms")).unwrap_or_else(|| panic!("{text}"));
        assert!(th.starts_with("   70 ┤"), "{text}");
        // Days 8 and 9 (72 and 76 ms) rise above the threshold row; days 0-6 (≤ 64 ms) do not reach it.
        let bars: Vec<&str> = lines.iter().filter(|l| l.contains('┤')).copied().collect();
        let column = |d: usize| -> usize {
            bars.iter().filter(|l| matches!(l.chars().nth(7 + 2 * d), Some('█' | '▄'))).count()
        };
        let heights: Vec<usize> = (0..10).map(column).collect();
        assert!(heights.windows(2).all(|h| h[0] <= h[1]), "{heights:?}\n{text}");
        let th_row = bars.iter().position(|l| l.ends_with("SLO 70 ms")).unwrap_or(0);
        let above = |d: usize| bars[..th_row].iter().any(|l| matches!(l.chars().nth(7 + 2 * d), Some('█' | '▄')));
        assert!(above(9) && !above(6), "{text}");
        // Marks at two columns a day: onset day 2, warning day 5, breach day 8.5.
        let marks = lines.iter().find(|l| l.trim_start().starts_with('O')).unwrap_or_else(|| panic!("{text}"));
        let col = |c: char| marks.chars().position(|x| x == c).map(|p| p - 7);
        assert_eq!((col('O'), col('W'), col('B')), (Some(4), Some(10), Some(17)), "{text}");
        assert!(text.ends_with("O fault onset day 2.0   W first warning day 5.0   B SLO breach day 8.5"), "{text}");
    }
}

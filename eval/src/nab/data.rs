//! Loading the NAB corpus: `data/<category>/<name>.csv` (header `timestamp,value`) and the
//! windows of `labels/combined_windows.json`, keyed by the file's path relative to `data/`.

use crate::error::EvalError;
use std::collections::BTreeMap;
use std::path::Path;

/// Relative path of the windows file inside a NAB directory.
pub const WINDOWS_FILE: &str = "labels/combined_windows.json";
/// Relative path of the data folder inside a NAB directory.
pub const DATA_DIR: &str = "data";

const NS_PER_S: u64 = 1_000_000_000;

/// One NAB data file with its label windows.
#[derive(Debug, Clone, PartialEq)]
pub struct NabFile {
    /// Path relative to `data/`, e.g. `realKnownCause/nyc_taxi.csv`.
    pub name: String,
    /// Row timestamps (UTC, ns since the epoch), in file order (NAB files have a few repeats).
    pub timestamps: Vec<u64>,
    /// Row values, in file order.
    pub values: Vec<f64>,
    /// Label windows as (start, end) timestamps in ns, both inclusive, in file order.
    pub windows: Vec<(u64, u64)>,
}

impl NabFile {
    /// Number of rows.
    pub fn len(&self) -> usize {
        self.timestamps.len()
    }

    /// True when the file has no row.
    pub fn is_empty(&self) -> bool {
        self.timestamps.is_empty()
    }

    /// The median interval between consecutive rows in ns (0 with fewer than two rows).
    pub fn step_ns(&self) -> u64 {
        let mut d: Vec<u64> = self.timestamps.windows(2).filter_map(|w| w[1].checked_sub(w[0])).collect();
        if d.is_empty() {
            return 0;
        }
        let mid = d.len() / 2;
        *d.select_nth_unstable(mid).1
    }

    /// Rows inside a window: the first row whose timestamp is the start through the first row whose
    /// timestamp is the end (how NAB's sweeper places them).
    pub fn window_rows(&self) -> Vec<(usize, usize)> {
        self.windows
            .iter()
            .filter_map(|&(s, e)| {
                let first = |t: u64| self.timestamps.iter().position(|&x| x == t);
                Some((first(s)?, first(e)?))
            })
            .collect()
    }
}

/// The whole corpus: every file named in the windows file, in the order of its keys (sorted).
#[derive(Debug, Clone, PartialEq)]
pub struct NabCorpus {
    /// The files.
    pub files: Vec<NabFile>,
}

impl NabCorpus {
    /// Total rows over all files.
    pub fn rows(&self) -> usize {
        self.files.iter().map(NabFile::len).sum()
    }

    /// Total windows over all files.
    pub fn windows(&self) -> usize {
        self.files.iter().map(|f| f.windows.len()).sum()
    }
}

/// Loads the corpus under `dir` (which holds `data/` and `labels/`).
pub fn load_corpus(dir: &Path) -> Result<NabCorpus, EvalError> {
    let wpath = dir.join(WINDOWS_FILE);
    let text = std::fs::read_to_string(&wpath).map_err(|e| EvalError::io(&wpath, e))?;
    let raw: BTreeMap<String, Vec<Vec<String>>> = serde_json::from_str(&text)
        .map_err(|e| EvalError::Data(format!("{}: not a NAB windows file: {e}", wpath.display())))?;
    let mut files = Vec::with_capacity(raw.len());
    for (name, wins) in raw {
        let mut windows = Vec::with_capacity(wins.len());
        for w in &wins {
            let [s, e] = w.as_slice() else {
                return Err(EvalError::Data(format!("{}: {name}: a window is not [start, end]", wpath.display())));
            };
            let at =
                |t: &str| parse_timestamp(t).map_err(|m| EvalError::Data(format!("{}: {name}: {m}", wpath.display())));
            windows.push((at(s)?, at(e)?));
        }
        let cpath = dir.join(DATA_DIR).join(&name);
        let csv = std::fs::read_to_string(&cpath).map_err(|e| EvalError::io(&cpath, e))?;
        let (timestamps, values) = parse_csv(&csv).map_err(|m| EvalError::Data(format!("{}: {m}", cpath.display())))?;
        files.push(NabFile { name, timestamps, values, windows });
    }
    tracing::debug!(files = files.len(), "NAB corpus loaded");
    Ok(NabCorpus { files })
}

/// Parses a NAB CSV (`timestamp,value` header, then one row per line) into timestamps (ns) and values.
pub fn parse_csv(text: &str) -> Result<(Vec<u64>, Vec<f64>), String> {
    let mut lines = text.lines().enumerate();
    match lines.next() {
        Some((_, h)) if h.trim() == "timestamp,value" => {}
        _ => return Err("expected the header `timestamp,value`".into()),
    }
    let (mut ts, mut vs) = (Vec::new(), Vec::new());
    for (i, line) in lines {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let row = || format!("line {}: {line:?}", i + 1);
        let (t, v) = line.split_once(',').ok_or_else(|| format!("{}: expected timestamp,value", row()))?;
        ts.push(parse_timestamp(t).map_err(|m| format!("{}: {m}", row()))?);
        let v: f64 = v.trim().parse().map_err(|_| format!("{}: the value is not a number", row()))?;
        vs.push(v);
    }
    Ok((ts, vs))
}

/// Parses `YYYY-MM-DD HH:MM:SS[.ffffff]` (UTC, `T` accepted as separator) into ns since the epoch.
pub fn parse_timestamp(s: &str) -> Result<u64, String> {
    let err = || format!("invalid timestamp {s:?}: expected YYYY-MM-DD HH:MM:SS[.ffffff]");
    let s = s.trim();
    let (date, time) = s.split_once([' ', 'T']).ok_or_else(err)?;
    let mut d = date.split('-');
    let (Some(y), Some(mo), Some(da), None) = (d.next(), d.next(), d.next(), d.next()) else {
        return Err(err());
    };
    let (hms, frac) = time.split_once('.').unwrap_or((time, ""));
    let mut t = hms.split(':');
    let (Some(h), Some(mi), Some(se), None) = (t.next(), t.next(), t.next(), t.next()) else {
        return Err(err());
    };
    let num = |x: &str| x.parse::<u64>().map_err(|_| err());
    let (y, mo, da, h, mi, se) = (num(y)?, num(mo)?, num(da)?, num(h)?, num(mi)?, num(se)?);
    if !(1970..=2262).contains(&y) || !(1..=12).contains(&mo) || !(1..=31).contains(&da) || h > 23 || mi > 59 || se > 60
    {
        return Err(err());
    }
    if frac.len() > 9 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return Err(err());
    }
    let frac_ns = if frac.is_empty() { 0 } else { num(frac)? * 10u64.pow(9 - frac.len() as u32) };
    let days = inferwatch_core::civil::days_from_civil(y as i64, mo as u32, da as u32);
    let days = u64::try_from(days).map_err(|_| err())?;
    let secs = days * 86_400 + h * 3600 + mi * 60 + se;
    secs.checked_mul(NS_PER_S).and_then(|n| n.checked_add(frac_ns)).ok_or_else(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_parse_to_utc_ns() {
        assert_eq!(parse_timestamp("1970-01-01 00:00:00"), Ok(0));
        // 2014-07-01 00:30:00 UTC = 1404174600 s (date -u -d '2014-07-01 00:30' +%s)
        assert_eq!(parse_timestamp("2014-07-01 00:30:00"), Ok(1_404_174_600 * NS_PER_S));
        assert_eq!(parse_timestamp("2014-07-01 00:30:00.000000"), Ok(1_404_174_600 * NS_PER_S));
        assert_eq!(parse_timestamp("2000-02-29 00:00:00.5"), Ok(951_782_400 * NS_PER_S + 500_000_000));
        assert!(parse_timestamp("2014-13-01 00:00:00").is_err());
        assert!(parse_timestamp("2014-07-01").is_err());
        assert!(parse_timestamp("2014-07-01 00:00:0x").is_err());
    }

    #[test]
    fn csv_parses_and_rejects_bad_rows() {
        let (t, v) = parse_csv("timestamp,value\n2014-07-01 00:00:00,1.5\n2014-07-01 00:05:00,-2e-3\n").unwrap();
        assert_eq!(t[1] - t[0], 300 * NS_PER_S);
        assert_eq!(v, vec![1.5, -2e-3]);
        assert!(parse_csv("ts,v\n").is_err());
        assert!(parse_csv("timestamp,value\n2014-07-01 00:00:00,abc\n").is_err());
    }

    #[test]
    fn step_is_the_median_interval() {
        let f = NabFile {
            name: "x".into(),
            timestamps: vec![0, 10, 20, 30, 100],
            values: vec![0.0; 5],
            windows: vec![(10, 20)],
        };
        assert_eq!(f.step_ns(), 10);
        assert_eq!(f.window_rows(), vec![(1, 2)]);
    }
}

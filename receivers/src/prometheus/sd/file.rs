//! `file_sd_configs`: target groups from JSON or YAML files (`[{targets: [...], labels: {...}}]`),
//! re-read when a file's size or modification time changes (checked every second, or every
//! `refresh_interval` when shorter) and whole every `refresh_interval` (default 5m), as
//! Prometheus does with its file watches. The last path segment may hold `*` and `?` wildcards.
//! Each group gets `__meta_filepath`. A file that cannot be read or parsed keeps its previous
//! groups and is counted (`reason="file_sd_error"`).

use super::{RawGroup, SdContext, Slot, TargetGroup};
use inferwatch_core::settings::GoDuration;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};
use tokio_util::sync::CancellationToken;

/// Prometheus' default `refresh_interval` of file discovery.
pub const DEFAULT_REFRESH: Duration = Duration::from_secs(300);
/// Largest file read (a larger one is refused and counted).
pub const MAX_FILE: u64 = 16 * 1024 * 1024;
/// Most files one config may match.
pub const MAX_FILES: usize = 1000;

/// One `file_sd_configs` entry.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FileSdConfig {
    /// Paths or patterns (`*` / `?` in the last segment) of `.json`, `.yml` or `.yaml` files.
    pub files: Vec<String>,
    /// How often every file is re-read (default 5m).
    #[serde(default)]
    pub refresh_interval: Option<GoDuration>,
}

impl FileSdConfig {
    /// Checks the patterns; the error names the index in `files`.
    pub fn check(&self) -> Result<(), (Option<usize>, String)> {
        if self.files.is_empty() {
            return Err((None, "at least one file is needed".into()));
        }
        for (i, f) in self.files.iter().enumerate() {
            let ok = [".json", ".yml", ".yaml"].iter().any(|e| f.ends_with(e));
            if !ok {
                return Err((
                    Some(i),
                    format!("path name {f:?} is not valid for file discovery (.json, .yml or .yaml)"),
                ));
            }
            let p = Path::new(f);
            let dir = p.parent().map(|d| d.to_string_lossy().to_string()).unwrap_or_default();
            if dir.contains(['*', '?', '[']) {
                return Err((Some(i), format!("{f:?}: wildcards are allowed in the last path segment only")));
            }
        }
        if matches!(self.refresh_interval, Some(d) if d.0.is_zero()) {
            return Err((None, "refresh_interval must be greater than 0".into()));
        }
        Ok(())
    }

    fn refresh(&self) -> Duration {
        self.refresh_interval.map_or(DEFAULT_REFRESH, |d| d.0)
    }
}

/// Whether `name` matches `pat` (`*` any run, `?` one character).
pub fn wildcard(pat: &str, name: &str) -> bool {
    let p: Vec<char> = pat.chars().collect();
    let n: Vec<char> = name.chars().collect();
    let (mut pi, mut ni, mut star, mut mark) = (0, 0, None, 0);
    while ni < n.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == n[ni]) {
            pi += 1;
            ni += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            mark = ni;
            pi += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ni = mark;
        } else {
            return false;
        }
    }
    while pi < p.len() && p[pi] == '*' {
        pi += 1;
    }
    pi == p.len()
}

/// The files the patterns match now, sorted.
fn expand(patterns: &[String]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for pat in patterns {
        let p = Path::new(pat);
        let last = p.file_name().map(|s| s.to_string_lossy().to_string()).unwrap_or_default();
        if !last.contains(['*', '?']) {
            out.push(p.to_path_buf());
            continue;
        }
        let dir = match p.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let Ok(rd) = std::fs::read_dir(&dir) else { continue };
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            if wildcard(&last, &name) {
                out.push(dir.join(name));
            }
            if out.len() >= MAX_FILES {
                break;
            }
        }
    }
    out.sort();
    out.dedup();
    out.truncate(MAX_FILES);
    out
}

/// Reads one file's groups.
pub fn read_groups(path: &Path) -> Result<Vec<TargetGroup>, String> {
    let shown = path.to_string_lossy().to_string();
    let meta = std::fs::metadata(path).map_err(|e| format!("{shown}: {e}"))?;
    if meta.len() > MAX_FILE {
        return Err(format!("{shown}: larger than {MAX_FILE} bytes"));
    }
    let bytes = std::fs::read(path).map_err(|e| format!("{shown}: {e}"))?;
    let raw: Vec<RawGroup> = if shown.ends_with(".json") {
        serde_json::from_slice(&bytes).map_err(|e| format!("{shown}: {e}"))?
    } else {
        let text = std::str::from_utf8(&bytes).map_err(|_| format!("{shown}: not UTF-8"))?;
        let node = inferwatch_core::config::yaml::parse(&shown, text).map_err(|errs| {
            format!("{shown}: {}", errs.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("; "))
        })?;
        let v = node.to_json();
        if v.is_null() { Vec::new() } else { serde_json::from_value(v).map_err(|e| format!("{shown}: {e}"))? }
    };
    Ok(raw
        .into_iter()
        .enumerate()
        .map(|(i, g)| g.into_group(format!("{shown}:{i}"), ("__meta_filepath", &shown)))
        .collect())
}

type Stamp = Option<(u64, SystemTime)>;

fn stamp(p: &Path) -> Stamp {
    std::fs::metadata(p).ok().map(|m| (m.len(), m.modified().unwrap_or(SystemTime::UNIX_EPOCH)))
}

/// Watches the files until cancelled.
pub async fn run(cfg: FileSdConfig, slot: Slot, ctx: SdContext, cancel: CancellationToken) {
    let refresh = cfg.refresh();
    let poll = refresh.min(Duration::from_secs(1));
    let mut known: BTreeMap<PathBuf, (Stamp, Vec<TargetGroup>)> = BTreeMap::new();
    let mut last_full = tokio::time::Instant::now();
    let mut first = true;
    loop {
        let full = last_full.elapsed() >= refresh;
        if full {
            last_full = tokio::time::Instant::now();
        }
        let files = expand(&cfg.files);
        let mut changed = first || known.len() != files.len() || known.keys().zip(&files).any(|(a, b)| a != b);
        known.retain(|p, _| files.contains(p));
        for f in &files {
            let s = stamp(f);
            let prev = known.get(f).map(|(st, _)| *st);
            if !full && prev == Some(s) {
                continue;
            }
            match read_groups(f) {
                Ok(groups) => {
                    known.insert(f.clone(), (s, groups));
                    changed = true;
                }
                Err(e) => {
                    ctx.failed("file", "file_sd_error");
                    tracing::warn!(job = %ctx.job, error = %e, "file_sd: cannot read a target file; keeping its last targets");
                    let old = known.remove(f).map(|(_, g)| g).unwrap_or_default();
                    known.insert(f.clone(), (s, old));
                }
            }
        }
        if changed {
            let cut = slot.publish(known.values().flat_map(|(_, g)| g.iter().cloned()).collect());
            if cut > 0 {
                ctx.failed("file", "sd_targets_cut");
            }
        }
        first = false;
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(poll) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcards_match() {
        assert!(wildcard("tg_*.json", "tg_a.json"));
        assert!(wildcard("tg_*.json", "tg_.json"));
        assert!(!wildcard("tg_*.json", "tg_a.yaml"));
        assert!(wildcard("t?.yml", "ta.yml"));
        assert!(!wildcard("t?.yml", "tab.yml"));
    }

    #[test]
    fn patterns_are_checked() {
        let c = |f: &str| FileSdConfig { files: vec![f.into()], refresh_interval: None }.check();
        assert!(c("/a/b_*.json").is_ok());
        assert_eq!(c("/a/b.txt").unwrap_err().0, Some(0));
        assert!(c("/a*/b.json").is_err());
    }
}

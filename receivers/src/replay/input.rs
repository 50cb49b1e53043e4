//! Listing the inputs: files and directories (recursively), the format of each file by its
//! extension, and the order they are read in (earliest first event time first).

use super::position::FileKey;
use std::path::{Path, PathBuf};

/// The formats a replay receiver reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Format {
    /// Apache Parquet (`.parquet`) of an inferwatch Arrow schema.
    Parquet,
    /// Arrow IPC (`.arrows`, `.arrow`): a stream, or a file when it starts with `ARROW1`.
    ArrowIpc,
    /// OTLP/JSON lines (`.jsonl`, `.json`), one export request per line.
    JsonLines,
}

/// One file to read.
#[derive(Debug, Clone)]
pub(crate) struct InputFile {
    /// Where it is.
    pub path: PathBuf,
    /// Its size when listed.
    pub size: u64,
    /// How to read it.
    pub format: Format,
}

impl InputFile {
    /// The file as the position fingerprint sees it.
    pub(crate) fn key(&self) -> FileKey {
        FileKey { path: self.path.display().to_string(), size: self.size }
    }
}

/// The format of `path` by its extension; `None` for files a replay does not read.
pub(crate) fn format_of(path: &Path) -> Option<Format> {
    let name = path.file_name()?.to_str()?;
    if name.ends_with(".inprogress") || name.starts_with('.') {
        return None;
    }
    match path.extension()?.to_str()?.to_ascii_lowercase().as_str() {
        "parquet" => Some(Format::Parquet),
        "arrows" | "arrow" => Some(Format::ArrowIpc),
        "jsonl" | "json" => Some(Format::JsonLines),
        _ => None,
    }
}

/// Why the inputs could not be listed.
#[derive(Debug, thiserror::Error)]
#[error("replay input {path}: {source}")]
pub(crate) struct ListError {
    /// The path that failed.
    pub path: PathBuf,
    /// The I/O error.
    #[source]
    pub source: std::io::Error,
}

/// Expands `inputs` into the readable files they name (directories recursively, in name
/// order); other files are skipped with a debug line. Files listed twice are kept once.
pub(crate) fn expand(inputs: &[PathBuf]) -> Result<Vec<InputFile>, ListError> {
    let mut out = Vec::new();
    for p in inputs {
        walk(p, &mut out)?;
    }
    let mut seen = std::collections::HashSet::new();
    out.retain(|f| seen.insert(f.path.clone()));
    Ok(out)
}

fn walk(path: &Path, out: &mut Vec<InputFile>) -> Result<(), ListError> {
    let err = |source| ListError { path: path.to_path_buf(), source };
    let meta = std::fs::metadata(path).map_err(err)?;
    if meta.is_dir() {
        let mut entries: Vec<PathBuf> =
            std::fs::read_dir(path).map_err(err)?.filter_map(|e| e.ok().map(|e| e.path())).collect();
        entries.sort();
        for e in entries {
            walk(&e, out)?;
        }
    } else if let Some(format) = format_of(path) {
        out.push(InputFile { path: path.to_path_buf(), size: meta.len(), format });
    } else {
        tracing::debug!(file = %path.display(), "replay skips a file of unknown type (or still being written)");
    }
    Ok(())
}

/// Orders files by their first event time (files without one last), ties by path.
pub(crate) fn sort_by_time(files: Vec<InputFile>, first_time: impl Fn(&InputFile) -> Option<u64>) -> Vec<InputFile> {
    let mut keyed: Vec<(Option<u64>, InputFile)> = files.into_iter().map(|f| (first_time(&f), f)).collect();
    keyed.sort_by(|(ta, a), (tb, b)| {
        let ta = ta.unwrap_or(u64::MAX);
        let tb = tb.unwrap_or(u64::MAX);
        ta.cmp(&tb).then_with(|| a.path.cmp(&b.path))
    });
    keyed.into_iter().map(|(_, f)| f).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_by_extension() {
        assert_eq!(format_of(Path::new("a/b.parquet")), Some(Format::Parquet));
        assert_eq!(format_of(Path::new("b.ARROWS")), Some(Format::ArrowIpc));
        assert_eq!(format_of(Path::new("b.arrow")), Some(Format::ArrowIpc));
        assert_eq!(format_of(Path::new("t.jsonl")), Some(Format::JsonLines));
        assert_eq!(format_of(Path::new("t.json")), Some(Format::JsonLines));
        assert_eq!(format_of(Path::new("t.parquet.inprogress")), None);
        assert_eq!(format_of(Path::new("notes.txt")), None);
        assert_eq!(format_of(Path::new("noext")), None);
    }

    #[test]
    fn sorted_by_time_then_path_unknown_last() {
        let f = |p: &str| InputFile { path: p.into(), size: 0, format: Format::JsonLines };
        let files = vec![f("d"), f("c"), f("b"), f("a")];
        let t = |x: &InputFile| match x.path.to_str() {
            Some("a") => None,
            Some("b") => Some(5),
            Some("c") => Some(5),
            _ => Some(1),
        };
        let order: Vec<_> = sort_by_time(files, t).into_iter().map(|f| f.path).collect();
        assert_eq!(order, vec![PathBuf::from("d"), "b".into(), "c".into(), "a".into()]);
    }
}

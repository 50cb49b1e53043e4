//! Feeding a scenario's `traces.jsonl` and `metrics.jsonl` into the harness, merged in event-time
//! order (one line = one export request; the files are each in time order).
//!
//! `inferwatch replay` reads files one after the other, which would put every span of a scenario
//! before its first scrape; merging keeps the two signals on one clock, as a live agent sees them.

use crate::error::EvalError;
use crate::harness::Harness;
use inferwatch_core::pdata::Payload;
use inferwatch_receivers::replay::{decode_otlp_json_line, payload_first_time};
use std::io::{BufRead, BufReader};
use std::path::Path;

/// One open JSON-lines file and its next decoded line.
struct Lines {
    path: String,
    reader: Box<dyn BufRead + Send>,
    next: Option<(u64, Payload)>,
    buf: Vec<u8>,
}

impl Lines {
    fn open(path: &Path) -> Result<Option<Lines>, EvalError> {
        if !path.exists() {
            return Ok(None);
        }
        let f = std::fs::File::open(path).map_err(|e| EvalError::io(path, e))?;
        let mut l = Lines {
            path: path.display().to_string(),
            reader: Box::new(BufReader::with_capacity(1 << 20, f)),
            next: None,
            buf: Vec::new(),
        };
        l.advance()?;
        Ok(Some(l))
    }

    /// Reads the next non-empty line into `next` (None at the end).
    fn advance(&mut self) -> Result<(), EvalError> {
        self.next = None;
        loop {
            self.buf.clear();
            let n = self
                .reader
                .read_until(b'\n', &mut self.buf)
                .map_err(|e| EvalError::Data(format!("{}: {e}", self.path)))?;
            if n == 0 {
                return Ok(());
            }
            let line = self.buf.trim_ascii();
            if line.is_empty() {
                continue;
            }
            let p = decode_otlp_json_line(line).map_err(|e| EvalError::Data(format!("{}: {e}", self.path)))?;
            let t = payload_first_time(&p).unwrap_or(0);
            self.next = Some((t, p));
            return Ok(());
        }
    }
}

/// Sends every line of `dir/traces.jsonl` and `dir/metrics.jsonl` in event-time order; returns the
/// lines sent. A signal no pipeline takes is skipped by the harness.
pub async fn feed_dir(harness: &Harness, dir: &Path) -> Result<u64, EvalError> {
    let mut files: Vec<Lines> = Vec::new();
    for name in ["traces.jsonl", "metrics.jsonl"] {
        if let Some(l) = Lines::open(&dir.join(name))? {
            files.push(l);
        }
    }
    let mut sent = 0u64;
    loop {
        let pick =
            files.iter().enumerate().filter_map(|(i, l)| l.next.as_ref().map(|(t, _)| (*t, i))).min().map(|(_, i)| i);
        let Some(i) = pick else { break };
        let Some((_, payload)) = files[i].next.take() else { break };
        harness.send(payload).await?;
        sent += 1;
        files[i].advance()?;
    }
    Ok(sent)
}

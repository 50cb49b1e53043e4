//! Reading trace files: the Azure LLM inference trace (CSV) and the generic CSV / JSONL format.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// A trace file that cannot be used; names the file and the 1-based line (0: the whole file).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{}:{line}: {message}", path.display())]
pub struct TraceError {
    /// The file.
    pub path: PathBuf,
    /// 1-based line (0: the file as a whole).
    pub line: usize,
    /// What is wrong.
    pub message: String,
}

/// The layout a trace was read in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TraceFormat {
    /// The Azure LLM inference trace: `TIMESTAMP,ContextTokens,GeneratedTokens`.
    Azure,
    /// Generic CSV: `timestamp,input_tokens,output_tokens[,session_id]`.
    Csv,
    /// Generic JSONL: `{"timestamp", "input_tokens", "output_tokens", "session_id"?}` a line.
    Jsonl,
}

/// One request of a trace.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TraceRow {
    /// Arrival, seconds after the trace's first arrival.
    pub at: f64,
    /// Prompt tokens of the request (the whole prompt, earlier turns included).
    pub input_tokens: u32,
    /// Output tokens of the request.
    pub output_tokens: u32,
    /// Session (multi-turn conversation) index, if the row names one.
    pub session: Option<u32>,
    /// The previous row of the same session (its earlier turn), if any.
    pub prev: Option<u32>,
    /// 1-based line of the row in the file.
    pub line: usize,
}

/// A whole trace, sorted by arrival.
#[derive(Debug, Clone, PartialEq)]
pub struct Trace {
    /// The file it was read from.
    pub path: PathBuf,
    /// Its layout.
    pub format: TraceFormat,
    /// The requests, by arrival (ties keep file order).
    pub rows: Vec<TraceRow>,
    /// Number of distinct sessions.
    pub sessions: usize,
}

/// Most rows a trace may have (bounded memory).
pub const MAX_ROWS: usize = 50_000_000;

/// Largest trace file read (it is read whole): 4 GiB.
pub const MAX_TRACE_BYTES: u64 = 4 << 30;

/// Most tokens one row may ask for, in or out (2 Mi: above any model's context today); the
/// prompt and the stand-in answer are built to that size.
pub const MAX_ROW_TOKENS: u64 = 2 << 20;

impl Trace {
    /// Reads a trace: JSONL when the first non-blank character is `{`, CSV otherwise.
    pub fn load(path: &Path) -> Result<Trace, TraceError> {
        let size = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
        if size > MAX_TRACE_BYTES {
            return Err(TraceError {
                path: path.to_path_buf(),
                line: 0,
                message: format!("the trace is {size} bytes, more than the {MAX_TRACE_BYTES} read (split it)"),
            });
        }
        let text = std::fs::read_to_string(path).map_err(|e| TraceError {
            path: path.to_path_buf(),
            line: 0,
            message: format!("cannot read the trace: {e}"),
        })?;
        Trace::parse(&text, path)
    }

    /// Parses trace text; `path` names it in errors.
    pub fn parse(text: &str, path: &Path) -> Result<Trace, TraceError> {
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        let raw = if text.trim_start().starts_with('{') { parse_jsonl(text, path)? } else { parse_csv(text, path)? };
        Trace::from_raw(raw, path)
    }

    /// Arrival times of the rows, seconds.
    pub fn times(&self) -> Vec<f64> {
        self.rows.iter().map(|r| r.at).collect()
    }

    /// Seconds from the first to the last arrival.
    pub fn span_s(&self) -> f64 {
        self.rows.last().map_or(0.0, |r| r.at)
    }

    fn from_raw(raw: Raw, path: &Path) -> Result<Trace, TraceError> {
        let Raw { format, mut rows } = raw;
        if rows.is_empty() {
            return Err(TraceError { path: path.to_path_buf(), line: 0, message: "the trace has no request".into() });
        }
        // Stable: rows with equal timestamps keep their file order.
        rows.sort_by(|a, b| a.at.total_cmp(&b.at));
        let t0 = rows[0].at;
        let mut ids: HashMap<String, u32> = HashMap::new();
        let mut last: Vec<u32> = Vec::new();
        let mut out = Vec::with_capacity(rows.len());
        for (i, r) in rows.into_iter().enumerate() {
            let (session, prev) = match r.session {
                None => (None, None),
                Some(s) => {
                    let next = ids.len() as u32;
                    let id = *ids.entry(s).or_insert(next);
                    let i = i as u32;
                    if id as usize == last.len() {
                        last.push(i);
                        (Some(id), None)
                    } else {
                        let p = last[id as usize];
                        last[id as usize] = i;
                        (Some(id), Some(p))
                    }
                }
            };
            out.push(TraceRow {
                at: r.at - t0,
                input_tokens: r.input,
                output_tokens: r.output,
                session,
                prev,
                line: r.line,
            });
        }
        Ok(Trace { path: path.to_path_buf(), format, rows: out, sessions: ids.len() })
    }
}

struct RawRow {
    at: f64,
    input: u32,
    output: u32,
    session: Option<String>,
    line: usize,
}

struct Raw {
    format: TraceFormat,
    rows: Vec<RawRow>,
}

/// Whether a timestamp was seconds or a date-time (a trace must not mix them).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum TimeKind {
    Seconds,
    DateTime,
}

/// Keeps the rows' timestamp kind consistent.
struct Kinds(Option<(TimeKind, usize)>);

impl Kinds {
    fn check(&mut self, k: TimeKind, line: usize) -> Result<(), String> {
        match self.0 {
            None => {
                self.0 = Some((k, line));
                Ok(())
            }
            Some((first, _)) if first == k => Ok(()),
            Some((_, l)) => Err(format!(
                "timestamp is {} but line {l} gave {}; a trace uses one kind",
                name(k),
                name(if k == TimeKind::Seconds { TimeKind::DateTime } else { TimeKind::Seconds })
            )),
        }
    }
}

fn name(k: TimeKind) -> &'static str {
    match k {
        TimeKind::Seconds => "seconds",
        TimeKind::DateTime => "a date-time",
    }
}

/// Parses a timestamp: seconds (`12.5`) or a date-time (`2023-11-16 18:15:46.6805900`,
/// RFC 3339 `2023-11-16T18:15:46.68Z`, `...+01:00`; no zone means UTC). Returns seconds.
fn parse_time(s: &str) -> Result<(f64, TimeKind), String> {
    let s = s.trim();
    if let Ok(v) = s.parse::<f64>() {
        if !v.is_finite() || v < 0.0 {
            return Err(format!("timestamp {s:?} must be finite and ≥ 0"));
        }
        return Ok((v, TimeKind::Seconds));
    }
    parse_datetime(s)
        .map(|v| (v, TimeKind::DateTime))
        .ok_or_else(|| format!("timestamp {s:?} is neither seconds nor a date-time like 2023-11-16T18:15:46.68Z"))
}

/// `YYYY-MM-DD[T ]HH:MM:SS[.frac][Z|±HH:MM|±HHMM]` as Unix seconds.
fn parse_datetime(s: &str) -> Option<f64> {
    let b = s.as_bytes();
    if b.len() < 19 || !s.is_ascii() {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let t = &s[r];
        if t.bytes().all(|c| c.is_ascii_digit()) { t.parse().ok() } else { None }
    };
    if b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') || b[13] != b':' || b[16] != b':' {
        return None;
    }
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, se) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || se > 60 {
        return None;
    }
    let mut rest = &s[19..];
    let mut frac = 0.0;
    if let Some(r) = rest.strip_prefix('.') {
        let n = r.bytes().take_while(u8::is_ascii_digit).count();
        if n == 0 {
            return None;
        }
        frac = format!("0.{}", &r[..n]).parse().ok()?;
        rest = &r[n..];
    }
    let offset = match rest {
        "" | "Z" | "z" => 0,
        z if z.len() == 6 || z.len() == 5 => {
            let sign = match z.as_bytes()[0] {
                b'+' => 1,
                b'-' => -1,
                _ => return None,
            };
            let digits: String = z[1..].chars().filter(|c| *c != ':').collect();
            if digits.len() != 4 || (z.len() == 6 && z.as_bytes()[3] != b':') {
                return None;
            }
            let hh: i64 = digits[..2].parse().ok()?;
            let mm: i64 = digits[2..].parse().ok()?;
            sign * (hh * 3600 + mm * 60)
        }
        _ => return None,
    };
    let days = inferwatch_core::civil::days_from_civil(y, mo as u32, d as u32);
    let secs = days * 86_400 + h * 3600 + mi * 60 + se - offset;
    Some(secs as f64 + frac)
}

fn tokens(v: &str, what: &str) -> Result<u32, String> {
    let t = v.trim();
    let n: u64 = t.parse().map_err(|_| format!("{what} {t:?} is not a whole number"))?;
    if n == 0 {
        return Err(format!("{what} must be at least 1"));
    }
    if n > MAX_ROW_TOKENS {
        return Err(format!("{what} {n} is more than {MAX_ROW_TOKENS}"));
    }
    u32::try_from(n).map_err(|_| format!("{what} {n} is too large"))
}

/// Splits one CSV line (RFC 4180 quoting, no line breaks inside fields).
fn split_csv(line: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    let mut chars = line.chars().peekable();
    let mut at_start = true;
    while let Some(c) = chars.next() {
        if quoted {
            if c == '"' {
                if chars.peek() == Some(&'"') {
                    chars.next();
                    cur.push('"');
                } else {
                    quoted = false;
                }
            } else {
                cur.push(c);
            }
        } else if c == '"' && at_start {
            quoted = true;
            at_start = false;
        } else if c == ',' {
            out.push(std::mem::take(&mut cur));
            at_start = true;
        } else {
            cur.push(c);
            at_start = false;
        }
    }
    if quoted {
        return Err("unterminated quoted field".into());
    }
    out.push(cur);
    Ok(out)
}

fn parse_csv(text: &str, path: &Path) -> Result<Raw, TraceError> {
    let err = |line: usize, message: String| TraceError { path: path.to_path_buf(), line, message };
    let mut lines = text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty());
    let Some((hl, header)) = lines.next() else {
        return Err(err(0, "the trace is empty".into()));
    };
    let cols: Vec<String> =
        split_csv(header).map_err(|m| err(hl + 1, m))?.iter().map(|c| c.trim().to_lowercase()).collect();
    let find = |names: &[&str]| cols.iter().position(|c| names.contains(&c.as_str()));
    let azure = find(&["contexttokens"]).is_some();
    let ts = find(&["timestamp"]);
    let input = find(&["input_tokens", "contexttokens"]);
    let output = find(&["output_tokens", "generatedtokens"]);
    let session = find(&["session_id"]);
    let (Some(ts), Some(input), Some(output)) = (ts, input, output) else {
        return Err(err(
            hl + 1,
            format!(
                "the header must name timestamp, input_tokens and output_tokens (or the Azure trace's \
                 TIMESTAMP, ContextTokens, GeneratedTokens); it has {header:?}"
            ),
        ));
    };
    let need = ts.max(input).max(output).max(session.unwrap_or(0)) + 1;
    let mut kinds = Kinds(None);
    let mut rows = Vec::new();
    for (i, l) in lines {
        let line = i + 1;
        if rows.len() >= MAX_ROWS {
            return Err(err(line, format!("more than {MAX_ROWS} rows")));
        }
        let f = split_csv(l).map_err(|m| err(line, m))?;
        if f.len() < need {
            return Err(err(line, format!("{} fields, the header has {}", f.len(), cols.len())));
        }
        let (at, k) = parse_time(&f[ts]).map_err(|m| err(line, m))?;
        kinds.check(k, line).map_err(|m| err(line, m))?;
        let input =
            tokens(&f[input], if azure { "ContextTokens" } else { "input_tokens" }).map_err(|m| err(line, m))?;
        let output =
            tokens(&f[output], if azure { "GeneratedTokens" } else { "output_tokens" }).map_err(|m| err(line, m))?;
        let session = session.map(|s| f[s].trim().to_string()).filter(|s| !s.is_empty());
        rows.push(RawRow { at, input, output, session, line });
    }
    Ok(Raw { format: if azure { TraceFormat::Azure } else { TraceFormat::Csv }, rows })
}

fn parse_jsonl(text: &str, path: &Path) -> Result<Raw, TraceError> {
    use serde_json::Value;
    let err = |line: usize, message: String| TraceError { path: path.to_path_buf(), line, message };
    let mut kinds = Kinds(None);
    let mut rows = Vec::new();
    for (i, l) in text.lines().enumerate() {
        let line = i + 1;
        if l.trim().is_empty() {
            continue;
        }
        if rows.len() >= MAX_ROWS {
            return Err(err(line, format!("more than {MAX_ROWS} rows")));
        }
        let v: Value = serde_json::from_str(l).map_err(|e| err(line, format!("not JSON: {e}")))?;
        let Value::Object(o) = v else {
            return Err(err(line, "each line must be a JSON object".into()));
        };
        let (at, k) = match o.get("timestamp") {
            Some(Value::Number(n)) => parse_time(&n.to_string()),
            Some(Value::String(s)) => parse_time(s),
            Some(_) => Err("`timestamp` must be a number (seconds) or an RFC 3339 string".into()),
            None => Err("missing `timestamp`".into()),
        }
        .map_err(|m| err(line, m))?;
        kinds.check(k, line).map_err(|m| err(line, m))?;
        let count = |key: &str| -> Result<u32, String> {
            match o.get(key) {
                Some(Value::Number(n)) if n.is_u64() => tokens(&n.to_string(), &format!("`{key}`")),
                Some(_) => Err(format!("`{key}` must be a whole number ≥ 1")),
                None => Err(format!("missing `{key}`")),
            }
        };
        let input = count("input_tokens").map_err(|m| err(line, m))?;
        let output = count("output_tokens").map_err(|m| err(line, m))?;
        let session = match o.get("session_id") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(Value::Number(n)) => Some(n.to_string()),
            Some(_) => return Err(err(line, "`session_id` must be a string or a number".into())),
        };
        rows.push(RawRow { at, input, output, session, line });
    }
    Ok(Raw { format: TraceFormat::Jsonl, rows })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Trace, TraceError> {
        Trace::parse(text, Path::new("t.csv"))
    }

    #[test]
    fn azure_format() {
        let t = parse(
            "\u{feff}TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n\
             2023-11-16 18:15:50.9951690,396,109\n\n2023-11-16 18:16:51.2224670,879,55\n",
        )
        .unwrap();
        assert_eq!(t.format, TraceFormat::Azure);
        assert_eq!(t.rows.len(), 3);
        assert_eq!((t.rows[0].input_tokens, t.rows[0].output_tokens, t.rows[0].line), (374, 44, 2));
        assert!((t.rows[1].at - 4.314579).abs() < 1e-6, "{}", t.rows[1].at);
        assert!((t.rows[2].at - 64.541877).abs() < 1e-6);
        assert_eq!(t.rows[2].line, 5);
        assert_eq!(t.sessions, 0);
    }

    #[test]
    fn generic_csv_with_sessions_and_rfc3339() {
        let t = parse(
            "session_id,timestamp,input_tokens,output_tokens,extra\n\
             a,2024-01-01T00:00:01Z,100,10,x\n\
             b,2024-01-01T01:00:00.5+01:00,50,5,y\n\
             \"a\",2024-01-01T00:00:03.25Z,200,20,z\n",
        )
        .unwrap();
        assert_eq!(t.format, TraceFormat::Csv);
        // b is 00:00:00.5 UTC: first after sorting.
        assert_eq!(t.rows.iter().map(|r| r.input_tokens).collect::<Vec<_>>(), vec![50, 100, 200]);
        assert_eq!(t.rows.iter().map(|r| r.at).collect::<Vec<_>>(), vec![0.0, 0.5, 2.75]);
        assert_eq!(t.sessions, 2);
        assert_eq!(t.rows[2].session, t.rows[1].session);
        assert_eq!(t.rows[2].prev, Some(1));
        assert_eq!((t.rows[0].prev, t.rows[1].prev), (None, None));
    }

    #[test]
    fn jsonl_format() {
        let t = Trace::parse(
            "{\"timestamp\": 10.5, \"input_tokens\": 7, \"output_tokens\": 3, \"session_id\": 4}\n\n\
             {\"timestamp\": 12, \"input_tokens\": 9, \"output_tokens\": 1, \"session_id\": \"4\", \"k\": 1}\n\
             {\"timestamp\": 11, \"input_tokens\": 5, \"output_tokens\": 2}\n",
            Path::new("t.jsonl"),
        )
        .unwrap();
        assert_eq!(t.format, TraceFormat::Jsonl);
        assert_eq!(t.rows.iter().map(|r| (r.at, r.line)).collect::<Vec<_>>(), vec![(0.0, 1), (0.5, 4), (1.5, 3)]);
        assert_eq!(t.sessions, 1);
        assert_eq!(t.rows[2].prev, Some(0));
        assert!((t.span_s() - 1.5).abs() < 1e-12);
    }

    #[test]
    fn bad_rows_name_file_and_line() {
        let e = parse("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,1,2\n2023-11-16 18:15:47,x,2\n")
            .unwrap_err();
        assert_eq!(e.line, 3);
        assert!(e.to_string().starts_with("t.csv:3: ContextTokens \"x\""), "{e}");
        let e = parse("timestamp,input_tokens,output_tokens\n1,2,0\n").unwrap_err();
        assert_eq!((e.line, e.message.as_str()), (2, "output_tokens must be at least 1"));
        let e = parse("timestamp,input_tokens,output_tokens\n1,2\n").unwrap_err();
        assert_eq!(e.line, 2);
        let e = parse("timestamp,input_tokens,output_tokens\n1,2,3\n2024-01-01T00:00:00Z,2,3\n").unwrap_err();
        assert_eq!(e.line, 3, "{e}");
        let e = parse("timestamp,input_tokens,output_tokens\n2024-13-01T00:00:00Z,2,3\n").unwrap_err();
        assert_eq!(e.line, 2);
        let e = parse("time,prompt\n1,2\n").unwrap_err();
        assert_eq!(e.line, 1);
        let e = parse("timestamp,input_tokens,output_tokens\n").unwrap_err();
        assert_eq!(e.line, 0);
        let e = Trace::parse("{\"timestamp\": 1, \"input_tokens\": 2}\n", Path::new("x.jsonl")).unwrap_err();
        assert_eq!(e.to_string(), "x.jsonl:1: missing `output_tokens`");
        let e = Trace::parse("{\"timestamp\": 1, \"input_tokens\": 2, \"output_tokens\": 1}\n[1]\n", Path::new("x"))
            .unwrap_err();
        assert_eq!(e.line, 2);
        let e = Trace::load(Path::new("/nonexistent/trace.csv")).unwrap_err();
        assert_eq!(e.line, 0);
    }

    #[test]
    fn a_row_asking_for_more_tokens_than_any_context_is_refused() {
        let e = parse("timestamp,input_tokens,output_tokens\n1,2,3\n2,4000000000,3\n").unwrap_err();
        assert_eq!(e.line, 3);
        assert!(e.to_string().contains("more than 2097152"), "{e}");
        let e = parse("timestamp,input_tokens,output_tokens\n1,2,2097153\n").unwrap_err();
        assert!(e.to_string().contains("output_tokens 2097153"), "{e}");
        assert_eq!(
            parse("timestamp,input_tokens,output_tokens\n1,2097152,1\n").unwrap().rows[0].input_tokens,
            2_097_152
        );
    }

    #[test]
    fn datetimes() {
        assert_eq!(parse_datetime("1970-01-01T00:00:00Z"), Some(0.0));
        assert_eq!(parse_datetime("2000-03-01 00:00:00"), Some(951_868_800.0));
        assert_eq!(parse_datetime("2024-01-01T02:00:00+02:00"), parse_datetime("2024-01-01T00:00:00Z"));
        assert_eq!(parse_datetime("2024-01-01T00:00:00-0130"), Some(1_704_067_200.0 + 5400.0));
        assert_eq!(parse_datetime("2024-01-01T00:00:00.25Z"), Some(1_704_067_200.25));
        assert_eq!(parse_datetime("2024-01-01"), None);
        assert_eq!(parse_datetime("2024-01-01T00:00:00.Z"), None);
        assert_eq!(parse_datetime("2024-01-01T00:00:00+5"), None);
    }
}

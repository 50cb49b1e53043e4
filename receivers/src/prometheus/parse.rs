//! A line parser for the Prometheus text exposition format 0.0.4 and OpenMetrics 1.0 text.
//!
//! It borrows from the input (label values are copied only when they hold escapes), groups
//! samples into metric families by their `# TYPE` and name suffixes, and reports the first bad
//! line with its number. Both formats are read leniently where real exporters differ: blank
//! lines, `\r\n`, tabs, trailing commas in label sets, plain comments, `untyped` and `unknown`,
//! every OpenMetrics type, optional exemplars (skipped) and optional timestamps (integer
//! milliseconds in the text format, float seconds in OpenMetrics). Names may contain colons,
//! and quoted (UTF-8) metric and label names are accepted inside the braces.
//!
//! Python's prometheus_client writes a counter's or histogram's `_created` series in the text
//! format as a gauge family of its own (`# TYPE x_created gauge`); such a family is folded into
//! the counter, histogram or summary it belongs to, so its values become start times.

use std::borrow::Cow;
use std::collections::HashMap;

/// The two exposition formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Prometheus text format 0.0.4 (`text/plain`).
    Text,
    /// OpenMetrics 1.0 text (`application/openmetrics-text`).
    OpenMetrics,
}

impl Format {
    /// The format a `Content-Type` header announces (text when absent or unknown).
    pub fn from_content_type(ct: &str) -> Format {
        if ct.trim_start().to_ascii_lowercase().starts_with("application/openmetrics-text") {
            Format::OpenMetrics
        } else {
            Format::Text
        }
    }
}

/// A family's type from its `# TYPE` line (`Unknown` when there is none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `counter`.
    Counter,
    /// `gauge`.
    Gauge,
    /// `histogram` (classic buckets).
    Histogram,
    /// `gaugehistogram` (OpenMetrics).
    GaugeHistogram,
    /// `summary`.
    Summary,
    /// `info` (OpenMetrics).
    Info,
    /// `stateset` (OpenMetrics).
    StateSet,
    /// `untyped`, `unknown` or no `# TYPE`.
    Unknown,
}

impl Kind {
    fn parse(s: &str) -> Option<Kind> {
        Some(match s {
            "counter" => Kind::Counter,
            "gauge" => Kind::Gauge,
            "histogram" => Kind::Histogram,
            "gaugehistogram" => Kind::GaugeHistogram,
            "summary" => Kind::Summary,
            "info" => Kind::Info,
            "stateset" => Kind::StateSet,
            "untyped" | "unknown" => Kind::Unknown,
            _ => return None,
        })
    }

    /// Whether a sample named family name + `suffix` belongs to a family of this kind.
    fn accepts(self, suffix: Suffix) -> bool {
        use Suffix as S;
        match self {
            Kind::Counter => matches!(suffix, S::None | S::Total | S::Created),
            Kind::Gauge | Kind::Unknown | Kind::StateSet => suffix == S::None,
            Kind::Histogram => matches!(suffix, S::Bucket | S::Sum | S::Count | S::Created),
            Kind::GaugeHistogram => matches!(suffix, S::Bucket | S::Gsum | S::Gcount),
            Kind::Summary => matches!(suffix, S::None | S::Sum | S::Count | S::Created),
            Kind::Info => matches!(suffix, S::Info | S::None),
        }
    }
}

/// Which series of its family a sample is, by the suffix after the family name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Suffix {
    /// The family name itself (gauge, unknown, text-format counter, summary quantile).
    None,
    /// `_total` (counter value).
    Total,
    /// `_created` (creation time, seconds since the epoch).
    Created,
    /// `_bucket` (histogram bucket; `le` moved to [`Sample::bound`] for histograms).
    Bucket,
    /// `_sum`.
    Sum,
    /// `_count`.
    Count,
    /// `_gsum` (gauge histogram).
    Gsum,
    /// `_gcount` (gauge histogram).
    Gcount,
    /// `_info` (info metric).
    Info,
}

/// Suffixes a family name may carry in its samples, in matching order.
const SUFFIXES: [(&str, Suffix); 8] = [
    ("_bucket", Suffix::Bucket),
    ("_count", Suffix::Count),
    ("_sum", Suffix::Sum),
    ("_created", Suffix::Created),
    ("_total", Suffix::Total),
    ("_gsum", Suffix::Gsum),
    ("_gcount", Suffix::Gcount),
    ("_info", Suffix::Info),
];

impl Suffix {
    /// The text after the family name.
    pub fn as_str(self) -> &'static str {
        match self {
            Suffix::None => "",
            Suffix::Total => "_total",
            Suffix::Created => "_created",
            Suffix::Bucket => "_bucket",
            Suffix::Sum => "_sum",
            Suffix::Count => "_count",
            Suffix::Gsum => "_gsum",
            Suffix::Gcount => "_gcount",
            Suffix::Info => "_info",
        }
    }
}

/// One label of a sample.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Label<'a> {
    /// Label name.
    pub name: Cow<'a, str>,
    /// Label value, unescaped.
    pub value: Cow<'a, str>,
}

/// One sample line.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample<'a> {
    /// Which series of the family this is.
    pub suffix: Suffix,
    /// Labels in exposition order (without `le` for histogram buckets and `quantile` for
    /// summary quantiles: those are in `bound`).
    pub labels: Vec<Label<'a>>,
    /// The `le` of a histogram bucket or the `quantile` of a summary sample.
    pub bound: Option<f64>,
    /// The value.
    pub value: f64,
    /// The sample's own timestamp, nanoseconds since the epoch.
    pub timestamp_ns: Option<i64>,
    /// 1-based line number.
    pub line: usize,
}

/// A metric family: its metadata and samples.
#[derive(Debug, Clone, PartialEq)]
pub struct Family<'a> {
    /// The family name (`# TYPE` name, or the sample name when untyped).
    pub name: Cow<'a, str>,
    /// The type.
    pub kind: Kind,
    /// `# HELP` text, unescaped.
    pub help: Option<Cow<'a, str>>,
    /// `# UNIT` text.
    pub unit: Option<Cow<'a, str>>,
    /// Samples in exposition order.
    pub samples: Vec<Sample<'a>>,
    typed: bool,
}

/// A parsed exposition.
#[derive(Debug, Clone, PartialEq)]
pub struct Exposition<'a> {
    /// The format it was read as.
    pub format: Format,
    /// Families in order of first appearance.
    pub families: Vec<Family<'a>>,
}

impl Exposition<'_> {
    /// Number of sample lines (Prometheus' `scrape_samples_scraped`).
    pub fn sample_count(&self) -> usize {
        self.families.iter().map(|f| f.samples.len()).sum()
    }
}

/// Why an exposition is malformed: the first bad line and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {message}")]
pub struct ParseError {
    /// 1-based line number.
    pub line: usize,
    /// What is wrong.
    pub message: String,
}

/// Parses UTF-8 bytes; invalid UTF-8 is reported at its line.
pub fn parse_bytes(body: &[u8], format: Format) -> Result<Exposition<'_>, ParseError> {
    match std::str::from_utf8(body) {
        Ok(text) => parse(text, format),
        Err(e) => {
            let good = &body[..e.valid_up_to()];
            let line = 1 + good.iter().filter(|&&b| b == b'\n').count();
            Err(ParseError { line, message: "invalid UTF-8".into() })
        }
    }
}

/// The scrape limits checked while parsing (Prometheus' `sample_limit`, `label_limit`,
/// `label_name_length_limit`, `label_value_length_limit`; 0 = no limit). Parsing stops at the
/// first sample over a limit, so a huge page costs no more memory than the limit allows.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    /// Most samples per scrape.
    pub sample_limit: usize,
    /// Most labels per series, `__name__` and the target's labels (`base_labels`) included.
    pub label_limit: usize,
    /// Longest label name, in bytes.
    pub label_name_length_limit: usize,
    /// Longest label value, in bytes.
    pub label_value_length_limit: usize,
    /// Labels every series gets from the target (`job`, `instance`, static labels).
    pub base_labels: usize,
}

/// A limit an exposition exceeded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimitExceeded {
    /// More samples than `sample_limit`.
    #[error("sample_limit exceeded: more than {limit} samples")]
    Samples {
        /// The limit.
        limit: usize,
    },
    /// A series with more labels than `label_limit`.
    #[error("label_limit exceeded (metric: {metric}, number of labels: {count}, limit: {limit})")]
    Labels {
        /// The metric (truncated).
        metric: String,
        /// Its label count.
        count: usize,
        /// The limit.
        limit: usize,
    },
    /// A label name longer than `label_name_length_limit`.
    #[error("label_name_length_limit exceeded (metric: {metric}, label name: {name}, limit: {limit})")]
    LabelName {
        /// The metric (truncated).
        metric: String,
        /// The label name (truncated).
        name: String,
        /// The limit.
        limit: usize,
    },
    /// A label value longer than `label_value_length_limit`.
    #[error("label_value_length_limit exceeded (metric: {metric}, label: {name}, value length: {len}, limit: {limit})")]
    LabelValue {
        /// The metric (truncated).
        metric: String,
        /// The label name (truncated).
        name: String,
        /// The value's length in bytes.
        len: usize,
        /// The limit.
        limit: usize,
    },
}

impl LimitExceeded {
    /// The `reason` label of the scrape failure counter (the setting's name).
    pub fn reason(&self) -> &'static str {
        match self {
            LimitExceeded::Samples { .. } => "sample_limit",
            LimitExceeded::Labels { .. } => "label_limit",
            LimitExceeded::LabelName { .. } => "label_name_length_limit",
            LimitExceeded::LabelValue { .. } => "label_value_length_limit",
        }
    }
}

/// Why [`parse_limited`] refused an exposition.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseFailure {
    /// A malformed line.
    #[error(transparent)]
    Malformed(#[from] ParseError),
    /// A limit was exceeded (at this line).
    #[error("line {line}: {limit}")]
    Limit {
        /// 1-based line number.
        line: usize,
        /// Which limit.
        limit: LimitExceeded,
    },
}

/// Parses UTF-8 bytes under `limits`.
pub fn parse_bytes_limited<'a>(
    body: &'a [u8],
    format: Format,
    limits: &Limits,
) -> Result<Exposition<'a>, ParseFailure> {
    match std::str::from_utf8(body) {
        Ok(text) => parse_limited(text, format, limits),
        Err(_) => parse_bytes(body, format).map_err(ParseFailure::Malformed),
    }
}

/// Parses an exposition.
pub fn parse(text: &str, format: Format) -> Result<Exposition<'_>, ParseError> {
    parse_limited(text, format, &Limits::default()).map_err(|e| match e {
        ParseFailure::Malformed(e) => e,
        ParseFailure::Limit { line, limit } => ParseError { line, message: limit.to_string() },
    })
}

/// Parses an exposition, stopping at the first sample over `limits`.
pub fn parse_limited<'a>(text: &'a str, format: Format, limits: &Limits) -> Result<Exposition<'a>, ParseFailure> {
    let mut p = Parser {
        format,
        families: Vec::new(),
        index: HashMap::new(),
        current: None,
        limits: *limits,
        samples: 0,
        exceeded: None,
    };
    let mut eof_at = None;
    for (i, raw) in text.split('\n').enumerate() {
        let line_no = i + 1;
        let line = raw.strip_suffix('\r').unwrap_or(raw).trim_start_matches([' ', '\t']);
        if let Some(at) = eof_at {
            if line.is_empty() {
                continue;
            }
            return Err(ParseError { line: line_no, message: format!("content after # EOF (line {at})") }.into());
        }
        if line.is_empty() {
            continue;
        }
        let r = if line.starts_with('#') {
            match p.comment(line) {
                Ok(true) => {
                    eof_at = Some(line_no);
                    Ok(())
                }
                Ok(false) => Ok(()),
                Err(e) => Err(e),
            }
        } else {
            p.sample(line, line_no)
        };
        if let Err(message) = r {
            return Err(match p.exceeded.take() {
                Some(limit) => ParseFailure::Limit { line: line_no, limit },
                None => ParseFailure::Malformed(ParseError { line: line_no, message }),
            });
        }
    }
    if format == Format::OpenMetrics && eof_at.is_none() {
        let line = text.lines().count().max(1);
        return Err(ParseError { line, message: "OpenMetrics exposition without # EOF".into() }.into());
    }
    let mut families = p.families;
    fold_created_gauges(&mut families);
    Ok(Exposition { format, families })
}

struct Parser<'a> {
    format: Format,
    families: Vec<Family<'a>>,
    index: HashMap<Cow<'a, str>, usize>,
    current: Option<usize>,
    limits: Limits,
    samples: usize,
    exceeded: Option<LimitExceeded>,
}

/// A cursor over one line.
struct Cursor<'a> {
    s: &'a str,
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn peek(&self) -> Option<u8> {
        self.s.as_bytes().get(self.pos).copied()
    }

    fn skip_ws(&mut self) -> bool {
        let start = self.pos;
        while matches!(self.peek(), Some(b' ' | b'\t')) {
            self.pos += 1;
        }
        self.pos > start
    }

    fn rest(&self) -> &'a str {
        self.s.get(self.pos..).unwrap_or("")
    }

    /// A token up to the next space or tab.
    fn token(&mut self) -> &'a str {
        let start = self.pos;
        while !matches!(self.peek(), None | Some(b' ' | b'\t')) {
            self.pos += 1;
        }
        self.s.get(start..self.pos).unwrap_or("")
    }

    /// A bare metric name `[a-zA-Z_:][a-zA-Z0-9_:]*` (empty when none).
    fn metric_name(&mut self) -> &'a str {
        let start = self.pos;
        if matches!(self.peek(), Some(c) if c.is_ascii_alphabetic() || c == b'_' || c == b':') {
            self.pos += 1;
            while matches!(self.peek(), Some(c) if c.is_ascii_alphanumeric() || c == b'_' || c == b':') {
                self.pos += 1;
            }
        }
        self.s.get(start..self.pos).unwrap_or("")
    }

    /// A bare label name `[a-zA-Z_][a-zA-Z0-9_]*` (empty when none).
    fn label_name(&mut self) -> &'a str {
        let start = self.pos;
        if matches!(self.peek(), Some(c) if c.is_ascii_alphabetic() || c == b'_') {
            self.pos += 1;
            while matches!(self.peek(), Some(c) if c.is_ascii_alphanumeric() || c == b'_') {
                self.pos += 1;
            }
        }
        self.s.get(start..self.pos).unwrap_or("")
    }

    /// A double-quoted string; the cursor is on the opening quote.
    fn quoted(&mut self) -> Result<Cow<'a, str>, String> {
        self.pos += 1;
        let start = self.pos;
        let bytes = self.s.as_bytes();
        let mut escaped = false;
        while let Some(&c) = bytes.get(self.pos) {
            match c {
                b'"' => {
                    let raw = self.s.get(start..self.pos).unwrap_or("");
                    self.pos += 1;
                    return Ok(if escaped { Cow::Owned(unescape(raw, true)) } else { Cow::Borrowed(raw) });
                }
                b'\\' => {
                    escaped = true;
                    self.pos += 2;
                }
                _ => self.pos += 1,
            }
        }
        Err("unterminated quoted string".into())
    }
}

/// Undoes `\\`, `\n` and (when `quote`) `\"`; other escapes are kept as written.
fn unescape(raw: &str, quote: bool) -> String {
    let mut out = String::with_capacity(raw.len());
    let mut chars = raw.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('\\') => out.push('\\'),
            Some('n') => out.push('\n'),
            Some('"') if quote => out.push('"'),
            Some(other) => {
                out.push('\\');
                out.push(other);
            }
            None => out.push('\\'),
        }
    }
    out
}

fn parse_value(s: &str) -> Result<f64, String> {
    if s.is_empty() {
        return Err("missing value".into());
    }
    // Rust accepts the spellings Go's ParseFloat does (NaN, +Inf, -Inf, Inf, exponents); it
    // also takes `infinity`, which Go takes too. Reject underscores and hex explicitly.
    if s.contains('_') || s.contains(['x', 'X']) {
        return Err(format!("invalid value {s:?}"));
    }
    s.parse::<f64>().map_err(|_| format!("invalid value {s:?}"))
}

fn parse_timestamp(s: &str, format: Format) -> Result<i64, String> {
    match format {
        Format::Text => {
            let ms: i64 = s.parse().map_err(|_| format!("invalid timestamp {s:?} (integer milliseconds expected)"))?;
            ms.checked_mul(1_000_000).ok_or_else(|| format!("timestamp {s} out of range"))
        }
        Format::OpenMetrics => {
            let secs = parse_value(s).map_err(|_| format!("invalid timestamp {s:?} (seconds expected)"))?;
            if !secs.is_finite() || secs.abs() >= 9.2e9 {
                return Err(format!("timestamp {s} out of range"));
            }
            // Whole seconds and the fraction apart, so that 1700000000.25 is exact.
            let whole = secs.trunc();
            Ok(whole as i64 * 1_000_000_000 + ((secs - whole) * 1e9).round() as i64)
        }
    }
}

impl<'a> Parser<'a> {
    /// Handles a `#` line; `Ok(true)` for `# EOF`.
    fn comment(&mut self, line: &'a str) -> Result<bool, String> {
        let mut c = Cursor { s: line, pos: 1 };
        c.skip_ws();
        let word = c.token();
        let kind = match word {
            "EOF" if c.rest().trim().is_empty() => return Ok(true),
            "HELP" | "TYPE" | "UNIT" => word,
            _ => return Ok(false), // a plain comment
        };
        if !c.skip_ws() {
            return Err(format!("{kind} line without a metric name"));
        }
        let name: Cow<'a, str> = if c.peek() == Some(b'"') {
            c.quoted()?
        } else {
            let n = c.metric_name();
            if n.is_empty() || !matches!(c.peek(), None | Some(b' ' | b'\t')) {
                return Err(format!("invalid metric name in {kind} line"));
            }
            Cow::Borrowed(n)
        };
        let had_space = c.skip_ws();
        let text = c.rest();
        let idx = self.family(name.clone());
        self.current = Some(idx);
        let fam = &mut self.families[idx];
        match kind {
            "HELP" => {
                if fam.help.is_some() {
                    return Err(format!("second HELP line for {name}"));
                }
                let quote = self.format == Format::OpenMetrics;
                fam.help =
                    Some(if text.contains('\\') { Cow::Owned(unescape(text, quote)) } else { Cow::Borrowed(text) });
            }
            "TYPE" => {
                if !had_space {
                    return Err(format!("TYPE line for {name} without a type"));
                }
                let k = Kind::parse(text.trim_end())
                    .ok_or_else(|| format!("unknown metric type {:?} for {name}", text.trim_end()))?;
                if fam.typed {
                    return Err(format!("second TYPE line for {name}"));
                }
                if !fam.samples.is_empty() {
                    return Err(format!("TYPE line for {name} after its samples"));
                }
                fam.kind = k;
                fam.typed = true;
            }
            _ => {
                if fam.unit.is_some() {
                    return Err(format!("second UNIT line for {name}"));
                }
                fam.unit = Some(Cow::Borrowed(text.trim_end()));
            }
        }
        Ok(false)
    }

    /// The index of the family named `name`, created (untyped) if new.
    fn family(&mut self, name: Cow<'a, str>) -> usize {
        if let Some(&i) = self.index.get(&name) {
            return i;
        }
        let i = self.families.len();
        self.families.push(Family {
            name: name.clone(),
            kind: Kind::Unknown,
            help: None,
            unit: None,
            samples: Vec::new(),
            typed: false,
        });
        self.index.insert(name, i);
        i
    }

    /// The family and suffix a sample name belongs to.
    fn resolve(&mut self, name: Cow<'a, str>) -> Result<(usize, Suffix), String> {
        if let Some(c) = self.current
            && let Some(s) = matches_family(&self.families[c], &name)
        {
            return Ok((c, s));
        }
        if let Some(&i) = self.index.get(name.as_ref())
            && self.families[i].kind.accepts(Suffix::None)
        {
            self.current = Some(i);
            return Ok((i, Suffix::None));
        }
        for (text, suffix) in SUFFIXES {
            if let Some(base) = name.strip_suffix(text)
                && let Some(&i) = self.index.get(base)
                && self.families[i].typed
                && self.families[i].kind.accepts(suffix)
            {
                self.current = Some(i);
                return Ok((i, suffix));
            }
        }
        let i = self.family(name.clone());
        let fam = &self.families[i];
        if !fam.kind.accepts(Suffix::None) {
            return Err(format!("sample {name} does not fit the {:?} family of that name", fam.kind));
        }
        self.current = Some(i);
        Ok((i, Suffix::None))
    }

    fn sample(&mut self, line: &'a str, line_no: usize) -> Result<(), String> {
        let mut c = Cursor { s: line, pos: 0 };
        let mut name: Option<Cow<'a, str>> = None;
        let bare = c.metric_name();
        if !bare.is_empty() {
            name = Some(Cow::Borrowed(bare));
        }
        let mut labels: Vec<Label<'a>> = Vec::new();
        match c.peek() {
            Some(b'{') => {
                c.pos += 1;
                self.labels(&mut c, &mut name, &mut labels)?;
            }
            Some(b' ' | b'\t') if name.is_some() => {}
            _ => return Err(format!("invalid metric name at {:?}", truncate(line))),
        }
        let Some(name) = name else { return Err("sample without a metric name".into()) };
        self.check_limits(&name, &labels)?;
        c.skip_ws();
        let value = parse_value(c.token())?;
        c.skip_ws();
        let mut timestamp_ns = None;
        match c.peek() {
            None => {}
            Some(b'#') => {} // an exemplar: skipped
            Some(_) => {
                timestamp_ns = Some(parse_timestamp(c.token(), self.format)?);
                c.skip_ws();
                match c.peek() {
                    None | Some(b'#') => {}
                    Some(_) => return Err(format!("unexpected {:?} after the timestamp", truncate(c.rest()))),
                }
            }
        }
        let (fi, suffix) = self.resolve(name.clone())?;
        let kind = self.families[fi].kind;
        let bound = match (kind, suffix) {
            (Kind::Histogram, Suffix::Bucket) => Some(take_bound(&mut labels, "le", &name)?),
            (Kind::Summary, Suffix::None) => Some(take_bound(&mut labels, "quantile", &name)?),
            _ => None,
        };
        self.families[fi].samples.push(Sample { suffix, labels, bound, value, timestamp_ns, line: line_no });
        Ok(())
    }

    /// Counts the sample and checks it against the limits (before its family is created).
    fn check_limits(&mut self, name: &str, labels: &[Label<'a>]) -> Result<(), String> {
        let l = self.limits;
        self.samples += 1;
        let metric = || truncate(name).to_string();
        let exceeded = if l.sample_limit > 0 && self.samples > l.sample_limit {
            Some(LimitExceeded::Samples { limit: l.sample_limit })
        } else if l.label_limit > 0 && labels.len() + 1 + l.base_labels > l.label_limit {
            Some(LimitExceeded::Labels {
                metric: metric(),
                count: labels.len() + 1 + l.base_labels,
                limit: l.label_limit,
            })
        } else {
            labels.iter().find_map(|lb| {
                if l.label_name_length_limit > 0 && lb.name.len() > l.label_name_length_limit {
                    Some(LimitExceeded::LabelName {
                        metric: metric(),
                        name: truncate(&lb.name).to_string(),
                        limit: l.label_name_length_limit,
                    })
                } else if l.label_value_length_limit > 0 && lb.value.len() > l.label_value_length_limit {
                    Some(LimitExceeded::LabelValue {
                        metric: metric(),
                        name: truncate(&lb.name).to_string(),
                        len: lb.value.len(),
                        limit: l.label_value_length_limit,
                    })
                } else {
                    None
                }
            })
        };
        match exceeded {
            Some(e) => {
                let m = e.to_string();
                self.exceeded = Some(e);
                Err(m)
            }
            None => Ok(()),
        }
    }

    /// Reads a label set after its `{`, up to and including `}`.
    fn labels(
        &self,
        c: &mut Cursor<'a>,
        name: &mut Option<Cow<'a, str>>,
        labels: &mut Vec<Label<'a>>,
    ) -> Result<(), String> {
        loop {
            c.skip_ws();
            match c.peek() {
                Some(b'}') => {
                    c.pos += 1;
                    return Ok(());
                }
                None => return Err("unterminated label set".into()),
                _ => {}
            }
            let lname: Cow<'a, str> = if c.peek() == Some(b'"') {
                let q = c.quoted()?;
                c.skip_ws();
                if matches!(c.peek(), Some(b',' | b'}')) {
                    // A quoted metric name inside the braces.
                    if name.is_some() {
                        return Err(format!("second metric name {q:?} in the label set"));
                    }
                    *name = Some(q);
                    if c.peek() == Some(b',') {
                        c.pos += 1;
                    }
                    continue;
                }
                q
            } else {
                let n = c.label_name();
                if n.is_empty() {
                    return Err(format!("invalid label name at {:?}", truncate(c.rest())));
                }
                Cow::Borrowed(n)
            };
            c.skip_ws();
            if c.peek() != Some(b'=') {
                return Err(format!("expected '=' after label name {lname}"));
            }
            c.pos += 1;
            c.skip_ws();
            if c.peek() != Some(b'"') {
                return Err(format!("expected '\"' to start the value of label {lname}"));
            }
            let value = c.quoted()?;
            if labels.iter().any(|l| l.name == lname) {
                return Err(format!("duplicate label {lname}"));
            }
            labels.push(Label { name: lname, value });
            c.skip_ws();
            match c.peek() {
                Some(b',') => c.pos += 1,
                Some(b'}') => {}
                None => return Err("unterminated label set".into()),
                Some(_) => return Err(format!("expected ',' or '}}' at {:?}", truncate(c.rest()))),
            }
        }
    }
}

/// The suffix of `name` within family `f`, if the name belongs to it.
fn matches_family(f: &Family<'_>, name: &str) -> Option<Suffix> {
    let rest = name.strip_prefix(f.name.as_ref())?;
    if rest.is_empty() {
        return f.kind.accepts(Suffix::None).then_some(Suffix::None);
    }
    if !f.typed {
        return None;
    }
    SUFFIXES.iter().find(|(t, s)| rest == *t && f.kind.accepts(*s)).map(|(_, s)| *s)
}

/// Removes label `which` and parses it as a float.
fn take_bound(labels: &mut Vec<Label<'_>>, which: &str, name: &str) -> Result<f64, String> {
    let i = labels.iter().position(|l| l.name == which).ok_or_else(|| format!("{name} has no {which} label"))?;
    let l = labels.remove(i);
    parse_value(&l.value).map_err(|_| format!("{name}: invalid {which} {:?}", l.value))
}

fn truncate(s: &str) -> &str {
    match s.char_indices().nth(40) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

/// Folds prometheus_client's text-format `x_created` gauge families into the counter
/// (`x_total`), histogram or summary (`x`) they describe.
fn fold_created_gauges(families: &mut Vec<Family<'_>>) {
    if !families.iter().any(|f| f.name.ends_with("_created")) {
        return;
    }
    let index: HashMap<&str, usize> = families.iter().enumerate().map(|(i, f)| (f.name.as_ref(), i)).collect();
    let moves: Vec<(usize, usize)> = families
        .iter()
        .enumerate()
        .filter(|(_, f)| matches!(f.kind, Kind::Gauge | Kind::Unknown))
        .filter_map(|(i, f)| {
            let base = f.name.strip_suffix("_created")?;
            let counter =
                index.get(format!("{base}_total").as_str()).copied().filter(|&t| families[t].kind == Kind::Counter);
            let other = || {
                index
                    .get(base)
                    .copied()
                    .filter(|&t| matches!(families[t].kind, Kind::Counter | Kind::Histogram | Kind::Summary))
            };
            Some((i, counter.or_else(other)?))
        })
        .collect();
    if moves.is_empty() {
        return;
    }
    let mut removed = vec![false; families.len()];
    for (from, to) in moves {
        let samples = std::mem::take(&mut families[from].samples);
        families[to].samples.extend(samples.into_iter().map(|s| Sample { suffix: Suffix::Created, ..s }));
        removed[from] = true;
    }
    let mut i = 0;
    families.retain(|_| {
        let keep = !removed[i];
        i += 1;
        keep
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(text: &str, format: Format) -> Exposition<'_> {
        parse(text, format).unwrap_or_else(|e| panic!("{e}\n{text}"))
    }

    #[test]
    fn names_with_colons_labels_and_escapes() {
        let e = one(
            "# HELP vllm:x Help with \\\\ and \\n.\n# TYPE vllm:x gauge\n\
             vllm:x{model_name=\"a \\\"b\\\" \\\\ c\\nd\",engine=\"0\",} 0.5\n",
            Format::Text,
        );
        assert_eq!(e.families.len(), 1);
        let f = &e.families[0];
        assert_eq!(f.name, "vllm:x");
        assert_eq!(f.kind, Kind::Gauge);
        assert_eq!(f.help.as_deref(), Some("Help with \\ and \n."));
        let s = &f.samples[0];
        assert_eq!(s.labels[0].value, "a \"b\" \\ c\nd");
        assert_eq!(s.labels[1].name, "engine");
        assert_eq!(s.value, 0.5);
        assert_eq!(s.line, 3);
    }

    #[test]
    fn special_values_and_timestamps() {
        let e = one("a NaN\nb +Inf 1700000000123\nc -Inf\nd 1e-3 -5\n", Format::Text);
        let v: Vec<f64> = e.families.iter().map(|f| f.samples[0].value).collect();
        assert!(v[0].is_nan());
        assert_eq!(&v[1..], &[f64::INFINITY, f64::NEG_INFINITY, 0.001]);
        assert_eq!(e.families[1].samples[0].timestamp_ns, Some(1_700_000_000_123_000_000));
        assert_eq!(e.families[3].samples[0].timestamp_ns, Some(-5_000_000));
        let e = one("# TYPE t gauge\nt 1 1700000000.25\n# EOF\n", Format::OpenMetrics);
        assert_eq!(e.families[0].samples[0].timestamp_ns, Some(1_700_000_000_250_000_000));
    }

    #[test]
    fn families_group_by_suffix() {
        let text = "# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_bucket{le=\"+Inf\"} 2\nh_sum 3\nh_count 2\n\
                    # TYPE s summary\ns{quantile=\"0.5\"} 1\ns_sum 2\ns_count 3\n\
                    # TYPE c_total counter\nc_total 4\n# TYPE c_created gauge\nc_created 1.5e9\n\
                    h_sum_x 1\n";
        let e = one(text, Format::Text);
        let names: Vec<&str> = e.families.iter().map(|f| f.name.as_ref()).collect();
        assert_eq!(names, ["h", "s", "c_total", "h_sum_x"]);
        let h = &e.families[0];
        let sfx: Vec<Suffix> = h.samples.iter().map(|s| s.suffix).collect();
        assert_eq!(sfx, [Suffix::Bucket, Suffix::Bucket, Suffix::Sum, Suffix::Count]);
        assert_eq!(h.samples[1].bound, Some(f64::INFINITY));
        assert!(h.samples[0].labels.is_empty(), "le is moved out of the labels");
        assert_eq!(e.families[1].samples[0].bound, Some(0.5));
        let c = &e.families[2];
        assert_eq!(c.samples.len(), 2);
        assert_eq!(c.samples[1].suffix, Suffix::Created);
        assert_eq!(c.samples[1].value, 1.5e9);
        assert_eq!(e.sample_count(), 10);
    }

    #[test]
    fn openmetrics_counters_exemplars_and_eof() {
        let text = "# TYPE x counter\n# UNIT x bytes\nx_total{a=\"1\"} 5 # {trace_id=\"t\"} 1 1.5\n\
                    x_created{a=\"1\"} 1.6e9\n# TYPE i info\ni_info{v=\"2\"} 1\n# EOF\n";
        let e = one(text, Format::OpenMetrics);
        let x = &e.families[0];
        assert_eq!(x.unit.as_deref(), Some("bytes"));
        assert_eq!(x.samples[0].suffix, Suffix::Total);
        assert_eq!(x.samples[0].value, 5.0);
        assert_eq!(x.samples[0].timestamp_ns, None);
        assert_eq!(x.samples[1].suffix, Suffix::Created);
        assert_eq!(e.families[1].samples[0].suffix, Suffix::Info);
        let bad = parse("# TYPE x counter\nx_total 1\n", Format::OpenMetrics).unwrap_err();
        assert!(bad.message.contains("EOF"), "{bad}");
        let bad = parse("x 1\n# EOF\ny 2\n", Format::OpenMetrics).unwrap_err();
        assert_eq!(bad.line, 3);
    }

    #[test]
    fn quoted_names() {
        let e = one("{\"my.metric\", \"a.b\"=\"c\"} 1\n", Format::Text);
        assert_eq!(e.families[0].name, "my.metric");
        assert_eq!(e.families[0].samples[0].labels[0].name, "a.b");
    }

    #[test]
    fn errors_carry_line_numbers() {
        let cases = [
            ("ok 1\nbad{a=\"1\" 2\n", 2, "expected ','"),
            ("ok 1\n\nx{a=1} 2\n", 3, "expected '\"'"),
            ("x 1\nx{a=\"1\",a=\"2\"} 2\n", 2, "duplicate label"),
            ("# TYPE x gauge\n# TYPE x counter\n", 2, "second TYPE"),
            ("x 1\n# TYPE x gauge\n", 2, "after its samples"),
            ("# TYPE x foo\n", 1, "unknown metric type"),
            ("# TYPE h histogram\nh_bucket 1\n", 2, "no le label"),
            ("# TYPE h histogram\nh_bucket{le=\"x\"} 1\n", 2, "invalid le"),
            ("# TYPE s summary\ns 1\n", 2, "no quantile"),
            ("x 1 2 3\n", 1, "after the timestamp"),
            ("x one\n", 1, "invalid value"),
            ("x\n", 1, "invalid metric name"),
            ("x 1 1.5\n", 1, "invalid timestamp"),
            ("1x 2\n", 1, "invalid metric name"),
            ("x{a=\"1\n", 1, "unterminated"),
            ("# HELP\n", 1, "without a metric name"),
        ];
        for (text, line, msg) in cases {
            let e = parse(text, Format::Text).unwrap_err();
            assert_eq!(e.line, line, "{text:?}: {e}");
            assert!(e.message.contains(msg), "{text:?}: {e}");
        }
        let e = parse_bytes(b"a 1\nb 2\n\xff 3\n", Format::Text).unwrap_err();
        assert_eq!((e.line, e.message.as_str()), (3, "invalid UTF-8"));
    }

    #[test]
    fn content_types() {
        assert_eq!(
            Format::from_content_type("application/openmetrics-text; version=1.0.0; charset=utf-8"),
            Format::OpenMetrics
        );
        assert_eq!(Format::from_content_type("text/plain; version=0.0.4"), Format::Text);
        assert_eq!(Format::from_content_type(""), Format::Text);
    }
}

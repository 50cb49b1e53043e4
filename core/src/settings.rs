//! Setting types shared by components: Go-style durations, endpoints, exporter queue / retry / TLS.

use serde::{Deserialize, Deserializer};
use std::fmt;
use std::time::Duration;

/// A duration written as otelcol writes it: `200ms`, `5s`, `1m30s`, `1.5h` (Go's syntax), plus
/// days and weeks (`7d`, `1w2d`); see [`parse_go_duration`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct GoDuration(pub Duration);

/// Why a duration string is malformed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid duration {input:?}: {reason}")]
pub struct DurationError {
    /// The text as given.
    pub input: String,
    /// What is wrong with it.
    pub reason: String,
}

impl DurationError {
    fn new(input: &str, reason: impl Into<String>) -> Self {
        DurationError { input: input.to_string(), reason: reason.into() }
    }
}

/// The units a duration string may use, for error messages.
const UNITS: &str = "ns, us, ms, s, m, h, d, w; e.g. 200ms, 5s, 1m30s, 7d";

/// The longest duration accepted: Go's `time.Duration` maximum, 2^63 - 1 nanoseconds (about 292 years).
pub const MAX_DURATION: Duration = Duration::from_nanos(i64::MAX as u64);

/// Nanoseconds in one unit of a duration string.
fn unit_nanos(unit: &str) -> Option<u128> {
    Some(match unit {
        "ns" => 1,
        "us" | "µs" | "μs" => 1_000,
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        "m" => 60 * 1_000_000_000,
        "h" => 3_600 * 1_000_000_000,
        "d" => 86_400 * 1_000_000_000,
        "w" => 7 * 86_400 * 1_000_000_000,
        _ => return None,
    })
}

/// Parses a duration: Go's `time.ParseDuration` syntax (a sequence of decimal numbers, each with
/// an optional fraction and a unit: `300ms`, `1.5h`, `2h45m`; units `ns`, `us`/`µs`, `ms`, `s`,
/// `m`, `h`) plus `d` (24h) and `w` (7d), e.g. `7d`, `1w2d`. `0` alone is allowed; a leading `+`
/// is ignored. Negative durations, a number without a unit, and durations above
/// [`MAX_DURATION`] are refused. The one parser for every duration the workspace reads.
pub fn parse_go_duration(s: &str) -> Result<Duration, DurationError> {
    let fail = |reason: &str| DurationError::new(s, reason);
    let too_long = || fail("longer than the maximum, 2562047h47m16.854775807s (Go's limit)");
    let t = s.trim();
    let t = t.strip_prefix('+').unwrap_or(t);
    if t == "0" {
        return Ok(Duration::ZERO);
    }
    if t.is_empty() {
        return Err(fail(&format!("empty (expected numbers with units: {UNITS})")));
    }
    if t.starts_with('-') {
        return Err(fail("negative durations are not allowed"));
    }
    let max = MAX_DURATION.as_nanos();
    let mut rest = t;
    let mut total: u128 = 0;
    while !rest.is_empty() {
        // Integer part (exact; overflow is an error).
        let int_len = rest.bytes().take_while(u8::is_ascii_digit).count();
        let mut whole: u128 = 0;
        for b in rest[..int_len].bytes() {
            whole = whole * 10 + u128::from(b - b'0');
            if whole > max {
                return Err(too_long());
            }
        }
        rest = &rest[int_len..];
        // Fraction: digits past the 18th cannot matter at nanosecond resolution and are dropped.
        let (mut frac, mut scale, mut frac_len) = (0u128, 1u128, 0usize);
        if let Some(r) = rest.strip_prefix('.') {
            frac_len = r.bytes().take_while(u8::is_ascii_digit).count();
            for b in r[..frac_len].bytes().take(18) {
                frac = frac * 10 + u128::from(b - b'0');
                scale *= 10;
            }
            rest = &r[frac_len..];
        }
        if int_len == 0 && frac_len == 0 {
            return Err(fail(&format!("expected a number before {rest:?} ({UNITS})")));
        }
        let unit_len = rest.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(rest.len());
        let unit = match &rest[..unit_len] {
            "" => return Err(fail(&format!("missing unit ({UNITS})"))),
            u => unit_nanos(u).ok_or_else(|| fail(&format!("unknown unit {u:?} ({UNITS})")))?,
        };
        rest = &rest[unit_len..];
        total += whole * unit + frac * unit / scale;
        if total > max {
            return Err(too_long());
        }
    }
    Ok(Duration::from_nanos(total as u64))
}

/// Parses a duration as [`parse_go_duration`] does, or a bare number of seconds (`2.5`, `30`),
/// for command-line flags and scenario files that accept either.
pub fn parse_duration_or_secs(s: &str) -> Result<Duration, DurationError> {
    let t = s.trim();
    if let Ok(secs) = t.parse::<f64>() {
        return Duration::try_from_secs_f64(secs)
            .ok()
            .filter(|d| *d <= MAX_DURATION)
            .ok_or_else(|| DurationError::new(s, "seconds must be a number from 0 to 9223372036"));
    }
    parse_go_duration(t)
}

impl<'de> Deserialize<'de> for GoDuration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            S(String),
            N(u64),
        }
        match Raw::deserialize(d)? {
            Raw::S(s) => parse_go_duration(&s).map(GoDuration).map_err(serde::de::Error::custom),
            // A bare integer is nanoseconds, as in Go's time.Duration; 0 is common.
            Raw::N(n) => Ok(GoDuration(Duration::from_nanos(n))),
        }
    }
}

impl fmt::Display for GoDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

/// A `host:port` listen address (`0.0.0.0:4317`, `localhost:4318`, `[::1]:4317`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPort {
    /// Host name or IP literal (without brackets).
    pub host: String,
    /// TCP port.
    pub port: u16,
}

/// Why an endpoint is malformed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid endpoint {0:?}: {1}")]
pub struct EndpointError(pub String, pub &'static str);

impl HostPort {
    /// Parses `host:port`.
    pub fn parse(s: &str) -> Result<Self, EndpointError> {
        let e = |why| EndpointError(s.to_string(), why);
        if s.contains("://") {
            return Err(e("a listen endpoint is host:port, without a scheme"));
        }
        let (host, port) = if let Some(rest) = s.strip_prefix('[') {
            let (h, p) = rest.split_once("]:").ok_or_else(|| e("expected [ipv6]:port"))?;
            (h, p)
        } else {
            s.rsplit_once(':').ok_or_else(|| e("expected host:port"))?
        };
        if host.contains(':') && !s.starts_with('[') {
            return Err(e("IPv6 hosts need brackets: [::1]:4317"));
        }
        if host.chars().any(|c| c.is_whitespace() || c == '/') {
            return Err(e("the host has invalid characters"));
        }
        let port: u16 = port.parse().map_err(|_| e("the port must be a number from 0 to 65535"))?;
        Ok(HostPort { host: host.to_string(), port })
    }

    /// `host:port` with brackets for IPv6, suitable for binding.
    pub fn to_bind_string(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            let h = if self.host.is_empty() { "0.0.0.0" } else { &self.host };
            format!("{}:{}", h, self.port)
        }
    }
}

impl<'de> Deserialize<'de> for HostPort {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        HostPort::parse(&s).map_err(serde::de::Error::custom)
    }
}

impl fmt::Display for HostPort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_bind_string())
    }
}

/// An exporter's destination: `http(s)://host:port[/path]` or, for gRPC, bare `host:port`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// `http` or `https`, when given.
    pub scheme: Option<String>,
    /// Host and port (port defaulted from the scheme when absent).
    pub authority: String,
    /// Path, possibly empty.
    pub path: String,
}

impl Endpoint {
    /// Parses an exporter endpoint.
    pub fn parse(s: &str) -> Result<Self, EndpointError> {
        let e = |why| EndpointError(s.to_string(), why);
        let (scheme, rest) = match s.split_once("://") {
            Some((sc, rest)) => {
                if sc != "http" && sc != "https" {
                    return Err(e("the scheme must be http or https"));
                }
                (Some(sc.to_string()), rest)
            }
            None => (None, s),
        };
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        if authority.is_empty() || authority.chars().any(char::is_whitespace) {
            return Err(e("missing or invalid host"));
        }
        let authority = if authority.contains(':') && !authority.ends_with(']') {
            let hp = HostPort::parse(authority).map_err(|_| e("invalid host:port"))?;
            hp.to_bind_string()
        } else if scheme.is_none() {
            return Err(e("expected host:port or a URL with http:// or https://"));
        } else {
            let port = if scheme.as_deref() == Some("https") { 443 } else { 80 };
            format!("{authority}:{port}")
        };
        Ok(Endpoint { scheme, authority, path: path.trim_end_matches('/').to_string() })
    }

    /// `scheme://authority` with `https` when `tls_enabled` and no scheme was given.
    pub fn base_url(&self, tls_enabled: bool) -> String {
        let scheme = self.scheme.clone().unwrap_or_else(|| if tls_enabled { "https".into() } else { "http".into() });
        format!("{scheme}://{}", self.authority)
    }
}

impl<'de> Deserialize<'de> for Endpoint {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Endpoint::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// `sending_queue` settings (otelcol exporterhelper).
#[derive(Debug, Clone, PartialEq)]
pub struct QueueSettings {
    /// Whether requests are queued (true) or sent in the caller's task (false).
    pub enabled: bool,
    /// Number of workers sending from the queue concurrently.
    pub num_consumers: usize,
    /// Queue capacity, in units of `sizer`.
    pub queue_size: usize,
    /// What `queue_size` counts: requests (batches), items (spans, points, records) or bytes.
    pub sizer: QueueSizer,
    /// Make a full queue wait for room (bounded by the caller's cancellation) instead of refusing.
    pub block_on_overflow: bool,
    /// Id of a `file_storage` extension: the queue is kept on disk there (`None`: in memory).
    pub storage: Option<String>,
    /// Batching of queued requests before they are sent (`sending_queue.batch`; `None`: off).
    pub batch: Option<QueueBatchSettings>,
}

impl Default for QueueSettings {
    fn default() -> Self {
        QueueSettings {
            enabled: true,
            num_consumers: 10,
            queue_size: 1000,
            sizer: QueueSizer::Requests,
            block_on_overflow: false,
            storage: None,
            batch: None,
        }
    }
}

impl QueueSettings {
    /// Checks `sending_queue` as otelcol does: a queue that is on needs room and workers, and
    /// its batch settings must be coherent.
    pub fn check(&self) -> Result<(), crate::vocab::FieldError> {
        use crate::vocab::FieldError;
        if self.enabled && self.queue_size == 0 {
            return Err(FieldError::at("sending_queue.queue_size", "queue_size must be positive"));
        }
        if self.enabled && self.num_consumers == 0 {
            return Err(FieldError::at("sending_queue.num_consumers", "num_consumers must be positive"));
        }
        let Some(b) = &self.batch else { return Ok(()) };
        if !self.enabled {
            return Err(FieldError::at(
                "sending_queue.batch",
                "batching happens in the queue: needs sending_queue.enabled: true",
            ));
        }
        if b.flush_timeout.0.is_zero() {
            return Err(FieldError::at(
                "sending_queue.batch.flush_timeout",
                "flush_timeout must be a non-zero duration",
            ));
        }
        if b.max_size != 0 && b.max_size < b.min_size {
            return Err(FieldError::at(
                "sending_queue.batch.max_size",
                format!("max_size ({}) must be 0 (no limit) or at least min_size ({})", b.max_size, b.min_size),
            ));
        }
        if b.max_size != 0 && b.sizer != QueueSizer::Items {
            return Err(FieldError::at(
                "sending_queue.batch.max_size",
                "splitting batches at max_size is supported with sizer: items only",
            ));
        }
        let mut seen = std::collections::BTreeSet::new();
        for k in &b.partition.metadata_keys {
            if !seen.insert(k.to_ascii_lowercase()) {
                return Err(FieldError::at(
                    "sending_queue.batch.partition.metadata_keys",
                    format!("duplicate metadata key {k:?} (keys are case-insensitive)"),
                ));
            }
        }
        Ok(())
    }
}

/// `sending_queue.batch` (otelcol exporterhelper): queued requests are merged until `min_size`
/// is reached or `flush_timeout` passes since the first of them, and split at `max_size`.
/// Batching after the (persistent) queue keeps what a client was acknowledged durable, unlike
/// a `batch` processor in front of the exporter, which holds acknowledged data in memory.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueBatchSettings {
    /// Send a batch this long after its first request at the latest.
    pub flush_timeout: GoDuration,
    /// Send as soon as a batch reaches this size (in units of `sizer`).
    pub min_size: u64,
    /// Split batches larger than this (0: no limit; items only).
    pub max_size: u64,
    /// What the sizes count; from the queue's `sizer` when not given, `items` when neither is.
    pub sizer: QueueSizer,
    /// Batches are kept apart by these client metadata keys.
    pub partition: BatchPartition,
}

/// `sending_queue.batch.partition`.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BatchPartition {
    /// Client metadata keys whose values separate batches (case-insensitive).
    pub metadata_keys: Vec<String>,
}

/// `sending_queue.batch` as written.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct BatchInput {
    flush_timeout: Option<GoDuration>,
    min_size: Option<u64>,
    max_size: Option<u64>,
    sizer: Option<QueueSizer>,
    #[serde(default)]
    partition: BatchPartition,
}

impl BatchInput {
    fn resolve(self, queue_sizer: Option<QueueSizer>) -> QueueBatchSettings {
        QueueBatchSettings {
            flush_timeout: self.flush_timeout.unwrap_or(GoDuration(Duration::from_millis(200))),
            min_size: self.min_size.unwrap_or(8192),
            max_size: self.max_size.unwrap_or(0),
            sizer: self.sizer.or(queue_sizer).unwrap_or(QueueSizer::Items),
            partition: self.partition,
        }
    }
}

impl<'de> Deserialize<'de> for QueueSettings {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        QueueSettings::deserialize_over(d, QueueSettings::default())
    }
}

/// What a sending queue's `queue_size` counts (otelcol's `sizer`).
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum QueueSizer {
    /// Requests (batches), whatever their size.
    #[default]
    Requests,
    /// Items: spans, metric data points, log records.
    Items,
    /// Bytes of the encoded OTLP request.
    Bytes,
}

/// `sending_queue` as written, every key optional (for exporters with their own defaults).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct QueueInput {
    enabled: Option<bool>,
    num_consumers: Option<usize>,
    queue_size: Option<usize>,
    sizer: Option<QueueSizer>,
    block_on_overflow: Option<bool>,
    storage: Option<String>,
    /// `batch: {}` turns batching on with the defaults.
    batch: Option<BatchInput>,
}

impl QueueSettings {
    /// Deserializes `sending_queue` with `defaults` for the keys not given (e.g. one consumer).
    pub fn deserialize_over<'de, D: Deserializer<'de>>(d: D, defaults: QueueSettings) -> Result<Self, D::Error> {
        let q = QueueInput::deserialize(d)?;
        Ok(QueueSettings {
            enabled: q.enabled.unwrap_or(defaults.enabled),
            num_consumers: q.num_consumers.unwrap_or(defaults.num_consumers),
            queue_size: q.queue_size.unwrap_or(defaults.queue_size),
            sizer: q.sizer.unwrap_or(defaults.sizer),
            block_on_overflow: q.block_on_overflow.unwrap_or(defaults.block_on_overflow),
            storage: q.storage.or(defaults.storage),
            batch: match q.batch {
                Some(b) => Some(b.resolve(q.sizer)),
                None => defaults.batch,
            },
        })
    }
}

/// `retry_on_failure` settings (otelcol exporterhelper).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct RetrySettings {
    /// Whether failed sends are retried.
    pub enabled: bool,
    /// First back-off interval.
    pub initial_interval: GoDuration,
    /// Upper bound of one back-off interval.
    pub max_interval: GoDuration,
    /// Give up after this long (0 = never).
    pub max_elapsed_time: GoDuration,
    /// Back-off growth factor.
    pub multiplier: f64,
    /// Jitter factor in [0, 1].
    pub randomization_factor: f64,
}

impl Default for RetrySettings {
    fn default() -> Self {
        RetrySettings {
            enabled: true,
            initial_interval: GoDuration(Duration::from_secs(5)),
            max_interval: GoDuration(Duration::from_secs(30)),
            max_elapsed_time: GoDuration(Duration::from_secs(300)),
            multiplier: 1.5,
            randomization_factor: 0.5,
        }
    }
}

/// Client TLS settings (otelcol configtls).
#[derive(Debug, Clone, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields, default)]
pub struct TlsClientSettings {
    /// Plain-text connection (no TLS).
    pub insecure: bool,
    /// CA bundle to verify the server with (PEM).
    pub ca_file: Option<String>,
    /// Client certificate for mTLS (PEM).
    pub cert_file: Option<String>,
    /// Client key for mTLS (PEM).
    pub key_file: Option<String>,
    /// Skip server certificate verification.
    pub insecure_skip_verify: bool,
    /// Override the server name used for verification.
    pub server_name_override: Option<String>,
}

/// Payload compression for exporters.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    /// gzip (otelcol's default).
    #[default]
    Gzip,
    /// No compression.
    None,
}

/// `compression_params` (otelcol's key): the gzip level.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct CompressionParams {
    /// gzip level 1 (fastest) to 9 (smallest); default 1.
    pub level: u32,
}

impl Default for CompressionParams {
    fn default() -> Self {
        CompressionParams { level: 1 }
    }
}

impl CompressionParams {
    /// Checks the level range.
    pub fn check(&self) -> Result<(), String> {
        if (1..=9).contains(&self.level) { Ok(()) } else { Err(format!("level must be 1 to 9, got {}", self.level)) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations() {
        assert_eq!(parse_go_duration("200ms").unwrap(), Duration::from_millis(200));
        assert_eq!(parse_go_duration("1m30s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_go_duration("1.5h").unwrap(), Duration::from_secs(5400));
        assert_eq!(parse_go_duration("0").unwrap(), Duration::ZERO);
        for bad in ["", "5", "5x", "-1s", "s", "1..2s"] {
            assert!(parse_go_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn durations_with_days_and_weeks() {
        let day = Duration::from_secs(86_400);
        assert_eq!(parse_go_duration("7d").unwrap(), 7 * day);
        assert_eq!(parse_go_duration("1w2d").unwrap(), 9 * day);
        assert_eq!(parse_go_duration("1w").unwrap(), 7 * day);
        assert_eq!(parse_go_duration("1d12h").unwrap(), Duration::from_secs(129_600));
        assert_eq!(parse_go_duration("1.5d").unwrap(), Duration::from_secs(129_600));
        assert_eq!(parse_go_duration("1h30m").unwrap(), Duration::from_secs(5400));
        assert_eq!(parse_go_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_go_duration("1.5h").unwrap(), Duration::from_secs(5400));
        assert_eq!(parse_go_duration(" 2h45m ").unwrap(), Duration::from_secs(9900));
        assert_eq!(parse_go_duration("+5s").unwrap(), Duration::from_secs(5));
    }

    #[test]
    fn durations_are_exact_like_go() {
        assert_eq!(parse_go_duration("1ns").unwrap(), Duration::from_nanos(1));
        assert_eq!(parse_go_duration("1.5us").unwrap(), Duration::from_nanos(1500));
        assert_eq!(parse_go_duration("2µs").unwrap(), Duration::from_micros(2));
        assert_eq!(parse_go_duration(".5s").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_go_duration("1.s").unwrap(), Duration::from_secs(1));
        // 0.1 + 0.2 is not 0.3 in floating point; the parser is exact.
        assert_eq!(parse_go_duration("0.1s0.2s").unwrap(), Duration::from_millis(300));
        assert_eq!(parse_go_duration("1.0000000001s").unwrap(), Duration::from_secs(1));
        assert_eq!(parse_go_duration("0.123456789123456789123s").unwrap(), Duration::from_nanos(123_456_789));
        assert_eq!(parse_go_duration("9223372036854775807ns").unwrap(), MAX_DURATION);
        assert_eq!(parse_go_duration("2562047h").unwrap(), Duration::from_secs(2_562_047 * 3600));
    }

    #[test]
    fn durations_overflowing_or_malformed_are_refused() {
        for bad in [
            "9223372036854775808ns",
            "2562048h",
            "106752d",
            "15251w",
            "2562047h48m",
            "99999999999999999999999999999999999999999s",
            "1e3s",
            "7days",
            "7D",
            "1w2",
            ".",
            ".s",
            "d",
            "-7d",
            "- 7d",
            "7 d",
            "1h 30m",
            "abc",
            "0x10s",
            "inf",
            "NaN",
        ] {
            assert!(parse_go_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn duration_errors_say_what_is_wrong() {
        let reason = |s: &str| parse_go_duration(s).unwrap_err().reason;
        assert!(reason("5x").starts_with("unknown unit \"x\""), "{}", reason("5x"));
        assert!(reason("5").starts_with("missing unit"), "{}", reason("5"));
        assert!(reason("-1s").starts_with("negative"), "{}", reason("-1s"));
        assert!(reason("200000w").starts_with("longer than the maximum"), "{}", reason("200000w"));
        assert!(reason("h").starts_with("expected a number"), "{}", reason("h"));
        let e = parse_go_duration("7days").unwrap_err().to_string();
        assert!(e.starts_with("invalid duration \"7days\": unknown unit \"days\""), "{e}");
    }

    #[test]
    fn durations_or_bare_seconds() {
        assert_eq!(parse_duration_or_secs("2.5").unwrap(), Duration::from_millis(2500));
        assert_eq!(parse_duration_or_secs("5").unwrap(), Duration::from_secs(5));
        assert_eq!(parse_duration_or_secs("7d").unwrap(), Duration::from_secs(7 * 86_400));
        for bad in ["-1", "inf", "NaN", "1e30", "-1s", "x"] {
            assert!(parse_duration_or_secs(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn go_duration_deserializes_days() {
        #[derive(Deserialize)]
        struct C {
            d: GoDuration,
        }
        let c: C = serde_json::from_str(r#"{"d": "1w2d"}"#).unwrap();
        assert_eq!(c.d.0, Duration::from_secs(9 * 86_400));
        assert!(serde_json::from_str::<C>(r#"{"d": "7days"}"#).is_err());
    }

    #[test]
    fn host_ports() {
        assert_eq!(HostPort::parse("0.0.0.0:4317").unwrap().port, 4317);
        assert_eq!(HostPort::parse("[::1]:4317").unwrap().host, "::1");
        assert_eq!(HostPort::parse(":4317").unwrap().to_bind_string(), "0.0.0.0:4317");
        for bad in ["4317", "localhost:99999", "http://x:1", "::1:4317", "a b:1"] {
            assert!(HostPort::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn endpoints() {
        let e = Endpoint::parse("tempo:4317").unwrap();
        assert_eq!(e.base_url(false), "http://tempo:4317");
        let e = Endpoint::parse("https://collector.example/otlp/").unwrap();
        assert_eq!(e.authority, "collector.example:443");
        assert_eq!(e.path, "/otlp");
        for bad in ["tempo", "ftp://x:1", "http://", "host:notaport"] {
            assert!(Endpoint::parse(bad).is_err(), "{bad}");
        }
    }
}

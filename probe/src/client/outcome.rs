//! What one request did, measured on the client, and why it failed.

use crate::quality::RciValue;
use std::borrow::Cow;
use std::time::{Duration, Instant, SystemTime};

/// Why a request failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ErrorKind {
    /// No complete answer within the deadline.
    Timeout,
    /// The connection could not be made.
    Connect,
    /// An HTTP error status.
    Http(u16),
    /// The server reported an error inside the stream.
    Stream,
    /// A response that is not the expected JSON.
    Decode,
    /// The stream ended without `[DONE]` or a finish reason.
    Incomplete,
    /// The connection broke while reading.
    Transport,
    /// Stopped by the user (not counted as an error).
    Cancelled,
}

impl ErrorKind {
    /// The name used in reports and as `error.type`.
    pub fn name(self) -> Cow<'static, str> {
        match self {
            ErrorKind::Timeout => "timeout".into(),
            ErrorKind::Connect => "connect".into(),
            ErrorKind::Http(s) => format!("http_{s}").into(),
            ErrorKind::Stream => "stream_error".into(),
            ErrorKind::Decode => "decode".into(),
            ErrorKind::Incomplete => "incomplete".into(),
            ErrorKind::Transport => "transport".into(),
            ErrorKind::Cancelled => "cancelled".into(),
        }
    }
}

/// A failed request: the kind and what the server or transport said.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestError {
    /// What kind of failure.
    pub kind: ErrorKind,
    /// Details (truncated).
    pub message: String,
}

/// What one request did, measured on the client.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// When the request was sent.
    pub start: Instant,
    /// The same moment on the wall clock.
    pub start_wall: SystemTime,
    /// Time to the first output token (streaming only).
    pub ttft: Option<Duration>,
    /// Gaps between successive chunks that carried output.
    pub itl: Vec<Duration>,
    /// Time to the end of the answer.
    pub e2e: Duration,
    /// Prompt tokens (from `usage`, else estimated).
    pub input_tokens: u64,
    /// Output tokens (from `usage`, else counted from the stream or estimated).
    pub output_tokens: u64,
    /// Whether the server reported `usage`.
    pub usage_reported: bool,
    /// The answer text (kept only when asked for).
    pub text: String,
    /// The finish reason of the first choice.
    pub finish_reason: Option<String>,
    /// `id` of the response.
    pub response_id: Option<String>,
    /// `model` of the response.
    pub response_model: Option<String>,
    /// Top-K log-probabilities of the first output token.
    pub first_top_logprobs: Option<Vec<f64>>,
    /// RCI against the reference, when one was given.
    pub rci: Option<RciValue>,
    /// Set when the request failed.
    pub error: Option<RequestError>,
    /// The chunks that carried output, with their timing (only when the spec asks for them).
    pub tokens: Vec<TokenEvent>,
}

/// One streamed chunk that carried output (a whole answer is one event at its end).
#[derive(Debug, Clone, PartialEq)]
pub struct TokenEvent {
    /// Time since the request was sent.
    pub at: Duration,
    /// Its content text.
    pub text: String,
    /// Its reasoning text (`reasoning_content`), usually empty.
    pub reasoning: String,
    /// Tokens it carried (from logprobs when present, else 1).
    pub tokens: u64,
}

impl Outcome {
    /// A request's outcome before anything is known of it.
    pub(crate) fn new(start: Instant, start_wall: SystemTime) -> Outcome {
        Outcome {
            start,
            start_wall,
            ttft: None,
            itl: Vec::new(),
            e2e: Duration::ZERO,
            input_tokens: 0,
            output_tokens: 0,
            usage_reported: false,
            text: String::new(),
            finish_reason: None,
            response_id: None,
            response_model: None,
            first_top_logprobs: None,
            rci: None,
            error: None,
            tokens: Vec::new(),
        }
    }

    /// Time per output token after the first: (e2e − ttft) / (output tokens − 1).
    pub fn tpot(&self) -> Option<Duration> {
        let ttft = self.ttft?;
        if self.output_tokens < 2 || self.error.is_some() {
            return None;
        }
        Some(self.e2e.saturating_sub(ttft) / (self.output_tokens - 1).min(u32::MAX as u64) as u32)
    }

    /// Whether the request succeeded.
    pub fn ok(&self) -> bool {
        self.error.is_none()
    }
}

/// A server or transport message cut to at most 300 bytes (on a character boundary).
pub(super) fn truncate(s: &str) -> String {
    const MAX: usize = 300;
    if s.len() <= MAX {
        return s.to_string();
    }
    let mut end = MAX;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

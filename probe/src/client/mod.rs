//! The OpenAI-compatible HTTP client: request bodies for `/v1/chat/completions` and
//! `/v1/completions`, the SSE parser, and per-request timing (TTFT, ITL, e2e).
//!
//! `tgi` speaks TGI's own `/generate_stream` and `/generate` (`--api tgi`).
//!
//! Works with vLLM, TGI's Messages API and other OpenAI-compatible servers: `usage` may be
//! absent, the first chunk may carry only the role, content deltas may be empty, reasoning
//! models stream `reasoning_content`, and `data:` may come with or without a space.
//!
//! Cut by concern: `request` (what is asked), `outcome` (what one request measured), `wire`
//! (the JSON bodies sent and received), `sse` (the event-stream parser), `stream` (per-request
//! state while a stream is read) and `http` (the client that sends and times); everything
//! public is re-exported here, so `inferwatch_probe::client::X` is the path to use.

mod http;
mod outcome;
mod request;
mod sse;
mod stream;
mod tgi;
mod wire;

pub use http::{Client, install_crypto_provider};
pub use outcome::{ErrorKind, Outcome, RequestError, TokenEvent};
pub use request::{Api, ClientConfig, Message, Prompt, RequestSpec, api_url, estimate_tokens};
pub use sse::SseParser;

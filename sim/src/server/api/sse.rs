//! The streamed response: SSE events (`data: {json}\n\n`, ending with `data: [DONE]`) built
//! from engine events as they arrive.

use std::collections::VecDeque;
use std::convert::Infallible;

use axum::body::{Body, Bytes};
use axum::http::{HeaderValue, header};
use axum::response::Response;
use serde::Serialize;
use tokio::sync::mpsc;

use super::error::unavailable;
use super::handlers::AbortGuard;
use super::output::Output;
use crate::server::driver::ReqEvent;

/// One SSE event: `data: {json}\n\n`.
pub(super) fn sse<T: Serialize>(v: &T) -> Bytes {
    let mut buf = b"data: ".to_vec();
    if serde_json::to_writer(&mut buf, v).is_err() {
        buf.truncate(6);
        buf.extend_from_slice(br#"{"error": {"message": "cannot serialise the chunk", "type": "InternalServerError", "param": null, "code": 500}}"#);
    }
    buf.extend_from_slice(b"\n\n");
    Bytes::from(buf)
}

pub(super) struct StreamState {
    pub(super) out: Output,
    pub(super) rx: mpsc::UnboundedReceiver<ReqEvent>,
    pub(super) guard: AbortGuard,
    pub(super) pending: VecDeque<Bytes>,
    pub(super) done: bool,
}

impl StreamState {
    pub(super) fn on_event(&mut self, ev: Option<ReqEvent>) {
        match ev {
            Some(ReqEvent::Token { choice, index, .. }) => {
                self.out.token_chunks(choice as usize, index, &mut self.pending)
            }
            Some(ReqEvent::Finished { choice, record }) => {
                if let Some(err) = self.out.finished(choice as usize, record.finish_reason) {
                    self.pending.push_back(sse(&err.body()));
                    self.end();
                } else if self.out.remaining == 0 {
                    if self.out.plan.include_usage {
                        self.pending.push_back(self.out.usage_chunk());
                    }
                    self.end();
                }
            }
            None => {
                self.pending.push_back(sse(&unavailable().body()));
                self.end();
            }
        }
    }

    pub(super) fn end(&mut self) {
        self.pending.push_back(Bytes::from_static(b"data: [DONE]\n\n"));
        self.guard.armed = self.out.remaining > 0;
        self.done = true;
    }
}

pub(super) fn stream_response(out: Output, rx: mpsc::UnboundedReceiver<ReqEvent>, guard: AbortGuard) -> Response {
    let state = StreamState { out, rx, guard, pending: VecDeque::new(), done: false };
    let stream = futures::stream::unfold(state, |mut s| async move {
        loop {
            if let Some(b) = s.pending.pop_front() {
                return Some((Ok::<Bytes, Infallible>(b), s));
            }
            if s.done {
                return None;
            }
            let ev = s.rx.recv().await;
            s.on_event(ev);
        }
    });
    let mut r = Response::new(Body::from_stream(stream));
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream; charset=utf-8"));
    r.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    r
}

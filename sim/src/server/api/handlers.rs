//! The axum handlers: `/v1/chat/completions`, `/v1/completions` and `/v1/models`; submitting a
//! planned request to the engine and answering it whole (streams are in `sse`).

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use tokio::sync::{mpsc, oneshot};

use super::error::{ApiError, parse_body, unavailable};
use super::output::Output;
use super::plan::{Kind, Plan, int_param};
use super::sse::stream_response;
use super::wire::{ChatRequest, CompletionRequest, ModelCard, ModelList, ModelPermission, PromptInput};
use super::{AppState, MAX_LOGPROBS};
use crate::engine::tokens::{self, mix64};
use crate::engine::{RejectReason, RequestId};
use crate::server::driver::{Command, ReqEvent, Submission};
use crate::server::prompt::{prepare_ids, prepare_text};

/// `POST /v1/chat/completions`.
pub async fn chat_completions(State(st): State<Arc<AppState>>, headers: HeaderMap, body: Bytes) -> Response {
    let arrival = st.clock.now();
    let r: Result<ChatRequest, ApiError> = parse_body(&body);
    // Images are loaded (and fetched) before planning, as vLLM's frontend loads them.
    let prompt = match &r {
        Ok(req) => Some(st.chat_prompt(&req.messages).await),
        Err(_) => None,
    };
    let planned = r.and_then(|req| {
        let prompt = prompt.unwrap_or_else(|| Err(ApiError::bad_request("the request has no messages")))?;
        let logprobs = if req.logprobs.unwrap_or(false) {
            Some(int_param(req.top_logprobs, "top_logprobs", 0, i64::from(MAX_LOGPROBS))?.unwrap_or(0))
        } else if req.top_logprobs.is_some_and(|k| k > 0) {
            return Err(ApiError {
                param: Some("top_logprobs"),
                ..ApiError::bad_request("when using `top_logprobs`, `logprobs` must be set to true.")
            });
        } else {
            None
        };
        let max = req.max_completion_tokens.or(req.max_tokens);
        st.plan(Kind::Chat, &headers, &req.common, vec![prompt], max, logprobs, arrival)
    });
    respond(st, planned).await
}

/// `POST /v1/completions`.
pub async fn completions(State(st): State<Arc<AppState>>, headers: HeaderMap, body: Bytes) -> Response {
    let arrival = st.clock.now();
    let r: Result<CompletionRequest, ApiError> = parse_body(&body);
    let planned = r.and_then(|req| {
        let prompts = match &req.prompt {
            PromptInput::Text(t) => vec![prepare_text(t)],
            PromptInput::Texts(ts) => ts.iter().map(|t| prepare_text(t)).collect(),
            PromptInput::Ids(ids) => vec![prepare_ids(ids)],
            PromptInput::IdLists(l) => l.iter().map(|ids| prepare_ids(ids)).collect(),
        };
        let logprobs = int_param(req.logprobs, "logprobs", 0, i64::from(MAX_LOGPROBS))?;
        st.plan(Kind::Completion, &headers, &req.common, prompts, req.max_tokens, logprobs, arrival)
    });
    respond(st, planned).await
}

/// Sends an abort for requests whose handler went away before they finished.
pub(super) struct AbortGuard {
    pub(super) ids: Vec<RequestId>,
    pub(super) cmd: mpsc::UnboundedSender<Command>,
    pub(super) armed: bool,
}

impl Drop for AbortGuard {
    fn drop(&mut self) {
        if self.armed {
            let _ = self.cmd.send(Command::Abort(std::mem::take(&mut self.ids)));
        }
    }
}

pub(super) async fn respond(st: Arc<AppState>, planned: Result<(Plan, Vec<Submission>), ApiError>) -> Response {
    let (plan, subs) = match planned {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    let ids: Vec<RequestId> = subs.iter().map(|s| s.spec.id).collect();
    let (tx, rx) = mpsc::unbounded_channel();
    let (reply_tx, reply_rx) = oneshot::channel();
    if st.cmd.send(Command::Submit { subs, events: tx, reply: reply_tx }).is_err() {
        return unavailable().into_response();
    }
    let rejected = |st: &AppState| {
        if let Some(t) = &st.tgi {
            t.lock().failure("validation");
        }
    };
    match reply_rx.await {
        Ok(Ok(())) => {}
        Ok(Err(RejectReason::TooLong)) => {
            rejected(&st);
            return ApiError::bad_request("the request exceeds the model's maximum context length").into_response();
        }
        Ok(Err(r)) => {
            rejected(&st);
            return ApiError::bad_request(format!("the engine refused the request: {r:?}")).into_response();
        }
        Err(_) => return unavailable().into_response(),
    }
    let guard = AbortGuard { ids, cmd: st.cmd.clone(), armed: true };
    let out = Output::new(plan);
    if out.plan.stream { stream_response(out, rx, guard) } else { whole_response(out, rx, guard).await }
}

pub(super) async fn whole_response(
    mut out: Output,
    mut rx: mpsc::UnboundedReceiver<ReqEvent>,
    mut guard: AbortGuard,
) -> Response {
    while out.remaining > 0 {
        match rx.recv().await {
            Some(ReqEvent::Token { choice, index, .. }) => {
                let choice = choice as usize;
                let tok = out.token(choice, index);
                let c = &mut out.choices[choice];
                c.text.push_str(&tok.text);
                c.tokens += 1;
                if out.plan.logprobs.is_some() {
                    c.logprobs.push(tok);
                }
            }
            Some(ReqEvent::Finished { choice, record }) => {
                if let Some(err) = out.finished(choice as usize, record.finish_reason) {
                    guard.armed = out.remaining > 0;
                    return err.into_response();
                }
            }
            None => return unavailable().into_response(),
        }
    }
    guard.armed = false;
    match out.whole() {
        Ok(body) => {
            let mut r = Response::new(Body::from(body));
            r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
            r
        }
        Err(e) => ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: format!("cannot serialise the response: {e}"),
            param: None,
        }
        .into_response(),
    }
}

/// A 200 response with `v` as JSON (keys in field order).
pub fn json_ok<T: Serialize>(v: &T) -> Response {
    match serde_json::to_vec(v) {
        Ok(body) => {
            let mut r = Response::new(Body::from(body));
            r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
            r
        }
        Err(e) => ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: format!("cannot serialise the response: {e}"),
            param: None,
        }
        .into_response(),
    }
}

/// `GET /v1/models`.
pub async fn models(State(st): State<Arc<AppState>>) -> Response {
    let data = st
        .served
        .iter()
        .map(|name| ModelCard {
            id: name,
            object: "model",
            created: st.started_unix_s,
            owned_by: "vllm",
            root: &st.root,
            parent: None,
            max_model_len: st.max_model_len,
            permission: vec![ModelPermission {
                id: format!("modelperm-{:016x}", mix64(st.seed ^ tokens::prompt_key(name))),
                object: "model_permission",
                created: st.started_unix_s,
                allow_create_engine: false,
                allow_sampling: true,
                allow_logprobs: true,
                allow_search_indices: false,
                allow_view: true,
                allow_fine_tuning: false,
                organization: "*",
                group: None,
                is_blocking: false,
            }],
        })
        .collect();
    json_ok(&ModelList { object: "list", data })
}

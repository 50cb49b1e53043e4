//! Run-time fault control: `GET /admin/faults` (the configured faults and which are active),
//! `POST /admin/faults` (replace them; JSON of [`crate::faults`]), `DELETE /admin/faults`.
//!
//! The POST body is a fault set `{"faults": [...]}`, a list of faults, or one fault
//! (`{"kind": "queue_blocking", "strength": 0.5}`). Its times (`onset`, `until`) count from
//! the moment of the call unless the query has `relative=false`, in which case they are on
//! the engine clock (seconds since the server started), as in the `--config` file.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use tokio::sync::oneshot;

use super::api::{ApiError, AppState, json_ok, parse_body};
use super::driver::{Command, FaultStatus};
use crate::faults::{Fault, FaultSet};

fn relative(query: Option<&str>) -> Result<bool, ApiError> {
    for pair in query.unwrap_or_default().split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, "true"));
        if k == "relative" {
            return match v {
                "true" | "1" => Ok(true),
                "false" | "0" => Ok(false),
                _ => Err(ApiError::bad_request(format!("relative must be true or false, got {v:?}"))),
            };
        }
    }
    Ok(true)
}

fn parse_faults(body: &[u8]) -> Result<FaultSet, ApiError> {
    let v: serde_json::Value = parse_body(body)?;
    let bad = |e: serde_json::Error| ApiError::bad_request(format!("invalid faults: {e}"));
    let set = match &v {
        serde_json::Value::Array(_) => FaultSet { faults: serde_json::from_value::<Vec<Fault>>(v).map_err(bad)? },
        serde_json::Value::Object(m) if m.contains_key("kind") => {
            FaultSet { faults: vec![serde_json::from_value::<Fault>(v).map_err(bad)?] }
        }
        serde_json::Value::Object(_) => serde_json::from_value::<FaultSet>(v).map_err(bad)?,
        _ => {
            return Err(ApiError::bad_request(
                "invalid faults: expected {\"faults\": [...]}, a list of faults, or one fault object",
            ));
        }
    };
    set.validate().map_err(|e| ApiError::bad_request(format!("invalid faults: {e}")))?;
    Ok(set)
}

async fn set(st: &AppState, faults: FaultSet, relative: bool) -> Response {
    let (tx, rx) = oneshot::channel();
    if st.cmd.send(Command::SetFaults { faults, relative, reply: tx }).is_err() {
        return unavailable();
    }
    match rx.await {
        Ok(Ok(status)) => status_response(&status),
        Ok(Err(e)) => ApiError::bad_request(format!("invalid faults: {e}")).into_response(),
        Err(_) => unavailable(),
    }
}

fn unavailable() -> Response {
    ApiError { status: StatusCode::SERVICE_UNAVAILABLE, message: "the engine is shutting down".into(), param: None }
        .into_response()
}

fn status_response(s: &FaultStatus) -> Response {
    json_ok(s)
}

/// `GET /admin/faults`.
pub async fn get_faults(State(st): State<Arc<AppState>>) -> Response {
    let (tx, rx) = oneshot::channel();
    if st.cmd.send(Command::GetFaults { reply: tx }).is_err() {
        return unavailable();
    }
    match rx.await {
        Ok(s) => status_response(&s),
        Err(_) => unavailable(),
    }
}

/// `POST /admin/faults`.
pub async fn post_faults(State(st): State<Arc<AppState>>, RawQuery(q): RawQuery, body: Bytes) -> Response {
    let rel = match relative(q.as_deref()) {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    match parse_faults(&body) {
        Ok(f) => set(&st, f, rel).await,
        Err(e) => e.into_response(),
    }
}

/// `DELETE /admin/faults`: removes every fault.
pub async fn delete_faults(State(st): State<Arc<AppState>>) -> Response {
    set(&st, FaultSet::default(), false).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_three_shapes_and_names_bad_keys() {
        let one = parse_faults(br#"{"kind":"queue_blocking","strength":0.5}"#).unwrap();
        assert_eq!(one.faults.len(), 1);
        let list = parse_faults(br#"[{"kind":"kv_pressure"},{"kind":"cold_start"}]"#).unwrap();
        assert_eq!(list.faults.len(), 2);
        let set = parse_faults(br#"{"faults":[{"kind":"slow_drift","rate_per_day":0.1}]}"#).unwrap();
        assert_eq!(set.faults.len(), 1);
        let e = parse_faults(br#"{"faults":[{"kind":"queue_blocking","strenght":0.5}]}"#).unwrap_err();
        assert!(e.message.contains("strenght"), "{}", e.message);
        let e = parse_faults(br#"{"kind":"queue_blocking","strenght":0.5}"#).unwrap_err();
        assert!(e.message.contains("strenght"), "{}", e.message);
        assert!(parse_faults(br#"{"kind":"queue_blocking","strength":2}"#).is_err());
        assert!(parse_faults(b"not json").is_err());
        assert_eq!(relative(Some("relative=false")), Ok(false));
        assert_eq!(relative(None), Ok(true));
        assert!(relative(Some("relative=maybe")).is_err());
    }
}

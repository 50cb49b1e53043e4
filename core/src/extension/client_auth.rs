//! What the authenticator extensions share: redacted secrets, credential files re-read as they
//! change, and the two calls exporters make (resolve `auth.authenticator` at create, add the
//! headers on each send).

use crate::auth::{AuthError, AuthSettings, ClientAuth};
use crate::exporterhelper::SendError;
use crate::host::Host;
use crate::vocab::FieldError;
use parking_lot::Mutex;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

/// A configured secret (token, password): deserialised from a string, never printed.
#[derive(Clone, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(transparent)]
pub struct Secret(pub String);

impl Secret {
    /// The secret's text.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Whether no secret is set.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.0.is_empty() { f.write_str("\"\"") } else { f.write_str("\"[REDACTED]\"") }
    }
}

impl std::fmt::Display for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("[REDACTED]")
    }
}

/// How often a credential file's modification time is checked.
pub const FILE_CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// A secret kept in a file: read at creation, re-read when its modification time or size
/// changes (checked at most every [`FILE_CHECK_INTERVAL`]); a failed re-read keeps the last
/// good value and logs a warning once per distinct error.
pub struct FileSecret {
    path: PathBuf,
    check_every: Duration,
    state: Mutex<FileState>,
}

struct FileState {
    value: Secret,
    stamp: Option<(SystemTime, u64)>,
    checked: Instant,
    last_error: Option<String>,
}

impl std::fmt::Debug for FileSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileSecret").field("path", &self.path).finish_non_exhaustive()
    }
}

fn stamp(path: &PathBuf) -> std::io::Result<(SystemTime, u64)> {
    let m = std::fs::metadata(path)?;
    Ok((m.modified().unwrap_or(SystemTime::UNIX_EPOCH), m.len()))
}

fn read_trimmed(path: &PathBuf) -> std::io::Result<String> {
    let s = std::fs::read_to_string(path)?;
    Ok(s.trim().to_string())
}

impl FileSecret {
    /// Reads `path` now; an unreadable or empty file is an error.
    pub fn open(path: impl Into<PathBuf>) -> Result<Self, String> {
        Self::with_interval(path, FILE_CHECK_INTERVAL)
    }

    /// As [`FileSecret::open`], checking the file every `check_every` (tests use zero).
    pub fn with_interval(path: impl Into<PathBuf>, check_every: Duration) -> Result<Self, String> {
        let path = path.into();
        let st = stamp(&path).ok();
        let value = read_trimmed(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        if value.is_empty() {
            return Err(format!("{} is empty", path.display()));
        }
        Ok(FileSecret {
            path,
            check_every,
            state: Mutex::new(FileState { value: Secret(value), stamp: st, checked: Instant::now(), last_error: None }),
        })
    }

    /// The current value (re-read first when the check is due and the file changed).
    pub fn current(&self) -> Secret {
        let mut st = self.state.lock();
        if st.checked.elapsed() < self.check_every {
            return st.value.clone();
        }
        st.checked = Instant::now();
        let now = match stamp(&self.path) {
            Ok(s) => s,
            Err(e) => {
                self.failed(&mut st, format!("cannot stat {}: {e}", self.path.display()));
                return st.value.clone();
            }
        };
        if st.stamp == Some(now) {
            return st.value.clone();
        }
        match read_trimmed(&self.path) {
            Ok(v) if !v.is_empty() => {
                if st.last_error.take().is_some() || st.value.0 != v {
                    tracing::info!(path = %self.path.display(), "credential file re-read");
                }
                st.value = Secret(v);
                st.stamp = Some(now);
            }
            Ok(_) => self.failed(&mut st, format!("{} is empty", self.path.display())),
            Err(e) => self.failed(&mut st, format!("cannot read {}: {e}", self.path.display())),
        }
        st.value.clone()
    }

    fn failed(&self, st: &mut FileState, message: String) {
        if st.last_error.as_deref() != Some(message.as_str()) {
            tracing::warn!(error = %message, "credential file unreadable; keeping the last good value");
        }
        st.last_error = Some(message);
    }
}

/// A secret given inline or in a file.
#[derive(Debug)]
pub enum SecretSource {
    /// A fixed value.
    Inline(Secret),
    /// A file re-read as it changes.
    File(FileSecret),
}

impl SecretSource {
    /// The current value.
    pub fn current(&self) -> Secret {
        match self {
            SecretSource::Inline(s) => s.clone(),
            SecretSource::File(f) => f.current(),
        }
    }
}

/// Constant-time equality of two byte strings (the length is not hidden).
pub fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    use subtle::ConstantTimeEq;
    a.len() == b.len() && bool::from(a.ct_eq(b))
}

/// The client half of `auth.authenticator`, looked up when the exporter is created; the error
/// is located at `auth.authenticator`.
pub fn resolve_client(host: &Host, auth: Option<&AuthSettings>) -> Result<Option<Arc<dyn ClientAuth>>, FieldError> {
    match auth {
        None => Ok(None),
        Some(a) => a.client(host).map(Some).map_err(|m| {
            FieldError::at("auth.authenticator", m.trim_start_matches("auth.authenticator: ").to_string())
        }),
    }
}

/// Adds the authenticator's headers to `headers` (replacing same-named ones); an authenticator
/// that cannot produce them makes the send fail retryably.
pub fn apply_client_auth(auth: Option<&Arc<dyn ClientAuth>>, headers: &mut http::HeaderMap) -> Result<(), SendError> {
    let Some(a) = auth else { return Ok(()) };
    a.apply(headers).map_err(|e: AuthError| SendError::Retryable {
        message: format!("client authenticator: {e}"),
        retry_after: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_never_print() {
        let s = Secret("hunter2".into());
        assert!(!format!("{s:?} {s}").contains("hunter2"));
    }

    #[test]
    fn file_secret_rereads_and_keeps_last_good() {
        let dir =
            std::env::temp_dir().join(format!("iw-secret-{}-{:?}", std::process::id(), std::thread::current().id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("token");
        std::fs::write(&p, "first\n").unwrap();
        let f = FileSecret::with_interval(&p, Duration::ZERO).unwrap();
        assert_eq!(f.current().expose(), "first");
        std::fs::write(&p, "second-token").unwrap();
        assert_eq!(f.current().expose(), "second-token");
        std::fs::remove_file(&p).unwrap();
        assert_eq!(f.current().expose(), "second-token", "an unreadable file keeps the last good value");
        std::fs::write(&p, "third").unwrap();
        assert_eq!(f.current().expose(), "third");
        let slow = FileSecret::with_interval(&p, Duration::from_secs(3600)).unwrap();
        std::fs::write(&p, "fourth-longer").unwrap();
        assert_eq!(slow.current().expose(), "third", "not re-checked before the interval");
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(FileSecret::open(dir.join("missing")).is_err());
    }
}

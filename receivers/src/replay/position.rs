//! The checkpointed read position of a replay receiver.
//!
//! The position is the ordered input list (path and size of each file), the index of the
//! file being read and the offset within it (rows for Arrow files, lines for JSON lines),
//! always just after a chunk the pipeline took. It is updated while the receiver holds the
//! state barrier, so a checkpoint never falls inside a chunk.

use inferwatch_core::component::ComponentId;
use inferwatch_core::state::{Checkpoint, StateError};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

/// Kind stored in the checkpoint envelope.
const KIND: &str = "replay_position";
/// Version of the payload format.
const VERSION: u32 = 1;

/// One input file as the fingerprint sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct FileKey {
    /// The path as listed.
    pub path: String,
    /// Its size in bytes when listed.
    pub size: u64,
}

/// What a checkpoint holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct PositionState {
    /// The ordered input list.
    pub inputs: Vec<FileKey>,
    /// Index of the next file to read from.
    pub file: u64,
    /// Rows or lines of that file already fed.
    pub offset: u64,
}

/// The position of one receiver, registered with the state registry.
pub(crate) struct ReplayPosition {
    key: String,
    /// The live position, once the inputs are listed.
    current: Mutex<Option<PositionState>>,
    /// What the last restore brought, until the receiver takes it.
    restored: Mutex<Option<PositionState>>,
}

impl ReplayPosition {
    /// The position of receiver `id` (key `receiver/<id>/position`).
    pub(crate) fn new(id: &ComponentId) -> Self {
        ReplayPosition { key: format!("receiver/{id}/position"), current: Mutex::new(None), restored: Mutex::new(None) }
    }

    /// Where to start reading `inputs`: after the restored position when it was taken on the
    /// same input list, else at the beginning. Makes `inputs` the live position's list.
    pub(crate) fn resume(&self, inputs: Vec<FileKey>) -> (usize, u64) {
        let restored = self.restored.lock().take();
        let (file, offset) = match restored {
            Some(r) if r.inputs == inputs => {
                if r.file > 0 || r.offset > 0 {
                    tracing::info!(position = %self.key, file = r.file, offset = r.offset,
                        "replay resumes after the checkpointed position");
                }
                (r.file, r.offset)
            }
            Some(_) => {
                tracing::info!(position = %self.key,
                    "replay inputs differ from the checkpointed ones; replaying from the beginning");
                (0, 0)
            }
            None => (0, 0),
        };
        let file_index = usize::try_from(file).unwrap_or(usize::MAX).min(inputs.len());
        let offset = if file_index == inputs.len() { 0 } else { offset };
        *self.current.lock() = Some(PositionState { inputs, file: file_index as u64, offset });
        (file_index, offset)
    }

    /// Records that everything before `offset` in file `file` was fed.
    pub(crate) fn advance(&self, file: usize, offset: u64) {
        if let Some(p) = self.current.lock().as_mut() {
            p.file = file as u64;
            p.offset = offset;
        }
    }

    /// The live position, if the inputs are listed.
    #[cfg(test)]
    pub(crate) fn current(&self) -> Option<PositionState> {
        self.current.lock().clone()
    }
}

impl Checkpoint for ReplayPosition {
    fn key(&self) -> String {
        self.key.clone()
    }

    fn kind(&self) -> &'static str {
        KIND
    }

    fn version(&self) -> u32 {
        VERSION
    }

    fn snapshot(&self) -> Result<Option<Vec<u8>>, StateError> {
        // Before the inputs are listed, a restored position is kept as it was.
        let state = self.current.lock().clone().or_else(|| self.restored.lock().clone());
        let Some(state) = state else { return Ok(None) };
        postcard::to_stdvec(&state)
            .map(Some)
            .map_err(|e| StateError::Corrupt { key: self.key.clone(), message: e.to_string() })
    }

    fn restore(&self, bytes: &[u8]) -> Result<(), StateError> {
        let state: PositionState = postcard::from_bytes(bytes)
            .map_err(|e| StateError::Corrupt { key: self.key.clone(), message: e.to_string() })?;
        *self.restored.lock() = Some(state);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(n: u64) -> Vec<FileKey> {
        (0..n).map(|i| FileKey { path: format!("f{i}"), size: 100 + i }).collect()
    }

    #[test]
    fn snapshot_restore_round_trip_resumes_on_same_inputs() {
        let id = ComponentId::parse("replay/a").unwrap();
        let p = ReplayPosition::new(&id);
        assert_eq!(p.key(), "receiver/replay/a/position");
        assert_eq!(p.snapshot().unwrap(), None);
        assert_eq!(p.resume(keys(3)), (0, 0));
        p.advance(1, 42);
        let bytes = p.snapshot().unwrap().unwrap();

        let q = ReplayPosition::new(&id);
        q.restore(&bytes).unwrap();
        // A checkpoint taken before listing keeps the restored position.
        assert_eq!(q.snapshot().unwrap().unwrap(), bytes);
        assert_eq!(q.resume(keys(3)), (1, 42));
        assert_eq!(q.current().unwrap().offset, 42);

        let r = ReplayPosition::new(&id);
        r.restore(&bytes).unwrap();
        assert_eq!(r.resume(keys(4)), (0, 0), "another input list starts over");
    }

    #[test]
    fn garbage_is_refused() {
        let p = ReplayPosition::new(&ComponentId::parse("replay").unwrap());
        assert!(matches!(p.restore(&[0xff, 0xff, 0xff]), Err(StateError::Corrupt { .. })));
    }
}

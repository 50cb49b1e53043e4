//! Checkpointed state: components register what they hold; a `storage` extension gives it a
//! redb file, restores it at start, saves it every `checkpoint_interval` and at shutdown.
//!
//! Each entry is written inside an envelope carrying the store format, the component's kind
//! and its own state version, so a checkpoint written by another build is refused with a
//! clear message instead of being misread. All entries of one checkpoint are written in one
//! redb transaction. Sources that need a checkpoint consistent with their read position (the
//! `replay` receiver) hold the [`StateRegistry::barrier`] while they feed the pipeline; a
//! checkpoint takes it too, so it always falls between two fully processed chunks.

use parking_lot::Mutex;
use redb::{Database, ReadableDatabase, TableDefinition};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Format of the envelope and of the store layout.
pub const STORE_FORMAT: u32 = 1;
const MAGIC: &[u8; 4] = b"IWCK";
const CHECKPOINTS: TableDefinition<&str, &[u8]> = TableDefinition::new("checkpoints");
const META: TableDefinition<&str, u32> = TableDefinition::new("meta");

/// A state or store failure.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// The checkpoint was written in a format this build cannot read.
    #[error(
        "checkpoint {key:?} has {what} {found}, this build reads {expected}; \
         remove the storage directory (or point `storage.directory` elsewhere) to start fresh"
    )]
    Incompatible {
        /// Entry key.
        key: String,
        /// Which version disagrees (`store format`, `state version`, `kind`).
        what: &'static str,
        /// Version found.
        found: String,
        /// Version expected.
        expected: String,
    },
    /// Serialization failed or the bytes are corrupt.
    #[error("checkpoint {key:?}: {message}")]
    Corrupt {
        /// Entry key.
        key: String,
        /// What went wrong.
        message: String,
    },
    /// The embedded store failed.
    #[error("state store {path}: {message}")]
    Store {
        /// Database path.
        path: String,
        /// What went wrong.
        message: String,
    },
}

/// Something with state to checkpoint (an Arrow stage, a replay position, an exporter to flush).
pub trait Checkpoint: Send + Sync {
    /// Unique, stable key (e.g. `stage/metrics/window_stats`).
    fn key(&self) -> String;
    /// Short kind name stored in the envelope (e.g. `arrow_stage`).
    fn kind(&self) -> &'static str;
    /// Version of the payload format.
    fn version(&self) -> u32;
    /// Serializes the state; `None` when there is nothing to save.
    fn snapshot(&self) -> Result<Option<Vec<u8>>, StateError>;
    /// Restores from a payload of the same kind and version.
    fn restore(&self, bytes: &[u8]) -> Result<(), StateError>;
    /// Makes everything emitted so far durable (close or sync files) before the checkpoint commits.
    fn make_durable(&self) -> Result<(), StateError> {
        Ok(())
    }
}

/// Wraps a payload: magic, store format, kind, version.
pub fn seal(kind: &str, version: u32, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(payload.len() + 16 + kind.len());
    v.extend_from_slice(MAGIC);
    v.extend_from_slice(&STORE_FORMAT.to_le_bytes());
    v.extend_from_slice(&version.to_le_bytes());
    v.push(kind.len().min(255) as u8);
    v.extend_from_slice(&kind.as_bytes()[..kind.len().min(255)]);
    v.extend_from_slice(payload);
    v
}

/// Unwraps a payload sealed by [`seal`], refusing other formats, kinds and versions.
pub fn unseal<'a>(key: &str, kind: &str, version: u32, bytes: &'a [u8]) -> Result<&'a [u8], StateError> {
    let corrupt = |m: &str| StateError::Corrupt { key: key.to_string(), message: m.to_string() };
    if bytes.len() < 13 || &bytes[..4] != MAGIC {
        return Err(corrupt("not an inferwatch checkpoint (bad magic)"));
    }
    let fmt = u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]);
    if fmt != STORE_FORMAT {
        return Err(StateError::Incompatible {
            key: key.into(),
            what: "store format",
            found: fmt.to_string(),
            expected: STORE_FORMAT.to_string(),
        });
    }
    let ver = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]);
    let klen = bytes[12] as usize;
    let Some(k) = bytes.get(13..13 + klen) else { return Err(corrupt("truncated")) };
    if k != kind.as_bytes() {
        return Err(StateError::Incompatible {
            key: key.into(),
            what: "kind",
            found: String::from_utf8_lossy(k).into_owned(),
            expected: kind.into(),
        });
    }
    if ver != version {
        return Err(StateError::Incompatible {
            key: key.into(),
            what: "state version",
            found: ver.to_string(),
            expected: version.to_string(),
        });
    }
    Ok(&bytes[13 + klen..])
}

/// The redb file holding checkpoints.
pub struct Store {
    db: Database,
    path: PathBuf,
}

impl Store {
    /// Opens (or creates) `DIR/inferwatch-state.redb`, refusing a store of another format.
    pub fn open(dir: &Path) -> Result<Store, StateError> {
        let path = dir.join("inferwatch-state.redb");
        let err = |m: String| StateError::Store { path: path.display().to_string(), message: m };
        std::fs::create_dir_all(dir).map_err(|e| err(format!("cannot create directory: {e}")))?;
        let db = Database::create(&path).map_err(|e| err(e.to_string()))?;
        let store = Store { db, path: path.clone() };
        let found = {
            let tx = store.db.begin_read().map_err(|e| err(e.to_string()))?;
            match tx.open_table(META) {
                Ok(t) => t.get("store_format").map_err(|e| err(e.to_string()))?.map(|g| g.value()),
                Err(redb::TableError::TableDoesNotExist(_)) => None,
                Err(e) => return Err(err(e.to_string())),
            }
        };
        match found {
            Some(f) if f != STORE_FORMAT => {
                return Err(StateError::Incompatible {
                    key: path.display().to_string(),
                    what: "store format",
                    found: f.to_string(),
                    expected: STORE_FORMAT.to_string(),
                });
            }
            Some(_) => {}
            None => {
                let tx = store.db.begin_write().map_err(|e| err(e.to_string()))?;
                {
                    let mut t = tx.open_table(META).map_err(|e| err(e.to_string()))?;
                    t.insert("store_format", STORE_FORMAT).map_err(|e| err(e.to_string()))?;
                }
                tx.commit().map_err(|e| err(e.to_string()))?;
            }
        }
        Ok(store)
    }

    fn err(&self, m: impl std::fmt::Display) -> StateError {
        StateError::Store { path: self.path.display().to_string(), message: m.to_string() }
    }

    /// Reads one entry.
    pub fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StateError> {
        let tx = self.db.begin_read().map_err(|e| self.err(e))?;
        let t = match tx.open_table(CHECKPOINTS) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
            Err(e) => return Err(self.err(e)),
        };
        Ok(t.get(key).map_err(|e| self.err(e))?.map(|g| g.value().to_vec()))
    }

    /// Writes entries in one transaction.
    pub fn put_all(&self, entries: &[(String, Vec<u8>)]) -> Result<(), StateError> {
        let tx = self.db.begin_write().map_err(|e| self.err(e))?;
        {
            let mut t = tx.open_table(CHECKPOINTS).map_err(|e| self.err(e))?;
            for (k, v) in entries {
                t.insert(k.as_str(), v.as_slice()).map_err(|e| self.err(e))?;
            }
        }
        tx.commit().map_err(|e| self.err(e))
    }

    /// The database path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Every stateful component of a running service, and the store they checkpoint to.
#[derive(Default)]
pub struct StateRegistry {
    members: Mutex<Vec<Arc<dyn Checkpoint>>>,
    store: Mutex<Option<Arc<Store>>>,
    barrier: tokio::sync::Mutex<()>,
}

impl StateRegistry {
    /// An empty registry with no store.
    pub fn new() -> Arc<StateRegistry> {
        Arc::new(StateRegistry::default())
    }

    /// Registers a member; it is restored when a store is attached and saved at every checkpoint.
    pub fn register(&self, m: Arc<dyn Checkpoint>) {
        self.members.lock().push(m);
    }

    /// True when a store is attached (state survives restarts).
    pub fn is_persistent(&self) -> bool {
        self.store.lock().is_some()
    }

    /// Attaches a store and restores every registered member from it.
    pub fn attach(&self, store: Arc<Store>) -> Result<usize, StateError> {
        let members = self.members.lock().clone();
        let mut restored = 0;
        for m in &members {
            let key = m.key();
            if let Some(bytes) = store.get(&key)? {
                let payload = unseal(&key, m.kind(), m.version(), &bytes)?;
                m.restore(payload)?;
                restored += 1;
            }
        }
        *self.store.lock() = Some(store);
        Ok(restored)
    }

    /// The lock a source holds while it feeds a chunk that must not be split by a checkpoint.
    pub fn barrier(&self) -> &tokio::sync::Mutex<()> {
        &self.barrier
    }

    /// Takes a checkpoint now (no-op without a store): waits for the barrier, makes outputs
    /// durable, then writes every member's state in one transaction. Returns entries written.
    pub async fn checkpoint(&self) -> Result<usize, StateError> {
        let Some(store) = self.store.lock().clone() else { return Ok(0) };
        let _guard = self.barrier.lock().await;
        self.checkpoint_locked(&store)
    }

    /// Takes a checkpoint while the caller already holds the barrier.
    pub fn checkpoint_holding_barrier(&self) -> Result<usize, StateError> {
        let Some(store) = self.store.lock().clone() else { return Ok(0) };
        self.checkpoint_locked(&store)
    }

    fn checkpoint_locked(&self, store: &Store) -> Result<usize, StateError> {
        let members = self.members.lock().clone();
        let mut entries = Vec::with_capacity(members.len());
        for m in &members {
            if let Some(p) = m.snapshot()? {
                entries.push((m.key(), seal(m.kind(), m.version(), &p)));
            }
        }
        for m in &members {
            m.make_durable()?;
        }
        store.put_all(&entries)?;
        Ok(entries.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Counter(Mutex<u64>, u32);
    impl Checkpoint for Counter {
        fn key(&self) -> String {
            "test/counter".into()
        }
        fn kind(&self) -> &'static str {
            "counter"
        }
        fn version(&self) -> u32 {
            self.1
        }
        fn snapshot(&self) -> Result<Option<Vec<u8>>, StateError> {
            Ok(Some(self.0.lock().to_le_bytes().to_vec()))
        }
        fn restore(&self, b: &[u8]) -> Result<(), StateError> {
            let a: [u8; 8] =
                b.try_into().map_err(|_| StateError::Corrupt { key: self.key(), message: "len".into() })?;
            *self.0.lock() = u64::from_le_bytes(a);
            Ok(())
        }
    }

    fn tmpdir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("iw-state-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[tokio::test]
    async fn checkpoint_and_restore_round_trip() {
        let dir = tmpdir("rt");
        {
            let reg = StateRegistry::new();
            let c = Arc::new(Counter(Mutex::new(41), 1));
            reg.register(c.clone());
            assert_eq!(reg.attach(Arc::new(Store::open(&dir).unwrap())).unwrap(), 0);
            *c.0.lock() = 42;
            assert_eq!(reg.checkpoint().await.unwrap(), 1);
        }
        let reg = StateRegistry::new();
        let c = Arc::new(Counter(Mutex::new(0), 1));
        reg.register(c.clone());
        assert_eq!(reg.attach(Arc::new(Store::open(&dir).unwrap())).unwrap(), 1);
        assert_eq!(*c.0.lock(), 42);
        // A build whose state version differs refuses the checkpoint instead of misreading it.
        let reg2 = StateRegistry::new();
        drop(reg);
        reg2.register(Arc::new(Counter(Mutex::new(0), 2)));
        let e = reg2.attach(Arc::new(Store::open(&dir).unwrap())).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("state version 1, this build reads 2"), "{msg}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn unseal_rejects_garbage_and_other_kinds() {
        assert!(matches!(unseal("k", "a", 1, b"xx"), Err(StateError::Corrupt { .. })));
        let s = seal("a", 1, b"payload");
        assert_eq!(unseal("k", "a", 1, &s).unwrap(), b"payload");
        assert!(matches!(unseal("k", "b", 1, &s), Err(StateError::Incompatible { what: "kind", .. })));
        let mut bad = s.clone();
        bad[4] = 9;
        assert!(matches!(unseal("k", "a", 1, &bad), Err(StateError::Incompatible { what: "store format", .. })));
    }
}

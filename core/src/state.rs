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
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
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
    /// The state file cannot be used (empty, corrupt, unreadable, another store format).
    #[error(
        "state file {path} is unusable ({}): {detail}; move it away, or set `on_corrupt: quarantine` \
         on the storage extension to have it moved aside and start with empty state",
        reason.as_str()
    )]
    Unusable {
        /// Database path.
        path: String,
        /// Why.
        reason: Unusable,
        /// What redb or the file system said.
        detail: String,
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

/// What the `storage` extension does with a state file it cannot use (`on_corrupt`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnCorrupt {
    /// Move the file aside (`<file>.corrupt-<unix-ts>`), warn once and start with empty state.
    #[default]
    Quarantine,
    /// Refuse to start (the agent exits 2) and leave the file as it is.
    Fail,
}

/// Why a state file (or one entry of it) could not be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unusable {
    /// The file has 0 bytes: whatever it held is lost.
    Empty,
    /// redb refused the file or panicked reading it.
    Corrupt,
    /// The file cannot be opened or read (permissions, not a regular file).
    Unreadable,
    /// Written by a build with another store format.
    Incompatible,
}

impl Unusable {
    /// The metric label (`empty`, `corrupt`, `unreadable`, `incompatible`).
    pub fn as_str(self) -> &'static str {
        match self {
            Unusable::Empty => "empty",
            Unusable::Corrupt => "corrupt",
            Unusable::Unreadable => "unreadable",
            Unusable::Incompatible => "incompatible",
        }
    }
}

/// A state file that was moved aside by [`Store::open_with`].
#[derive(Debug, Clone)]
pub struct Quarantined {
    /// Why it could not be used.
    pub reason: Unusable,
    /// What redb (or the file system) said.
    pub detail: String,
    /// Where the file now is.
    pub moved_to: PathBuf,
}

/// A store opened by [`Store::open_with`], and the file it had to set aside, if any.
pub struct Opened {
    /// The store, ready for use.
    pub store: Store,
    /// Set when the previous state file was unusable and moved aside (state starts empty).
    pub quarantined: Option<Quarantined>,
}

type Opener = Arc<dyn Fn() -> Result<Database, redb::DatabaseError> + Send + Sync>;

/// The redb file holding checkpoints.
///
/// After a failed transaction (an I/O error leaves redb refusing every later one with
/// `PreviousIo`) the database is dropped and reopened on next use, so checkpointing recovers
/// once the cause clears. Panics inside redb are caught and reported as errors.
pub struct Store {
    db: Mutex<Option<Database>>,
    path: PathBuf,
    opener: Opener,
}

thread_local! {
    static QUIET_PANIC: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f`, turning a panic into an error message. While it runs, the panic hook stays quiet
/// on this thread (the caller reports the problem in one line of its own).
fn guarded<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !QUIET_PANIC.with(|q| q.get()) {
                previous(info)
            }
        }));
    });
    let was = QUIET_PANIC.with(|q| q.replace(true));
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    QUIET_PANIC.with(|q| q.set(was));
    r.map_err(|p| {
        let msg = p
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".into());
        format!("redb panicked: {msg}")
    })
}

/// The state file's name inside the storage directory.
pub const STATE_FILE: &str = "inferwatch-state.redb";

impl Store {
    /// Opens (or creates) `DIR/inferwatch-state.redb`, refusing a corrupt store or one of
    /// another format (nothing is moved aside; see [`Store::open_with`]).
    pub fn open(dir: &Path) -> Result<Store, StateError> {
        Store::open_with(dir, OnCorrupt::Fail).map(|o| o.store)
    }

    /// Opens (or creates) `DIR/inferwatch-state.redb`. A file that is empty, corrupt (redb
    /// refuses it or panics on it), unreadable or of another store format is, with
    /// [`OnCorrupt::Quarantine`], renamed `<file>.corrupt-<unix-ts>` and a fresh store created;
    /// with [`OnCorrupt::Fail`] it is an error ([`StateError::Unusable`]).
    pub fn open_with(dir: &Path, policy: OnCorrupt) -> Result<Opened, StateError> {
        let path = dir.join(STATE_FILE);
        let err = |m: String| StateError::Store { path: path.display().to_string(), message: m };
        std::fs::create_dir_all(dir).map_err(|e| err(format!("cannot create directory: {e}")))?;
        let opener_path = path.clone();
        let opener: Opener = Arc::new(move || Database::create(&opener_path));
        match Store::try_open(&path, &opener) {
            Ok(store) => Ok(Opened { store, quarantined: None }),
            Err(Failure::Fatal(e)) => Err(e),
            Err(Failure::Unusable(reason, detail)) => {
                if policy == OnCorrupt::Fail {
                    return Err(StateError::Unusable { path: path.display().to_string(), reason, detail });
                }
                let moved_to = quarantine(&path).map_err(|e| {
                    err(format!(
                        "the state file is unusable ({}: {detail}) and cannot be moved aside: {e}",
                        reason.as_str()
                    ))
                })?;
                let store = Store::try_open(&path, &opener).map_err(|f| match f {
                    Failure::Fatal(e) => e,
                    Failure::Unusable(_, d) => err(format!("a fresh state file is unusable too: {d}")),
                })?;
                Ok(Opened { store, quarantined: Some(Quarantined { reason, detail, moved_to }) })
            }
        }
    }

    /// Opens with a custom opener (tests inject failing storage backends through it).
    #[cfg(test)]
    fn open_from(path: PathBuf, opener: Opener) -> Result<Store, StateError> {
        Store::try_open(&path, &opener).map_err(|f| match f {
            Failure::Fatal(e) => e,
            Failure::Unusable(r, d) => StateError::Unusable { path: path.display().to_string(), reason: r, detail: d },
        })
    }

    fn try_open(path: &Path, opener: &Opener) -> Result<Store, Failure> {
        let err = |m: String| StateError::Store { path: path.display().to_string(), message: m };
        match std::fs::metadata(path) {
            Ok(m) if !m.is_file() => {
                return Err(Failure::Unusable(Unusable::Unreadable, "not a regular file".into()));
            }
            Ok(m) if m.len() == 0 => {
                return Err(Failure::Unusable(Unusable::Empty, "the file has 0 bytes (truncated)".into()));
            }
            Ok(_) => {
                if let Err(e) = std::fs::File::open(path) {
                    return Err(Failure::Unusable(Unusable::Unreadable, e.to_string()));
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Failure::Unusable(Unusable::Unreadable, e.to_string())),
        }
        let db = match guarded(|| opener()) {
            Ok(Ok(db)) => db,
            Ok(Err(redb::DatabaseError::DatabaseAlreadyOpen | redb::DatabaseError::LockProtocolMismatch)) => {
                return Err(Failure::Fatal(err(
                    "the state file is in use by another process (one agent per storage directory)".into(),
                )));
            }
            Ok(Err(redb::DatabaseError::UpgradeRequired(v))) => {
                return Err(Failure::Unusable(Unusable::Incompatible, format!("redb file format {v}")));
            }
            Ok(Err(redb::DatabaseError::Storage(redb::StorageError::Io(e))))
                if e.kind() == std::io::ErrorKind::PermissionDenied =>
            {
                return Err(Failure::Unusable(Unusable::Unreadable, e.to_string()));
            }
            Ok(Err(e)) => return Err(Failure::Unusable(Unusable::Corrupt, e.to_string())),
            Err(panic) => return Err(Failure::Unusable(Unusable::Corrupt, panic)),
        };
        // Read everything once now, so that a corrupt page is found at start, not mid-run.
        let checked = guarded(|| -> Result<Option<u32>, String> {
            let tx = db.begin_read().map_err(|e| e.to_string())?;
            if let Ok(t) = tx.open_table(CHECKPOINTS) {
                for item in t.iter().map_err(|e| e.to_string())? {
                    let (k, v) = item.map_err(|e| e.to_string())?;
                    let _ = (k.value().len(), v.value().len());
                }
            }
            match tx.open_table(META) {
                Ok(t) => Ok(t.get("store_format").map_err(|e| e.to_string())?.map(|g| g.value())),
                Err(redb::TableError::TableDoesNotExist(_)) => Ok(None),
                Err(e) => Err(e.to_string()),
            }
        });
        let found = match checked {
            Ok(Ok(f)) => f,
            Ok(Err(m)) | Err(m) => return Err(Failure::Unusable(Unusable::Corrupt, m)),
        };
        match found {
            Some(f) if f != STORE_FORMAT => {
                return Err(Failure::Unusable(
                    Unusable::Incompatible,
                    format!("store format {f}, this build reads {STORE_FORMAT}"),
                ));
            }
            Some(_) => {}
            None => {
                let written = guarded(|| -> Result<(), String> {
                    let tx = db.begin_write().map_err(|e| e.to_string())?;
                    {
                        let mut t = tx.open_table(META).map_err(|e| e.to_string())?;
                        t.insert("store_format", STORE_FORMAT).map_err(|e| e.to_string())?;
                    }
                    tx.commit().map_err(|e| e.to_string())
                });
                match written {
                    Ok(Ok(())) => {}
                    Ok(Err(m)) => return Err(Failure::Fatal(err(m))),
                    Err(m) => return Err(Failure::Unusable(Unusable::Corrupt, m)),
                }
            }
        }
        Ok(Store { db: Mutex::new(Some(db)), path: path.to_path_buf(), opener: opener.clone() })
    }

    fn err(&self, m: impl std::fmt::Display) -> StateError {
        StateError::Store { path: self.path.display().to_string(), message: m.to_string() }
    }

    /// Runs `f` on the database, reopening it first when an earlier call failed; on failure
    /// (or a panic inside redb) the database is dropped so that the next call reopens it.
    fn with_db<T>(&self, f: impl FnOnce(&Database) -> Result<T, String>) -> Result<T, StateError> {
        let mut slot = self.db.lock();
        if slot.is_none() {
            let reopened = guarded(|| (self.opener)()).map_err(|m| self.err(m))?;
            *slot = Some(reopened.map_err(|e| self.err(format!("reopening the store: {e}")))?);
        }
        let Some(db) = slot.as_ref() else { return Err(self.err("store unavailable")) };
        match guarded(|| f(db)) {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(m)) | Err(m) => {
                *slot = None;
                Err(self.err(m))
            }
        }
    }

    /// Reads one entry.
    pub fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StateError> {
        self.with_db(|db| {
            let tx = db.begin_read().map_err(|e| e.to_string())?;
            let t = match tx.open_table(CHECKPOINTS) {
                Ok(t) => t,
                Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
                Err(e) => return Err(e.to_string()),
            };
            Ok(t.get(key).map_err(|e| e.to_string())?.map(|g| g.value().to_vec()))
        })
    }

    /// Writes entries in one transaction.
    pub fn put_all(&self, entries: &[(String, Vec<u8>)]) -> Result<(), StateError> {
        self.with_db(|db| {
            let tx = db.begin_write().map_err(|e| e.to_string())?;
            {
                let mut t = tx.open_table(CHECKPOINTS).map_err(|e| e.to_string())?;
                for (k, v) in entries {
                    t.insert(k.as_str(), v.as_slice()).map_err(|e| e.to_string())?;
                }
            }
            tx.commit().map_err(|e| e.to_string())
        })
    }

    /// The database path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

enum Failure {
    /// Not the file's fault (locked by another process, directory unwritable): no quarantine.
    Fatal(StateError),
    /// The file cannot be used.
    Unusable(Unusable, String),
}

/// Renames `path` to `<path>.corrupt-<unix-ts>` (with `-N` when that exists).
fn quarantine(path: &Path) -> std::io::Result<PathBuf> {
    let ts = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let base = format!("{}.corrupt-{ts}", path.display());
    let mut target = PathBuf::from(&base);
    let mut n = 1;
    while target.exists() {
        target = PathBuf::from(format!("{base}-{n}"));
        n += 1;
    }
    std::fs::rename(path, &target)?;
    if let Some(dir) = path.parent()
        && let Ok(d) = std::fs::File::open(dir)
    {
        let _ = d.sync_all();
    }
    Ok(target)
}

/// Every stateful component of a running service, and the store they checkpoint to.
#[derive(Default)]
pub struct StateRegistry {
    members: Mutex<Vec<Arc<dyn Checkpoint>>>,
    store: Mutex<Option<Arc<Store>>>,
    barrier: tokio::sync::Mutex<()>,
    last_error: Mutex<Option<String>>,
}

/// Restores one member from `store`; `Ok(false)` when the store holds nothing for it.
fn restore_one(store: &Store, m: &dyn Checkpoint) -> Result<bool, StateError> {
    let key = m.key();
    let Some(bytes) = store.get(&key)? else { return Ok(false) };
    let payload = unseal(&key, m.kind(), m.version(), &bytes)?;
    // A restore that panics on bad bytes is a corrupt entry, not a crash.
    match guarded(|| m.restore(payload)) {
        Ok(r) => r.map(|()| true),
        Err(message) => Err(StateError::Corrupt { key, message }),
    }
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

    /// Attaches a store and restores every registered member from it; the first entry that
    /// cannot be restored is an error (and the store is not attached).
    pub fn attach(&self, store: Arc<Store>) -> Result<usize, StateError> {
        let members = self.members.lock().clone();
        let mut restored = 0;
        for m in &members {
            if restore_one(&store, m.as_ref())? {
                restored += 1;
            }
        }
        *self.store.lock() = Some(store);
        Ok(restored)
    }

    /// Attaches a store and restores every member it can: an entry that cannot be restored
    /// (corrupt, or written by another version of its component) is skipped, that member
    /// starts empty, and the error is returned for the caller to report.
    pub fn attach_tolerant(&self, store: Arc<Store>) -> (usize, Vec<StateError>) {
        let members = self.members.lock().clone();
        let (mut restored, mut skipped) = (0, Vec::new());
        for m in &members {
            match restore_one(&store, m.as_ref()) {
                Ok(true) => restored += 1,
                Ok(false) => {}
                Err(e) => skipped.push(e),
            }
        }
        *self.store.lock() = Some(store);
        (restored, skipped)
    }

    /// The error of the most recent checkpoint, `None` when it succeeded (or none was taken).
    pub fn last_checkpoint_error(&self) -> Option<String> {
        self.last_error.lock().clone()
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
        let r = self.write_checkpoint(store);
        *self.last_error.lock() = r.as_ref().err().map(|e| e.to_string());
        r
    }

    fn write_checkpoint(&self, store: &Store) -> Result<usize, StateError> {
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

    fn corrupt_files(dir: &Path) -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.to_string_lossy().contains(".corrupt-"))
            .collect();
        v.sort();
        v
    }

    /// Writes a valid store holding one counter of value `n`.
    async fn valid_store(dir: &Path, n: u64) {
        let reg = StateRegistry::new();
        reg.register(Arc::new(Counter(Mutex::new(n), 1)));
        reg.attach(Arc::new(Store::open(dir).unwrap())).unwrap();
        reg.checkpoint().await.unwrap();
    }

    #[tokio::test]
    async fn unusable_files_are_moved_aside_and_state_starts_empty() {
        fn file(d: &Path) -> PathBuf {
            d.join(STATE_FILE)
        }
        // Garbage, a truncated 0-byte file, and a directory in the file's place.
        type Make = Box<dyn Fn(&Path)>;
        let cases: Vec<(&str, Unusable, Make)> = vec![
            ("garbage", Unusable::Corrupt, Box::new(|d: &Path| std::fs::write(file(d), vec![0x5a; 8192]).unwrap())),
            ("empty", Unusable::Empty, Box::new(|d: &Path| std::fs::write(file(d), b"").unwrap())),
            ("dir", Unusable::Unreadable, Box::new(|d: &Path| std::fs::create_dir_all(file(d)).unwrap())),
        ];
        for (name, reason, make) in cases {
            let dir = tmpdir(&format!("q-{name}"));
            std::fs::create_dir_all(&dir).unwrap();
            make(&dir);
            // `fail` refuses and leaves the file alone.
            let e = Store::open_with(&dir, OnCorrupt::Fail).err().unwrap();
            assert!(matches!(e, StateError::Unusable { reason: r, .. } if r == reason), "{name}: {e}");
            assert!(e.to_string().contains("on_corrupt: quarantine"), "{e}");
            assert!(corrupt_files(&dir).is_empty());
            // `quarantine` moves it aside and opens a fresh, working store.
            let o = Store::open_with(&dir, OnCorrupt::Quarantine).unwrap();
            let q = o.quarantined.clone().expect(name);
            assert_eq!(q.reason, reason, "{name}");
            assert_eq!(corrupt_files(&dir), vec![q.moved_to.clone()]);
            assert!(q.moved_to.file_name().unwrap().to_string_lossy().starts_with("inferwatch-state.redb.corrupt-"));
            o.store.put_all(&[("k".into(), b"v".to_vec())]).unwrap();
            assert_eq!(o.store.get("k").unwrap().unwrap(), b"v");
            drop(o);
            // The fresh file is fine on the next start.
            assert!(Store::open_with(&dir, OnCorrupt::Quarantine).unwrap().quarantined.is_none());
            let _ = std::fs::remove_dir_all(&dir);
        }
    }

    #[tokio::test]
    async fn flipped_bytes_never_panic() {
        let dir = tmpdir("flip");
        valid_store(&dir, 7).await;
        let original = std::fs::read(dir.join(STATE_FILE)).unwrap();
        // Flip bytes across the whole file, one region at a time: every open either works
        // (the damage missed live pages) or is refused cleanly; none panics.
        let mut refused = 0;
        for at in (0..original.len()).step_by(original.len() / 24 + 1) {
            let mut bytes = original.clone();
            for b in bytes.iter_mut().skip(at).take(64) {
                *b = !*b;
            }
            std::fs::write(dir.join(STATE_FILE), &bytes).unwrap();
            for f in corrupt_files(&dir) {
                std::fs::remove_file(f).unwrap();
            }
            match Store::open_with(&dir, OnCorrupt::Quarantine) {
                Ok(o) => {
                    if o.quarantined.is_some() {
                        refused += 1;
                    }
                    let reg = StateRegistry::new();
                    reg.register(Arc::new(Counter(Mutex::new(0), 1)));
                    let _ = reg.attach_tolerant(Arc::new(o.store));
                }
                Err(e) => panic!("flip at {at}: not recovered: {e}"),
            }
        }
        assert!(refused > 0, "no flip was detected at all");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn one_bad_entry_is_skipped_by_the_tolerant_attach() {
        let dir = tmpdir("entry");
        valid_store(&dir, 5).await;
        {
            let s = Store::open(&dir).unwrap();
            s.put_all(&[("test/other".into(), b"not sealed".to_vec())]).unwrap();
        }
        struct Other;
        impl Checkpoint for Other {
            fn key(&self) -> String {
                "test/other".into()
            }
            fn kind(&self) -> &'static str {
                "other"
            }
            fn version(&self) -> u32 {
                1
            }
            fn snapshot(&self) -> Result<Option<Vec<u8>>, StateError> {
                Ok(None)
            }
            fn restore(&self, _: &[u8]) -> Result<(), StateError> {
                panic!("must not be called with a bad envelope")
            }
        }
        let reg = StateRegistry::new();
        let c = Arc::new(Counter(Mutex::new(0), 1));
        reg.register(Arc::new(Other));
        reg.register(c.clone());
        let (restored, skipped) = reg.attach_tolerant(Arc::new(Store::open(&dir).unwrap()));
        assert_eq!((restored, skipped.len()), (1, 1), "{skipped:?}");
        assert!(skipped[0].to_string().contains("bad magic"), "{}", skipped[0]);
        assert_eq!(*c.0.lock(), 5, "the good entry is restored");
        assert!(reg.is_persistent());
        // A restore that panics is a corrupt entry too.
        struct Panics;
        impl Checkpoint for Panics {
            fn key(&self) -> String {
                "test/counter".into()
            }
            fn kind(&self) -> &'static str {
                "counter"
            }
            fn version(&self) -> u32 {
                1
            }
            fn snapshot(&self) -> Result<Option<Vec<u8>>, StateError> {
                Ok(None)
            }
            fn restore(&self, _: &[u8]) -> Result<(), StateError> {
                panic!("bad bytes")
            }
        }
        drop(reg);
        let reg = StateRegistry::new();
        reg.register(Arc::new(Panics));
        let (restored, skipped) = reg.attach_tolerant(Arc::new(Store::open(&dir).unwrap()));
        assert_eq!(restored, 0);
        assert!(skipped[0].to_string().contains("panicked: bad bytes"), "{}", skipped[0]);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A file backend whose writes fail while `fail` is set (a full or failing disk).
    #[derive(Debug)]
    struct Flaky {
        file: std::sync::Mutex<std::fs::File>,
        fail: Arc<std::sync::atomic::AtomicBool>,
    }

    impl Flaky {
        fn check(&self) -> std::io::Result<()> {
            if self.fail.load(std::sync::atomic::Ordering::SeqCst) {
                Err(std::io::Error::from_raw_os_error(28)) // ENOSPC
            } else {
                Ok(())
            }
        }
    }

    impl redb::StorageBackend for Flaky {
        fn len(&self) -> std::io::Result<u64> {
            Ok(self.file.lock().unwrap().metadata()?.len())
        }
        fn read(&self, offset: u64, out: &mut [u8]) -> std::io::Result<()> {
            use std::os::unix::fs::FileExt;
            self.file.lock().unwrap().read_exact_at(out, offset)
        }
        fn set_len(&self, len: u64) -> std::io::Result<()> {
            self.check()?;
            self.file.lock().unwrap().set_len(len)
        }
        fn sync_data(&self) -> std::io::Result<()> {
            self.check()?;
            self.file.lock().unwrap().sync_data()
        }
        fn write(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
            use std::os::unix::fs::FileExt;
            self.check()?;
            self.file.lock().unwrap().write_all_at(data, offset)
        }
    }

    #[cfg(unix)]
    #[tokio::test]
    async fn checkpointing_recovers_after_an_io_error_clears() {
        let dir = tmpdir("flaky");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(STATE_FILE);
        let fail = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (p, f) = (path.clone(), fail.clone());
        let opener: Opener = Arc::new(move || {
            let file = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&p)?;
            redb::Builder::new().create_with_backend(Flaky { file: std::sync::Mutex::new(file), fail: f.clone() })
        });
        let reg = StateRegistry::new();
        let c = Arc::new(Counter(Mutex::new(1), 1));
        reg.register(c.clone());
        reg.attach(Arc::new(Store::open_from(path.clone(), opener).unwrap())).unwrap();
        assert_eq!(reg.checkpoint().await.unwrap(), 1);
        assert_eq!(reg.last_checkpoint_error(), None);
        // The disk fails: the checkpoint fails, and keeps failing while it does.
        fail.store(true, std::sync::atomic::Ordering::SeqCst);
        *c.0.lock() = 2;
        assert!(reg.checkpoint().await.is_err());
        assert!(reg.checkpoint().await.is_err());
        assert!(reg.last_checkpoint_error().is_some_and(|e| e.contains(&path.display().to_string())));
        // It clears: the next checkpoint works again (redb alone would answer PreviousIo forever).
        fail.store(false, std::sync::atomic::Ordering::SeqCst);
        *c.0.lock() = 3;
        assert_eq!(reg.checkpoint().await.unwrap(), 1);
        assert_eq!(reg.last_checkpoint_error(), None);
        drop(reg);
        let reg = StateRegistry::new();
        let c = Arc::new(Counter(Mutex::new(0), 1));
        reg.register(c.clone());
        reg.attach(Arc::new(Store::open(&dir).unwrap())).unwrap();
        assert_eq!(*c.0.lock(), 3, "the checkpoint after recovery is the one on disk");
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

//! Extension `file_storage` (otelcol's `filestorage`): a directory where exporters with
//! `sending_queue.storage: file_storage/<name>` keep their persistent queues, one subdirectory
//! per exporter and signal. The queue engine is a segmented append-only log (see
//! [`crate::queue`]); otelcol's bbolt `compaction` keys are accepted and documented, space being
//! reclaimed by deleting fully acknowledged segments as soon as they are.

use crate::component::{Extension, ExtensionFactory};
use crate::host::CreateContext;
use crate::host::StatusHandle;
use crate::pdata::Signal;
use crate::settings::GoDuration;
use crate::vocab::{ComponentError, FieldError, parse_config};
use async_trait::async_trait;
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// `compaction` of `file_storage` (otelcol's keys; see the docs for what each does here).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct CompactionConfig {
    /// otelcol: compact at start. Here: the start repairs and trims the log instead (always).
    pub on_start: bool,
    /// otelcol: compact online when the file shrank. Here: acknowledged segments are deleted at once (always).
    pub on_rebound: bool,
    /// otelcol: where the compaction's temporary file goes. Here: not used (no copy is made).
    pub directory: Option<PathBuf>,
    /// otelcol: allocated size that arms online compaction. Here: not used.
    pub rebound_needed_threshold_mib: u64,
    /// otelcol: used size below which armed compaction runs. Here: not used.
    pub rebound_trigger_threshold_mib: u64,
    /// otelcol: items moved per compaction transaction. Here: not used.
    pub max_transaction_size: u64,
    /// otelcol: how often online compaction is considered. Here: not used.
    pub check_interval: GoDuration,
    /// otelcol: remove temporary compaction files at start. Here: not used.
    pub cleanup_on_start: bool,
}

impl Default for CompactionConfig {
    fn default() -> Self {
        CompactionConfig {
            on_start: false,
            on_rebound: false,
            directory: None,
            rebound_needed_threshold_mib: 100,
            rebound_trigger_threshold_mib: 10,
            max_transaction_size: 65_536,
            check_interval: GoDuration(Duration::from_secs(5)),
            cleanup_on_start: false,
        }
    }
}

/// Settings of `file_storage`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FileStorageConfig {
    /// Where the queues live (required).
    pub directory: PathBuf,
    /// Create `directory` (mode `directory_permissions`) when missing; otherwise it must exist.
    #[serde(default)]
    pub create_directory: bool,
    /// Mode of a created directory, octal (default `0750`).
    #[serde(default = "default_permissions")]
    pub directory_permissions: String,
    /// How long to wait for a queue directory held by another process (default 1s).
    #[serde(default = "default_timeout")]
    pub timeout: GoDuration,
    /// Sync each batch to the device before acknowledging it (survives power loss; default false:
    /// written to the file first, so it survives a crash or kill -9 of the agent).
    #[serde(default)]
    pub fsync: bool,
    /// otelcol's bbolt compaction settings (accepted; see the docs).
    #[serde(default)]
    pub compaction: CompactionConfig,
}

fn default_permissions() -> String {
    "0750".into()
}

fn default_timeout() -> GoDuration {
    GoDuration(Duration::from_secs(1))
}

impl FileStorageConfig {
    fn check(&self) -> Result<u32, FieldError> {
        if self.directory.as_os_str().is_empty() {
            return Err(FieldError::at("directory", "must not be empty"));
        }
        let mode = u32::from_str_radix(self.directory_permissions.trim_start_matches("0o"), 8)
            .ok()
            .filter(|m| *m <= 0o7777)
            .ok_or_else(|| FieldError::at("directory_permissions", "must be an octal mode such as 0750"))?;
        if self.timeout.0.is_zero() {
            return Err(FieldError::at("timeout", "must be positive"));
        }
        Ok(mode)
    }
}

/// What `file_storage` registers in the host's services: where queues go and how they are synced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileStorage {
    /// The extension's directory.
    pub directory: PathBuf,
    /// Sync batches to the device before acknowledging them.
    pub fsync: bool,
    /// How long to wait for a queue directory's lock.
    pub timeout: Duration,
}

/// `otlp/tempo` → `otlp~tempo`: a file name for a component id (other odd characters → `_`).
fn file_safe(s: &str) -> String {
    s.chars()
        .map(|c| match c {
            '/' => '~',
            c if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') => c,
            _ => '_',
        })
        .collect()
}

impl FileStorage {
    /// The queue directory of exporter `id` for `signal` (otelcol's naming: `exporter_<id>_<signal>`).
    pub fn queue_dir(&self, id: &str, signal: Signal) -> PathBuf {
        self.directory.join(format!("exporter_{}_{}", file_safe(id), signal.as_str()))
    }
}

/// Factory of `file_storage`.
pub struct FileStorageFactory;

impl ExtensionFactory for FileStorageFactory {
    fn type_name(&self) -> &'static str {
        "file_storage"
    }
    fn parse(&self, cfg: &serde_json::Value) -> Result<crate::component::Parsed, FieldError> {
        let c: FileStorageConfig = parse_config(cfg)?;
        let mode = c.check()?;
        Ok(std::sync::Arc::new((c, mode)))
    }
    fn build(
        &self,
        ctx: CreateContext,
        parsed: &crate::component::Parsed,
    ) -> Result<Box<dyn Extension>, ComponentError> {
        let (c, mode) = crate::component::typed::<(FileStorageConfig, u32)>(parsed)?;
        let mode = *mode;
        prepare_directory(&c.directory, c.create_directory, mode)
            .map_err(|e| ComponentError::Start(format!("file_storage directory {}: {e}", c.directory.display())))?;
        let s = FileStorage { directory: c.directory.clone(), fsync: c.fsync, timeout: c.timeout.0 };
        if c.compaction != CompactionConfig::default() {
            tracing::info!(extension = %ctx.id,
                "file_storage: compaction settings have no effect here: acknowledged queue segments are deleted as soon as they are");
        }
        ctx.host.services.provide(&ctx.id.to_string(), s);
        Ok(Box::new(FileStorageExtension))
    }
}

/// Checks (or creates) the storage directory.
fn prepare_directory(dir: &Path, create: bool, mode: u32) -> Result<(), String> {
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err("exists and is not a directory".into()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && create => {
            let mut b = std::fs::DirBuilder::new();
            b.recursive(true);
            std::os::unix::fs::DirBuilderExt::mode(&mut b, mode);
            b.create(dir).map_err(|e| format!("cannot be created: {e}"))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Err("does not exist (create it, or set create_directory: true)".into())
        }
        Err(e) => Err(format!("cannot be read: {e}")),
    }
}

/// The running extension (the queues themselves belong to their exporters).
pub struct FileStorageExtension;

#[async_trait]
impl Extension for FileStorageExtension {
    async fn start(&mut self, _status: StatusHandle) -> Result<(), ComponentError> {
        Ok(())
    }
    async fn shutdown(&mut self) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::Telemetry;
    use crate::vocab::ComponentId;
    use serde_json::json;
    use std::sync::Arc;

    #[test]
    fn validates_like_otelcol() {
        let f = FileStorageFactory;
        assert!(f.validate(&json!({"directory": "/var/lib/x"})).is_ok());
        assert_eq!(
            f.validate(&json!({"directory": ""})).unwrap_err(),
            FieldError::at("directory", "must not be empty")
        );
        assert!(f.validate(&json!({})).is_err());
        assert!(f.validate(&json!({"directory": "/x", "directory_permissions": "0999"})).is_err());
        assert!(f.validate(&json!({"directory": "/x", "bogus": 1})).is_err());
        let all = json!({"directory": "/x", "timeout": "2s", "fsync": true, "create_directory": true,
            "compaction": {"on_start": true, "on_rebound": true, "directory": "/tmp", "rebound_needed_threshold_mib": 5,
                "rebound_trigger_threshold_mib": 1, "max_transaction_size": 10, "check_interval": "1s", "cleanup_on_start": true}});
        assert!(f.validate(&all).is_ok());
    }

    #[test]
    fn creates_the_directory_only_when_asked_and_registers_its_service() {
        let tmp = std::env::temp_dir().join(format!("iw-fs-{}-{}", std::process::id(), line!()));
        let _ = std::fs::remove_dir_all(&tmp);
        let dir = tmp.join("q");
        let ctx = || CreateContext::new(ComponentId::parse("file_storage/q").unwrap(), Arc::new(Telemetry::new()));
        let f = FileStorageFactory;
        assert!(f.create(ctx(), &json!({"directory": dir})).is_err(), "missing directory refused");
        let c = ctx();
        let host = c.host.clone();
        f.create(c, &json!({"directory": dir, "create_directory": true, "fsync": true})).unwrap();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777, 0o750);
        let s: FileStorage = host.services.get("file_storage/q").unwrap();
        assert!(s.fsync);
        assert_eq!(
            s.queue_dir("otlp/tempo", Signal::Traces).file_name().unwrap().to_str().unwrap(),
            "exporter_otlp~tempo_traces"
        );
        let _ = std::fs::remove_dir_all(&tmp);
    }
}

//! Extension `storage`: where checkpointed state lives (an embedded redb file in `directory`),
//! restored at start, saved every `checkpoint_interval` and at shutdown.

use crate::component::{Extension, ExtensionFactory};
use crate::host::CreateContext;
use crate::host::Host;
use crate::host::StatusHandle;
use crate::settings::GoDuration;
use crate::state::{OnCorrupt, StateError, Store};
use crate::telemetry::Telemetry;
use crate::vocab::{ComponentError, FieldError, parse_config};
use async_trait::async_trait;
use serde::Deserialize;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Settings of `storage`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StorageConfig {
    /// Directory of the state file (created when missing).
    pub directory: PathBuf,
    /// How often to checkpoint (default 10s).
    #[serde(default = "default_interval")]
    pub checkpoint_interval: GoDuration,
    /// A state file that is empty, corrupt, unreadable or of another format: `quarantine`
    /// (default: moved aside, start empty) or `fail` (refuse to start, exit 2).
    #[serde(default)]
    pub on_corrupt: OnCorrupt,
}

fn default_interval() -> GoDuration {
    GoDuration(Duration::from_secs(10))
}

/// Factory of `storage`.
pub struct StorageFactory;

impl ExtensionFactory for StorageFactory {
    fn type_name(&self) -> &'static str {
        "storage"
    }
    fn parse(&self, cfg: &serde_json::Value) -> Result<crate::component::Parsed, FieldError> {
        let c: StorageConfig = parse_config(cfg)?;
        if c.directory.as_os_str().is_empty() {
            return Err(FieldError::at("directory", "must not be empty"));
        }
        if c.checkpoint_interval.0 < Duration::from_millis(10) {
            return Err(FieldError::at("checkpoint_interval", "must be at least 10ms"));
        }
        Ok(std::sync::Arc::new(c))
    }
    fn build(
        &self,
        ctx: CreateContext,
        parsed: &crate::component::Parsed,
    ) -> Result<Box<dyn Extension>, ComponentError> {
        let config = crate::component::typed::<StorageConfig>(parsed)?.clone();
        Ok(Box::new(Storage {
            config,
            host: ctx.host,
            telemetry: ctx.telemetry,
            stop: CancellationToken::new(),
            timer: None,
        }))
    }
}

/// The running extension.
pub struct Storage {
    config: StorageConfig,
    host: Arc<Host>,
    telemetry: Arc<Telemetry>,
    stop: CancellationToken,
    timer: Option<tokio::task::JoinHandle<bool>>,
}

/// Takes one checkpoint; `failing` holds whether the previous one failed, so that a run of
/// failures logs one ERROR (then DEBUG) and the recovery one INFO line.
async fn checkpoint(host: &Host, telemetry: &Telemetry, failing: &mut bool) {
    match host.state.checkpoint().await {
        Ok(n) => {
            telemetry.checkpoints("ok").inc();
            if std::mem::take(failing) {
                tracing::info!(entries = n, "checkpointing recovered");
            } else {
                tracing::debug!(entries = n, "checkpoint written");
            }
        }
        Err(e) => {
            telemetry.checkpoints("failed").inc();
            if std::mem::replace(failing, true) {
                tracing::debug!(error = %e, "checkpoint failed again; retrying at the next interval");
            } else {
                tracing::error!(error = %e, "checkpoint failed; retrying at every interval");
            }
        }
    }
}

/// A start failure; `on_corrupt: fail` makes unusable state a configuration error (exit 2).
fn start_error(e: StateError, on_corrupt: OnCorrupt) -> ComponentError {
    let unusable =
        matches!(e, StateError::Unusable { .. } | StateError::Incompatible { .. } | StateError::Corrupt { .. });
    if unusable && on_corrupt == OnCorrupt::Fail {
        ComponentError::Config(FieldError::at("on_corrupt", e.to_string()))
    } else {
        ComponentError::Start(e.to_string())
    }
}

#[async_trait]
impl Extension for Storage {
    async fn start(&mut self, _status: StatusHandle) -> Result<(), ComponentError> {
        if self.host.state.is_persistent() {
            return Err(ComponentError::Start("only one storage extension may be enabled".into()));
        }
        let policy = self.config.on_corrupt;
        let opened = Store::open_with(&self.config.directory, policy).map_err(|e| start_error(e, policy))?;
        let path = opened.store.path().display().to_string();
        if let Some(q) = &opened.quarantined {
            self.telemetry.state_unusable("file", q.reason.as_str()).inc();
            tracing::warn!(path = %path, reason = q.reason.as_str(), moved_to = %q.moved_to.display(),
                "state file unusable ({}); moved aside, starting with empty state: the detector baselines, \
                 budgets and pending alerts it held are lost", q.detail);
        }
        let store = Arc::new(opened.store);
        let restored = match policy {
            OnCorrupt::Fail => self.host.state.attach(store).map_err(|e| start_error(e, policy))?,
            OnCorrupt::Quarantine => {
                let (restored, skipped) = self.host.state.attach_tolerant(store);
                for e in skipped {
                    let reason = if matches!(e, StateError::Incompatible { .. }) { "incompatible" } else { "corrupt" };
                    self.telemetry.state_unusable("entry", reason).inc();
                    tracing::warn!(path = %path, error = %e, "checkpoint entry not restored; that component starts empty");
                }
                restored
            }
        };
        tracing::info!(path = %path, restored, "state store opened");
        let (host, telemetry, stop) = (self.host.clone(), self.telemetry.clone(), self.stop.clone());
        let every = self.config.checkpoint_interval.0;
        self.timer = Some(tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            let mut failing = false;
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return failing,
                    _ = tick.tick() => checkpoint(&host, &telemetry, &mut failing).await,
                }
            }
        }));
        Ok(())
    }

    async fn shutdown(&mut self) {
        self.stop.cancel();
        let mut failing = match self.timer.take() {
            Some(t) => t.await.unwrap_or(false),
            None => false,
        };
        // The final checkpoint; `inferwatch run` reports its result (`last_checkpoint_error`).
        checkpoint(&self.host, &self.telemetry, &mut failing).await;
    }
}

//! Extension `storage`: where checkpointed state lives (an embedded redb file in `directory`),
//! restored at start, saved every `checkpoint_interval` and at shutdown.

use crate::component::{ComponentError, CreateContext, Extension, ExtensionFactory, FieldError, parse_config};
use crate::graph::StatusHandle;
use crate::host::Host;
use crate::settings::GoDuration;
use crate::state::Store;
use crate::telemetry::Telemetry;
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
    fn validate(&self, cfg: &serde_json::Value) -> Result<(), FieldError> {
        let c: StorageConfig = parse_config(cfg)?;
        if c.directory.as_os_str().is_empty() {
            return Err(FieldError::at("directory", "must not be empty"));
        }
        if c.checkpoint_interval.0 < Duration::from_millis(10) {
            return Err(FieldError::at("checkpoint_interval", "must be at least 10ms"));
        }
        Ok(())
    }
    fn create(&self, ctx: CreateContext, cfg: &serde_json::Value) -> Result<Box<dyn Extension>, ComponentError> {
        self.validate(cfg)?;
        let config: StorageConfig = parse_config(cfg)?;
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
    timer: Option<tokio::task::JoinHandle<()>>,
}

async fn checkpoint(host: &Host, telemetry: &Telemetry) {
    match host.state.checkpoint().await {
        Ok(n) => {
            telemetry.checkpoints("ok").inc();
            tracing::debug!(entries = n, "checkpoint written");
        }
        Err(e) => {
            telemetry.checkpoints("failed").inc();
            tracing::error!(error = %e, "checkpoint failed");
        }
    }
}

#[async_trait]
impl Extension for Storage {
    async fn start(&mut self, _status: StatusHandle) -> Result<(), ComponentError> {
        if self.host.state.is_persistent() {
            return Err(ComponentError::Start("only one storage extension may be enabled".into()));
        }
        let store = Store::open(&self.config.directory).map_err(|e| ComponentError::Start(e.to_string()))?;
        let path = store.path().display().to_string();
        let restored = self.host.state.attach(Arc::new(store)).map_err(|e| ComponentError::Start(e.to_string()))?;
        tracing::info!(path = %path, restored, "state store opened");
        let (host, telemetry, stop) = (self.host.clone(), self.telemetry.clone(), self.stop.clone());
        let every = self.config.checkpoint_interval.0;
        self.timer = Some(tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tick.tick() => checkpoint(&host, &telemetry).await,
                }
            }
        }));
        Ok(())
    }

    async fn shutdown(&mut self) {
        self.stop.cancel();
        if let Some(t) = self.timer.take() {
            let _ = t.await;
        }
        checkpoint(&self.host, &self.telemetry).await;
    }
}

//! `run`, `validate` and `components`: loading, checking and running a configuration.

use anyhow::Context;
use inferwatch::components::registry;
use inferwatch_core::config::{self, Config, ConfigError};
use inferwatch_core::graph::Service;
use inferwatch_core::telemetry::Telemetry;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// Exit code for an invalid configuration (also: a state file refused with `on_corrupt: fail`).
const EXIT_CONFIG: u8 = 2;
/// Exit code of a shutdown that lost something: accepted items not delivered before
/// `service.shutdown_timeout`, or a final checkpoint that failed.
const EXIT_SHUTDOWN_LOSS: u8 = 3;

/// Loads and validates; returns every error.
pub(crate) fn load_checked(paths: &[PathBuf]) -> Result<Config, Vec<ConfigError>> {
    load_checked_with(paths, &[])
}

/// Loads with the `--set` overrides and validates; returns every error, structural and per component.
pub(crate) fn load_checked_with(paths: &[PathBuf], sets: &[String]) -> Result<Config, Vec<ConfigError>> {
    config::check(paths, sets, &|k| std::env::var(k).ok(), &registry())
}

/// Prints configuration errors on stderr.
pub(crate) fn report(errors: &[ConfigError]) {
    eprintln!("error: invalid configuration ({} error{}):", errors.len(), if errors.len() == 1 { "" } else { "s" });
    for e in errors {
        eprintln!("  {e}");
    }
}

/// The configuration's warnings (valid settings that cannot do what they seem to).
pub(crate) fn warnings(cfg: &Config) -> Vec<ConfigError> {
    config::warnings(cfg, &registry())
}

/// `inferwatch validate`.
pub fn validate(paths: &[PathBuf], sets: &[String]) -> ExitCode {
    match load_checked_with(paths, sets) {
        Ok(cfg) => {
            // Warnings do not make the configuration invalid: the exit code stays 0.
            for w in warnings(&cfg) {
                eprintln!("warning: {w}");
            }
            let names: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
            println!(
                "configuration is valid: {} ({} pipelines, {} receivers, {} processors, {} exporters, {} connectors, {} extensions)",
                names.join(", "),
                cfg.service.pipelines.len(),
                cfg.receivers.len(),
                cfg.processors.len(),
                cfg.exporters.len(),
                cfg.connectors.len(),
                cfg.extensions.len()
            );
            ExitCode::SUCCESS
        }
        Err(errors) => {
            report(&errors);
            ExitCode::from(EXIT_CONFIG)
        }
    }
}

/// `inferwatch components`.
pub fn print_components() {
    println!("{:<10} {:<20} signals", "kind", "type");
    for c in registry().describe() {
        println!("{:<10} {:<20} {}", c.kind.singular(), c.type_name, c.signals.join(", "));
    }
}

/// `inferwatch run`.
pub fn run(paths: &[PathBuf], sets: &[String], log_level: Option<&str>) -> ExitCode {
    let cfg = match load_checked_with(paths, sets) {
        Ok(c) => c,
        Err(errors) => {
            report(&errors);
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    let t = &cfg.service.telemetry;
    if let Err(e) = crate::cli::init_logging_with(log_level.or(t.logs_level.as_deref()), t) {
        eprintln!("error: {e}");
        return ExitCode::from(EXIT_CONFIG);
    }
    for w in warnings(&cfg) {
        tracing::warn!("configuration: {w}");
    }
    raise_open_files_limit();
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().thread_name("inferwatch").build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(serve(cfg)) {
        Ok(Shutdown { undelivered: 0, checkpoint_error: None }) => ExitCode::SUCCESS,
        Ok(_) => ExitCode::from(EXIT_SHUTDOWN_LOSS),
        Err(e) => {
            eprintln!("error: {e:#}");
            if is_config_error(&e) { ExitCode::from(EXIT_CONFIG) } else { ExitCode::FAILURE }
        }
    }
}

/// Whether a start failure is a component refusing its settings (exit 2: restarting won't help).
fn is_config_error(e: &anyhow::Error) -> bool {
    use inferwatch_core::component::ComponentError;
    e.chain().any(|c| {
        matches!(c.downcast_ref::<inferwatch_core::graph::GraphError>(), Some(g) if matches!(g.source, ComponentError::Config(_)))
    })
}

/// Raises the open-files soft limit to the hard limit, so that many connections do not run
/// the agent out of file descriptors at the common 1,024 default.
fn raise_open_files_limit() {
    #[cfg(unix)]
    match inferwatch_core::telemetry::process::raise_open_files_limit() {
        Ok((old, new)) if new > old => tracing::info!(old, new, "raised the open-files limit (RLIMIT_NOFILE)"),
        Ok((old, _)) => tracing::debug!(limit = old, "open-files limit (RLIMIT_NOFILE) already at the hard limit"),
        Err(e) => tracing::warn!(error = %e, "cannot raise the open-files limit (RLIMIT_NOFILE)"),
    }
}

/// What a shutdown could not preserve.
struct Shutdown {
    /// Accepted items not delivered.
    undelivered: u64,
    /// Why the final checkpoint failed, if it did.
    checkpoint_error: Option<String>,
}

/// The self-telemetry's running parts: the pull endpoint and the periodic OTLP push.
pub(crate) struct SelfMetrics {
    stop_endpoint: CancellationToken,
    push: Option<crate::self_telemetry::SelfMetricsPush>,
}

impl SelfMetrics {
    /// Stops the endpoint and makes the push's last export.
    pub(crate) async fn stop(self) {
        self.stop_endpoint.cancel();
        if let Some(p) = self.push {
            p.shutdown().await;
        }
    }
}

/// Creates the self-telemetry registry with the `service.telemetry.resource`, serves it where
/// the configuration says, and starts the periodic OTLP readers.
pub(crate) async fn start_self_metrics(cfg: &Config) -> anyhow::Result<(Arc<Telemetry>, SelfMetrics)> {
    let telemetry = Arc::new(Telemetry::new());
    let resource = crate::self_telemetry::resource(&cfg.service.telemetry);
    telemetry.set_resource(resource.clone());
    let stop_endpoint = CancellationToken::new();
    if let Some(addr) = &cfg.service.telemetry.metrics_address {
        let local = telemetry
            .clone()
            .serve(addr, cfg.service.telemetry.metrics_tls.as_ref(), stop_endpoint.clone())
            .await
            .with_context(|| format!("cannot serve self-metrics on {addr}"))?;
        tracing::info!(address = %local, "self-metrics on http://{local}/metrics");
    }
    let push =
        crate::self_telemetry::SelfMetricsPush::start(&cfg.service.telemetry.periodic_readers, &telemetry, &resource);
    let push = match push {
        Ok(p) => p,
        Err(e) => {
            stop_endpoint.cancel();
            return Err(e);
        }
    };
    Ok((telemetry, SelfMetrics { stop_endpoint, push }))
}

async fn serve(cfg: Config) -> anyhow::Result<Shutdown> {
    let (telemetry, stop_telemetry) = start_self_metrics(&cfg).await?;
    let mut service = Service::build(&cfg, &registry(), telemetry.clone()).context("cannot build the pipelines")?;
    if let Err(e) = service.start().await {
        tracing::error!(error = %e, "start failed; shutting down");
        service.shutdown(cfg.service.shutdown_timeout).await;
        stop_telemetry.stop().await;
        return Err(anyhow::Error::new(e).context("cannot start the pipelines"));
    }
    wait_for_signal().await;
    tracing::info!(timeout = ?cfg.service.shutdown_timeout, "shutting down: receivers first, then draining");
    let host = service.host();
    let report = service.shutdown(cfg.service.shutdown_timeout).await;
    stop_telemetry.stop().await;
    let checkpoint_error = if host.state.is_persistent() { host.state.last_checkpoint_error() } else { None };
    if let Some(e) = &checkpoint_error {
        tracing::error!(error = %e, "the final checkpoint failed; state since the last good checkpoint is lost");
    }
    match (report.undelivered, &checkpoint_error) {
        (0, None) => tracing::info!("shutdown complete; everything accepted was delivered"),
        (0, Some(_)) => tracing::warn!(
            exit_code = EXIT_SHUTDOWN_LOSS,
            "shutdown finished; everything accepted was delivered, but the final checkpoint failed"
        ),
        (items, _) => tracing::warn!(
            items,
            exit_code = EXIT_SHUTDOWN_LOSS,
            "shutdown finished; {items} accepted items could not be delivered and were dropped"
        ),
    }
    Ok(Shutdown { undelivered: report.undelivered, checkpoint_error })
}

/// Waits for SIGTERM or Ctrl-C.
pub(crate) async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => tracing::info!("received SIGTERM"),
                    _ = tokio::signal::ctrl_c() => tracing::info!("received interrupt"),
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGTERM; waiting for Ctrl-C only");
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

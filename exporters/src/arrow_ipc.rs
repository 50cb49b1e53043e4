//! The `arrow_ipc` exporter: records traces and metrics as Arrow IPC stream files (`.arrows`,
//! ending with the end-of-stream marker), rotated by size and event time. Layout and crash
//! safety are described in [`crate::recording`].

use crate::recording::{self, BatchFile, FileFormat, RotationConfig};
use arrow_ipc::writer::StreamWriter;
use arrow_schema::SchemaRef;
use inferwatch_core::arrow::RecordBatch;
use inferwatch_core::component::{ComponentError, CreateContext, ExporterFactory, FieldError, NodeRef, parse_config};
use inferwatch_core::pdata::Signal;
use inferwatch_core::settings::GoDuration;
use serde::Deserialize;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::PathBuf;

/// Settings of the `arrow_ipc` exporter.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ArrowIpcConfig {
    /// Root directory of the recording (required).
    pub directory: PathBuf,
    /// When files are closed and new ones started.
    #[serde(default)]
    pub rotation: RotationConfig,
    /// How far event times may lie behind the latest one written (or ahead of the wall clock)
    /// and still name files (default 1h); rows outside are written to the current file and counted.
    #[serde(default = "recording::default_allowed_lateness")]
    pub allowed_lateness: GoDuration,
}

impl ArrowIpcConfig {
    /// Parses and checks settings.
    pub fn from_value(v: &serde_json::Value) -> Result<Self, FieldError> {
        let c: ArrowIpcConfig = parse_config(v)?;
        recording::validate_directory(&c.directory)?;
        c.rotation.validate()?;
        Ok(c)
    }
}

/// Factory of the `arrow_ipc` exporter.
#[derive(Debug, Default, Clone, Copy)]
pub struct ArrowIpcExporterFactory;

impl ExporterFactory for ArrowIpcExporterFactory {
    fn type_name(&self) -> &'static str {
        "arrow_ipc"
    }

    fn signals(&self) -> &'static [Signal] {
        &[Signal::Traces, Signal::Metrics]
    }

    fn parse(&self, cfg: &serde_json::Value) -> Result<inferwatch_core::component::Parsed, FieldError> {
        Ok(std::sync::Arc::new(ArrowIpcConfig::from_value(cfg)?))
    }

    fn build(
        &self,
        ctx: CreateContext,
        parsed: &inferwatch_core::component::Parsed,
        signal: Signal,
    ) -> Result<NodeRef, ComponentError> {
        let c = inferwatch_core::component::typed::<ArrowIpcConfig>(parsed)?;
        recording::create(&ctx, signal, c.directory.clone(), c.rotation, c.allowed_lateness.0, Box::new(IpcFormat))
    }
}

/// Arrow IPC streaming format.
struct IpcFormat;

impl FileFormat for IpcFormat {
    fn extension(&self) -> &'static str {
        "arrows"
    }

    fn open(&self, file: File, schema: SchemaRef) -> Result<Box<dyn BatchFile>, String> {
        let out = Counting { inner: BufWriter::new(file), written: 0 };
        let w = StreamWriter::try_new(out, &schema).map_err(|e| e.to_string())?;
        Ok(Box::new(IpcFile(w)))
    }
}

/// Counts the bytes that pass through to the buffered file.
struct Counting {
    inner: BufWriter<File>,
    written: u64,
}

impl Write for Counting {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

struct IpcFile(StreamWriter<Counting>);

impl BatchFile for IpcFile {
    fn write(&mut self, batch: &RecordBatch) -> Result<(), String> {
        self.0.write(batch).map_err(|e| e.to_string())
    }

    fn size(&self) -> u64 {
        self.0.get_ref().written
    }

    fn finish(self: Box<Self>) -> Result<File, String> {
        // Writes the end-of-stream marker and flushes.
        let out = self.0.into_inner().map_err(|e| e.to_string())?;
        out.inner.into_inner().map_err(|e| e.error().to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn config_defaults_and_errors() {
        let c = ArrowIpcConfig::from_value(&json!({"directory": "/tmp/rec"})).unwrap();
        assert_eq!(c.rotation, RotationConfig::default());
        let f = ArrowIpcExporterFactory;
        assert!(f.validate(&json!(null)).is_err(), "directory is required");
        assert!(f.validate(&json!({"directory": "d", "compression": "zstd"})).is_err());
        assert!(f.validate(&json!({"directory": "d", "rotation": {"max_age": "0s"}})).is_err());
        assert!(f.validate(&json!({"directory": "d", "rotation": {"max_bytes": 4096, "max_age": "1m"}})).is_ok());
    }
}

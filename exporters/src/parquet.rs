//! The `parquet` exporter: records traces and metrics as Parquet files (one row per span or
//! data point, in the Arrow schemas of `inferwatch_core::arrow::schema`), rotated by size and
//! event time. Layout and crash safety are described in [`crate::recording`].

use crate::recording::{self, BatchFile, FileFormat, RotationConfig};
use arrow_schema::SchemaRef;
use inferwatch_core::arrow::RecordBatch;
use inferwatch_core::component::{ComponentError, CreateContext, ExporterFactory, FieldError, NodeRef, parse_config};
use inferwatch_core::pdata::Signal;
use inferwatch_core::settings::GoDuration;
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;
use serde::Deserialize;
use std::fs::File;
use std::path::PathBuf;

/// Compression of the column chunks.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum ParquetCompression {
    /// Zstandard (default).
    #[default]
    Zstd,
    /// Uncompressed.
    None,
}

/// Settings of the `parquet` exporter.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ParquetConfig {
    /// Root directory of the recording (required).
    pub directory: PathBuf,
    /// When files are closed and new ones started.
    #[serde(default)]
    pub rotation: RotationConfig,
    /// How far event times may lie behind the latest one written (or ahead of the wall clock)
    /// and still name files (default 1h); rows outside are written to the current file and counted.
    #[serde(default = "recording::default_allowed_lateness")]
    pub allowed_lateness: GoDuration,
    /// `zstd` (default) or `none`.
    #[serde(default)]
    pub compression: ParquetCompression,
    /// zstd level (default 3); only with `compression: zstd`.
    #[serde(default)]
    pub compression_level: Option<i32>,
    /// Rows per row group (default 65536).
    #[serde(default = "default_row_group_size")]
    pub row_group_size: usize,
}

fn default_row_group_size() -> usize {
    65_536
}

/// zstd level when none is given.
pub const DEFAULT_ZSTD_LEVEL: i32 = 3;

impl ParquetConfig {
    /// Parses and checks settings.
    pub fn from_value(v: &serde_json::Value) -> Result<Self, FieldError> {
        let c: ParquetConfig = parse_config(v)?;
        recording::validate_directory(&c.directory)?;
        c.rotation.validate()?;
        if c.row_group_size == 0 {
            return Err(FieldError::at("row_group_size", "row_group_size must be positive"));
        }
        c.parquet_compression()?;
        Ok(c)
    }

    /// The parquet compression these settings ask for.
    pub fn parquet_compression(&self) -> Result<Compression, FieldError> {
        match (self.compression, self.compression_level) {
            (ParquetCompression::None, None) => Ok(Compression::UNCOMPRESSED),
            (ParquetCompression::None, Some(_)) => {
                Err(FieldError::at("compression_level", "compression_level applies to compression: zstd only"))
            }
            (ParquetCompression::Zstd, level) => {
                let level = level.unwrap_or(DEFAULT_ZSTD_LEVEL);
                ZstdLevel::try_new(level)
                    .map(Compression::ZSTD)
                    .map_err(|e| FieldError::at("compression_level", format!("invalid zstd level {level}: {e}")))
            }
        }
    }

    fn properties(&self) -> Result<WriterProperties, FieldError> {
        Ok(WriterProperties::builder()
            .set_compression(self.parquet_compression()?)
            .set_max_row_group_row_count(Some(self.row_group_size.max(1)))
            .build())
    }
}

/// Factory of the `parquet` exporter.
#[derive(Debug, Default, Clone, Copy)]
pub struct ParquetExporterFactory;

impl ExporterFactory for ParquetExporterFactory {
    fn type_name(&self) -> &'static str {
        "parquet"
    }

    fn signals(&self) -> &'static [Signal] {
        &[Signal::Traces, Signal::Metrics]
    }

    fn parse(&self, cfg: &serde_json::Value) -> Result<inferwatch_core::component::Parsed, FieldError> {
        Ok(std::sync::Arc::new(ParquetConfig::from_value(cfg)?))
    }

    fn build(
        &self,
        ctx: CreateContext,
        parsed: &inferwatch_core::component::Parsed,
        signal: Signal,
    ) -> Result<NodeRef, ComponentError> {
        let c = inferwatch_core::component::typed::<ParquetConfig>(parsed)?;
        let format = ParquetFormat { props: c.properties()? };
        recording::create(&ctx, signal, c.directory.clone(), c.rotation, c.allowed_lateness.0, Box::new(format))
    }
}

/// Parquet files written with `ArrowWriter` (which stores the Arrow schema in the footer).
struct ParquetFormat {
    props: WriterProperties,
}

impl FileFormat for ParquetFormat {
    fn extension(&self) -> &'static str {
        "parquet"
    }

    fn open(&self, file: File, schema: SchemaRef) -> Result<Box<dyn BatchFile>, String> {
        let w = ArrowWriter::try_new(file, schema, Some(self.props.clone())).map_err(|e| e.to_string())?;
        Ok(Box::new(ParquetFile(w)))
    }
}

struct ParquetFile(ArrowWriter<File>);

impl BatchFile for ParquetFile {
    fn write(&mut self, batch: &RecordBatch) -> Result<(), String> {
        self.0.write(batch).map_err(|e| e.to_string())
    }

    fn size(&self) -> u64 {
        (self.0.bytes_written() + self.0.in_progress_size()) as u64
    }

    fn finish(self: Box<Self>) -> Result<File, String> {
        // Flushes the open row group, writes the footer and flushes the buffer.
        self.0.into_inner().map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn config_defaults_and_errors() {
        let c = ParquetConfig::from_value(&json!({"directory": "/tmp/rec"})).unwrap();
        assert_eq!(c.rotation, RotationConfig::default());
        assert_eq!(c.rotation.max_bytes, 67_108_864);
        assert_eq!(c.rotation.max_age.0, std::time::Duration::from_secs(3600));
        assert_eq!(c.compression, ParquetCompression::Zstd);
        assert_eq!(c.row_group_size, 65_536);
        assert_eq!(c.parquet_compression().unwrap(), Compression::ZSTD(ZstdLevel::try_new(3).unwrap()));
        let none = ParquetConfig::from_value(&json!({"directory": "d", "compression": "none"})).unwrap();
        assert_eq!(none.parquet_compression().unwrap(), Compression::UNCOMPRESSED);

        let f = ParquetExporterFactory;
        assert!(f.validate(&json!({})).is_err(), "directory is required");
        assert!(f.validate(&json!({"directory": ""})).is_err());
        assert!(f.validate(&json!({"directory": "d", "compresion": "zstd"})).is_err());
        assert!(f.validate(&json!({"directory": "d", "compression": "gzip"})).is_err());
        assert!(f.validate(&json!({"directory": "d", "compression_level": 99})).is_err());
        assert!(f.validate(&json!({"directory": "d", "compression": "none", "compression_level": 3})).is_err());
        assert!(f.validate(&json!({"directory": "d", "row_group_size": 0})).is_err());
        assert!(f.validate(&json!({"directory": "d", "rotation": {"max_bytes": 0}})).is_err());
        assert!(f.validate(&json!({"directory": "d", "rotation": {"max_age": "soon"}})).is_err());
        assert!(f.validate(&json!({"directory": "d", "rotation": {"max_files": 3}})).is_err());
        let e = f.validate(&json!({"directory": "d", "compression_level": 99})).unwrap_err();
        assert_eq!(e.path, vec![inferwatch_core::component::PathSeg::Key("compression_level".into())]);
        let ok = json!({"directory": "d", "rotation": {"max_bytes": 1024, "max_age": "10m"}, "compression_level": 9,
            "row_group_size": 100});
        assert!(f.validate(&ok).is_ok());
    }
}

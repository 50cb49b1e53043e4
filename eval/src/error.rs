//! Errors of the evaluation.

use inferwatch_core::config::ConfigError;

/// Why an evaluation could not run.
#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    /// The detector pipeline's configuration is invalid.
    #[error("invalid eval pipeline configuration:\n{0}")]
    Config(String),
    /// The pipeline failed to build, start, take data or drain.
    #[error("eval pipeline: {0}")]
    Pipeline(String),
    /// A scenario could not be simulated or its ground truth read.
    #[error("scenario {name}: {message}")]
    Scenario {
        /// The scenario's file or name.
        name: String,
        /// What went wrong.
        message: String,
    },
    /// Reading or writing a file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The error.
        source: std::io::Error,
    },
    /// Input data is malformed.
    #[error("{0}")]
    Data(String),
}

impl EvalError {
    /// A configuration error from the loader's or validator's list.
    pub fn config(errors: Vec<ConfigError>) -> Self {
        EvalError::Config(errors.iter().map(|e| format!("  {e}")).collect::<Vec<_>>().join("\n"))
    }

    /// An I/O error on `path`.
    pub fn io(path: &std::path::Path, source: std::io::Error) -> Self {
        EvalError::Io { path: path.display().to_string(), source }
    }
}

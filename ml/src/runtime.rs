//! Finding and loading ONNX Runtime (ort `load-dynamic`), and opening sessions on it.
//!
//! The library is searched in this order: `ORT_DYLIB_PATH`; the config key `runtime_library`;
//! where the README's setup installs it (`.venv/lib/python3*/site-packages/onnxruntime/capi/
//! libonnxruntime.so.*` under the current directory and under the executable's `../..`); the
//! system library folders. An explicit path (variable or key) is the only one tried. One ONNX
//! Runtime is loaded per process: later loads reuse it. The `.venv` search also tries the parents
//! of the current directory, so `cargo test` (run in the crate's folder) finds the checkout's.

use ort::session::Session;
use ort::session::builder::GraphOptimizationLevel;
use serde::Deserialize;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The environment variable naming the library.
pub const ENV_VAR: &str = "ORT_DYLIB_PATH";
/// Oldest ONNX Runtime minor version this build accepts (ort feature `api-24`).
pub const MIN_MINOR: u32 = 24;
/// What the error messages say fixes a missing or old runtime.
pub const FIX: &str = "run ./scripts/test.sh (it installs onnxruntime==1.31.1 into .venv), \
     or set ORT_DYLIB_PATH or the processor's runtime_library to a libonnxruntime.so.1.x (x >= 24)";

const SYSTEM_DIRS: &[&str] =
    &["/usr/local/lib", "/usr/lib", "/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64"];

/// Why ONNX Runtime or a model could not be used.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// No library was found.
    #[error("ONNX Runtime not found; looked for: {looked}. Fix: {FIX}")]
    NotFound {
        /// The places searched, in order.
        looked: String,
    },
    /// The library did not load, or is too old.
    #[error("ONNX Runtime at {path} cannot be used: {message}. Fix: {FIX}")]
    Load {
        /// The library.
        path: PathBuf,
        /// The loader's message.
        message: String,
    },
    /// ONNX Runtime refused something (environment, session, run).
    #[error("ONNX Runtime: {0}")]
    Ort(String),
    /// The model does not fit its card.
    #[error("model {path}: {message}")]
    Model {
        /// The model.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
}

impl From<ort::Error> for RuntimeError {
    fn from(e: ort::Error) -> Self {
        RuntimeError::Ort(e.to_string())
    }
}

/// Where a session runs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ExecutionProvider {
    /// The CPU (default).
    #[default]
    Cpu,
    /// CUDA, falling back to the CPU with one log line when it cannot be registered.
    Cuda,
}

impl ExecutionProvider {
    /// The config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            ExecutionProvider::Cpu => "cpu",
            ExecutionProvider::Cuda => "cuda",
        }
    }
}

/// The inputs of the library search.
#[derive(Debug, Clone, Default)]
pub struct Search {
    /// Value of `ORT_DYLIB_PATH`, if set and not empty.
    pub env_path: Option<OsString>,
    /// The config key `runtime_library`.
    pub configured: Option<PathBuf>,
    /// The current directory.
    pub cwd: Option<PathBuf>,
    /// The running executable.
    pub exe: Option<PathBuf>,
    /// Whether to search the system library folders.
    pub system: bool,
}

impl Search {
    /// The search of this process: its environment, current directory and executable.
    pub fn from_process(configured: Option<PathBuf>) -> Search {
        Search {
            env_path: std::env::var_os(ENV_VAR).filter(|v| !v.is_empty()),
            configured,
            cwd: std::env::current_dir().ok(),
            exe: std::env::current_exe().ok(),
            system: true,
        }
    }

    /// The library to load, or the list of what was looked for.
    pub fn locate(&self) -> Result<PathBuf, RuntimeError> {
        let absolute = |p: &Path| match (&self.cwd, p.is_absolute()) {
            (Some(c), false) => c.join(p),
            _ => p.to_path_buf(),
        };
        let explicit = |what: &str, p: &Path| {
            let p = absolute(p);
            if p.is_file() {
                Ok(p)
            } else {
                Err(RuntimeError::NotFound { looked: format!("{what} = {} (no such file)", p.display()) })
            }
        };
        if let Some(e) = &self.env_path {
            return explicit(ENV_VAR, Path::new(e));
        }
        if let Some(c) = &self.configured {
            return explicit("runtime_library", c);
        }
        let mut looked = vec![format!("{ENV_VAR} (unset)"), "runtime_library (unset)".to_string()];
        // The current directory and its parents (a test runs in its crate's folder), then the
        // executable's ../.. (target/release → the checkout).
        let mut roots: Vec<PathBuf> = self.cwd.iter().flat_map(|c| c.ancestors()).map(Path::to_path_buf).collect();
        if let Some(repo) = self.exe.as_ref().and_then(|e| e.parent()).and_then(|d| d.parent()).and_then(|d| d.parent())
            && !roots.iter().any(|r| r == repo)
        {
            roots.push(repo.to_path_buf());
        }
        for root in roots {
            let lib = root.join(".venv").join("lib");
            looked.push(format!("{}/python3*/site-packages/onnxruntime/capi/libonnxruntime.so.*", lib.display()));
            for py in sorted_entries(&lib, |n| n.starts_with("python3")) {
                let capi = py.join("site-packages").join("onnxruntime").join("capi");
                if let Some(found) = newest_library(&capi) {
                    return Ok(found);
                }
            }
        }
        if self.system {
            for dir in SYSTEM_DIRS {
                looked.push(format!("{dir}/libonnxruntime.so*"));
                if let Some(found) = newest_library(Path::new(dir)) {
                    return Ok(found);
                }
            }
        }
        Err(RuntimeError::NotFound { looked: looked.join(", ") })
    }
}

fn sorted_entries(dir: &Path, keep: impl Fn(&str) -> bool) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut v: Vec<PathBuf> = rd
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(&keep))
        .collect();
    v.sort();
    v
}

/// The `libonnxruntime.so.*` in `dir` with the highest version, compared numerically (1.31.1 over
/// 1.9.0; the plain `.so` ranks lowest). A too-old one is refused at load time with the fix.
fn newest_library(dir: &Path) -> Option<PathBuf> {
    let mut v = sorted_entries(dir, |n| n == "libonnxruntime.so" || n.starts_with("libonnxruntime.so."));
    v.retain(|p| p.is_file());
    v.into_iter().max_by_key(|p| library_version(p))
}

/// The numeric version in a `libonnxruntime.so.X.Y.Z` file name (empty for the plain `.so`).
fn library_version(p: &Path) -> Vec<u64> {
    let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    name.strip_prefix("libonnxruntime.so.")
        .map(|v| v.split('.').map(|x| x.parse::<u64>().unwrap_or(0)).collect())
        .unwrap_or_default()
}

/// A loaded ONNX Runtime.
#[derive(Clone)]
pub struct Runtime {
    env: ort::environment::Environment,
    library: PathBuf,
}

static LOADED: Mutex<Option<Runtime>> = Mutex::new(None);

impl Runtime {
    /// Locates and loads the library (once per process; later calls reuse it).
    pub fn load(search: &Search) -> Result<Runtime, RuntimeError> {
        let path = search.locate()?;
        let mut loaded = LOADED.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(rt) = loaded.as_ref() {
            if rt.library != path {
                tracing::info!(
                    loaded = %rt.library.display(), requested = %path.display(),
                    "ONNX Runtime is already loaded in this process; using it"
                );
            }
            return Ok(rt.clone());
        }
        let builder =
            ort::init_from(&path).map_err(|e| RuntimeError::Load { path: path.clone(), message: e.to_string() })?;
        let env = builder.with_name("inferwatch").build()?;
        tracing::info!(library = %path.display(), "ONNX Runtime loaded");
        let rt = Runtime { env, library: path };
        *loaded = Some(rt.clone());
        Ok(rt)
    }

    /// The library file it was loaded from.
    pub fn library(&self) -> &Path {
        &self.library
    }

    /// Opens a session on `model` with `threads` intra-op threads; returns it and the provider
    /// actually used (CUDA falls back to the CPU with one warning).
    pub fn session(
        &self,
        model: &Path,
        provider: ExecutionProvider,
        threads: usize,
    ) -> Result<(Session, ExecutionProvider), RuntimeError> {
        let mut builder = Session::builder(&self.env)?
            .with_optimization_level(GraphOptimizationLevel::All)
            .map_err(|e| RuntimeError::Ort(e.to_string()))?
            .with_intra_threads(threads.max(1))
            .map_err(|e| RuntimeError::Ort(e.to_string()))?;
        let mut used = ExecutionProvider::Cpu;
        if provider == ExecutionProvider::Cuda {
            match builder.with_execution_providers([ort::ep::CUDA::default().build().error_on_failure()]) {
                Ok(b) => {
                    builder = b;
                    used = ExecutionProvider::Cuda;
                }
                Err(e) => {
                    tracing::warn!(model = %model.display(), error = %e, "CUDA execution provider unavailable; running on the CPU");
                    builder = e.recover();
                }
            }
        }
        let session = builder.commit_from_file(model).map_err(|e| RuntimeError::Model {
            path: model.to_path_buf(),
            message: format!("ONNX Runtime cannot load it: {e}"),
        })?;
        Ok((session, used))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn library_versions_compare_numerically() {
        use std::path::Path;
        assert!(
            super::library_version(Path::new("/x/libonnxruntime.so.1.31.1"))
                > super::library_version(Path::new("/x/libonnxruntime.so.1.9.0"))
        );
        assert!(
            super::library_version(Path::new("/x/libonnxruntime.so.1.9.0"))
                > super::library_version(Path::new("/x/libonnxruntime.so"))
        );
    }

    use super::*;

    #[test]
    fn explicit_paths_are_the_only_ones_tried() {
        let dir = std::env::temp_dir().join(format!("iw-ort-search-{}", std::process::id()));
        let capi = dir.join(".venv/lib/python3.11/site-packages/onnxruntime/capi");
        std::fs::create_dir_all(&capi).unwrap();
        std::fs::write(capi.join("libonnxruntime.so.1.31.1"), b"x").unwrap();
        std::fs::write(capi.join("libonnxruntime_providers_shared.so"), b"x").unwrap();
        let mut s = Search { cwd: Some(dir.clone()), ..Default::default() };
        assert_eq!(s.locate().unwrap(), capi.join("libonnxruntime.so.1.31.1"));
        s.configured = Some(PathBuf::from("nope/libonnxruntime.so.1"));
        let e = s.locate().unwrap_err().to_string();
        assert!(e.contains("runtime_library = ") && e.contains("nope/libonnxruntime.so.1 (no such file)"), "{e}");
        assert!(e.contains("./scripts/test.sh"), "{e}");
        s.env_path = Some(capi.join("libonnxruntime.so.1.31.1").into_os_string());
        assert_eq!(s.locate().unwrap(), capi.join("libonnxruntime.so.1.31.1"));
        let e = Search { cwd: Some(std::env::temp_dir().join("iw-ort-none")), ..Default::default() }
            .locate()
            .unwrap_err()
            .to_string();
        assert!(e.contains("ORT_DYLIB_PATH (unset)") && e.contains("python3*/site-packages/onnxruntime/capi"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

//! `inferwatch train-lstm-ae`: trains the `lstm_ae` model by running the project's Python training
//! script (scripts/lstm_ae/train.py, numpy + onnx), streaming its output. docs/lstm-ae.md.

use clap::Args;
use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};

/// The training script, relative to the repository root.
const SCRIPT: &str = "scripts/lstm_ae/train.py";
/// What to run when the Python packages are missing.
const FIX: &str = "run ./scripts/test.sh (it creates .venv with them) or `pip install -r tests/e2e/requirements.txt`, \
                   or point --python / INFERWATCH_PYTHON at an interpreter that has them";
/// Exit status for an environment problem (no Python, missing packages, no script).
const EXIT_ENV: u8 = 3;

/// Options of `inferwatch train-lstm-ae`.
#[derive(Debug, Clone, Args)]
pub struct TrainArgs {
    /// Recordings: Parquet files or directories written by the `parquet` exporter (one recording each).
    #[arg(long, required = true, num_args = 1..)]
    pub input: Vec<PathBuf>,
    /// Output model, `models/NAME.onnx`; the card is written next to it as `NAME.json`.
    #[arg(long)]
    pub out: PathBuf,
    /// Comma-separated metric names of the k signals (default: the eight of docs/lstm-ae.md).
    #[arg(long)]
    pub signals: Option<String>,
    /// Window length T in steps.
    #[arg(long, default_value_t = 60)]
    pub window: u32,
    /// Step in seconds.
    #[arg(long, default_value_t = 60)]
    pub step: u32,
    /// Use every n-th training window.
    #[arg(long, default_value_t = 2)]
    pub stride: u32,
    /// Hidden units of each LSTM.
    #[arg(long, default_value_t = 32)]
    pub hidden: u32,
    /// Training epochs.
    #[arg(long, default_value_t = 40)]
    pub epochs: u32,
    /// Structured pruning: fraction of hidden units kept (e.g. 0.6), then fine-tuning.
    #[arg(long)]
    pub prune: Option<f64>,
    /// Random seed.
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
    /// Also fit the PCA baseline on the same windows and write its card here.
    #[arg(long)]
    pub pca_out: Option<PathBuf>,
    /// Python interpreter (default: $INFERWATCH_PYTHON, ./.venv/bin/python, python3).
    #[arg(long)]
    pub python: Option<PathBuf>,
}

/// Why training could not start.
#[derive(Debug)]
enum TrainError {
    /// No interpreter could be started.
    NoPython(Vec<PathBuf>),
    /// The interpreter lacks a package.
    MissingPackages { python: PathBuf, detail: String },
    /// scripts/lstm_ae/train.py not found.
    NoScript(Vec<PathBuf>),
    /// The script could not be started.
    Spawn { python: PathBuf, error: std::io::Error },
    /// A bad argument.
    BadArg(String),
}

impl fmt::Display for TrainError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TrainError::NoPython(tried) => write!(
                f,
                "no Python interpreter found (tried {}); training needs Python 3 with numpy, onnx and pyarrow: {FIX}",
                join(tried)
            ),
            TrainError::MissingPackages { python, detail } => write!(
                f,
                "{} cannot import the training packages numpy, onnx and pyarrow ({detail}); {FIX}",
                python.display()
            ),
            TrainError::NoScript(tried) => write!(
                f,
                "training script {SCRIPT} not found (looked in {}); run from the repository checkout",
                join(tried)
            ),
            TrainError::Spawn { python, error } => write!(f, "cannot run {}: {error}", python.display()),
            TrainError::BadArg(m) => f.write_str(m),
        }
    }
}

fn join(paths: &[PathBuf]) -> String {
    paths.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
}

/// Runs the training; the exit status is the script's (3 when the environment is not ready).
pub fn run(args: TrainArgs) -> ExitCode {
    match start(&args) {
        Ok(code) => code,
        Err(e) => {
            tracing::error!(error = %e, "train-lstm-ae cannot start");
            eprintln!("inferwatch train-lstm-ae: {e}");
            ExitCode::from(match e {
                TrainError::BadArg(_) => 2,
                _ => EXIT_ENV,
            })
        }
    }
}

fn start(args: &TrainArgs) -> Result<ExitCode, TrainError> {
    if let Some(p) = args.prune
        && !(p > 0.0 && p <= 1.0)
    {
        return Err(TrainError::BadArg(format!("--prune is the fraction of units kept, in (0, 1]; got {p}")));
    }
    if args.out.extension().and_then(|e| e.to_str()) != Some("onnx") {
        return Err(TrainError::BadArg(format!("--out must end in .onnx, got {}", args.out.display())));
    }
    let python = find_python(args.python.as_deref())?;
    check_packages(&python)?;
    let script = find_script()?;
    let argv = script_args(args);
    tracing::info!(python = %python.display(), script = %script.display(), "training lstm_ae");
    let status = Command::new(&python)
        .arg(&script)
        .args(&argv)
        .stdin(Stdio::null())
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit())
        .status()
        .map_err(|error| TrainError::Spawn { python: python.clone(), error })?;
    Ok(match status.code() {
        Some(0) => ExitCode::SUCCESS,
        Some(c) => ExitCode::from(u8::try_from(c).unwrap_or(1)),
        None => ExitCode::FAILURE,
    })
}

/// The interpreter: --python, $INFERWATCH_PYTHON, ./.venv/bin/python, then python3 on PATH.
fn find_python(explicit: Option<&Path>) -> Result<PathBuf, TrainError> {
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(p) = explicit {
        // An explicit choice is used as given, never replaced by a fallback.
        return if runs(p) { Ok(p.to_path_buf()) } else { Err(TrainError::NoPython(vec![p.to_path_buf()])) };
    }
    if let Some(p) = std::env::var_os("INFERWATCH_PYTHON").filter(|p| !p.is_empty()) {
        candidates.push(PathBuf::from(p));
    }
    candidates.push(PathBuf::from(".venv/bin/python"));
    candidates.push(PathBuf::from("python3"));
    for c in &candidates {
        if runs(c) {
            return Ok(c.clone());
        }
    }
    Err(TrainError::NoPython(candidates))
}

fn runs(python: &Path) -> bool {
    Command::new(python)
        .args(["-c", "import sys; sys.exit(0 if sys.version_info >= (3, 9) else 1)"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

fn check_packages(python: &Path) -> Result<(), TrainError> {
    let out = Command::new(python)
        .args(["-c", "import numpy, onnx, pyarrow"])
        .stdin(Stdio::null())
        .output()
        .map_err(|error| TrainError::Spawn { python: python.to_path_buf(), error })?;
    if out.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    let detail = stderr.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("import failed").trim().to_string();
    Err(TrainError::MissingPackages { python: python.to_path_buf(), detail })
}

/// scripts/lstm_ae/train.py under the working directory, else under an ancestor of the executable
/// (target/release/inferwatch in a checkout).
fn find_script() -> Result<PathBuf, TrainError> {
    let mut tried = vec![PathBuf::from(SCRIPT)];
    if Path::new(SCRIPT).is_file() {
        return Ok(PathBuf::from(SCRIPT));
    }
    if let Ok(exe) = std::env::current_exe() {
        for dir in exe.ancestors().skip(1) {
            let p = dir.join(SCRIPT);
            if p.is_file() {
                return Ok(p);
            }
            tried.push(p);
        }
    }
    Err(TrainError::NoScript(tried))
}

/// The script's command line for these options.
fn script_args(a: &TrainArgs) -> Vec<OsString> {
    let mut v: Vec<OsString> = vec!["--input".into()];
    v.extend(a.input.iter().map(|p| p.as_os_str().to_owned()));
    v.push("--out".into());
    v.push(a.out.as_os_str().to_owned());
    if let Some(s) = &a.signals {
        v.push("--signals".into());
        v.push(s.into());
    }
    for (flag, value) in [
        ("--window", a.window.to_string()),
        ("--step", a.step.to_string()),
        ("--stride", a.stride.to_string()),
        ("--hidden", a.hidden.to_string()),
        ("--epochs", a.epochs.to_string()),
        ("--seed", a.seed.to_string()),
    ] {
        v.push(flag.into());
        v.push(value.into());
    }
    if let Some(p) = a.prune {
        v.push("--prune".into());
        v.push(p.to_string().into());
    }
    if let Some(p) = &a.pca_out {
        v.push("--pca-out".into());
        v.push(p.as_os_str().to_owned());
    }
    v.push("--command".into());
    v.push(card_command(a).into());
    v
}

/// The command recorded in the model card: this invocation, without --python.
fn card_command(a: &TrainArgs) -> String {
    let mut s = String::from("inferwatch train-lstm-ae --input");
    for p in &a.input {
        s.push(' ');
        s.push_str(&p.display().to_string());
    }
    s.push_str(&format!(" --out {}", a.out.display()));
    if let Some(sig) = &a.signals {
        s.push_str(&format!(" --signals {sig}"));
    }
    s.push_str(&format!(
        " --window {} --step {} --stride {} --hidden {} --epochs {} --seed {}",
        a.window, a.step, a.stride, a.hidden, a.epochs, a.seed
    ));
    if let Some(p) = a.prune {
        s.push_str(&format!(" --prune {p}"));
    }
    if let Some(p) = &a.pca_out {
        s.push_str(&format!(" --pca-out {}", p.display()));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: TrainArgs,
    }

    fn parse(argv: &[&str]) -> TrainArgs {
        Cli::try_parse_from(std::iter::once("x").chain(argv.iter().copied())).unwrap().args
    }

    #[test]
    fn input_and_out_are_required() {
        assert!(Cli::try_parse_from(["x", "--out", "m.onnx"]).is_err());
        assert!(Cli::try_parse_from(["x", "--input", "rec"]).is_err());
    }

    #[test]
    fn script_args_carry_every_option() {
        let a = parse(&["--input", "a", "b", "--out", "models/m.onnx", "--prune", "0.6", "--hidden", "16"]);
        let v: Vec<String> = script_args(&a).iter().map(|s| s.to_string_lossy().into_owned()).collect();
        let at = |flag: &str| v.iter().position(|x| x == flag).map(|i| v[i + 1].clone());
        assert_eq!(&v[..4], ["--input", "a", "b", "--out"]);
        assert_eq!(at("--prune").as_deref(), Some("0.6"));
        assert_eq!(at("--hidden").as_deref(), Some("16"));
        assert_eq!(at("--window").as_deref(), Some("60"));
        assert!(at("--signals").is_none() && at("--pca-out").is_none());
        let cmd = at("--command").unwrap();
        assert!(cmd.starts_with("inferwatch train-lstm-ae --input a b --out models/m.onnx"), "{cmd}");
        assert!(cmd.contains("--prune 0.6") && !cmd.contains("--python"), "{cmd}");
    }

    #[test]
    fn bad_prune_and_out_are_refused_before_python_runs() {
        let a = parse(&["--input", "a", "--out", "m.onnx", "--prune", "1.5", "--python", "/nonexistent/python"]);
        assert!(matches!(start(&a), Err(TrainError::BadArg(m)) if m.contains("--prune")));
        let a = parse(&["--input", "a", "--out", "m.json"]);
        assert!(matches!(start(&a), Err(TrainError::BadArg(m)) if m.contains(".onnx")));
    }

    #[test]
    fn an_explicit_missing_python_is_not_replaced() {
        let e = find_python(Some(Path::new("/nonexistent/python3"))).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("/nonexistent/python3") && msg.contains("pip install -r tests/e2e/requirements.txt"));
    }
}

//! `inferwatch bench` as a standalone program, until the main binary wires it:
//! `cargo run -p inferwatch-probe --example bench -- --endpoint http://127.0.0.1:8000 --model M --rate 5`.

use clap::Parser;
use std::process::ExitCode;

/// Drive an OpenAI-compatible endpoint and measure it.
#[derive(Parser)]
#[command(name = "bench")]
struct Cli {
    #[command(flatten)]
    args: inferwatch_probe::BenchArgs,
}

fn main() -> ExitCode {
    inferwatch_probe::main_entry(Cli::parse().args)
}

//! The `inferwatch` binary: command line, logging and the agent's life cycle.

mod cli;
mod demo;
mod eval;
mod replay;
mod run;
mod self_telemetry;
mod train;

use clap::Parser;
use std::process::ExitCode;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Returns mimalloc's free pages to the system (used by the memory limiter).
fn release_free_memory() {
    // SAFETY: mi_collect has no preconditions; `true` forces freeing of all unused memory.
    unsafe { libmimalloc_sys::mi_collect(true) }
}

fn main() -> ExitCode {
    inferwatch_core::telemetry::process::set_memory_releaser(release_free_memory);
    let cli = cli::Cli::parse();
    let level = cli.log_level;
    match cli.command.unwrap_or_default() {
        // `run` sets up logging once the configuration (service.telemetry.logs.level) is read.
        cli::Command::Run(args) => run::run(&args.config, &args.set, level.as_deref()),
        // `replay` sets up logging once the configuration is read, as `run` does.
        cli::Command::Replay(args) => replay::run(&args, level.as_deref()),
        cli::Command::Validate(args) => {
            cli::init_logging(level.as_deref());
            run::validate(&args.config, &args.set)
        }
        cli::Command::PrintConfig(args) => cli::print_config(&args),
        cli::Command::Sim(args) => {
            cli::init_logging(level.as_deref());
            let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("inferwatch sim: {e}");
                    return ExitCode::FAILURE;
                }
            };
            match rt.block_on(inferwatch_sim::server::run(*args)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("inferwatch sim: {e}");
                    ExitCode::from(e.exit_code())
                }
            }
        }
        cli::Command::Bench(args) => {
            cli::init_logging(Some(level.as_deref().unwrap_or("warn")));
            inferwatch_probe::main_entry(*args)
        }
        cli::Command::Demo(args) => {
            cli::init_logging(Some(level.as_deref().unwrap_or("warn")));
            demo::run(args)
        }
        cli::Command::Eval(args) => {
            cli::init_logging(Some(level.as_deref().unwrap_or("warn")));
            eval::run(*args)
        }
        cli::Command::TrainLstmAe(args) => {
            cli::init_logging(Some(level.as_deref().unwrap_or("warn")));
            train::run(*args)
        }
        cli::Command::Components => {
            run::print_components();
            ExitCode::SUCCESS
        }
    }
}

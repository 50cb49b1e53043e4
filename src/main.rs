//! The `inferwatch` binary: command line, logging and the agent's life cycle.

mod cli;
mod run;

use clap::Parser;
use std::process::ExitCode;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    cli::init_logging(cli.log_level.as_deref());
    match cli.command.unwrap_or_default() {
        cli::Command::Run(args) => run::run(&args.config),
        cli::Command::Validate(args) => run::validate(&args.config),
        cli::Command::Components => {
            run::print_components();
            ExitCode::SUCCESS
        }
    }
}

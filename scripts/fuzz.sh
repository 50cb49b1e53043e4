#!/usr/bin/env bash
# The long fuzz run (issue 15): every target (or those given with --target) for --secs
# seconds each (default 60), release build. Prints per target: executions, executions/s,
# crashes, hangs, memory and invariant findings, distinct findings. Exits 1 on any finding;
# minimised findings are written to fuzz/findings/<target>/ (copy a fixed one into
# fuzz/corpus/<target>/ as a regression input).
#
#   scripts/fuzz.sh [--secs N] [--target T]... [--seed S]
#   scripts/fuzz.sh gen-corpus      # rewrite the generated part of the seed corpus
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p inferwatch-fuzz --quiet
exec target/release/inferwatch-fuzz "$@"

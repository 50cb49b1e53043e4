#!/usr/bin/env bash
# Builds the agent (release) and runs it on ./pipeline.yaml, or on the files given with --config.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --bin inferwatch
if [ "$#" -eq 0 ]; then
  exec target/release/inferwatch run --config pipeline.yaml
fi
exec target/release/inferwatch "$@"

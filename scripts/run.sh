#!/usr/bin/env bash
# Builds the agent (release) and runs it on ./pipeline.yaml, or with the arguments given
# (e.g. `./scripts/run.sh demo`, `./scripts/run.sh run --config my.yaml`).
# When a configuration uses the lstm_ae detector, ONNX Runtime (the PyPI onnxruntime wheel's
# libonnxruntime.so, which lstm_ae loads at run time) is installed into .venv first.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --bin inferwatch

ensure_onnxruntime() {
    if ls .venv/lib/python3*/site-packages/onnxruntime/capi/libonnxruntime.so.1* >/dev/null 2>&1; then
        return 0
    fi
    echo "a configuration uses lstm_ae: installing ONNX Runtime (PyPI onnxruntime==1.31.1) into .venv"
    [[ -x .venv/bin/python ]] || python3 -m venv .venv
    .venv/bin/python -m pip install --quiet --disable-pip-version-check onnxruntime==1.31.1
}

# The configuration files this run uses: the values of --config / -c, else ./pipeline.yaml.
configs=()
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
    case "${args[i]}" in
        --config=*) configs+=("${args[i]#--config=}") ;;
        --config|-c) configs+=("${args[i + 1]:-}"); i=$((i + 1)) ;;
    esac
done
[[ ${#configs[@]} -eq 0 ]] && configs=(pipeline.yaml)
if grep -qs -E '^\s*lstm_ae(/[^:]*)?:' "${configs[@]}"; then
    ensure_onnxruntime
fi

if [ "$#" -eq 0 ]; then
  exec target/release/inferwatch run --config pipeline.yaml
fi
exec target/release/inferwatch "$@"

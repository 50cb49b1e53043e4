#!/usr/bin/env bash
# Device check of lstm_ae on ONNX Runtime's CUDA execution provider (issue 8, item 5). < 60 s.
#
# Scores the committed model (models/lstm_ae_default.onnx) on 512 fixed windows with
# execution_provider cuda and with cpu, through the same code the processor uses, and reports:
#   - which provider actually ran (the CPU `onnxruntime` wheel has no CUDA provider, and the CUDA
#     provider of `onnxruntime-gpu` also needs the CUDA and cuDNN libraries: without them the
#     processor falls back to the CPU with one log line, and so does this check);
#   - the largest score difference against the CPU run (must be <= 1e-4).
# Exit status: 0 = ran on CUDA and equal; 3 = fell back to the CPU (scores equal); 1 = scores differ
# or the check failed.
#
# Usage: deploy/gpu-check-ort.sh
#   LSTM_BENCH=path/to/lstm-bench   the binary (default target/release/lstm-bench, built if missing)
#   ORT_DYLIB_PATH=.../libonnxruntime.so.1.x   the runtime (default: the .venv search of the processor);
#                                   point it at onnxruntime-gpu's library to test CUDA for real.
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=${LSTM_BENCH:-target/release/lstm-bench}
if [[ ! -x $BIN ]]; then
  echo "== building $BIN"
  cargo build --release -p inferwatch-bench --bin lstm-bench || exit 1
fi
echo "== GPU"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
else
  echo "nvidia-smi not found"
fi
echo "== CUDA libraries visible to the loader"
ldconfig -p 2>/dev/null | grep -E 'libcudart\.so|libcublas\.so|libcudnn\.so' | awk '{print $1}' | sort -u | head -8 || true
[[ -n ${ORT_DYLIB_PATH:-} ]] && echo "ORT_DYLIB_PATH=$ORT_DYLIB_PATH"
echo "== lstm_ae cuda vs cpu"
out=$(timeout 50 "$BIN" --check-provider cuda --model models/lstm_ae_default.onnx --windows 512 2>&1)
rc=$?
echo "$out"
if [[ $rc -ne 0 ]]; then
  echo "RESULT: FAIL (lstm-bench exit $rc)"
  exit 1
fi
if grep -q '"fell_back_to_cpu": true' <<<"$out"; then
  echo "RESULT: FALLBACK — the CUDA execution provider could not be registered; lstm_ae ran on the CPU (scores equal)"
  exit 3
fi
echo "RESULT: OK — lstm_ae ran on CUDA; scores equal the CPU run within 1e-4"

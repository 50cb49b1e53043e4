#!/usr/bin/env bash
# Runs both device checks on a GPU machine with prebuilt binaries (target/release/inferwatch and
# target/release/lstm-bench): the nvml receiver against nvidia-smi (deploy/gpu-check.sh), then
# lstm_ae on ONNX Runtime's CUDA provider (deploy/gpu-check-ort.sh) with whichever ONNX Runtime
# library the machine has (ORT_DYLIB_PATH, else one found under Python's site-packages).
# Output goes to stdout and, when $OUT is set, to $OUT/device-check.txt. Exit 0 when the nvml check
# passed and the ONNX Runtime check did not fail (a CPU fallback is reported, not failed).
set -uo pipefail
cd "$(dirname "$0")/.."
log=${OUT:-/tmp}/device-check.txt
{
echo "== host: $(hostname) $(date -u +%FT%TZ)"
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader 2>&1
echo "== nvml receiver"
bash deploy/gpu-check.sh target/release/inferwatch; nvml_rc=$?; echo "gpu-check.sh exit $nvml_rc"
echo "== ONNX Runtime on this machine"
if [[ -z ${ORT_DYLIB_PATH:-} ]]; then
    for py in python3 python; do
        command -v $py >/dev/null || continue
        $py - <<'PY' 2>&1
try:
    import onnxruntime as o, os
    print("onnxruntime", o.__version__, o.get_available_providers(), os.path.dirname(o.__file__))
except Exception as e:
    print("no onnxruntime module:", e)
PY
        # The library of the module Python imports first (onnxruntime-gpu when that is installed).
        lib=$($py -c 'import onnxruntime as o, os, glob; print((sorted(glob.glob(os.path.join(os.path.dirname(o.__file__), "capi", "libonnxruntime.so.1*"))) or [""])[-1])' 2>/dev/null)
        break
    done
    [[ -z ${lib:-} ]] && lib=$(find / -xdev -name 'libonnxruntime.so.1*' -not -path '*/proc/*' 2>/dev/null | head -1)
    [[ -n ${lib:-} ]] && export ORT_DYLIB_PATH=$lib
fi
echo "ORT_DYLIB_PATH=${ORT_DYLIB_PATH:-<none found>}"
if [[ -n ${ORT_DYLIB_PATH:-} ]]; then
    LSTM_BENCH=target/release/lstm-bench bash deploy/gpu-check-ort.sh; ort_rc=$?; echo "gpu-check-ort.sh exit $ort_rc"
else
    echo "SKIP  lstm_ae CUDA check: no ONNX Runtime library on this machine (and none carried)"
fi
# Exit 1 when the nvml check failed or the ONNX Runtime check failed (3 = fell back to the CPU is not a failure).
[[ ${nvml_rc:-1} -eq 0 && ${ort_rc:-0} -ne 1 ]]
} 2>&1 | tee "$log"

#!/usr/bin/env bash
# Device check of the `nvml` receiver on a host with an NVIDIA GPU. Builds nothing: it runs an
# already built agent (the path in $1, default target/release/inferwatch) with an nvml receiver
# feeding a `debug` exporter (one line per data point) for 10 s, and checks against nvidia-smi:
#   1. the agent found the GPUs (no "no GPU telemetry" line) and every GPU reported;
#   2. hw.gpu.memory.limit equals nvidia-smi's memory.total within 1 %;
#   3. hw.gpu.memory.usage is within 1 % of the total of nvidia-smi's memory.used (read at the start);
#   4. hw.gpu.utilization lies in [0, 1];
#   5. a known load moves the memory reading: with python3 + torch present, 4 GiB are allocated on
#      GPU 0 for 4 s in the middle of the run and hw.gpu.memory.usage must rise by >= 3.5 GiB and
#      fall back; the allocating process's own memory (process.gpu.memory.usage) is reported when
#      the driver lists it (inside some sandboxes it does not: then INFO, not FAIL).
#      Without torch the load check is skipped and says so.
# Needs only the binary, nvidia-smi, bash and awk. Prints PASS/FAIL per check and a summary; exit 0
# when everything that ran passed. Takes about 15 s.
set -u

BIN=${1:-target/release/inferwatch}
RUN_S=${RUN_S:-10}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
fails=0
pass() { echo "PASS  $*"; }
fail() { echo "FAIL  $*"; fails=$((fails + 1)); }
info() { echo "INFO  $*"; }

[ -x "$BIN" ] || { echo "FAIL  agent binary not found or not executable: $BIN"; exit 2; }
command -v nvidia-smi >/dev/null || { echo "FAIL  nvidia-smi not found"; exit 2; }

nvidia-smi --query-gpu=index,uuid,name,memory.total,memory.used --format=csv,noheader,nounits >"$WORK/smi.csv" \
  || { echo "FAIL  nvidia-smi cannot query the GPUs"; exit 2; }
info "nvidia-smi: $(tr '\n' ';' <"$WORK/smi.csv")"
ngpus=$(grep -c . "$WORK/smi.csv")

cat >"$WORK/agent.yaml" <<'EOF'
receivers:
  nvml:
    collection_interval: 200ms
    naming: otel
    process_metrics: true
    peak_window: 2s
exporters:
  debug:
    verbosity: normal
    sampling_initial: 1000000
    sampling_thereafter: 1
service:
  telemetry:
    metrics:
      level: none
  pipelines:
    metrics:
      receivers: [nvml]
      exporters: [debug]
EOF

"$BIN" run --config "$WORK/agent.yaml" >"$WORK/out.txt" 2>"$WORK/log.txt" &
agent=$!

load_pid=""
if python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  sleep 3
  python3 - >"$WORK/load.txt" 2>&1 <<'EOF' &
import os, time, torch
x = torch.empty(4 << 30, dtype=torch.uint8, device="cuda:0")
x.fill_(1)
torch.cuda.synchronize()
print("pid", os.getpid(), "allocated", x.numel(), flush=True)
time.sleep(4)
EOF
  load_pid=$!
  wait "$load_pid"
  sleep $((RUN_S - 3 - 5 > 0 ? RUN_S - 3 - 5 : 1))
else
  info "python3 with torch (CUDA) not available: the load check is skipped"
  sleep "$RUN_S"
fi
kill -TERM "$agent" 2>/dev/null
wait "$agent" 2>/dev/null

if grep -q "no GPU telemetry" "$WORK/log.txt"; then
  fail "the agent found no GPU: $(grep 'no GPU telemetry' "$WORK/log.txt" | head -1)"
else
  pass "the agent sampled: $(grep -m1 'nvml receiver sampling' "$WORK/log.txt" | sed 's/.*gpus=//' | cut -c1-200)"
fi

# Per GPU UUID: limit, memory usage series, utilisation range, rounds seen.
awk -v smi="$WORK/smi.csv" -v out="$WORK/metrics.tsv" '
  function uuid(l,   m) { if (match(l, /gpu\.uuid=[^,}]+/)) return substr(l, RSTART + 9, RLENGTH - 9); return "" }
  function val(l) { return $NF }
  /^hw\.gpu\.memory\.limit\{/ { lim[uuid($0)] = val($0) }
  /^hw\.gpu\.memory\.usage\{/ { u = uuid($0); v = val($0) + 0; n[u]++; if (!(u in mn) || v < mn[u]) mn[u] = v;
                                if (v > mx[u]) mx[u] = v; if (!(u in first)) first[u] = v; last[u] = v }
  /^hw\.gpu\.utilization\{/   { u = uuid($0); v = val($0) + 0; if (!(u in umin) || v < umin[u]) umin[u] = v; if (v > umax[u]) umax[u] = v }
  END { for (u in n) printf "%s\t%s\t%d\t%.0f\t%.0f\t%.0f\t%.0f\t%s\t%s\n", u, lim[u], n[u], mn[u], mx[u], first[u], last[u], umin[u], umax[u] > out }
' "$WORK/out.txt"
touch "$WORK/metrics.tsv"
seen=$(grep -c . "$WORK/metrics.tsv")
[ "$seen" -eq "$ngpus" ] && pass "$seen of $ngpus GPUs reported" || fail "$seen of $ngpus GPUs reported"

while IFS=', ' read -r idx uuid rest; do
  line=$(grep -F "$uuid" "$WORK/metrics.tsv")
  [ -n "$line" ] || { fail "GPU $idx ($uuid): no metrics"; continue; }
  total_mib=$(awk -F', ' -v u="$uuid" '$2 == u { print $(NF - 1) }' "$WORK/smi.csv")
  used_mib=$(awk -F', ' -v u="$uuid" '$2 == u { print $NF }' "$WORK/smi.csv")
  IFS=$'\t' read -r _ lim rounds mn mx first last umin umax <<<"$line"
  info "GPU $idx: $rounds samples; limit $lim B; usage min $mn max $mx first $first last $last B; utilization [$umin, $umax]"
  awk -v l="$lim" -v t="$total_mib" 'BEGIN { d = l - t * 1048576; if (d < 0) d = -d; exit !(t > 0 && d <= 0.01 * t * 1048576) }' \
    && pass "GPU $idx: memory limit $lim B = nvidia-smi total $total_mib MiB (within 1 %)" \
    || fail "GPU $idx: memory limit $lim B vs nvidia-smi total $total_mib MiB"
  awk -v f="$first" -v u="$used_mib" -v t="$total_mib" 'BEGIN { d = f - u * 1048576; if (d < 0) d = -d; exit !(d <= 0.01 * t * 1048576) }' \
    && pass "GPU $idx: memory usage $first B ~ nvidia-smi used $used_mib MiB (within 1 % of total)" \
    || fail "GPU $idx: memory usage $first B vs nvidia-smi used $used_mib MiB"
  awk -v a="$umin" -v b="$umax" 'BEGIN { exit !(a != "" && a >= 0 && b <= 1) }' \
    && pass "GPU $idx: utilization in [0, 1] ($umin..$umax)" || fail "GPU $idx: utilization out of [0, 1] ($umin..$umax)"
  if [ -n "$load_pid" ] && [ "$idx" = 0 ]; then
    awk -v a="$mn" -v b="$mx" -v z="$last" 'BEGIN { exit !(b - a >= 3.5 * 1073741824 && b - z >= 3.5 * 1073741824) }' \
      && pass "GPU 0: a 4 GiB allocation moved hw.gpu.memory.usage by $(( (mx - mn) / 1048576 )) MiB and it fell back" \
      || fail "GPU 0: a 4 GiB allocation did not move hw.gpu.memory.usage (min $mn max $mx last $last)"
    lp=$(awk '/^pid/ { print $2 }' "$WORK/load.txt")
    if [ -n "$lp" ] && grep -q "^process\.gpu\.memory\.usage{.*process\.pid=$lp[,}]" "$WORK/out.txt"; then
      pass "GPU 0: the allocating process (pid $lp) is reported in process.gpu.memory.usage"
    else
      pids=$(grep -o 'process\.pid=[0-9]*' "$WORK/out.txt" | sort -u | tr '\n' ' ')
      info "GPU 0: pid ${lp:-?} not in process.gpu.memory.usage (pids seen: ${pids:-none}; the driver may hide them here)"
    fi
  fi
done <"$WORK/smi.csv"

peaks=$(grep -c '^gpu\.memory\.peak{' "$WORK/out.txt")
[ "$peaks" -gt 0 ] && pass "gpu.memory.peak emitted ($peaks points over ${RUN_S}s with 2s windows)" || fail "no gpu.memory.peak"
grep -E ' (ERROR|WARN) ' "$WORK/log.txt" | head -5 | sed 's/^/INFO  agent log: /'

if [ "$fails" -eq 0 ]; then echo "SUMMARY: PASS"; exit 0; fi
echo "SUMMARY: FAIL ($fails checks failed)"
exit 1

#!/usr/bin/env bash
# OTLP pass-through: inferwatch vs Rotel, same generator, same sink, same run.
#
#   otlp-load gen (core 0) --> collector (core 1) --> otlp-load sink (core 0)
#
# Usage: bench/passthrough.sh [CASE ...]        (from anywhere; see bench/README.md)
#   cases: grpc http rate10k rate10k-http idle  (default: grpc http rate10k idle)
# Environment:
#   REPS=3 DUR=20s           repetitions and load duration per run
#   COLLECTORS="inferwatch rotel"
#   STREAMS=4 BATCH=512      load shape of the grpc/http cases (rate10k: 4 x 100 at 10,000 spans/s)
#   PIN=1                    taskset: collector on core 1, generator and sink on core 0
#   OUT=bench/results/passthrough-<time>
#   IDLE_WAIT=30             seconds to wait for the machine to go quiet before each run (0: don't)
#   SETTLE_MAX=30            seconds to wait for the sink to receive everything after the load
#   NOISY_PCT=15 RETRY_NOISY=2  a run in which other processes used more than NOISY_PCT % of a core
#                            is set aside (CASE.COLLECTOR.REP.rejected-N) and repeated, up to RETRY_NOISY times
#   SKIP_BUILD=1             use the binaries already in target/release
#   ROTEL=/path/rotel-agent  use this Rotel instead of bench/.venv-rotel
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

REPS=${REPS:-3}
DUR=${DUR:-20s}
COLLECTORS=${COLLECTORS:-"inferwatch rotel"}
STREAMS=${STREAMS:-4}
BATCH=${BATCH:-512}
PIN=${PIN:-1}
IDLE_WAIT=${IDLE_WAIT:-30}
IDLE_MAX_PCT=${IDLE_MAX_PCT:-10}
SETTLE_MAX=${SETTLE_MAX:-30}
NOISY_PCT=${NOISY_PCT:-15}
RETRY_NOISY=${RETRY_NOISY:-2}
OUT=${OUT:-bench/results/passthrough-$(date +%Y%m%d-%H%M%S)}
ROTEL_VERSION=0.0.1a15
# Collector in, sink in, inferwatch self-metrics.
C_GRPC=${C_GRPC:-24317}
C_HTTP=${C_HTTP:-24318}
S_GRPC=${S_GRPC:-14317}
S_HTTP=${S_HTTP:-14318}
SELF_METRICS=${SELF_METRICS:-28888}

CASES=("$@")
[[ ${#CASES[@]} -gt 0 ]] || CASES=(grpc http rate10k idle)

LOAD=target/release/otlp-load
INFERWATCH=target/release/inferwatch

log() { printf '[passthrough %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

dur_secs() { # 20s | 1m | 500ms | 20  ->  whole seconds, rounded up
    local d=$1
    case $d in
        *ms) echo $(((${d%ms} + 999) / 1000)) ;;
        *s) echo "${d%s}" ;;
        *m) echo $((${d%m} * 60)) ;;
        *) echo "$d" ;;
    esac
}
DUR_S=$(dur_secs "$DUR")
[[ $DUR_S =~ ^[0-9]+$ && $DUR_S -gt 0 ]] || die "DUR=$DUR: use e.g. 20s, 1m"

# ---------------------------------------------------------------- processes we started
PIDS=()
cleanup() {
    local p
    for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    sleep 0.5
    for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

alive() { kill -0 "$1" 2>/dev/null; }

# wait_stop PID SECONDS: true if it exited in time
wait_stop() {
    local pid=$1 deadline=$((SECONDS + $2))
    while alive "$pid" && ((SECONDS < deadline)); do sleep 0.1; done
    ! alive "$pid"
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# wait_port PORT SECONDS PID: true once PORT accepts connections; false if PID dies or time runs out
wait_port() {
    local deadline=$((SECONDS + $2))
    while ((SECONDS < deadline)); do
        port_open "$1" && return 0
        alive "$3" || return 1
        sleep 0.1
    done
    return 1
}


# Busy share of the machine over 1 s, in % of one core.
host_busy_pct() {
    local a b
    read -r _ u n s i w q sq st _ </proc/stat
    a=("$((u + n + s + i + w + q + sq + st))" "$((i + w))")
    sleep 1
    read -r _ u n s i w q sq st _ </proc/stat
    b=("$((u + n + s + i + w + q + sq + st))" "$((i + w))")
    local dt=$((b[0] - a[0])) di=$((b[1] - a[1]))
    ((dt > 0)) || { echo 0; return; }
    echo $(((dt - di) * 100 * NCPU / dt))
}

# Waits (up to IDLE_WAIT s) for the machine to be quiet; prints the last busy figure.
wait_idle() {
    local busy deadline=$((SECONDS + IDLE_WAIT))
    busy=$(host_busy_pct)
    while ((busy > IDLE_MAX_PCT && SECONDS < deadline)); do busy=$(host_busy_pct); done
    echo "$busy"
}

# ---------------------------------------------------------------- setup
NCPU=$(grep -c '^cpu[0-9]' /proc/stat)
if [[ $PIN == 1 ]] && { ((NCPU < 2)) || ! command -v taskset >/dev/null; }; then
    log "fewer than 2 cores or no taskset: running unpinned"
    PIN=0
fi
# Command prefixes (not functions: `cmd &` must give the PID of the process itself; taskset execs it).
PIN0=() PIN1=()
if [[ $PIN == 1 ]]; then PIN0=(taskset -c 0) PIN1=(taskset -c 1); fi

ensure_rotel() {
    if [[ -n ${ROTEL:-} ]]; then
        [[ -x $ROTEL ]] || die "ROTEL=$ROTEL is not executable"
        return
    fi
    local venv=bench/.venv-rotel
    local find='import rotel, os; print(os.path.join(os.path.dirname(rotel.__file__), "rotel-agent"))'
    if ! ROTEL=$("$venv/bin/python" -c "$find" 2>/dev/null) || [[ ! -x $ROTEL ]]; then
        log "installing rotel==$ROTEL_VERSION into $venv"
        python3 -m venv "$venv"
        "$venv/bin/pip" install -q "rotel==$ROTEL_VERSION"
        ROTEL=$("$venv/bin/python" -c "$find")
    fi
    [[ -x $ROTEL ]] || die "no rotel-agent at $ROTEL"
}

wants() { [[ " $COLLECTORS " == *" $1 "* ]]; }

if [[ ${SKIP_BUILD:-0} != 1 ]]; then
    log "building otlp-load"
    cargo build --release -q -p inferwatch-bench --bin otlp-load
    if wants inferwatch; then
        log "building inferwatch"
        cargo build --release -q --bin inferwatch || die "inferwatch does not build; COLLECTORS=rotel runs Rotel alone"
    fi
fi
[[ -x $LOAD ]] || die "no $LOAD"
if wants inferwatch; then [[ -x $INFERWATCH ]] || die "no $INFERWATCH"; fi
if wants rotel; then ensure_rotel; fi

mkdir -p "$OUT"
for p in $C_GRPC $C_HTTP $S_GRPC $S_HTTP; do
    port_open "$p" && die "port $p is already in use on 127.0.0.1"
done

{
    printf '{"date": "%s", "reps": %s, "dur": "%s", "streams": %s, "batch": %s, "pinned": %s, "cores": %s,\n' \
        "$(date -Iseconds)" "$REPS" "$DUR" "$STREAMS" "$BATCH" "$([[ $PIN == 1 ]] && echo true || echo false)" "$NCPU"
    printf ' "cpu": "%s", "kernel": "%s", "git": "%s",\n' \
        "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//;s/"/\\"/g')" "$(uname -r)" \
        "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo -dirty)"
    printf ' "rotel": "%s", "inferwatch": "%s"}\n' \
        "$(wants rotel && "$ROTEL" version 2>/dev/null | head -1)" \
        "$(wants inferwatch && "$INFERWATCH" --version 2>/dev/null | head -1)"
} >"$OUT/env.json"

# ---------------------------------------------------------------- one run
inferwatch_config() { # PROTO FILE
    local exporter
    if [[ $1 == grpc ]]; then
        exporter="otlp:
    endpoint: 127.0.0.1:$S_GRPC
    tls: { insecure: true }
    compression: gzip"
    else
        exporter="otlphttp:
    endpoint: http://127.0.0.1:$S_HTTP
    compression: gzip"
    fi
    cat >"$2" <<EOF
# Generated by bench/passthrough.sh: OTLP in -> batch -> OTLP out (gzip), like Rotel's defaults.
receivers:
  otlp:
    protocols:
      grpc: { endpoint: 127.0.0.1:$C_GRPC }
      http: { endpoint: 127.0.0.1:$C_HTTP }
processors:
  batch: { send_batch_size: 8192, send_batch_max_size: 8192, timeout: 200ms }
exporters:
  $exporter
service:
  telemetry: { metrics: { address: 127.0.0.1:$SELF_METRICS } }
  pipelines:
    traces: { receivers: [otlp], processors: [batch], exporters: [${exporter%%:*}] }
EOF
}

run_one() { # CASE COLLECTOR REP
    local case=$1 coll=$2 rep=$3
    local dir="$OUT/$case.$coll.$rep"
    mkdir -p "$dir"
    local proto=grpc streams=$STREAMS batch=$BATCH rate=""
    case $case in
        grpc | idle) ;;
        http) proto=http ;;
        rate10k) streams=4 batch=100 rate=10000 ;;
        rate10k-http) proto=http streams=4 batch=100 rate=10000 ;;
        *) die "unknown case $case" ;;
    esac

    local p deadline=$((SECONDS + 15))
    for p in $C_GRPC $C_HTTP $S_GRPC $S_HTTP; do
        while port_open "$p"; do
            ((SECONDS < deadline)) || die "port $p is still in use on 127.0.0.1"
            sleep 0.2
        done
    done
    local busy=0
    if ((IDLE_WAIT > 0)); then busy=$(wait_idle); fi
    log "$case / $coll / rep $rep (machine busy before: ${busy}% of a core)"

    "${PIN0[@]}" "$LOAD" sink --grpc "127.0.0.1:$S_GRPC" --http "127.0.0.1:$S_HTTP" --seqs-out "$dir/sink.seqs" \
        >"$dir/sink.json" 2>"$dir/sink.log" &
    local spid=$!
    PIDS+=("$spid")
    wait_port "$S_HTTP" 10 "$spid" && wait_port "$S_GRPC" 10 "$spid" || die "sink did not start (see $dir/sink.log)"

    local cpid
    if [[ $coll == inferwatch ]]; then
        inferwatch_config "$proto" "$dir/config.yaml"
        "${PIN1[@]}" "$INFERWATCH" run --config "$dir/config.yaml" >"$dir/collector.log" 2>&1 &
        cpid=$!
    else
        local exp=(--otlp-exporter-endpoint "http://127.0.0.1:$S_GRPC")
        [[ $proto == http ]] && exp=(--otlp-exporter-protocol http --otlp-exporter-endpoint "http://127.0.0.1:$S_HTTP")
        "${PIN1[@]}" "$ROTEL" start --otlp-grpc-endpoint "127.0.0.1:$C_GRPC" --otlp-http-endpoint "127.0.0.1:$C_HTTP" \
            --exporter otlp "${exp[@]}" --pid-file "$dir/rotel.pid" --log-file "$dir/rotel.log" \
            >"$dir/collector.log" 2>&1 &
        cpid=$!
    fi
    PIDS+=("$cpid")
    local started=true
    if ! { wait_port "$C_GRPC" 30 "$cpid" && wait_port "$C_HTTP" 30 "$cpid"; }; then
        started=false
        log "  $coll did not start; see $dir/collector.log"
    fi

    local hwm="" settle_ok=false stop="sigterm"
    if [[ $started == true ]]; then
        sleep 0.5
        if [[ $case == idle ]]; then
            "${PIN0[@]}" "$LOAD" watch --pid "$cpid" --pid "$spid" --duration "$DUR" >"$dir/watch.json" || true
        else
            local endpoint="http://127.0.0.1:$C_GRPC"
            [[ $proto == http ]] && endpoint="http://127.0.0.1:$C_HTTP"
            local args=(gen --endpoint "$endpoint" --protocol "$proto" --streams "$streams" --batch "$batch"
                --duration "$DUR" --acked-out "$dir/acked.seqs" --watch-pid "$cpid" --watch-pid "$spid")
            [[ -n $rate ]] && args+=(--rate "$rate")
            "${PIN0[@]}" timeout $((DUR_S + 60)) "$LOAD" "${args[@]}" >"$dir/gen.json" 2>"$dir/gen.log" ||
                log "  generator failed (see $dir/gen.log)"
        fi
        hwm=$(awk '/^VmHWM:/ {print $2}' "/proc/$cpid/status" 2>/dev/null || true)
        if [[ $case != idle && -s $dir/acked.seqs ]]; then
            "${PIN0[@]}" "$LOAD" settle --sink "http://127.0.0.1:$S_HTTP" --acked "$dir/acked.seqs" --max "${SETTLE_MAX}s" \
                >"$dir/settle.json" 2>>"$dir/gen.log" || true
        fi
    fi
    kill -TERM "$cpid" 2>/dev/null || true
    if ! wait_stop "$cpid" 20; then
        stop="killed"
        log "  $coll did not stop within 20 s of SIGTERM; killing it"
        kill -KILL "$cpid" 2>/dev/null || true
        wait_stop "$cpid" 5 || true
    fi
    local crc=0
    wait "$cpid" 2>/dev/null || crc=$?
    # Whatever the collector flushed on shutdown reaches the sink before it stops.
    if [[ $case != idle && -s $dir/acked.seqs ]]; then
        "${PIN0[@]}" "$LOAD" settle --sink "http://127.0.0.1:$S_HTTP" --acked "$dir/acked.seqs" --quiet-for 1s --max 10s \
            >"$dir/settle-after-stop.json" 2>>"$dir/gen.log" || true
    fi
    kill -TERM "$spid" 2>/dev/null || true
    wait_stop "$spid" 10 || kill -KILL "$spid" 2>/dev/null || true
    wait "$spid" 2>/dev/null || true
    if [[ -s $dir/acked.seqs || -s $dir/gen.json ]] && [[ -e $dir/sink.seqs ]]; then
        [[ -e $dir/acked.seqs ]] || : >"$dir/acked.seqs"
        "$LOAD" check --acked "$dir/acked.seqs" --delivered "$dir/sink.seqs" >"$dir/check.json" 2>/dev/null || true
    fi
    printf '{"case": "%s", "collector": "%s", "rep": %s, "pid": %s, "started": %s, "stop": "%s", "exit_code": %s, "vmhwm_kib": %s, "busy_before_pct": %s}\n' \
        "$case" "$coll" "$rep" "$cpid" "$started" "$stop" "$crc" "${hwm:-null}" "$busy" >"$dir/meta.json"
    PIDS=()
}

# Share of a core that processes other than ours used during the run (integer; 0 if unknown).
other_pct() {
    python3 - "$1" <<'PY'
import json, os, sys
for name in ("gen.json", "watch.json"):
    try:
        with open(os.path.join(sys.argv[1], name)) as f:
            host = json.load(f)["watch" if name == "gen.json" else "host"]
        host = host.get("host", host)
        print(max(0, int(host.get("other_pct") or 0)))
        break
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
else:
    print(0)
PY
}

log "results in $OUT (cases: ${CASES[*]}; collectors: $COLLECTORS; REPS=$REPS DUR=$DUR; pinned=$PIN)"
for rep in $(seq 1 "$REPS"); do
    # Alternate which collector goes first, so that drift in the machine does not favour one.
    order=($COLLECTORS)
    if ((rep % 2 == 0)); then
        rev=()
        for ((k = ${#order[@]} - 1; k >= 0; k--)); do rev+=("${order[k]}"); done
        order=("${rev[@]}")
    fi
    for case in "${CASES[@]}"; do
        for coll in "${order[@]}"; do
            for ((try = 0; ; try++)); do
                run_one "$case" "$coll" "$rep"
                other=$(other_pct "$OUT/$case.$coll.$rep")
                ((other > NOISY_PCT && try < RETRY_NOISY)) || break
                log "  other processes used ${other}% of a core during the run: setting it aside and repeating"
                mv "$OUT/$case.$coll.$rep" "$OUT/$case.$coll.$rep.rejected-$try"
            done
        done
    done
done

python3 bench/passthrough_report.py "$OUT"

#!/usr/bin/env bash
# The project's test command: formatting, lints, unit tests and the
# end-to-end suite (tests/e2e, pytest against target/debug/inferwatch, the binary `cargo test` built).
#
#   ./scripts/test.sh              everything
#   ./scripts/test.sh --quick      skip cargo fmt and clippy
#   ./scripts/test.sh --e2e-only   only build the binary (dev profile, opt-level 1) and run the e2e suite
#   ./scripts/test.sh --no-e2e     skip the e2e suite
#   ./scripts/test.sh -- ARGS      pass ARGS to pytest (e.g. -- -k roundtrip -x)
#
# Environment: INFERWATCH_SLOW=1 also runs the slow / soak e2e tests; INFERWATCH_E2E_WORKERS
# sets the pytest workers (default 3, 0 = one process); PYTHON picks the
# interpreter for the venv (default python3). Idempotent: the venv at .venv is reused and pip
# runs only when tests/e2e/requirements.txt changed.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$(pwd)

QUICK=0
E2E=1
CARGO_TESTS=1
PYTEST_ARGS=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --quick) QUICK=1 ;;
        --e2e-only) QUICK=1; CARGO_TESTS=0 ;;
        --no-e2e) E2E=0 ;;
        --) shift; PYTEST_ARGS+=("$@"); break ;;
        -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "unknown option: $1 (see --help)" >&2; exit 64 ;;
    esac
    shift
done

PYTHON=${PYTHON:-python3}
VENV="$ROOT/.venv"
REQ="$ROOT/tests/e2e/requirements.txt"
declare -a TIMES=()

step() { # name, command...
    local name=$1; shift
    echo
    echo "==> $name"
    local t0=$SECONDS rc
    # A subshell outside any `if`, so that `set -e` holds inside shell functions too.
    set +e
    (set -e; "$@")
    rc=$?
    set -e
    record "$name" "$t0" "$rc" ""
}

# Records a finished step's time; a failed one prints the summary and ends the script.
record() { # name, start, exit code, suffix for a passed step
    local name=$1 t0=$2 rc=$3 suffix=$4
    if [[ $rc -eq 0 ]]; then
        TIMES+=("$(printf '%-30s %5ds  ok%s' "$name" $((SECONDS - t0)) "$suffix")")
    else
        TIMES+=("$(printf '%-30s %5ds  FAILED (exit %d)' "$name" $((SECONDS - t0)) "$rc")")
        summary
        echo "FAILED: $name" >&2
        exit "$rc"
    fi
}

summary() {
    echo
    echo "==> summary"
    printf '    %s\n' "${TIMES[@]}"
}

as_root() {
    if [[ $(id -u) -eq 0 ]]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
        echo "need root to run: $*" >&2; return 1; fi
}

# apt-get that waits up to 10 minutes for the dpkg/apt locks another process holds (unattended
# upgrades, a second install) instead of failing at once.
apt_get() {
    as_root apt-get -o DPkg::Lock::Timeout=600 "$@"
}

# Under CI=true a package the tests need but cannot be installed fails the step (loudly) instead
# of letting the tests that need it error later; elsewhere it is a warning and those tests skip.
missing_package() { # message
    if [[ "${CI:-}" == "true" ]]; then
        echo "ERROR: $1" >&2
        return 1
    fi
    echo "WARNING: $1; the tests that need it will skip" >&2
}

ensure_venv() {
    if [[ -x "$VENV/bin/python" ]] && "$VENV/bin/python" -c 'import sys' 2>/dev/null; then
        :
    else
        rm -rf "$VENV"
        if ! "$PYTHON" -m venv "$VENV" 2>/dev/null; then
            echo "python3 -m venv failed; installing the venv module (python3-venv)"
            rm -rf "$VENV"
            local ver
            ver=$("$PYTHON" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
            export DEBIAN_FRONTEND=noninteractive
            apt_get update -qq
            apt_get install -y -qq "python${ver}-venv" || apt_get install -y -qq python3-venv
            "$PYTHON" -m venv "$VENV"
        fi
    fi
    local want have=""
    want=$(sha256sum "$REQ" | cut -d' ' -f1)
    [[ -f "$VENV/.requirements.sha256" ]] && have=$(cat "$VENV/.requirements.sha256")
    if [[ "$want" != "$have" ]]; then
        "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r "$REQ"
        echo "$want" > "$VENV/.requirements.sha256"
    else
        echo "venv up to date ($VENV)"
    fi
}

ensure_checkov() {
    # checkov (the Kubernetes manifest checks of tests/e2e/test_kubernetes.py) pins packaging<24,
    # which pytest 9 cannot use: it gets a venv of its own, .venv/checkov, installed once.
    local want="checkov==3.3.30" cv="$VENV/checkov"
    if [[ -x "$cv/bin/checkov" && "$(cat "$cv/.installed" 2>/dev/null)" == "$want" ]]; then
        echo "checkov present ($cv/bin/checkov)"
        return 0
    fi
    rm -rf "$cv"
    "$PYTHON" -m venv "$cv"
    if "$cv/bin/python" -m pip install --quiet --disable-pip-version-check "$want"; then
        echo "$want" > "$cv/.installed"
        echo "checkov installed ($cv/bin/checkov)"
    else
        missing_package "could not install $want into $cv"
    fi
}

ensure_promtool() {
    # promtool (Debian package `prometheus`) for the /metrics lint test of the simulator, and the
    # prometheus server itself for the prometheus / prometheusremotewrite exporter tests; the
    # tests that need them skip without them, and fail when CI=true.
    if command -v promtool >/dev/null && [[ -x /usr/bin/prometheus ]]; then
        echo "promtool and prometheus present ($(command -v promtool), /usr/bin/prometheus)"
        return 0
    fi
    if ! command -v apt-get >/dev/null; then
        echo "WARNING: promtool missing and no apt-get; the promtool e2e tests will skip (fail under CI=true)" >&2
        return 0
    fi
    echo "promtool or prometheus missing; installing the Debian package prometheus"
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-cache show prometheus >/dev/null 2>&1; then
        apt_get update -qq || true
    fi
    if apt_get install -y -qq --no-install-recommends prometheus && command -v promtool >/dev/null \
        && [[ -x /usr/bin/prometheus ]]; then
        echo "promtool and prometheus installed ($(command -v promtool), /usr/bin/prometheus)"
    else
        missing_package "could not install the Debian package prometheus (promtool, /usr/bin/prometheus)"
    fi
}

ensure_alertmanager() {
    # The Alertmanager server (Debian package `prometheus-alertmanager`, /usr/bin/prometheus-alertmanager)
    # for the alerts exporter test (tests/e2e/test_alerts.py); the test skips without it, and fails
    # when CI=true. The package is looked up with apt-cache policy first (apt-get update only when
    # no candidate is known yet).
    if [[ -x /usr/bin/prometheus-alertmanager ]]; then
        echo "alertmanager present (/usr/bin/prometheus-alertmanager)"
        return 0
    fi
    if ! command -v apt-get >/dev/null; then
        echo "WARNING: alertmanager missing and no apt-get; the alerts e2e test will skip (fail under CI=true)" >&2
        return 0
    fi
    echo "alertmanager missing; installing the Debian package prometheus-alertmanager"
    export DEBIAN_FRONTEND=noninteractive
    has_candidate() { apt-cache policy prometheus-alertmanager 2>/dev/null | grep -q 'Candidate: [0-9]'; }
    if ! has_candidate; then
        apt_get update -qq || true
    fi
    # One retry after a fresh index: a stale list or a transient mirror error fails the first.
    if { has_candidate && apt_get install -y -qq --no-install-recommends prometheus-alertmanager; } \
        || { apt_get update -qq; apt_get install -y --no-install-recommends prometheus-alertmanager; }; then
        :
    fi
    if [[ -x /usr/bin/prometheus-alertmanager ]]; then
        echo "alertmanager installed (/usr/bin/prometheus-alertmanager)"
    else
        missing_package "could not install the Debian package prometheus-alertmanager"
    fi
}

# A step run in the background: its output goes to a log that `join` prints when it is waited
# for, so that waiting work (package installs, the e2e suite) overlaps compiling and linting.
declare -A BG_PID=() BG_T0=() BG_LOG=()
# A failing step ends the script: background steps still running end with it.
trap 'for p in "${BG_PID[@]}"; do kill "$p" 2>/dev/null || true; done' EXIT
bg_step() { # name, command...
    local name=$1; shift
    BG_LOG[$name]=$(mktemp "${TMPDIR:-/tmp}/inferwatch-test.XXXXXX")
    BG_T0[$name]=$SECONDS
    echo
    echo "==> $name (in the background)"
    (set -e; "$@") >"${BG_LOG[$name]}" 2>&1 &
    BG_PID[$name]=$!
}
join() { # name
    local name=$1 rc
    set +e
    wait "${BG_PID[$name]}"
    rc=$?
    set -e
    unset "BG_PID[$name]"
    echo
    echo "==> $name (joined)"
    cat "${BG_LOG[$name]}"
    rm -f "${BG_LOG[$name]}"
    record "$name" "${BG_T0[$name]}" "$rc" " (background)"
}
installs() {
    ensure_venv
    if [[ $E2E -eq 1 ]]; then
        ensure_promtool
        ensure_alertmanager
        ensure_checkov
    fi
}
e2e() {
    # The e2e tests mostly wait on agents, simulators and sinks: three pytest workers (xdist)
    # overlap that waiting (the longest test alone takes ~7 minutes). INFERWATCH_E2E_WORKERS=0
    # runs them in one process.
    local workers=${INFERWATCH_E2E_WORKERS:-3}
    local flags=(-v --durations=10)
    [[ "$workers" != "0" ]] && flags+=(-n "$workers" --dist worksteal)
    [[ ${#PYTEST_ARGS[@]} -gt 0 ]] && flags+=("${PYTEST_ARGS[@]}")
    "$VENV/bin/python" -m pytest tests/e2e "${flags[@]}"
}

# On a clean clone (CI) incremental compilation only costs time and gigabytes of disk.
if [[ "${CI:-}" == "true" && -z "${CARGO_INCREMENTAL:-}" ]]; then
    export CARGO_INCREMENTAL=0
fi
if [[ $QUICK -eq 0 ]]; then
    step "cargo fmt --check" cargo fmt --all -- --check
fi
# The venv (which also holds ONNX Runtime: the onnxruntime wheel's libonnxruntime.so, loaded by
# the lstm_ae tests of `cargo test`; with INFERWATCH_REQUIRE_ORT=1 they fail instead of
# skipping), promtool, Alertmanager and checkov install while the workspace compiles.
bg_step "installs (venv, promtool, alertmanager, checkov)" installs
export INFERWATCH_REQUIRE_ORT=1
# The dev profile is opt-level 1 (Cargo.toml). `cargo test --workspace --no-run` builds
# target/debug/inferwatch too (the root package's integration tests need it), with the features
# the whole workspace unifies to; `cargo build --bin inferwatch` unifies fewer features and would
# compile a second copy of tokio, tonic, hyper and the rest, so it runs only when the unit tests
# are skipped. The shipped binary is --release.
if [[ $CARGO_TESTS -eq 1 ]]; then
    step "cargo test --no-run (build)" cargo test --workspace --no-run
elif [[ $E2E -eq 1 ]]; then
    step "cargo build --bin inferwatch" cargo build --bin inferwatch
fi
join "installs (venv, promtool, alertmanager, checkov)"
export INFERWATCH_BIN="${CARGO_TARGET_DIR:-$ROOT/target}/debug/inferwatch"
# The e2e suite runs beside the unit tests and clippy: it is mostly waiting (about 2.5
# CPU-minutes in 9 wall-minutes), they are mostly computing.
[[ $E2E -eq 1 ]] && bg_step "pytest tests/e2e" e2e
if [[ $CARGO_TESTS -eq 1 ]]; then
    step "cargo test" cargo test --workspace
fi
if [[ $QUICK -eq 0 ]]; then
    step "cargo clippy -D warnings" cargo clippy --workspace --all-targets -- -D warnings
fi
[[ $E2E -eq 1 ]] && join "pytest tests/e2e"
summary
echo "all steps passed"

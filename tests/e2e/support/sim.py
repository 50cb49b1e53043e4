"""The simulated vLLM server (`inferwatch sim`) as a test fixture, plus what the sim tests share:
the binary, a process wrapper, OpenAI-client helpers that keep every chunk, a Prometheus
text-format parser, percentiles and a small load driver.

Binary: $INFERWATCH_BIN when set (scripts/test.sh sets it to the release build); otherwise the
newer of target/debug/inferwatch and target/release/inferwatch that has the `sim` subcommand.
The agent of the span test runs from the same binary.

Fixtures (import them into a test module): `sim_bin` (session) and `sims`, a factory of
`Sim` processes on free ports (`--port 0`, the bound address is read from the log). Every sim
still running at the end of a test gets SIGTERM and must exit 0; its log is attached to the
report of a failed test.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal as _signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import pytest
import requests

from . import yamlgen
from .agent import REPO

# --------------------------------------------------------------------------------------------
# binary


def _has_sim(path: Path | str) -> bool:
    try:
        r = subprocess.run([str(path), "sim", "--help"], capture_output=True, text=True, timeout=30,
                           stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0 and "--served-model-name" in r.stdout


def sim_binary() -> str:
    """$INFERWATCH_BIN, else the newest of target/{debug,release}/inferwatch that has `sim`."""
    env = os.environ.get("INFERWATCH_BIN")
    if env:
        return env
    cands = [p for p in (REPO / "target" / "debug" / "inferwatch", REPO / "target" / "release" / "inferwatch")
             if p.is_file() and os.access(p, os.X_OK)]
    cands.sort(key=lambda p: p.stat().st_mtime, reverse=True)
    for p in cands:
        if _has_sim(p):
            return str(p)
    return str(cands[0]) if cands else str(REPO / "target" / "debug" / "inferwatch")


@pytest.fixture(scope="session")
def sim_bin() -> str:
    b = sim_binary()
    if not Path(b).is_file() or not os.access(b, os.X_OK):
        pytest.fail(f"inferwatch binary not found at {b}: cargo build --bin inferwatch, or set INFERWATCH_BIN",
                    pytrace=False)
    if not _has_sim(b):
        pytest.fail(f"{b} has no `sim` subcommand (stale build?): cargo build --bin inferwatch", pytrace=False)
    return b


# --------------------------------------------------------------------------------------------
# the process

_ADDR = re.compile(r"serving the OpenAI API address=(\S+):(\d+)")

#: Seconds of the synthetic answers: a short natural length keeps real-time tests fast.
FAST_ANSWERS = {"median_output_tokens": 12}

#: A custom GPU ten times an A10G (compute and bandwidth); step overhead and memory as usual.
FAST_GPU = {
    "name": "fast10x",
    "memory_gib": 80,
    "bandwidth_gbs": 6000,
    "fp16_tflops": 1250,
    "effective_bandwidth_gbs": 6400,
    "effective_tflops": 809,
    "step_overhead_us": 1000,
    "activation_reserve_gib": 1,
}


class Sim:
    """One `inferwatch sim` process (serving mode) with its log."""

    def __init__(self, binary: str, workdir: Path, name: str, args: tuple = (), config: Optional[dict] = None,
                 env: Optional[dict] = None) -> None:
        self.binary = binary
        self.name = name
        self.workdir = workdir
        self.args = tuple(str(a) for a in args)
        self.config_path: Optional[Path] = None
        if config is not None:
            self.config_path = workdir / f"{name}.yaml"
            self.config_path.write_text(yamlgen.dump(config))
        self.env = env
        self.log_path = workdir / f"{name}.log"
        self.proc: Optional[subprocess.Popen] = None
        self.host = "127.0.0.1"
        self.port = 0
        self.returncode: Optional[int] = None
        self._log_file = None

    def start(self, timeout: float = 30.0) -> "Sim":
        args = [self.binary, "--log-level", "info", "sim", "--port", "0"]
        if self.config_path is not None:
            args += ["--config", str(self.config_path)]
        args += list(self.args)
        env = dict(os.environ)
        env.pop("RUST_LOG", None)
        if self.env:
            env.update(self.env)
        self._log_file = open(self.log_path, "ab")
        self.proc = subprocess.Popen(args, stdout=self._log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     cwd=self.workdir, env=env)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"sim {self.name} exited with {self.proc.returncode} while starting:\n{self.log()}")
            m = _ADDR.search(self.log())
            if m:
                self.host, self.port = m.group(1), int(m.group(2))
                try:
                    if requests.get(self.url + "/health", timeout=1).status_code == 200:
                        return self
                except requests.RequestException:
                    pass
            time.sleep(0.02)  # polling interval, not synchronisation
        raise AssertionError(f"sim {self.name} not serving after {timeout}s:\n{self.log()}")

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM, wait; returns the exit code (kills and fails after `timeout`)."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(_signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
                raise AssertionError(f"sim {self.name} did not exit within {timeout}s of SIGTERM; killed")
        self.returncode = self.proc.returncode
        if self._log_file:
            self._log_file.close()
            self._log_file = None
        return self.returncode

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return "(no log)"

    # --- API ------------------------------------------------------------------------------------

    def client(self, **kw):
        """An `openai.OpenAI` client for this server (no retries: a failure must show)."""
        import openai

        return openai.OpenAI(base_url=self.url + "/v1", api_key="EMPTY", max_retries=0,
                             timeout=kw.pop("timeout", 60.0), **kw)

    def metrics_text(self) -> str:
        r = requests.get(self.url + "/metrics", timeout=10)
        r.raise_for_status()
        return r.text

    def families(self) -> dict[str, "Family"]:
        return parse_prometheus(self.metrics_text())

    def get_faults(self) -> dict:
        r = requests.get(self.url + "/admin/faults", timeout=10)
        assert r.status_code == 200, r.text
        return r.json()

    def post_faults(self, body: Any) -> requests.Response:
        return requests.post(self.url + "/admin/faults", json=body, timeout=10)

    def set_faults(self, body: Any) -> dict:
        r = self.post_faults(body)
        assert r.status_code == 200, f"POST /admin/faults {body} -> {r.status_code} {r.text}"
        return r.json()

    def clear_faults(self) -> dict:
        r = requests.delete(self.url + "/admin/faults", timeout=10)
        assert r.status_code == 200, r.text
        return r.json()


@pytest.fixture
def sims(sim_bin, tmp_path, request):
    """Factory: sims(name, *args, config=dict|None, env=dict|None, start=True) -> Sim."""
    started: list[Sim] = []
    # The conftest's report hook attaches the logs of everything in this list to a failure.
    logs = getattr(request.node, "_inferwatch_agents", None)
    if logs is None:
        logs = request.node._inferwatch_agents = []

    def make(name: str, *args, config: Optional[dict] = None, env: Optional[dict] = None, start: bool = True) -> Sim:
        s = Sim(sim_bin, tmp_path, name, args, config, env)
        started.append(s)
        logs.append(s)
        if start:
            s.start()
        return s

    yield make
    problems = []
    for s in reversed(started):
        if s.running():
            try:
                rc = s.stop()
            except AssertionError as e:
                problems.append(str(e))
                continue
            if rc != 0:
                problems.append(f"sim {s.name} exited with {rc} after SIGTERM")
    if problems:
        pytest.fail("; ".join(problems), pytrace=False)


# --------------------------------------------------------------------------------------------
# prompts and OpenAI calls


def _word(n: int) -> str:
    """A six-letter lowercase word for n (one token of the sim's stand-in tokenizer)."""
    s = ""
    for _ in range(6):
        n, r = divmod(n, 26)
        s += chr(ord("a") + r)
    return s


def long_prompt(words: int, salt: int) -> str:
    """A prompt of `words` six-letter words (about one token each), distinct per salt so that
    no two prompts share a prefix-cache entry."""
    head = [_word(salt * 7919 + i) for i in range(3)]
    return " ".join(head + ["abcdef"] * max(0, words - 3))


@dataclass
class Streamed:
    """Everything one streamed call returned."""

    id: str = ""
    chunks: list = field(default_factory=list)
    content: list = field(default_factory=list)  # the text of each content chunk, in order
    role_chunks: int = 0
    finish_reasons: list = field(default_factory=list)  # (chunk index, reason)
    usage: Any = None
    usage_chunk_index: Optional[int] = None
    logprobs: list = field(default_factory=list)  # per content chunk: the chunk's logprobs object
    t_send: float = 0.0
    t_first: Optional[float] = None  # first content chunk (monotonic)
    t_done: float = 0.0
    wall_send: float = 0.0
    wall_done: float = 0.0

    @property
    def text(self) -> str:
        return "".join(self.content)

    @property
    def ttft(self) -> float:
        assert self.t_first is not None, "no content chunk"
        return self.t_first - self.t_send

    @property
    def e2e(self) -> float:
        return self.t_done - self.t_send


def stream_call(create: Callable, chat: bool, **kw) -> Streamed:
    """Runs `create(stream=True, **kw)` and parses every chunk (one choice)."""
    out = Streamed(t_send=time.monotonic(), wall_send=time.time())
    stream = create(stream=True, **kw)
    for i, ch in enumerate(stream):
        now = time.monotonic()
        out.chunks.append(ch)
        if not out.id:
            out.id = ch.id
        assert ch.id == out.id, f"chunk {i} has id {ch.id}, the stream started with {out.id}"
        if ch.usage is not None:
            assert out.usage is None, f"a second usage chunk at {i}"
            out.usage = ch.usage
            out.usage_chunk_index = i
        for c in ch.choices:
            assert c.index == 0, c
            if chat:
                if c.delta.role is not None:
                    out.role_chunks += 1
                    assert c.delta.role == "assistant" and not c.delta.content, c
                    continue
                piece = c.delta.content
            else:
                piece = c.text
            if c.finish_reason is not None:
                out.finish_reasons.append((i, c.finish_reason))
            if piece is None or piece == "":
                assert c.finish_reason is not None, f"chunk {i} carries neither text nor a finish reason: {ch}"
                continue
            out.content.append(piece)
            if out.t_first is None:
                out.t_first = now
            if c.logprobs is not None:
                out.logprobs.append(c.logprobs)
    out.t_done = time.monotonic()
    out.wall_done = time.time()
    return out


def percentile(values, q: float) -> float:
    """Nearest-rank percentile (q in (0, 1])."""
    v = sorted(values)
    assert v, "no values"
    return v[min(len(v) - 1, max(0, math.ceil(q * len(v)) - 1))]


def run_load(fn: Callable[[int], Any], n: int, rate: Optional[float] = None, workers: int = 16) -> list:
    """Calls fn(i) for i in range(n): with `rate`, open loop at a constant rate (request i is
    sent i / rate seconds after the first, whatever the earlier ones are doing); without it,
    closed loop with `workers` concurrent callers. Returns the results in index order;
    the first exception is re-raised."""
    results: list = [None] * n
    errors: list = []

    def call(i: int) -> None:
        try:
            results[i] = fn(i)
        except BaseException as e:  # noqa: BLE001 - re-raised below
            errors.append(e)

    with ThreadPoolExecutor(max_workers=workers if rate is None else max(workers, n)) as ex:
        t0 = time.monotonic()
        futs = []
        for i in range(n):
            if rate is not None:
                due = t0 + i / rate
                # pacing the arrival schedule, not waiting for anything
                while (left := due - time.monotonic()) > 0:
                    time.sleep(left)
            futs.append(ex.submit(call, i))
        for f in futs:
            f.result()
    if errors:
        raise errors[0]
    return results


# --------------------------------------------------------------------------------------------
# Prometheus text format


@dataclass
class Family:
    name: str
    type: str = "untyped"
    help: Optional[str] = None
    samples: list = field(default_factory=list)  # (sample name, labels dict, value)


_LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+(-?\d+))?$')
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"\s*(,|$)')


def _labels(text: str, line: str) -> dict:
    out: dict = {}
    pos = 0
    text = text or ""
    while pos < len(text):
        m = _LABEL.match(text, pos)
        assert m, f"bad label set in line {line!r}"
        assert m.group(1) not in out, f"duplicate label {m.group(1)} in {line!r}"
        out[m.group(1)] = m.group(2).replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\")
        pos = m.end()
    return out


def _value(s: str) -> float:
    return float(s)  # also takes +Inf, -Inf, NaN


_SUFFIXES = {"histogram": ("_bucket", "_count", "_sum"), "summary": ("_count", "_sum"), "counter": ("",)}


def parse_prometheus(text: str) -> dict[str, Family]:
    """Parses the text format 0.0.4 strictly enough for tests: families by the name in their
    TYPE line; every sample must belong to the family declared before it."""
    fams: dict[str, Family] = {}
    current: Optional[Family] = None
    for line in text.splitlines():
        if not line.strip():
            continue
        if line.startswith("# HELP ") or line.startswith("# TYPE "):
            _, kind, rest = line.split(" ", 2)
            name, _, arg = rest.partition(" ")
            f = fams.get(name)
            if f is None:
                f = fams[name] = Family(name)
            if kind == "HELP":
                f.help = arg
            else:
                f.type = arg
            current = f
            continue
        if line.startswith("#"):
            continue
        m = _LINE.match(line)
        assert m, f"unparsable sample line {line!r}"
        sname = m.group(1)
        fam = current
        ok = fam is not None and (sname == fam.name or any(
            sname == fam.name + s for s in _SUFFIXES.get(fam.type, ())))
        if not ok:
            fam = fams.setdefault(sname, Family(sname))
        fam.samples.append((sname, _labels(m.group(2), line), _value(m.group(3))))
    return fams


@dataclass
class Hist:
    """One histogram series: upper bounds (ending with +Inf), cumulative counts, sum, count."""

    bounds: list
    cumulative: list
    sum: float
    count: float

    def fraction_le(self, bound: float) -> float:
        """Share of observations <= `bound` (which must be a bucket bound)."""
        assert bound in self.bounds, f"{bound} is not a bucket bound ({self.bounds})"
        return self.cumulative[self.bounds.index(bound)] / self.count if self.count else 1.0

    def minus(self, other: "Hist") -> "Hist":
        assert self.bounds == other.bounds
        return Hist(self.bounds, [a - b for a, b in zip(self.cumulative, other.cumulative)],
                    self.sum - other.sum, self.count - other.count)


def histogram(fams: dict[str, Family], name: str, **labels) -> Hist:
    """The histogram series `name` whose labels include `labels` (exactly one must match)."""
    f = fams.get(name)
    assert f is not None and f.type == "histogram", f"{name}: no histogram family"
    series: dict[tuple, dict] = {}
    for sname, lab, v in f.samples:
        if not all(lab.get(k) == val for k, val in labels.items()):
            continue
        key = tuple(sorted((k, x) for k, x in lab.items() if k != "le"))
        s = series.setdefault(key, {"b": [], "sum": None, "count": None})
        if sname.endswith("_bucket"):
            s["b"].append((_value(lab["le"]), v))
        elif sname.endswith("_sum"):
            s["sum"] = v
        elif sname.endswith("_count"):
            s["count"] = v
    assert len(series) == 1, f"{name}{labels}: {len(series)} series match"
    s = next(iter(series.values()))
    return Hist([b for b, _ in s["b"]], [c for _, c in s["b"]], s["sum"], s["count"])


def sample_value(fams: dict[str, Family], family: str, sample: Optional[str] = None, **labels) -> float:
    """Sum of the samples of `family` (named `sample`, default the family name) matching `labels`."""
    f = fams.get(family)
    assert f is not None, f"no family {family}"
    sample = sample or family
    return sum(v for n, lab, v in f.samples if n == sample and all(lab.get(k) == x for k, x in labels.items()))


# --------------------------------------------------------------------------------------------
# promtool


def promtool() -> str:
    """The promtool binary; without it the test skips, or fails when CI=true."""
    p = shutil.which("promtool")
    if p:
        return p
    msg = "promtool not found (Debian package `prometheus`; scripts/test.sh installs it)"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(msg + " and CI=true", pytrace=False)
    pytest.skip(msg)


def dump_json(obj: Any) -> str:
    return json.dumps(obj, indent=1, sort_keys=True, default=str)


def wait_until(pred: Callable[[], Any], timeout: float, what: str, interval: float = 0.05):
    """Polls `pred` until it returns a truthy value (returned); fails after `timeout`."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = pred()
        if last:
            return last
        time.sleep(interval)  # polling interval
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


__all__ = [
    "FAST_ANSWERS", "FAST_GPU", "Family", "Hist", "Sim", "Streamed", "dump_json", "histogram", "long_prompt",
    "parse_prometheus", "percentile", "promtool", "run_load", "sample_value", "sim_bin", "sim_binary", "sims",
    "stream_call", "wait_until",
]

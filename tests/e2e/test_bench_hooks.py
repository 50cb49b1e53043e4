"""Plug-in hooks of `inferwatch bench` (probe/README.md, "Plug-in hooks") against the real
simulator and a real OTLP/gRPC receiver (support/sink.py).

- The example hook in Python (probe/examples/hooks/system_prompt.py), given in a bench config
  file's `hooks:`, rewrites every request: a long system message first, `max_tokens` 5 and
  `ignore_eos` — the simulator's own token counters show both changes. Its per-request metrics
  (characters per token, streamed chunks seen by post_decode) appear in the JSON report, on the
  request spans and as OTLP histograms the receiver gets.
- A hook that dies mid-run, and one that answers garbage, are reported (state, exit status,
  stderr, protocol errors, timeouts) while every request still completes.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

from support import otlp
from support.agent import REPO
from support.sim import FAST_ANSWERS, FAST_GPU, sample_value, sim_bin, sims, wait_until  # noqa: F401

MODEL = "sim-hooks-model"
CONFIG = {**FAST_ANSWERS, "engine": {"gpu": FAST_GPU}}
EXAMPLE = REPO / "probe" / "examples" / "hooks" / "system_prompt.py"
SYSTEM = " ".join(f"rule{i} be precise and brief" for i in range(15))  # 75 words
N = 8


def _sim(sims):
    return sims("sim", "--served-model-name", MODEL, "--seed", "5", config=CONFIG)


def _counter(fams, name: str) -> float:
    """A vLLM counter's `_total`, whether its TYPE line names the family with `_total` or not."""
    family = name if name in fams else name.removesuffix("_total")
    return sample_value(fams, family, name)


def _counters(sim) -> tuple[float, float]:
    fams = sim.families()
    return _counter(fams, "vllm:prompt_tokens_total"), _counter(fams, "vllm:generation_tokens_total")


def _bench(sim_bin, sim, tmp_path: Path, name: str, *extra: str) -> tuple[dict, subprocess.CompletedProcess]:
    out = tmp_path / f"{name}.json"
    r = subprocess.run([sim_bin, "bench", "--endpoint", sim.url, "--model", MODEL, "--concurrency", "1",
                        "--requests", str(N), "--max-tokens", "8", "--prompt-tokens", "40", "--json", str(out),
                        "--quiet", *extra],
                       capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL, cwd=tmp_path)
    assert r.returncode == 0, f"exit {r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    return json.loads(out.read_text()), r


def _hook(report: dict, name: str) -> dict:
    hooks = report.get("hooks")
    assert hooks, f"no hooks section: {sorted(report)}"
    found = [h for h in hooks["chain"] if h["name"] == name]
    assert found, [h["name"] for h in hooks["chain"]]
    return found[0]


def _hook_points(sink, name: str) -> list:
    """Data points of the OTLP metric `name` from the last export that has it (cumulative)."""
    last = []
    for a in sink.delivered("metrics"):
        pts = [p for _, _, m in otlp.iter_metrics(a.request) if m.name == name for p in otlp.data_points(m)]
        if pts:
            last = pts
    return last


def test_python_hook_rewrites_requests_and_adds_metrics(sims, sim_bin, tmp_path, grpc_sink):
    sim = _sim(sims)
    base_report, _ = _bench(sim_bin, sim, tmp_path, "base")
    p0, g0 = _counters(sim)
    assert base_report["requests"]["completed"] == N and "hooks" not in base_report

    sink = grpc_sink()
    cfg = tmp_path / "bench.yaml"
    cfg.write_text("hooks:\n"
                   f"  - command: [{json.dumps(sys.executable)}, {json.dumps(str(EXAMPLE))}, --system, "
                   f"{json.dumps(SYSTEM)}, --max-tokens, '5', --param, ignore_eos=true]\n"
                   "    timeout: 5s\n")
    report, run = _bench(sim_bin, sim, tmp_path, "hooked", "--config", str(cfg), "--otlp-endpoint", sink.endpoint,
                         "--otlp-interval", "1s")
    p1, g1 = _counters(sim)
    assert report["requests"]["completed"] == N, report["requests"]

    # --- the simulator saw the rewritten requests ------------------------------------------
    base_prompt = p0 / N
    hooked_prompt = (p1 - p0) / N
    print(f"prompt tokens per request: {base_prompt:.1f} without the hook, {hooked_prompt:.1f} with it; "
          f"generation tokens {g0:.0f} then {g1 - g0:.0f}")
    assert hooked_prompt - base_prompt >= 60, "the 75-word system message reached the server"
    assert g1 - g0 == 5 * N, "max_tokens 5 with ignore_eos, from the hook, reached the server"
    assert g0 != 5 * N, "without the hook the answers are not all 5 tokens (the check can fail)"
    assert report["tokens"]["input_mean"] - base_report["tokens"]["input_mean"] >= 60

    # --- the report --------------------------------------------------------------------------
    h = _hook(report, "system_prompt")
    assert (h["kind"], h["state"], h["protocol_errors"]) == ("external", "ok", 0), h
    assert report["hooks"]["failures"] == 0, report["hooks"]
    for point in ("pre_inference", "post_decode", "metric_finalize"):
        assert h[point] == {"calls": N, "failures": 0, "timeouts": 0}, (point, h)
    m = h["metrics"]
    assert m["chunks"]["count"] == N and m["chunks"]["mean"] == 5.0, m  # post_decode saw every token
    cpt = m["chars_per_token"]
    assert cpt["count"] == N and 0 < cpt["min"] <= cpt["mean"] <= cpt["max"] < 100, cpt
    assert report["hooks"]["metadata"]["system_prompt"] == {"added": N}, report["hooks"]["metadata"]
    assert "system_prompt" in run.stdout and "chars_per_token" in run.stdout, run.stdout

    # --- OTLP: spans carry the metrics and metadata; the histograms arrive ------------------
    sink.wait_spans(N, timeout=30)
    spans = [otlp.attrs(s.attributes) for _, _, s in sink.spans()]
    tagged = [a for a in spans if "inferwatch.bench.hook.chars_per_token" in a]
    assert len(tagged) == N, [sorted(a) for a in spans]
    assert all(a["inferwatch.bench.hook.meta.system_prompt"] == "added" for a in tagged)
    assert all(a["inferwatch.bench.hook.chunks"] == 5.0 for a in tagged)
    assert all(a["gen_ai.request.max_tokens"] == 5 for a in tagged), "the span has the rewritten max_tokens"

    def histogram(name):
        pts = _hook_points(sink, name)
        return pts if pts and sum(p.count for p in pts) >= N else None

    pts = wait_until(lambda: histogram("inferwatch.bench.hook.chars_per_token"), 30, "the hook's OTLP histogram")
    assert len(pts) == 1, pts
    assert otlp.attrs(pts[0].attributes)["inferwatch.hook.name"] == "system_prompt"
    assert pts[0].count == N and abs(pts[0].sum - cpt["sum"]) < 1e-6 * max(1.0, cpt["sum"]), (pts[0], cpt)
    chunks = wait_until(lambda: histogram("inferwatch.bench.hook.chunks"), 30, "the chunks histogram")
    assert chunks[0].sum == 5 * N


DIES = r"""
import json, sys
n = 0
for line in sys.stdin:
    m = json.loads(line)
    if m["type"] == "hello":
        print(json.dumps({"type": "hello", "name": "dies", "wants": ["pre_inference"]}), flush=True)
    elif m["type"] == "pre_inference":
        n += 1
        if n == 3:
            print("hook: giving up on purpose", file=sys.stderr, flush=True)
            sys.exit(7)
        print(json.dumps({"type": "pre_inference", "id": m["id"], "request": {"max_tokens": 2}}), flush=True)
"""

GARBAGE = r"""
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m["type"] == "hello":
        print(json.dumps({"type": "hello", "name": "garbage", "wants": ["pre_inference"]}), flush=True)
    elif m["type"] == "pre_inference":
        print("this is not a JSON line", flush=True)
"""


def _script(tmp_path: Path, name: str, text: str) -> str:
    p = tmp_path / name
    p.write_text(text)
    return f"{shlex.quote(sys.executable)} {shlex.quote(str(p))}"


def test_a_hook_that_dies_is_reported_and_the_run_goes_on(sims, sim_bin, tmp_path):
    sim = _sim(sims)
    report, run = _bench(sim_bin, sim, tmp_path, "dies", "--hook", _script(tmp_path, "dies.py", DIES))
    assert report["requests"]["completed"] == N and report["requests"]["failed"] == 0, report["requests"]
    h = _hook(report, "dies")
    assert h["state"] == "failed", h
    assert "exit status: 7" in h["detail"] and "giving up on purpose" in h["detail"], h["detail"]
    pre = h["pre_inference"]
    # Two answered, then every call fails (the third when the process exits, the rest at once).
    assert pre == {"calls": N, "failures": N - 2, "timeouts": 0}, pre
    assert report["hooks"]["failures"] == N - 2
    # The two answered requests had max_tokens 2; the others went out unchanged (8).
    assert report["tokens"]["output_total"] > 2 * 2 + (N - 2) * 2, report["tokens"]
    assert "dies" in run.stdout and "failed" in run.stdout, run.stdout


def test_a_hook_that_answers_garbage_is_given_up_after_timeouts(sims, sim_bin, tmp_path):
    sim = _sim(sims)
    report, _ = _bench(sim_bin, sim, tmp_path, "garbage", "--hook", _script(tmp_path, "garbage.py", GARBAGE),
                       "--hook-timeout", "300ms")
    assert report["requests"]["completed"] == N, report["requests"]
    h = _hook(report, "garbage")
    assert h["state"] == "unresponsive", h
    assert h["protocol_errors"] >= 3, h
    assert h["pre_inference"] == {"calls": N, "failures": N, "timeouts": 3}, h["pre_inference"]
    assert "3 calls in a row" in h["detail"], h

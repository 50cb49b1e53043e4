"""Trace replay (`inferwatch bench --trace`, probe/README.md "Trace replay") against the real
simulator.

- The first 10 minutes of the Azure LLM inference conversation trace (tests/fixtures/traces,
  CC BY 4.0, Patel et al., "Splitwise", ISCA 2024) at 10x speed: every request is sent
  (the trace's count exactly), the arrivals per trace minute as actually sent are within 5 % of
  the trace's, and every request's served prompt tokens and completion tokens equal the trace's
  (the bench report's per-request comparison, its quantiles, and the simulator's own
  `vllm:prompt_tokens_total` / `vllm:generation_tokens_total` equal to the trace's sums).
- A generic JSONL trace with multi-turn sessions: the later turns carry the earlier ones and
  still get exactly the trace's prompt length; sampling, windowing and looping.
- A bad row is an error naming the file and line (exit 2).
- INFERWATCH_SLOW=1: the whole hour (19,366 requests) at 10x, about 6 minutes.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
from datetime import datetime
from pathlib import Path

import pytest

from support.agent import REPO
from support.sim import FAST_GPU, sample_value, sim_bin, sims  # noqa: F401

MODEL = "sim-trace-model"
FIXTURE = REPO / "tests" / "fixtures" / "traces" / "azure_conv_10min.csv"
FULL = REPO.parent / "shared" / "datasets" / "azure-llm-2023" / "AzureLLMInferenceTrace_conv.csv"
#: Three times FAST_GPU: the conversation trace at 10x (about 54 requests/s of 1,155 prompt and
#: 211 output tokens on average over the hour) stays within its capacity, so nothing overflows.
TRACE_GPU = {**FAST_GPU, "name": "fast30x", "bandwidth_gbs": 18000, "fp16_tflops": 3750,
             "effective_bandwidth_gbs": 19200, "effective_tflops": 2427}
CONFIG = {"engine": {"gpu": TRACE_GPU, "max_model_len": 16384, "max_num_seqs": 1024}}


def _read_azure(path: Path) -> list[tuple[float, int, int]]:
    rows = []
    with open(path, encoding="utf-8-sig") as f:
        header = f.readline().strip().split(",")
        assert header == ["TIMESTAMP", "ContextTokens", "GeneratedTokens"], header
        for line in f:
            if not line.strip():
                continue
            ts, ctx, gen = line.strip().split(",")
            t = datetime.strptime(ts[:26], "%Y-%m-%d %H:%M:%S.%f").timestamp()
            rows.append((t, int(ctx), int(gen)))
    t0 = min(r[0] for r in rows)
    return sorted(((t - t0, c, g) for t, c, g in rows), key=lambda r: r[0])


def _quantile(values: list[int], q: float) -> int:
    v = sorted(values)
    return v[max(0, math.ceil(q * len(v)) - 1)]


def _bench(sim_bin, sim, tmp_path: Path, name: str, *args: str, timeout: float = 300):
    out = tmp_path / f"{name}.json"
    r = subprocess.run([sim_bin, "bench", "--endpoint", sim.url, "--model", MODEL, "--json", str(out), "--quiet",
                        "--timeout", "120s", *args],
                       capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, cwd=tmp_path)
    assert r.returncode == 0, f"exit {r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    return json.loads(out.read_text()), r


def _counter(fams, name: str) -> float:
    """A counter's total, whether the exposition's family is `name` or `name_total`."""
    family = name if name in fams else f"{name}_total"
    return sample_value(fams, family, f"{name}_total")


def _counters(sim) -> tuple[float, float, float]:
    fams = sim.families()
    return (_counter(fams, "vllm:prompt_tokens"), _counter(fams, "vllm:generation_tokens"),
            _counter(fams, "vllm:request_success"))


def _replay_and_check(sim_bin, sims, tmp_path, path: Path, timeout: float) -> dict:
    rows = _read_azure(path)
    sim = sims("sim", "--served-model-name", MODEL, "--seed", "3", config=CONFIG)
    p0, g0, s0 = _counters(sim)
    # The completions API: its template is one BOS token, so even the trace's 2-token prompts
    # can be exact (the Llama 3 chat template alone is 10 tokens; see the sessions test for chat).
    report, r = _bench(sim_bin, sim, tmp_path, "replay", "--trace", str(path), "--trace-speed", "10",
                       "--api", "completions", timeout=timeout)
    t = report["trace"]
    n = len(rows)
    # The request count, exactly.
    assert (t["rows"], t["scheduled"], t["sent"], t["overflow"]) == (n, n, n, 0), t
    assert (t["completed"], t["failed"], report["requests"]["completed"]) == (n, 0, n), (t, r.stderr[-2000:])
    # Arrivals per trace minute: the schedule is the trace's, the sends within 5 %.
    want = [0] * (int(rows[-1][0] // 60) + 1)
    for at, _, _ in rows:
        want[int(at // 60)] += 1
    assert t["per_minute_scheduled"] == want
    sent = t["per_minute_sent"]
    assert sum(sent) == n and len(sent) >= len(want)
    worst = max(abs(s - w) / w for s, w in zip(sent, want) if w >= 20)
    assert worst <= 0.05, (worst, sent, want)
    # Tokens: every request served exactly the trace's prompt and output length.
    assert t["compared"] == n and t["usage_missing"] == 0, t
    assert (t["input_exact"], t["output_exact"], t["prompts_clamped"]) == (n, n, 0), t["mismatches"]
    ctx = [c for _, c, _ in rows]
    gen = [g for _, _, g in rows]
    for key, vals in (("input_tokens", ctx), ("output_tokens", gen)):
        st = t[key]
        assert st["served"] == st["trace"], st
        assert st["trace"]["n"] == n and st["trace"]["max"] == max(vals)
        for q in ("p50", "p90", "p99"):
            exact = _quantile(vals, float("0." + q[1:]))
            assert abs(st["trace"][q] - exact) <= max(1, exact * 0.002), (key, q, st["trace"][q], exact)
        assert abs(st["trace"]["mean"] - sum(vals) / n) < 1e-6 * sum(vals)
    # The simulator's own counters: the trace's sums.
    p1, g1, s1 = _counters(sim)
    assert (p1 - p0, g1 - g0, s1 - s0) == (sum(ctx), sum(gen), n)
    assert "trace" in r.stdout and "prompt exact" in r.stdout
    print(f"\ntrace replay {path.name} at 10x: {n} requests, wall {report['duration_s']:.1f} s, "
          f"per-minute sent {sent} vs trace {want}, "
          f"max send lag {t['max_send_lag_s']:.3f} s, worst minute {worst * 100:.2f} %, "
          f"prompt tokens p50/p90/p99 {t['input_tokens']['served']['p50']}/"
          f"{t['input_tokens']['served']['p90']}/{t['input_tokens']['served']['p99']}, "
          f"output p50/p90/p99 {t['output_tokens']['served']['p50']}/{t['output_tokens']['served']['p90']}/"
          f"{t['output_tokens']['served']['p99']}, sim prompt/generation tokens {p1 - p0:.0f}/{g1 - g0:.0f}")
    return report


@pytest.mark.timeout(420)  # 60 s of sending at 10x, then the simulator's backlog drains
def test_azure_conversation_excerpt_at_10x(sims, sim_bin, tmp_path):
    _replay_and_check(sim_bin, sims, tmp_path, FIXTURE, timeout=300)


@pytest.mark.slow
@pytest.mark.timeout(1500)  # 6 minutes of sending at 10x, then the backlog drains
def test_azure_conversation_hour_at_10x(sims, sim_bin, tmp_path):
    if not FULL.is_file():
        pytest.skip(f"{FULL} not present")
    _replay_and_check(sim_bin, sims, tmp_path, FULL, timeout=1400)


def test_generic_jsonl_sessions_sampling_and_loop(sims, sim_bin, tmp_path):
    # 4 sessions x 3 turns, 2 s apart; later turns are longer than their history.
    lines = []
    for turn in range(3):
        for s in range(4):
            at = turn * 2.0 + s * 0.25
            lines.append(json.dumps({"timestamp": at, "input_tokens": 60 + 150 * turn + s,
                                     "output_tokens": 8 + s, "session_id": f"user-{s}"}))
    path = tmp_path / "sessions.jsonl"
    path.write_text("\n".join(lines) + "\n")
    sim = sims("sim", "--served-model-name", MODEL, "--seed", "3", config=CONFIG)
    for api in ("chat", "completions"):
        p0, g0, _ = _counters(sim)
        report, _ = _bench(sim_bin, sim, tmp_path, f"sessions-{api}", "--trace", str(path), "--trace-speed", "4",
                           "--api", api)
        t = report["trace"]
        assert (t["format"], t["sessions"], t["sent"], t["completed"]) == ("jsonl", 4, 12, 12), t
        assert (t["input_exact"], t["output_exact"]) == (12, 12), t["mismatches"]
        p1, g1, _ = _counters(sim)
        want_in = sum(json.loads(x)["input_tokens"] for x in lines)
        assert (p1 - p0, g1 - g0) == (want_in, sum(8 + s for s in range(4)) * 3)

    # A window of the Azure excerpt (its 2nd minute), looped for two laps at 20x, half sampled.
    rows = _read_azure(FIXTURE)
    in_window = sum(1 for at, _, _ in rows if 60 <= at < 120)
    report, _ = _bench(sim_bin, sim, tmp_path, "window", "--trace", str(FIXTURE), "--trace-speed", "20",
                       "--trace-start", "1m", "--trace-duration", "1m", "--trace-loop", "--trace-sample", "0.5",
                       "--duration", "5.9s", "--seed", "11")
    t = report["trace"]
    assert t["rows_per_lap"] == in_window and t["period_s"] == 60.0
    assert abs(t["scheduled"] - in_window) <= 0.15 * in_window, (t["scheduled"], in_window)
    assert t["completed"] == t["scheduled"] and t["input_exact"] == t["scheduled"]
    assert len(t["per_minute_scheduled"]) == 2 and min(t["per_minute_scheduled"]) > 0.3 * in_window


def test_bad_trace_rows_name_file_and_line(sim_bin, tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.1,10,5\n"
                   "2023-11-16 18:15:47.2,ten,5\n")
    r = subprocess.run([sim_bin, "bench", "--endpoint", "http://127.0.0.1:9", "--model", "m", "--trace", str(bad)],
                       capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert f"{bad}:3: ContextTokens \"ten\" is not a whole number" in r.stderr, r.stderr
    r = subprocess.run([sim_bin, "bench", "--endpoint", "http://127.0.0.1:9", "--model", "m", "--trace", str(FIXTURE),
                        "--trace-loop"], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert r.returncode == 2 and "--duration or --requests" in r.stderr, r.stderr


def test_scenario_uses_the_trace_as_load_shape(sim_bin, tmp_path):
    """`load.trace` in a scenario: the simulated clock gets the trace's requests, at its times."""
    rows = _read_azure(FIXTURE)
    sc = tmp_path / "trace.yaml"
    rel = os.path.relpath(FIXTURE, tmp_path)
    sc.write_text("name: trace_conv\nduration: 2m\nengine: {gpu: mi300x, max_model_len: 16384}\n"
                  f"load: {{trace: {{path: {json.dumps(rel)}, speed: 10}}}}\n"
                  "slo: {metric: ttft, quantile: 0.9, threshold: 2s, window: 10s, min_requests: 5}\n")
    out = tmp_path / "out"
    r = subprocess.run([sim_bin, "sim", "--scenario", str(sc), "--out", str(out)], capture_output=True, text=True,
                       timeout=300, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr
    gt = json.loads((out / "ground_truth.json").read_text())
    inst = gt["instances"][0]
    assert inst["requests"] == len(rows) and inst["rejected"] == 0
    # SLO windows of 10 s simulated = 100 s of trace at 10x: the trace's counts, exactly.
    want = [0] * 6
    for at, _, _ in rows:
        want[min(int(at // 100), 5)] += 1
    assert [w[1] for w in inst["slo_windows"]] == want, (inst["slo_windows"], want)
    # A bad trace fails the load with the field, file and line.
    bad = tmp_path / "bad.csv"
    bad.write_text("timestamp,input_tokens,output_tokens\n0,10,5\n1,10,-1\n")
    sc.write_text(sc.read_text().replace(json.dumps(rel), "bad.csv"))
    r = subprocess.run([sim_bin, "sim", "--scenario", str(sc), "--out", str(out)], capture_output=True, text=True,
                       timeout=60, stdin=subprocess.DEVNULL)
    assert r.returncode != 0 and "load.trace.path:" in r.stderr and "bad.csv:3:" in r.stderr, r.stderr

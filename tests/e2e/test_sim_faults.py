"""Faults switched on at run time (POST /admin/faults) move their signal the documented way,
driven with the OpenAI client and measured on the server's engine clock (its /metrics
histograms; the simulated step times do not stretch on a busy machine), against a healthy
control on the same server (docs/detectors/kv_pressure.md for the 800 ms queue rule, scenarios/README.md#faults,
sim/src/faults.rs):

- queue blocking: request queue time p99 above 800 ms; about strength x period;
- context-length collapse: the prefill time of prompts over 4k tokens rises sharply, prompts
  under 1k tokens do not move.
"""

from __future__ import annotations

import threading
import time

from support.sim import (FAST_ANSWERS, FAST_GPU, histogram, long_prompt, percentile, run_load,  # noqa: F401
                         sample_value, sim_bin, sims, stream_call)

MODEL = "fault-model"


class WaitingProbe:
    """Polls vllm:num_requests_waiting in the background; keeps the largest value seen."""

    def __init__(self, sim) -> None:
        self.sim = sim
        self.max = 0.0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            v = sample_value(self.sim.families(), "vllm:num_requests_waiting")
            self.max = max(self.max, v)
            self._stop.wait(0.05)  # polling interval

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join(10)


def _queue_phase(sim, tag: str, n: int = 16, rate: float = 8.0) -> dict:
    """n short streamed requests at a constant rate; client TTFTs and the server's queue-time
    histogram over exactly these requests."""
    c = sim.client()
    fams = sim.families()
    before = histogram(fams, "vllm:request_queue_time_seconds")
    before_ttft = histogram(fams, "vllm:time_to_first_token_seconds")

    def one(i: int):
        s = stream_call(c.completions.create, False, model=MODEL, prompt=f"{tag} request {i}: say something",
                        max_tokens=6, extra_body={"ignore_eos": True}, stream_options={"include_usage": True})
        assert s.usage.completion_tokens == 6
        return s

    with WaitingProbe(sim) as probe:
        res = run_load(one, n, rate=rate)
    fams = sim.families()
    q = histogram(fams, "vllm:request_queue_time_seconds").minus(before)
    assert q.count == n, f"{q.count} queue-time observations for {n} requests"
    ttft = histogram(fams, "vllm:time_to_first_token_seconds").minus(before_ttft)
    assert ttft.count == n, f"{ttft.count} TTFT observations for {n} requests"
    return {"ttft": [s.ttft for s in res], "engine_ttft": ttft, "queue": q, "max_waiting": probe.max}


def test_queue_blocking(sims):
    sim = sims("sim", "--gpu", "a10g", "--served-model-name", MODEL, config=FAST_ANSWERS)
    assert sim.get_faults()["active"] == []

    healthy = _queue_phase(sim, "healthy")
    # upper bounds on the engine clock (TTFT from the server's histogram): a busy machine's
    # scheduling delays reach the client's timings, not the simulated ones
    assert healthy["engine_ttft"].fraction_le(0.75) == 1.0, f"healthy TTFTs above 750 ms: {healthy['engine_ttft']}"
    assert healthy["queue"].fraction_le(0.3) == 1.0, f"healthy queue times above 300 ms: {healthy['queue']}"

    # a bad fault is refused and names the problem
    r = sim.post_faults({"kind": "queue_blocking", "strenght": 0.5})
    assert r.status_code == 400 and "strenght" in r.text, r.text
    r = sim.post_faults({"kind": "queue_blocking", "strength": 1.5})
    assert r.status_code == 400, r.text

    # admission stalls for the first 2 s of every 4 s, from now on (the documented defaults); the
    # 2 s of load below start inside the first stall
    st = sim.set_faults({"kind": "queue_blocking", "strength": 0.5, "period": "4s"})
    assert st["active"] == ["queue_blocking"], st
    assert len(st["faults"]) == 1 and abs(st["faults"][0]["onset"] - st["now"]) < 1.0, st
    assert sim.get_faults()["faults"] == st["faults"]
    faulty = _queue_phase(sim, "faulty")
    q = faulty["queue"]
    # p99 > 800 ms: fewer than 99 % of the requests queued 800 ms or less (0.8 is a bucket bound)
    assert q.fraction_le(0.8) < 0.99, f"queue-time p99 not above 800 ms: {q}"
    assert percentile(faulty["ttft"], 0.99) > 0.8, faulty["ttft"]
    # magnitude: nobody waits much longer than one stall (strength x period = 2 s)
    assert q.fraction_le(2.5) == 1.0, f"queue times beyond the 2 s stall: {q}"
    assert faulty["engine_ttft"].fraction_le(2.5) == 1.0, f"TTFTs beyond the 2 s stall: {faulty['engine_ttft']}"
    assert faulty["max_waiting"] >= 3, f"vllm:num_requests_waiting peaked at {faulty['max_waiting']}"

    st = sim.clear_faults()
    assert st["active"] == [] and st["faults"] == []


#: Engine-clock histograms of `_collapse_phase`: prefill (scheduled -> first token) and
#: inference (scheduled -> finished) are the engine's work on a request, with no wall-clock
#: component, and are what the assertions use; TTFT and e2e (in the report only) count from
#: the handler's arrival stamp, so a busy machine's delay between the HTTP handler and the
#: engine task can land in their queue part.
_ENGINE_TIMES = {"prefill": "vllm:request_prefill_time_seconds", "inference": "vllm:request_inference_time_seconds",
                 "ttft": "vllm:time_to_first_token_seconds", "e2e": "vllm:e2e_request_latency_seconds"}


def _collapse_phase(sim, tag: str, words: int, n: int = 6) -> dict:
    """n streamed completions of a `words`-token prompt, one at a time (no batching between
    them, so the engine's timings depend on the prompt alone); the mean engine-clock timings of
    exactly these requests, from the /metrics histograms' sums (exact, unlike their buckets)."""
    c = sim.client()
    before = sim.families()

    def one(i: int):
        t0 = time.monotonic()
        s = stream_call(c.completions.create, False, model=MODEL, prompt=long_prompt(words, hash((tag, i)) % 10**6),
                        max_tokens=8, extra_body={"ignore_eos": True}, stream_options={"include_usage": True})
        assert s.usage.completion_tokens == 8
        return s, time.monotonic() - t0

    res = run_load(one, n, workers=1)
    after = sim.families()
    out: dict = {"tokens": {s.usage.prompt_tokens for s, _ in res}, "client_e2e": sum(w for _, w in res) / n}
    for key, name in _ENGINE_TIMES.items():
        h = histogram(after, name).minus(histogram(before, name))
        assert h.count == n, f"{name}: {h.count} observations for {n} requests"
        out[key] = h.sum / h.count
    return out


def test_context_length_collapse(sims):
    # ten times an A10G, so that 7k-token prompts take tenths of a second
    sim = sims("sim", "--served-model-name", MODEL, config={**FAST_ANSWERS, "engine": {"gpu": FAST_GPU}})
    long_words, short_words = 7000, 500

    h_long = _collapse_phase(sim, "healthy", long_words)
    h_short = _collapse_phase(sim, "healthy", short_words, n=10)
    assert min(h_long["tokens"]) > 4096 and max(h_short["tokens"]) < 1000, (h_long, h_short)

    st = sim.set_faults({"kind": "context_collapse", "strength": 3, "threshold_tokens": 4096})
    assert st["active"] == ["context_collapse"], st
    f_long = _collapse_phase(sim, "faulty", long_words)
    f_short = _collapse_phase(sim, "faulty", short_words, n=10)
    sim.clear_faults()
    report = f"healthy long {h_long}, short {h_short}; faulty long {f_long}, short {f_short}"
    print(report)

    # Every timing below is on the simulator's engine clock (simulated step durations), so the
    # ratios hold however loaded the machine is; the client's wall-clock timings are not used.
    # long prompts: work past 4096 tokens costs 4x, so a 7k prompt's prefill about doubles
    assert f_long["prefill"] >= 1.6 * h_long["prefill"], report
    assert f_long["inference"] >= 1.3 * h_long["inference"], report
    # short prompts do not move (the same work, on the same engine)
    assert f_short["prefill"] <= 1.1 * h_short["prefill"], report
    assert f_short["inference"] <= 1.1 * h_short["inference"], report
    # >4k prompts far above <1k prompts, and further apart than in the healthy control
    assert f_long["prefill"] >= 5 * f_short["prefill"], report
    assert f_long["prefill"] / f_short["prefill"] >= 1.5 * h_long["prefill"] / h_short["prefill"], report
    # The client waits for what the engine clock says (a busy machine only adds to it): the
    # collapse reaches the stream, not only the histograms.
    assert f_long["client_e2e"] >= 0.9 * f_long["inference"], report

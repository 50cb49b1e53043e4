"""`GET /metrics` of `inferwatch sim` against vLLM: promtool accepts it, the names, types,
labels and buckets are those of vLLM V1 (tests/fixtures/servers/vllm-*.metrics.json), and the counters and
histograms add up to what the OpenAI client saw."""

from __future__ import annotations

import math
import re
import subprocess

import pytest
import requests

from support.sim import (FAST_ANSWERS, FAST_GPU, histogram, promtool, run_load,  # noqa: F401 (fixtures)
                         sample_value, sim_bin, sims, stream_call)

MODEL = "metrics-model"
CONFIG = {**FAST_ANSWERS, "engine": {"gpu": FAST_GPU}}

# --------------------------------------------------------------------------------------------
# The reference table, transcribed from vLLM V1's metric definitions (gauges, counters, histograms, removed names)
# (vLLM main 2026-01-23, V1 engine, one API server process).

TTFT = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
        80.0, 160.0, 640.0, 2560.0]
ITL = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0]
LATENCY = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
           960.0, 1920.0, 7680.0]
ITERATION = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
PARAMS_N = [1, 2, 5, 10, 20]
KV_RESIDENCY = [0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1200,
                1800]


def buckets_1_2_5(max_model_len: int) -> list[int]:
    """vLLM's build_1_2_5_buckets: 1, 2, 5, 10, 20, 50, ... up to max_model_len."""
    out, exp = [], 0
    while True:
        for m in (1, 2, 5):
            v = m * 10 ** exp
            if v > max_model_len:
                return out
            out.append(v)
        exp += 1


BASE = ("engine", "model_name")
TOKENS = "1-2-5"  # placeholder for buckets_1_2_5(max_model_len)

# exposed family name -> (type, labels besides `le`, buckets or None)
REQUIRED = {
    # gauges
    "vllm:num_requests_running": ("gauge", BASE, None),
    "vllm:num_requests_waiting": ("gauge", BASE, None),
    "vllm:kv_cache_usage_perc": ("gauge", BASE, None),
    # counters (registered without, exposed with `_total`)
    "vllm:prompt_tokens_total": ("counter", BASE, None),
    "vllm:generation_tokens_total": ("counter", BASE, None),
    "vllm:request_success_total": ("counter", BASE + ("finished_reason",), None),
    "vllm:num_preemptions_total": ("counter", BASE, None),
    "vllm:prefix_cache_queries_total": ("counter", BASE, None),
    "vllm:prefix_cache_hits_total": ("counter", BASE, None),
    # histograms with vLLM's buckets
    "vllm:time_to_first_token_seconds": ("histogram", BASE, TTFT),
    "vllm:inter_token_latency_seconds": ("histogram", BASE, ITL),
    "vllm:request_time_per_output_token_seconds": ("histogram", BASE, ITL),
    "vllm:e2e_request_latency_seconds": ("histogram", BASE, LATENCY),
    "vllm:request_queue_time_seconds": ("histogram", BASE, LATENCY),
    "vllm:request_prefill_time_seconds": ("histogram", BASE, LATENCY),
    "vllm:request_decode_time_seconds": ("histogram", BASE, LATENCY),
    "vllm:request_inference_time_seconds": ("histogram", BASE, LATENCY),
    "vllm:request_prompt_tokens": ("histogram", BASE, TOKENS),
    "vllm:request_generation_tokens": ("histogram", BASE, TOKENS),
    "vllm:request_max_num_generation_tokens": ("histogram", BASE, TOKENS),
    "vllm:request_params_max_tokens": ("histogram", BASE, TOKENS),
    "vllm:request_params_n": ("histogram", BASE, PARAMS_N),
    "vllm:request_prefill_kv_computed_tokens": ("histogram", BASE, TOKENS),
    "vllm:iteration_tokens_total": ("histogram", BASE, ITERATION),
    # vLLM 0.33 defaults (tests/fixtures/servers/vllm-0.33.0.metrics.json)
    "vllm:num_requests_waiting_by_reason": ("gauge", BASE + ("reason",), None),
    "vllm:prompt_tokens_by_source_total": ("counter", BASE + ("source",), None),
    "vllm:prompt_tokens_cached_total": ("counter", BASE, None),
    "vllm:prompt_tokens_cached_by_source_total": ("counter", BASE + ("source",), None),
    "vllm:request_num_preemptions": ("histogram", BASE, [1, 2, 3, 4, 5, 10, 20]),
    "vllm:estimated_flops_per_gpu_total": ("counter", BASE, None),
    "vllm:estimated_read_bytes_per_gpu_total": ("counter", BASE, None),
    "vllm:estimated_write_bytes_per_gpu_total": ("counter", BASE, None),
}
# Exposed only with a feature (LoRA, sleep mode, KV connector, multimodal, spec decode, NaN
# checks, --kv-cache-metrics, NIXL): allowed, and then typed and labelled as in vLLM.
OPTIONAL = {
    "vllm:engine_sleep_state": ("gauge", BASE + ("sleep_state",), None),
    "vllm:external_prefix_cache_queries_total": ("counter", BASE, None),
    "vllm:external_prefix_cache_hits_total": ("counter", BASE, None),
    "vllm:mm_cache_queries_total": ("counter", BASE, None),
    "vllm:mm_cache_hits_total": ("counter", BASE, None),
    "vllm:corrupted_requests_total": ("counter", BASE, None),
    "vllm:spec_decode_num_drafts_total": ("counter", BASE, None),
    "vllm:spec_decode_num_draft_tokens_total": ("counter", BASE, None),
    "vllm:spec_decode_num_accepted_tokens_total": ("counter", BASE, None),
    "vllm:spec_decode_num_accepted_tokens_per_pos_total": ("counter", BASE + ("position",), None),
    "vllm:kv_block_lifetime_seconds": ("histogram", BASE, KV_RESIDENCY),
    "vllm:kv_block_idle_before_evict_seconds": ("histogram", BASE, KV_RESIDENCY),
    "vllm:kv_block_reuse_gap_seconds": ("histogram", BASE, KV_RESIDENCY),
}
# Label-less of model_name: checked on their own.
SPECIAL = {"vllm:cache_config_info", "vllm:lora_requests_info",
           "vllm:admission_rejections_total"}  # the last has `model_name, reason`, no `engine`
# Removed or V0-only names a V1 server of this vintage no longer exposes.
GONE = ["vllm:gpu_cache_usage_perc", "vllm:gpu_prefix_cache_queries", "vllm:gpu_prefix_cache_hits",
        "vllm:time_per_output_token_seconds", "vllm:num_requests_swapped", "vllm:cpu_cache_usage_perc",
        "vllm:cpu_prefix_cache_hit_rate", "vllm:gpu_prefix_cache_hit_rate", "vllm:time_in_queue_requests",
        "vllm:model_forward_time_milliseconds", "vllm:model_execute_time_milliseconds",
        "vllm:spec_decode_draft_acceptance_rate", "vllm:spec_decode_efficiency"]
CACHE_CONFIG_LABELS = {"block_size", "num_gpu_blocks", "gpu_memory_utilization", "cache_dtype",
                       "enable_prefix_caching", "engine"}


def go_float(v: float) -> str:
    """prometheus_client's floatToGoString (how vLLM prints `le` and values)."""
    v = float(v)
    if v == math.inf:
        return "+Inf"
    s = repr(v)
    dot = s.find(".")
    if v > 0 and dot > 6:
        mantissa = f"{s[0]}.{s[1:dot]}{s[dot + 1:]}".rstrip("0.")
        return f"{mantissa}e+0{dot - 1}"
    return s


def _check_family(problems: list, fams, name: str, spec, max_model_len: int, model: str) -> None:
    typ, labels, buckets = spec
    f = fams[name]
    if f.type != typ:
        problems.append(f"{name}: type {f.type}, vLLM has {typ}")
        return
    if not f.help:
        problems.append(f"{name}: no HELP")
    if not f.samples:
        problems.append(f"{name}: no samples")
    want = set(labels)
    for sname, lab, _ in f.samples:
        got = set(lab) - ({"le"} if sname.endswith("_bucket") else set())
        if got != want:
            problems.append(f"{sname}: labels {sorted(got)}, vLLM has {sorted(want)}")
            break
        if lab.get("model_name") != model or lab.get("engine") != "0":
            problems.append(f"{sname}: model_name={lab.get('model_name')!r} engine={lab.get('engine')!r}")
            break
    if typ == "histogram":
        if buckets == TOKENS:
            buckets = buckets_1_2_5(max_model_len)
        les = [lab["le"] for sname, lab, _ in f.samples if sname == name + "_bucket"]
        want_le = [go_float(b) for b in buckets] + ["+Inf"]
        # one series per label set (finished_reason etc. do not apply to histograms)
        n_series = max(1, len({tuple(sorted((k, v) for k, v in lab.items() if k != "le"))
                               for _, lab, _ in f.samples}))
        if les != want_le * n_series:
            problems.append(f"{name}: buckets {les[:len(want_le)]}, vLLM has {want_le}")
        for suffix in ("_count", "_sum"):
            if not any(sname == name + suffix for sname, _, _ in f.samples):
                problems.append(f"{name}: no {name}{suffix}")
    if typ == "counter" and not all(sname == name for sname, _, _ in f.samples):
        problems.append(f"{name}: counter samples not named {name}")


def _send_traffic(sim, with_one_token: bool = False) -> list[dict]:
    """A mix of chat / completions, whole / streamed calls; returns what the client saw."""
    c = sim.client()
    p = "Explain continuous batching in one paragraph"

    def call(i: int) -> dict:
        kind = i % 4
        prompt = f"{p} (variant {i})"
        max_tokens = 6 + i
        extra = {"ignore_eos": True} if i % 3 == 0 else {}
        if with_one_token and i == 0:
            max_tokens = 1
        if kind == 0:
            r = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": prompt}],
                                          max_tokens=max_tokens, extra_body=extra)
            u, fr = r.usage, r.choices[0].finish_reason
        elif kind == 1:
            r = c.completions.create(model=MODEL, prompt=prompt, max_tokens=max_tokens, extra_body=extra)
            u, fr = r.usage, r.choices[0].finish_reason
        else:
            create = c.chat.completions.create if kind == 2 else c.completions.create
            body = {"messages": [{"role": "user", "content": prompt}]} if kind == 2 else {"prompt": prompt}
            s = stream_call(create, kind == 2, model=MODEL, max_tokens=max_tokens, extra_body=extra,
                            stream_options={"include_usage": True}, **body)
            u, fr = s.usage, s.finish_reasons[-1][1]
        return {"prompt": u.prompt_tokens, "completion": u.completion_tokens, "finish": fr, "max_tokens": max_tokens}

    return run_load(call, 10, workers=4)


def test_promtool_accepts_metrics(sims):
    tool = promtool()
    sim = sims("sim", "--served-model-name", MODEL, config=CONFIG)
    _send_traffic(sim)
    r = requests.get(sim.url + "/metrics", timeout=10)
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4"), r.headers["content-type"]
    text = r.text

    def check(body: str) -> tuple[int, list[str]]:
        p = subprocess.run([tool, "check", "metrics"], input=body, capture_output=True, text=True, timeout=60)
        return p.returncode, [ln for ln in (p.stdout + p.stderr).splitlines() if ln.strip()]

    # promtool itself tells parse errors (exit 1, "error while linting") from lint problems (exit 3)
    rc, lines = check(text + "vllm:broken{model_name=\"x\"} not-a-number\n")
    assert rc == 1 and any("error while linting" in ln for ln in lines), (rc, lines)

    rc, lines = check(text)
    assert rc in (0, 3), f"promtool exit {rc}:\n" + "\n".join(lines)
    assert not any("error" in ln.lower() for ln in lines), "\n".join(lines)
    # The only lint complaints allowed are those vLLM's own output triggers: colons in every
    # `vllm:` name, and `_total` on the histogram vllm:iteration_tokens_total.
    allowed = [re.compile(r"^vllm:[a-zA-Z0-9_:]+ metric names should not contain ':'$"),
               re.compile(r'^vllm:iteration_tokens_total non-counter metrics should not have "_total" suffix$')]
    other = [ln for ln in lines if not any(a.match(ln) for a in allowed)]
    assert not other, "promtool lint problems vLLM does not have:\n" + "\n".join(other)


def test_names_types_labels_buckets_match_reference(sims):
    sim = sims("sim", "--served-model-name", MODEL, "other-name", "--max-model-len", "4096",
               "--num-gpu-blocks-override", "3000", config=CONFIG)
    _send_traffic(sim)
    fams = sim.families()
    problems: list[str] = []
    for name, spec in REQUIRED.items():
        if name not in fams:
            problems.append(f"{name}: missing")
            continue
        _check_family(problems, fams, name, spec, 4096, MODEL)
    vllm_names = {n for n in fams if n.startswith("vllm:")}
    created = {n for n in vllm_names if n.endswith("_created")}
    for n in sorted(vllm_names - created - set(REQUIRED)):
        if n in OPTIONAL:
            _check_family(problems, fams, n, OPTIONAL[n], 4096, MODEL)
        elif n not in SPECIAL:
            problems.append(f"{n}: not a vLLM V1 metric")
    for n in GONE:
        for exposed in (n, n + "_total"):
            if exposed in fams:
                problems.append(f"{exposed}: removed from vLLM but exposed")
    # prometheus_client's `_created` series: one gauge per counter / histogram, same labels
    for n in sorted(created):
        base = n[: -len("_created")]
        owner = fams.get(base + "_total") or fams.get(base)
        if owner is None or owner.type not in ("counter", "histogram"):
            problems.append(f"{n}: a _created series without its counter or histogram")
        elif fams[n].type != "gauge":
            problems.append(f"{n}: type {fams[n].type}, prometheus_client writes gauge")
    # success counter: one child per finished reason
    reasons = {lab.get("finished_reason") for _, lab, _ in fams["vllm:request_success_total"].samples}
    if not {"stop", "length"} <= reasons <= {"stop", "length", "abort", "error", "repetition"}:
        problems.append(f"vllm:request_success_total finished_reason values {sorted(reasons)}")
    # the info gauge: config fields as labels, value 1; the only place num_gpu_blocks appears
    info = fams.get("vllm:cache_config_info")
    if info is None or info.type != "gauge" or len(info.samples) != 1:
        problems.append(f"vllm:cache_config_info: {info}")
    else:
        _, lab, v = info.samples[0]
        if v != 1.0 or not CACHE_CONFIG_LABELS <= set(lab) or "model_name" in lab:
            problems.append(f"vllm:cache_config_info: value {v}, labels {sorted(lab)}")
        elif (lab["block_size"], lab["num_gpu_blocks"], lab["engine"]) != ("16", "3000", "0"):
            problems.append(f"vllm:cache_config_info: {lab}")
    # every histogram series is well formed
    for f in fams.values():
        if f.type != "histogram":
            continue
        h = histogram(fams, f.name)
        if h.bounds[-1] != math.inf or h.bounds != sorted(h.bounds) or len(set(h.bounds)) != len(h.bounds):
            problems.append(f"{f.name}: bounds {h.bounds}")
        if any(b > a for a, b in zip(h.cumulative[1:], h.cumulative)) or h.cumulative[-1] != h.count:
            problems.append(f"{f.name}: buckets not cumulative or +Inf != _count")
        if h.count > 0 and not h.sum >= 0:
            problems.append(f"{f.name}: sum {h.sum}")
    assert not problems, "\n".join(problems)

    # the token buckets follow --max-model-len (8192 by default: ... 2000, 5000)
    other = sims("default-len", "--served-model-name", MODEL, config=CONFIG)
    h = histogram(other.families(), "vllm:request_prompt_tokens")
    assert h.bounds == [float(b) for b in buckets_1_2_5(8192)] + [math.inf]
    assert buckets_1_2_5(8192)[-2:] == [2000, 5000] and buckets_1_2_5(4096)[-1] == 2000


def test_metrics_agree_with_client_usage(sims):
    sim = sims("sim", "--served-model-name", MODEL, config=CONFIG)
    before = sim.families()
    seen = _send_traffic(sim)
    fams = sim.families()
    n = len(seen)
    prompt = sum(s["prompt"] for s in seen)
    completion = sum(s["completion"] for s in seen)
    m = {"model_name": MODEL}

    def delta(name: str, sample: str | None = None, **labels) -> float:
        return sample_value(fams, name, sample, **m, **labels) - sample_value(before, name, sample, **m, **labels)

    assert delta("vllm:prompt_tokens_total") == prompt
    assert delta("vllm:generation_tokens_total") == completion
    for reason in ("stop", "length"):
        assert delta("vllm:request_success_total", finished_reason=reason) == \
            sum(s["finish"] == reason for s in seen), reason
    assert delta("vllm:request_success_total", finished_reason="abort") == 0
    assert delta("vllm:request_success_total", finished_reason="error") == 0
    for name in ("vllm:e2e_request_latency_seconds", "vllm:request_queue_time_seconds",
                 "vllm:request_prefill_time_seconds", "vllm:request_decode_time_seconds",
                 "vllm:request_inference_time_seconds", "vllm:time_to_first_token_seconds",
                 "vllm:request_prompt_tokens", "vllm:request_generation_tokens", "vllm:request_params_n",
                 "vllm:request_params_max_tokens", "vllm:request_prefill_kv_computed_tokens"):
        assert histogram(fams, name, **m).count == n, name
    h = lambda name: histogram(fams, name, **m)  # noqa: E731
    assert h("vllm:request_prompt_tokens").sum == prompt
    assert h("vllm:request_generation_tokens").sum == completion
    assert h("vllm:request_params_max_tokens").sum == sum(s["max_tokens"] for s in seen)
    assert h("vllm:request_params_n").sum == n
    assert h("vllm:inter_token_latency_seconds").count == completion - n, "one ITL per token after the first"
    assert h("vllm:request_prefill_kv_computed_tokens").sum <= prompt
    # all finished: nothing running or waiting
    assert sample_value(fams, "vllm:num_requests_running", **m) == 0
    assert sample_value(fams, "vllm:num_requests_waiting", **m) == 0
    # e2e >= ttft, and the phases add up (sums of seconds over the same requests)
    e2e, ttft = h("vllm:e2e_request_latency_seconds").sum, h("vllm:time_to_first_token_seconds").sum
    parts = sum(h(x).sum for x in ("vllm:request_queue_time_seconds", "vllm:request_prefill_time_seconds",
                                  "vllm:request_decode_time_seconds"))
    assert 0 < ttft <= e2e and math.isclose(parts, e2e, rel_tol=0.02, abs_tol=0.01), (ttft, e2e, parts)
    assert math.isclose(h("vllm:request_inference_time_seconds").sum,
                        h("vllm:request_prefill_time_seconds").sum + h("vllm:request_decode_time_seconds").sum,
                        rel_tol=0.01, abs_tol=0.005)
    it = h("vllm:iteration_tokens_total")
    assert completion - n <= it.sum <= prompt + completion, (it.sum, prompt, completion)


@pytest.mark.xfail(strict=True, reason="sim bugs in sim/src/server/prom.rs observe_finished / driver: TPOT "
                   "skipped for 1-token requests, params_n and max_num_generation_tokens per choice and from "
                   "max_tokens, iteration_tokens without the first token")
def test_request_histograms_follow_vllm_semantics(sims):
    """vLLM observes TPOT for every finished request (0 for a single token), and
    request_max_num_generation_tokens / request_params_n once per API request, the former
    being the longest output of its n choices (vllm/v1/engine/parallel_sampling.py); an
    iteration's token count is its prompt plus generated tokens (vllm/v1/metrics/loggers.py)."""
    sim = sims("sim", "--served-model-name", MODEL, config=CONFIG)
    c = sim.client()
    probe = c.completions.create(model=MODEL, prompt="One token please", max_tokens=1)  # the study's TTFT probe
    two = c.completions.create(model=MODEL, prompt="Two answers please", max_tokens=30, n=2)
    assert len(two.choices) == 2 and probe.usage.completion_tokens == 1
    rest = _send_traffic(sim)
    fams = sim.families()
    h = lambda name: histogram(fams, name, model_name=MODEL)  # noqa: E731
    finished = 1 + 2 + len(rest)  # engine requests (n=2 is two)
    api_requests = 1 + 1 + len(rest)
    problems = []
    tpot = h("vllm:request_time_per_output_token_seconds").count
    if tpot != finished:
        problems.append(f"TPOT observed {tpot} times for {finished} finished requests "
                        "(vLLM observes 0.0 for single-token requests)")
    pn = h("vllm:request_params_n")
    if (pn.count, pn.sum) != (api_requests, api_requests + 1):
        problems.append(f"request_params_n count/sum {pn.count}/{pn.sum}, vLLM: {api_requests}/{api_requests + 1} "
                        "(one observation per API request)")
    # the n=2 usage has only the sum of both choices: their longest lies between half and all of it
    mx = h("vllm:request_max_num_generation_tokens")
    single = 1 + sum(s["completion"] for s in rest)
    two_total = two.usage.completion_tokens
    if not (mx.count == api_requests and single + two_total / 2 <= mx.sum <= single + two_total):
        problems.append(f"request_max_num_generation_tokens: sum {mx.sum} over {mx.count}; vLLM: generated tokens "
                        f"of the longest choice, once per API request: {api_requests} observations summing to "
                        f"{single + two_total / 2}..{single + two_total}")
    it = h("vllm:iteration_tokens_total").sum
    total = sample_value(fams, "vllm:prompt_tokens_total") + sample_value(fams, "vllm:generation_tokens_total")
    if it != total:
        problems.append(f"iteration_tokens_total sum {it}; vLLM: prompt_tokens_total + generation_tokens_total "
                        f"= {total} (no prefix-cache hits here)")
    assert not problems, "\n".join(problems)

"""`inferwatch sim` against what vLLM (0.33, 0.10, V0 0.6.6) and SGLang 0.5.23 really register: the
families of its `/metrics`, parsed with prometheus_client's own parser, compared field by field with
the reference table read from the server's released source
(tests/fixtures/servers/<server>-<version>.metrics.json, issue 20).

The table is checked against the capture rendered by the real prometheus_client from the same
definitions (vllm-<version>.prom) first, so that a wrong expectation here fails on the fixture and
not only on the sim."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from support.prometheus import wait_until

from support.sim import FAST_ANSWERS, FAST_GPU, long_prompt, run_load, sim_bin, sims  # noqa: F401 (fixtures)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "servers"
MODEL = "fidelity-model"
# The table's 1-2-5 token buckets are those of max_model_len 8192.
MAX_MODEL_LEN = "8192"
CONFIG = {**FAST_ANSWERS, "engine": {"gpu": FAST_GPU}}
# fixture version -> the sim's --vllm-version
VERSIONS = {"0.33.0": "0.33", "0.10.0": "0.10", "0.6.6.post1": "0.6"}
SGLANG = "0.5.23"


def table(version: str, server: str = "vllm") -> dict:
    return json.loads((FIXTURES / f"{server}-{version}.metrics.json").read_text())


def parse(text: str, prefix: str = "vllm:") -> dict:
    """prometheus_client's parser: exposed family name -> Metric (the server's families only)."""
    return {f.name: f for f in text_string_to_metric_families(text) if f.name.startswith(prefix)}


def expected_families(t: dict) -> dict[str, dict]:
    """Exposed family name -> table row, plus the `_created` gauge family prometheus_client writes
    for every counter and histogram of a single-API-server V1 process."""
    out = {}
    for row in t["families"]:
        out[row["exposed_family"]] = row
        if row["type"] in ("counter", "histogram") and t.get("exposition_mode") == "single":
            out[row["exposed_family"] + "_created"] = {**row, "type": "gauge", "created_of": row["exposed_family"],
                                                        "buckets": None}
    return out


def label_sets(fam) -> set[frozenset]:
    return {frozenset(k for k in s.labels if not (k == "le" and s.name.endswith("_bucket"))) for s in fam.samples}


def compare(fams: dict, t: dict, model: str | None, required: set | None = None) -> list[str]:
    """Every difference between parsed families and the table, as readable lines. Every table
    family must be there, or (multiprocess servers, whose families appear with their first child)
    those in `required`."""
    want = expected_families(t)
    must = set(want) if required is None else required
    problems = [f"{n}: missing" for n in sorted(must - set(fams))]
    problems += [f"{n}: not a {t['server']} {t['version']} family" for n in sorted(set(fams) - set(want))]
    for name in sorted(set(want) & set(fams)):
        row, fam = want[name], fams[name]
        if fam.type != row["type"]:
            problems.append(f"{name}: type {fam.type}, vLLM has {row['type']}")
        if fam.documentation != row["help"]:
            problems.append(f"{name}: help {fam.documentation!r}, vLLM has {row['help']!r}")
        if not fam.samples:
            problems.append(f"{name}: no samples")
            continue
        sets = label_sets(fam)
        # multiprocess gauges of mode `all` carry the process id
        pid = t.get("exposition_mode") == "multiprocess" and row["type"] == "gauge" and \
            row.get("multiprocess_mode") in (None, "all")
        if sets != {frozenset(row["labelnames"]) | ({"pid"} if pid else set())}:
            problems.append(f"{name}: label names {sorted(map(sorted, sets))}, vLLM has {sorted(row['labelnames'])}")
        for label, values in (row.get("label_values") or {}).items():
            got = {s.labels.get(label) for s in fam.samples}
            # a multiprocess server has a child per value seen so far; a single process one all
            seen_so_far = t.get("exposition_mode") == "multiprocess"
            if not got <= set(values) if seen_so_far else got != set(values):
                problems.append(f"{name}: {label} values {sorted(map(str, got))}, vLLM has {sorted(values)}")
        if model is not None and "model_name" in row["labelnames"]:
            bad = {(s.labels.get("model_name"), s.labels.get("engine")) for s in fam.samples} - {(model, "0")}
            if "engine" not in row["labelnames"] or t["server"] != "vllm" or t.get("engine") == "V0":
                bad = {m for m, _ in bad if m != model}
            if bad:
                problems.append(f"{name}: model_name/engine {sorted(map(str, bad))}")
        if row["type"] == "histogram" and "created_of" not in row:
            for labels in {tuple(sorted((k, v) for k, v in s.labels.items() if k != "le")) for s in fam.samples}:
                les = [float(s.labels["le"]) for s in fam.samples
                       if s.name == name + "_bucket" and tuple(sorted((k, v) for k, v in s.labels.items()
                                                                      if k != "le")) == labels]
                if les != [float(b) for b in row["buckets"]] + [float("inf")]:
                    problems.append(f"{name}: buckets {les}, vLLM has {row['buckets']} + +Inf")
                    break
    return problems


def value(fams: dict, name: str, sample: str | None = None, **labels) -> float:
    """The sum of the samples `sample` (default: the family name) of family `name` matching labels."""
    sample = sample or name
    got = [s.value for s in fams[name].samples
           if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items())]
    assert got, f"no {sample}{labels}"
    return sum(got)


def capture(version: str, server: str = "vllm") -> dict:
    return parse((FIXTURES / f"{server}-{version}.prom").read_text(), f"{server}:")


@pytest.mark.parametrize("version", VERSIONS)
def test_the_reference_table_matches_the_real_client_capture(version):
    """The table and the prometheus_client capture agree, so the table is what a real server shows."""
    t = table(version)
    assert len(t["families"]) == t["family_count"]
    cap = capture(version)
    # multiprocess (V0): the families with a child after a normal run, which are the capture's
    required = set(cap) if t.get("exposition_mode") == "multiprocess" else None
    if required:
        assert len(cap) == 29, sorted(cap)
    assert compare(cap, t, None, required) == []


def test_the_sglang_table_matches_its_capture():
    t = table(SGLANG, "sglang")
    assert len(t["families"]) == t["family_count"] == 130
    cap = capture(SGLANG, "sglang")
    assert len(cap) == 49
    problems = compare(cap, t, None, set(cap))
    # the capture's `cuda_graph_passes` modes are not the source's (`prefill_none`, ...); names are
    assert problems == [], "\n".join(problems)


@pytest.mark.parametrize("version", VERSIONS)
def test_sim_metrics_are_the_vllm_default_families(sims, version):
    t = table(version)
    sim = sims("sim", "--served-model-name", MODEL, "--max-model-len", MAX_MODEL_LEN,
               "--vllm-version", VERSIONS[version], config=CONFIG)
    idle = parse(sim.metrics_text())
    v0 = t.get("engine") == "V0"
    # V0 (multiprocess): a family shows once it has a child; idle, the gauges and counters of
    # the engine's stats log, none of the histograms, no request_success reason yet.
    required = set(capture(version)) if v0 else None
    idle_required = {n for n, f in capture(version).items() if f.type in ("gauge", "counter")} - \
        {"vllm:request_success"} if v0 else None
    assert compare(idle, t, MODEL, idle_required) == [], "idle: every default family is there before any request"
    if v0:
        assert not any(f.type == "histogram" for f in idle.values()), sorted(idle)
        assert "vllm:request_success" not in idle
        assert "_created" not in sim.metrics_text()

    c = sim.client()
    shared = long_prompt(200, 1)

    def call(i: int):
        # the first ones share one long prompt (prefix-cache hits), the rest are distinct
        prompt = shared if i < 4 else long_prompt(40, 100 + i)
        return c.completions.create(model=MODEL, prompt=prompt, max_tokens=4 + i % 5)

    run_load(call, 4, workers=1)  # sequential: the second and later find the first one's blocks
    run_load(lambda i: call(4 + i), 8, workers=4)
    fams = parse(sim.metrics_text())
    problems = compare(fams, t, MODEL, required)
    assert problems == [], "\n".join(problems)

    finished = value(fams, "vllm:request_success", "vllm:request_success_total")
    assert finished == 12
    if v0:
        assert set(fams) == set(capture(version)), "the families of the V0 capture after traffic"
        reasons = {s.labels["finished_reason"] for s in fams["vllm:request_success"].samples}
        assert reasons <= {"stop", "length"} and reasons, reasons
        itl = value(fams, "vllm:time_per_output_token_seconds", "vllm:time_per_output_token_seconds_count")
        generated = value(fams, "vllm:generation_tokens", "vllm:generation_tokens_total")
        assert itl == generated - finished, "one interval per token after each request's first"
        assert value(fams, "vllm:time_in_queue_requests", "vllm:time_in_queue_requests_count") == finished
        hit = value(fams, "vllm:gpu_prefix_cache_hit_rate")
        assert 0 < hit < 1, f"V0's hit-rate gauge moved with the repeated prompt: {hit}"
        return
    prompt = value(fams, "vllm:prompt_tokens", "vllm:prompt_tokens_total")
    hits = value(fams, "vllm:prefix_cache_hits", "vllm:prefix_cache_hits_total")
    assert hits > 0, "the repeated prompt hit the prefix cache"
    if version == "0.10.0":
        # the deprecated aliases carry the same values
        assert value(fams, "vllm:gpu_prefix_cache_hits", "vllm:gpu_prefix_cache_hits_total") == hits
        assert value(fams, "vllm:gpu_cache_usage_perc") == value(fams, "vllm:kv_cache_usage_perc")
        tpot = value(fams, "vllm:time_per_output_token_seconds", "vllm:time_per_output_token_seconds_count")
        generated = value(fams, "vllm:generation_tokens", "vllm:generation_tokens_total")
        assert tpot == generated - finished, "one interval per token after each request's first"
        return
    # the new families are fed from the engine, not constants
    assert value(fams, "vllm:request_success", "vllm:request_success_total", finished_reason="repetition") == 0
    assert value(fams, "vllm:request_num_preemptions", "vllm:request_num_preemptions_count") == finished
    assert value(fams, "vllm:num_preemptions", "vllm:num_preemptions_total") == 0
    cached = value(fams, "vllm:prompt_tokens_cached", "vllm:prompt_tokens_cached_total")
    assert cached == hits, "no preemptions: cached prompt tokens = prefix-cache hits"
    by_source = lambda s: value(fams, "vllm:prompt_tokens_by_source", "vllm:prompt_tokens_by_source_total",  # noqa
                                source=s)
    assert by_source("local_cache_hit") == cached
    assert by_source("local_compute") + by_source("local_cache_hit") + by_source("external_kv_transfer") == prompt
    assert value(fams, "vllm:prompt_tokens_cached_by_source", "vllm:prompt_tokens_cached_by_source_total",
                 source="device") == cached
    assert value(fams, "vllm:num_requests_waiting_by_reason") == value(fams, "vllm:num_requests_waiting")
    assert value(fams, "vllm:engine_sleep_state", sleep_state="awake") == 1


def test_sim_sglang_metrics_are_sglangs(sims):
    """`--flavor sglang` over HTTP: prometheus_client's parser reads it; every family is one SGLang
    0.5.23 registers (type, help, label set with `pid` on the mode-`all` gauges, is_streaming and
    cache_source values, buckets); after traffic every family of the capture is there; the
    values follow the requests."""
    t = table(SGLANG, "sglang")
    sim = sims("sglang", "--flavor", "sglang", "--served-model-name", MODEL, config=CONFIG)
    idle = parse(sim.metrics_text(), "sglang:")
    assert compare(idle, t, MODEL, {"sglang:num_running_reqs", "sglang:token_usage", "sglang:max_total_num_tokens"}) \
        == []
    assert "sglang:time_to_first_token_seconds" not in idle, "no child before the first request"
    c = sim.client()
    shared = long_prompt(200, 1)
    run_load(lambda i: c.completions.create(model=MODEL, prompt=shared, max_tokens=4), 3, workers=1)
    run_load(lambda i: list(c.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": long_prompt(30, 50 + i)}], max_tokens=5, stream=True)),
        4, workers=2)
    # a client that goes away mid-stream: SGLang's tokenizer aborts the request and counts it
    with requests.post(sim.url + "/v1/completions", stream=True, timeout=30,
                       json={"model": MODEL, "prompt": "long", "max_tokens": 3000, "stream": True,
                             "ignore_eos": True}) as resp:
        assert resp.status_code == 200
        next(resp.iter_lines())
    text = wait_until(lambda: (lambda t: t if "sglang:num_aborted_requests_total{" in t else None)(sim.metrics_text()),
                      20, "the abort counted")
    assert "_created" not in text
    fams = parse(text, "sglang:")
    cap = capture(SGLANG, "sglang")
    problems = compare(fams, t, MODEL, set(cap))
    assert problems == [], "\n".join(problems)
    by_stream = lambda fam, sample, s: value(fams, fam, sample, is_streaming=s)  # noqa: E731
    assert by_stream("sglang:num_requests", "sglang:num_requests_total", "false") == 3
    assert by_stream("sglang:num_requests", "sglang:num_requests_total", "true") == 5, "the aborted one too"
    assert value(fams, "sglang:num_aborted_requests", "sglang:num_aborted_requests_total") == 1
    assert by_stream("sglang:time_to_first_token_seconds", "sglang:time_to_first_token_seconds_count", "true") == 5
    assert value(fams, "sglang:cached_tokens", "sglang:cached_tokens_total", cache_source="device") > 0, \
        "the repeated prompt hit the prefix cache"
    assert value(fams, "sglang:queue_time_seconds", "sglang:queue_time_seconds_count") == 8
    # only streamed requests record inter-token latencies: one per token after each first
    generated = by_stream("sglang:generation_tokens", "sglang:generation_tokens_total", "true")
    assert value(fams, "sglang:inter_token_latency_seconds", "sglang:inter_token_latency_seconds_count") == \
        generated - 5
    assert value(fams, "sglang:http_responses", "sglang:http_responses_total", endpoint="/v1/completions",
                 status_code="200") == 4, "3 whole, 1 streamed (then dropped)"
    assert value(fams, "sglang:max_total_num_tokens") > 0
    pids = {s.labels["pid"] for s in fams["sglang:num_retracted_reqs"].samples}
    assert len(pids) == 1 and pids.pop().isdigit()

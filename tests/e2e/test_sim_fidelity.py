"""`inferwatch sim` against what vLLM really registers by default: the families of its `/metrics`,
parsed with prometheus_client's own parser, compared field by field with the reference table read
from vLLM's released source (tests/fixtures/servers/vllm-<version>.metrics.json, issue 20).

The table is checked against the capture rendered by the real prometheus_client from the same
definitions (vllm-<version>.prom) first, so that a wrong expectation here fails on the fixture and
not only on the sim."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from support.sim import FAST_ANSWERS, FAST_GPU, long_prompt, run_load, sim_bin, sims  # noqa: F401 (fixtures)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "servers"
MODEL = "fidelity-model"
# The table's 1-2-5 token buckets are those of max_model_len 8192.
MAX_MODEL_LEN = "8192"
CONFIG = {**FAST_ANSWERS, "engine": {"gpu": FAST_GPU}}
# fixture version -> the sim's --vllm-version
VERSIONS = {"0.33.0": "0.33", "0.10.0": "0.10"}


def table(version: str) -> dict:
    return json.loads((FIXTURES / f"vllm-{version}.metrics.json").read_text())


def parse(text: str) -> dict:
    """prometheus_client's parser: exposed family name -> Metric (vllm: families only)."""
    return {f.name: f for f in text_string_to_metric_families(text) if f.name.startswith("vllm:")}


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


def compare(fams: dict, t: dict, model: str | None) -> list[str]:
    """Every difference between parsed families and the table, as readable lines."""
    want = expected_families(t)
    problems = [f"{n}: missing" for n in sorted(set(want) - set(fams))]
    problems += [f"{n}: not a vLLM {t['version']} default family" for n in sorted(set(fams) - set(want))]
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
        if sets != {frozenset(row["labelnames"])}:
            problems.append(f"{name}: label names {sorted(map(sorted, sets))}, vLLM has {sorted(row['labelnames'])}")
        for label, values in (row.get("label_values") or {}).items():
            got = {s.labels.get(label) for s in fam.samples}
            if got != set(values):
                problems.append(f"{name}: {label} values {sorted(map(str, got))}, vLLM has {sorted(values)}")
        if model is not None and "model_name" in row["labelnames"]:
            bad = {(s.labels.get("model_name"), s.labels.get("engine")) for s in fam.samples} - {(model, "0")}
            if "engine" not in row["labelnames"]:
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


@pytest.mark.parametrize("version", VERSIONS)
def test_the_reference_table_matches_the_real_client_capture(version):
    """The table and the prometheus_client capture agree, so the table is what a real server shows."""
    t = table(version)
    assert len(t["families"]) == t["family_count"]
    capture = parse((FIXTURES / f"vllm-{version}.prom").read_text())
    assert compare(capture, t, None) == []


@pytest.mark.parametrize("version", VERSIONS)
def test_sim_metrics_are_the_vllm_default_families(sims, version):
    t = table(version)
    sim = sims("sim", "--served-model-name", MODEL, "--max-model-len", MAX_MODEL_LEN,
               "--vllm-version", VERSIONS[version], config=CONFIG)
    idle = parse(sim.metrics_text())
    assert compare(idle, t, MODEL) == [], "idle: every default family is there before any request"

    c = sim.client()
    shared = long_prompt(200, 1)

    def call(i: int):
        # the first ones share one long prompt (prefix-cache hits), the rest are distinct
        prompt = shared if i < 4 else long_prompt(40, 100 + i)
        return c.completions.create(model=MODEL, prompt=prompt, max_tokens=4 + i % 5)

    run_load(call, 4, workers=1)  # sequential: the second and later find the first one's blocks
    run_load(lambda i: call(4 + i), 8, workers=4)
    fams = parse(sim.metrics_text())
    problems = compare(fams, t, MODEL)
    assert problems == [], "\n".join(problems)

    finished = value(fams, "vllm:request_success", "vllm:request_success_total")
    assert finished == 12
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

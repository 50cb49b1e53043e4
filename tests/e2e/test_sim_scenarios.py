"""`inferwatch sim --scenario FILE --out DIR`: the same scenario and seed give byte-identical
files; the ground truth (fault onset, first SLO breach, the SLO) agrees with the scenario file
and with its own per-window values; the telemetry files are OTLP JSON lines."""

from __future__ import annotations

import calendar
import json
import re
import subprocess
import time
from pathlib import Path

import pytest

from support import otlp
from support.agent import REPO
from support.sim import sim_bin  # noqa: F401 (fixture)

# A short one: 4 simulated hours, one instance, one fault at 2h, a TTFT SLO.
SCENARIO = REPO / "scenarios" / "context_collapse_weak.yaml"
FILES = ("traces.jsonl", "metrics.jsonl", "ground_truth.json")

_UNITS = {"ms": 1e-3, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def secs(text) -> float:
    """The sim's duration syntax: a number of seconds or `2d12h`, `500ms`, `2.5m`."""
    t = str(text).strip().strip('"')
    try:
        return float(t)
    except ValueError:
        pass
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)", t)
    assert parts and "".join(a + b for a, b in parts) == t, f"bad duration {text!r}"
    return sum(float(a) * _UNITS[b] for a, b in parts)


def flow_map(yaml_text: str, key: str) -> dict:
    """The one-line flow mapping `key: { a: 1, b: x }` of a scenario file (no PyYAML here)."""
    m = re.search(rf"^{key}:\s*\{{(.*)\}}\s*$", yaml_text, re.M)
    assert m, f"no one-line `{key}: {{...}}` in the scenario"
    return {k.strip(): v.strip() for k, v in (p.split(":", 1) for p in m.group(1).split(","))}


def scalar(yaml_text: str, key: str) -> str:
    m = re.search(rf"^{key}:\s*(.+?)\s*$", yaml_text, re.M)
    assert m, f"no top-level `{key}:`"
    return m.group(1).strip('"')


def _run_all(binary: str, jobs: dict[str, list[str]], cwd: Path, timeout: float = 120) -> dict:
    """Runs the commands concurrently; returns name -> CompletedProcess-like tuple (rc, out, err)."""
    procs = {name: subprocess.Popen([binary, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                    cwd=cwd, stdin=subprocess.DEVNULL) for name, args in jobs.items()}
    deadline = time.monotonic() + timeout
    out = {}
    for name, p in procs.items():
        try:
            o, e = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs.values():
                q.kill()
            raise AssertionError(f"{name}: still running after {timeout}s")
        out[name] = (p.returncode, o, e)
    return out


@pytest.fixture(scope="module")
def runs(sim_bin, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("scenarios")
    text = SCENARIO.read_text()
    seed = int(scalar(text, "seed"))
    reseeded = tmp / "reseeded.yaml"
    reseeded.write_text(re.sub(r"^seed:.*$", f"seed: {seed + 1}", text, count=1, flags=re.M))
    jobs = {
        "a": ["sim", "--scenario", str(SCENARIO), "--out", str(tmp / "a")],
        "b": ["sim", "--scenario", str(SCENARIO), "--out", str(tmp / "b")],
        "reseeded": ["sim", "--scenario", str(reseeded), "--out", str(tmp / "reseeded")],
        "seed_flag": ["sim", "--scenario", str(SCENARIO), "--out", str(tmp / "seed_flag"), "--seed", str(seed + 1)],
    }
    res = _run_all(sim_bin, jobs, tmp)
    for name in ("a", "b", "reseeded"):
        rc, o, e = res[name]
        assert rc == 0, f"{name}: exit {rc}\n{e}"
    return {"dir": tmp, "res": res, "text": text, "seed": seed}


def test_same_seed_same_files(runs):
    a, b = runs["dir"] / "a", runs["dir"] / "b"
    assert sorted(p.name for p in a.iterdir()) == sorted(FILES)
    assert sorted(p.name for p in b.iterdir()) == sorted(FILES)
    for f in FILES:
        x, y = (a / f).read_bytes(), (b / f).read_bytes()
        assert x, f"{f} is empty"
        assert x == y, f"{f} differs between two runs of the same scenario and seed"
    assert runs["res"]["a"][1] == runs["res"]["b"][1], "the run summaries differ"
    # and the seed matters: another seed, other traffic (the ground truth's seed follows)
    r = runs["dir"] / "reseeded"
    assert (r / "traces.jsonl").read_bytes() != (a / "traces.jsonl").read_bytes()
    assert json.loads((r / "ground_truth.json").read_text())["seed"] == runs["seed"] + 1


def test_seed_flag_with_scenario_is_not_ignored(runs):
    rc, _, err = runs["res"]["seed_flag"]
    if rc == 2:
        return  # refused as a usage error: fine
    assert rc == 0, err
    same = (runs["dir"] / "seed_flag" / "traces.jsonl").read_bytes() == (runs["dir"] / "a" / "traces.jsonl").read_bytes()
    assert not same, "--seed N changed nothing"


def test_ground_truth_matches_the_scenario(runs):
    text = runs["text"]
    out = runs["dir"] / "a"
    gt = json.loads((out / "ground_truth.json").read_text())
    summary = json.loads(runs["res"]["a"][1])

    # identity and time range
    assert gt["format"] == 1
    assert gt["scenario"] == scalar(text, "name") == SCENARIO.stem
    assert gt["seed"] == runs["seed"]
    start = scalar(text, "start")
    assert gt["start"] == start
    start_ns = calendar.timegm(time.strptime(start, "%Y-%m-%dT%H:%M:%SZ")) * 10**9
    assert gt["start_time_unix_nano"] == start_ns
    assert gt["end_time_unix_nano"] - start_ns == secs(scalar(text, "duration")) * 1e9

    # the SLO as written in the file
    slo = flow_map(text, "slo")
    assert gt["slo"]["metric"] == slo["metric"]
    assert gt["slo"]["quantile"] == float(slo["quantile"])
    assert gt["slo"]["threshold_s"] == secs(slo["threshold"])
    assert gt["slo"]["window_s"] == secs(slo["window"])
    min_requests = gt["slo"]["min_requests"]
    assert isinstance(min_requests, int) and min_requests >= 1

    # the fault and its onset
    fault = re.search(r"^\s+- \{\s*kind:\s*(\w+),\s*onset:\s*(\w+)", text, re.M)
    assert fault, "no fault line in the scenario"
    kind, onset_s = fault.group(1), secs(fault.group(2))
    onset_ns = start_ns + int(onset_s * 1e9)
    assert gt["healthy"] is False
    assert gt["fault_onset_unix_nano"] == onset_ns
    (inst,) = gt["instances"]
    assert [f["kind"] for f in inst["faults"]] == [kind]
    assert inst["faults"][0]["onset_unix_nano"] == onset_ns and inst["faults"][0]["spec"]["onset"] == onset_s
    assert inst["fault_onset_unix_nano"] == onset_ns

    # the first breach is the first window over the threshold with enough requests
    thr, win = gt["slo"]["threshold_s"], gt["slo"]["window_s"]
    windows = inst["slo_windows"]
    assert windows and all(len(w) == 3 for w in windows)
    assert [w[0] for w in windows] == sorted(w[0] for w in windows)
    assert all(w[0] % win == 0 for w in windows), "windows not aligned to the SLO window"
    counted = [w for w in windows if w[1] >= min_requests]
    breaching = [w for w in counted if w[2] > thr]
    assert inst["windows_evaluated"] == len(counted)
    assert inst["windows_breached"] == len(breaching)
    assert breaching, "the fault scenario never breaches its SLO"
    first = breaching[0]
    assert inst["first_breach_unix_nano"] == start_ns + int(first[0] * 1e9) == gt["first_breach_unix_nano"]
    assert abs(inst["first_breach_value_s"] - first[2]) < 1e-6
    assert gt["first_breach_unix_nano"] >= onset_ns, "the SLO breaches before the fault starts"
    assert all(w[2] <= thr for w in counted if start_ns + w[0] * 1e9 < onset_ns)
    assert inst["requests"] == summary["requests"] and sum(w[1] for w in windows) <= inst["requests"]


def test_output_files_are_otlp_json_lines(runs):
    out = runs["dir"] / "a"
    gt = json.loads((out / "ground_truth.json").read_text())
    summary = json.loads(runs["res"]["a"][1])
    t0, t1 = gt["start_time_unix_nano"], gt["end_time_unix_nano"]
    spans = 0
    lines = (out / "traces.jsonl").read_text().splitlines()
    assert len(lines) == summary["trace_lines"]
    for line in lines:
        req = otlp.otlp_json_to_proto("traces", json.loads(line))
        for rs, ss, span in otlp.iter_spans(req):
            spans += 1
            a = otlp.attrs(span.attributes)
            assert span.name == "llm_request" and span.kind == 2 and ss.scope.name == "vllm.llm_engine"
            assert t0 <= span.start_time_unix_nano <= span.end_time_unix_nano
            assert a["gen_ai.latency.time_to_first_token"] <= a["gen_ai.latency.e2e"] + 1e-9
            assert a["gen_ai.usage.prompt_tokens"] > 0
    assert spans == summary["spans_written"] > 0
    mlines = (out / "metrics.jsonl").read_text().splitlines()
    assert len(mlines) == summary["metric_lines"]
    step = int(gt["metrics_interval_s"] * 1e9)
    last = t0
    for line in mlines:
        # one scrape per line, on the metrics_interval grid, in time order; the last one may
        # follow the end by the time the requests in flight take to drain
        stamps = {int(x) for x in re.findall(r'"timeUnixNano":"(\d+)"', line)}
        assert len(stamps) == 1, stamps
        (ts,) = stamps
        assert (ts - t0) % step == 0 and last < ts <= t1 + 20 * step, (ts, last)
        last = ts
    names = set()
    for line in mlines[:3] + mlines[-3:]:  # full OTLP/JSON decoding of a few (it is slow)
        req = otlp.otlp_json_to_proto("metrics", json.loads(line))
        for _, _, m in otlp.iter_metrics(req):
            names.add(m.name)
            assert otlp.data_points(m), m.name
    for n in ("vllm:num_requests_running", "vllm:time_to_first_token_seconds", "vllm:kv_cache_usage_perc"):
        assert n in names, f"{n} not in metrics.jsonl ({sorted(names)[:20]} ...)"


def test_readme_documents_the_ground_truth(runs):
    readme = REPO / "scenarios" / "README.md"
    assert readme.is_file(), "scenarios/README.md missing"
    doc = readme.read_text()
    gt = json.loads((runs["dir"] / "a" / "ground_truth.json").read_text())
    keys = set(gt) | set(gt["slo"]) | set(gt["instances"][0])
    missing = sorted(k for k in keys if k not in doc)
    assert not missing, f"ground-truth fields not documented in scenarios/README.md: {missing}"

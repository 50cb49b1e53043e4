"""`inferwatch eval`: scenarios simulated, run through the detector pipeline and scored; charts;
the NAB runner on a small corpus cut from the real one."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Two files of the Numenta Anomaly Benchmark (MIT, tests/fixtures/nab/LICENSE.txt) and their windows.
NAB = ROOT / "tests" / "fixtures" / "nab"


@pytest.mark.long(3)
def test_eval_scores_a_fast_fault_a_5ms_regression_and_an_aa_pair(run_cli, tmp_path):
    lib = tmp_path / "lib"
    lib.mkdir()
    for name in ("queue_blocking_strong", "healthy_ab_control", "ab_regression_5ms"):
        shutil.copy(ROOT / "scenarios" / f"{name}.yaml", lib / f"{name}.yaml")
    out = tmp_path / "report.json"
    charts = tmp_path / "charts"
    r = run_cli("eval", "--scenarios", str(lib), "--json", str(out), "--charts", str(charts),
                "--cache", str(tmp_path / "cache"), timeout=240)
    assert r.returncode == 0, r.stderr
    assert "| queue_blocking_strong | fast |" in r.stdout
    rep = json.loads(out.read_text())
    by = {s["outcome"]["scenario"]: s for s in rep["scenarios"]}
    q = by["queue_blocking_strong"]["outcome"]
    # Queue blocking (2.4 s stalls every 4 s) from 2 h: seen within 5 minutes, nothing critical before.
    assert q["detected"] is True
    assert 0 <= q["delay_s"] <= 300, q
    assert q["false_criticals"] == 0, by["queue_blocking_strong"]["alerts"]
    assert q["pass"] is True
    first = q["first_alert"]
    assert first["detector"] in ("kv_pressure", "cusum") and first["metric"].startswith("llm.")
    aa = by["healthy_ab_control"]["outcome"]
    assert aa["kind"] == "ab" and aa["detected"] is None and aa["pass"] is True
    # The library's 5 ms TTFT-p95 regression (ground truth +5.43 ms), mirrored and fully traced:
    # delta_ab, pooling the last 3 h of paired requests, warns; no other detector is judged.
    ab = by["ab_regression_5ms"]
    assert ab["outcome"]["detected"] is True and ab["outcome"]["pass"] is True, ab["outcome"]
    assert ab["outcome"]["first_alert"]["detector"] == "delta_ab"
    assert all(a["detector"] != "delta_ab" for a in by["healthy_ab_control"]["alerts"])
    assert rep["totals"]["scenarios"] == 3
    for name, signal in (("queue_blocking_strong", "llm.queue.p99"), ("healthy_ab_control", "llm.ttft.p95")):
        svg = (charts / f"{name}.svg").read_text()
        assert svg.startswith("<svg") and "SLO threshold" in svg and signal in svg, name
    # The second run takes the simulated output from the cache.
    r2 = run_cli("eval", "--scenarios", str(lib), "--only", "queue_blocking_strong", "--cache", str(tmp_path / "cache"),
                 timeout=120)
    assert r2.returncode == 0, r2.stderr
    assert "0.0 s simulating" in r2.stdout


def test_eval_without_scenarios_is_a_usage_error(run_cli, tmp_path):
    (tmp_path / "empty").mkdir()
    r = run_cli("eval", "--scenarios", str(tmp_path / "empty"))
    assert r.returncode == 2
    assert "no scenario files" in r.stderr


def test_eval_nab_on_two_files(run_cli, tmp_path):
    # A corpus of two real NAB files with their labels: the runner, the scorer and the table.
    corpus = NAB
    out = tmp_path / "nab.json"
    r = run_cli("eval", "--nab", str(corpus), "--detector", "zscore_skew", "--json", str(out), timeout=120)
    assert r.returncode == 0, r.stderr
    assert "Windowed Gaussian" in r.stdout, r.stdout
    rep = json.loads(out.read_text())
    assert rep["detector"] == "zscore_skew"
    assert rep["files"] == 2 and rep["rows"] == 8064 and rep["windows"] == 1
    # One level per row after zscore_skew's 50-point warm-up, in each file.
    assert rep["level_points"] == 8064 - 2 * 50
    text = json.dumps(rep)
    assert "standard" in text and "reward_low_FP" in text and "reward_low_FN" in text


def test_eval_generates_a_held_out_family_and_scores_it_as_series(run_cli, tmp_path):
    # `--generate` writes NAB's layout plus truth.json; `--series` scores cusum on three of its
    # files (kept small: a healthy one, a step, a burst) and prints the trade-off curve.
    fam = tmp_path / "fam"
    r = run_cli("eval", "--generate", str(fam), "--family", "a", "--seed", "17", timeout=120)
    assert r.returncode == 0, r.stderr
    assert "28 files" in r.stdout, r.stdout
    windows = json.loads((fam / "labels" / "combined_windows.json").read_text())
    truth = json.loads((fam / "labels" / "truth.json").read_text())
    assert len(windows) == 28 and set(windows) == set(truth)
    kinds = sorted(t["kind"] for t in truth.values())
    assert kinds.count("healthy") == 8 and kinds.count("fast") == 12 and kinds.count("drift") == 8
    # The same seed writes the same bytes.
    again = tmp_path / "again"
    assert run_cli("eval", "--generate", str(again), "--family", "a", "--seed", "17").returncode == 0
    name = "a/fast_step_short_00.csv"
    assert (fam / "data" / name).read_bytes() == (again / "data" / name).read_bytes()
    keep = ["a/healthy_00.csv", name, "a/fast_burst_03.csv"]
    (fam / "labels" / "combined_windows.json").write_text(json.dumps({k: windows[k] for k in keep}))
    out = tmp_path / "series.json"
    r = run_cli("eval", "--series", str(fam), "--detector", "cusum", "--json", str(out), timeout=240)
    assert r.returncode == 0, r.stderr
    assert "| warning at | FA / 30 d |" in r.stdout, r.stdout
    rep = json.loads(out.read_text())
    assert rep["files"] == 3 and rep["for_s"] == 0
    at = {c["threshold"]: c for c in rep["curve"]}
    assert len(at) == 9
    # At the alerts' warning (0.6): both faults within 5 minutes, no critical before them.
    assert at[0.6]["fast"] == 2 and at[0.6]["fast_caught"] == 2, at[0.6]
    assert at[0.6]["critical_per_30d"] == 0, at[0.6]
    # The curve is monotone: a lower threshold never has fewer false alarms.
    fas = [at[t]["false_alarms_per_30d"] for t in sorted(at)]
    assert all(a >= b for a, b in zip(fas, fas[1:])), fas
    # A bad family is a usage error.
    assert run_cli("eval", "--generate", str(tmp_path / "x"), "--family", "c").returncode == 2

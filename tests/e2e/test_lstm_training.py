"""The `lstm_ae` training stack (scripts/lstm_ae/, numpy + onnx): feature windows against the shared
fixture, numpy forward pass against ONNX Runtime, BPTT against finite differences, a tiny training
run, pruning, and `inferwatch train-lstm-ae` without numpy. docs/lstm-ae.md."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "tests" / "fixtures" / "lstm_ae"
sys.path.insert(0, str(ROOT / "scripts" / "lstm_ae"))

import features  # noqa: E402
import lstm  # noqa: E402
import make_fixtures  # noqa: E402
import onnx_export  # noqa: E402
import train  # noqa: E402

BASE = make_fixtures.BASE_BUCKET


def session(path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


# ---- feature windows -------------------------------------------------------------------------


def test_features_give_the_committed_windows():
    card = json.loads((FIX / "card.json").read_text())
    want = json.loads((FIX / "windows.json").read_text())["windows"]
    got = features.card_windows([FIX / "features.parquet"], card)
    assert len(got) == len(want) > 100
    for i, w in enumerate(want):
        assert list(got.groups[i]) == w["group"] and got.end_buckets[i] == w["end_bucket"], i
        np.testing.assert_allclose(got.x[i], np.array(w["x"], np.float32), atol=1e-6, rtol=0)
        np.testing.assert_array_equal(got.mask[i], np.array(w["mask"], np.float32))


def test_fixture_windows_follow_the_contract():
    card = json.loads((FIX / "card.json").read_text())
    series = {s.group: s for s in features.build_series([FIX / "features.parquet"], card["signals"], "scrape",
                                                        60, card["max_fill_steps"])}
    # Model-less GPU points join the instance's model group; an instance without one gets model "".
    assert set(series) == {("inst-a", "v1", "m1"), ("inst-b", "v2", "m2"), ("inst-c", "v9", "")}
    a = series[("inst-a", "v1", "m1")]
    j = {n: card["signals"].index(n) for n in card["signals"]}
    gpu = j["hw.gpu.utilization"]
    assert not np.isnan(a.raw[10 - (a.first - BASE), gpu])
    # Duplicates: the later time wins; at equal times the later row.
    assert a.raw[20 - (a.first - BASE), j["llm.tpot.p95"]] == 0.09
    assert a.raw[20 - (a.first - BASE), j["llm.kv_cache.usage"]] == 0.66
    # source=spans rows (value 99) are skipped; the clipped scrape value 50 at bucket 55 is there.
    ttft = a.raw[:, j["llm.ttft.p95"]]
    assert 99.0 not in ttft and ttft[55 - (a.first - BASE)] == 50.0
    # Carry-forward for at most max_fill_steps (3) buckets, then missing.
    q = a.raw[:, j["llm.queue.p99"]]
    off = a.first - BASE
    assert all(not math.isnan(q[b - off]) for b in (60, 61, 62))
    assert all(math.isnan(q[b - off]) for b in range(63, 80)) and not math.isnan(q[80 - off])
    # Buckets 40, 41 hold no rows: gaps, so no window spans them.
    got = features.card_windows([FIX / "features.parquet"], card)
    ends_a = [e - BASE for g, e in zip(got.groups, got.end_buckets) if g[0] == "inst-a"]
    assert 39 in ends_a and not any(40 <= e < 49 for e in ends_a) and 49 in ends_a
    # Group B never has KV usage: that column is masked out (and 0) in every window.
    kv = j["llm.kv_cache.usage"]
    for g, x, m in zip(got.groups, got.x, got.mask):
        if g[0] == "inst-b":
            assert not m[:, kv].any() and not x[:, kv].any()
        assert np.abs(x).max() <= card["clip"]


def test_fixtures_regenerate_identically(tmp_path):
    subprocess.run([sys.executable, str(ROOT / "scripts" / "lstm_ae" / "make_fixtures.py"), "--out", str(tmp_path)],
                   check=True, capture_output=True, timeout=60)
    for name in ("windows.json", "card.json", "forward.json", "tiny.json"):
        assert json.loads((tmp_path / name).read_text()) == json.loads((FIX / name).read_text()), name


# ---- model -----------------------------------------------------------------------------------


def test_numpy_forward_equals_onnx_runtime_on_the_tiny_model():
    doc = json.loads((FIX / "forward.json").read_text())
    x = np.array(doc["input"], np.float32)
    want = np.array(doc["output"])
    model = onnx.load(str(FIX / "tiny.onnx"))
    assert model.ir_version == 8 and model.opset_import[0].version == 17
    p = onnx_export.params_from_model(model)
    assert lstm.hidden_of(p) == 4 and p["enc_W"].shape == (16, 3)
    np.testing.assert_allclose(lstm.forward(p, x.astype(np.float64)), want, atol=1e-6, rtol=0)
    y = session(FIX / "tiny.onnx").run(["output"], {"input": x})[0]
    assert y.shape == (5, 8, 3)
    np.testing.assert_allclose(y, want, atol=1e-5, rtol=0)
    # The score of the forward fixture is the masked MSE of the output.
    mask = np.array(doc["mask"], np.float32)
    np.testing.assert_allclose(features.score(x, y, mask), doc["score"], rtol=1e-5)


def test_gate_order_mapping_matters():
    """A model exported with the gates in our own order (no mapping) differs from ORT: the mapping is tested."""
    p = lstm.init_params(3, 4, seed=3)
    x = np.random.default_rng(0).standard_normal((2, 8, 3)).astype(np.float32)
    good = session_from(onnx_export.build_model(p, 8)).run(None, {"input": x})[0]
    np.testing.assert_allclose(good, lstm.forward(p, x.astype(np.float64)), atol=1e-5)
    saved = onnx_export.GATES_TO_ONNX
    try:
        onnx_export.GATES_TO_ONNX = (0, 1, 2, 3)
        bad = session_from(onnx_export.build_model(p, 8)).run(None, {"input": x})[0]
    finally:
        onnx_export.GATES_TO_ONNX = saved
    assert np.abs(bad - good).max() > 1e-3


def session_from(model) -> ort.InferenceSession:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def test_bptt_gradient_matches_finite_differences():
    p = lstm.init_params(3, 5, seed=11)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 6, 3))
    m = (rng.random(x.shape) > 0.25).astype(np.float64)
    _, g = lstm.loss_and_grads(p, x, m)
    eps = 1e-6
    for name in lstm.PARAMS:
        for idx in [tuple(int(rng.integers(0, n)) for n in p[name].shape) for _ in range(6)]:
            old = p[name][idx]
            p[name][idx] = old + eps
            lp, _ = lstm.loss_and_grads(p, x, m)
            p[name][idx] = old - eps
            lm, _ = lstm.loss_and_grads(p, x, m)
            p[name][idx] = old
            num = (lp - lm) / (2 * eps)
            assert abs(num - g[name][idx]) <= 1e-7 + 1e-5 * abs(num), (name, idx, num, g[name][idx])


def test_adam_lowers_the_loss_on_structured_windows():
    t = np.arange(12)
    phase = np.random.default_rng(6).uniform(0, 2 * np.pi, size=(48, 1, 1))
    x = np.sin(0.6 * t[None, :, None] + phase + np.arange(3)[None, None, :])
    m = np.ones_like(x)
    p = lstm.init_params(3, 8, seed=5)
    before, _ = lstm.loss_and_grads(p, x, m)
    opt = lstm.Adam(p, lr=1e-2)
    for _ in range(60):
        _, g = lstm.loss_and_grads(p, x, m)
        opt.step(p, g)
    after, _ = lstm.loss_and_grads(p, x, m)
    assert after < 0.5 * before


# ---- training CLI, pruning -------------------------------------------------------------------


def run_train(tmp_path, *extra) -> dict:
    out = tmp_path / "m.onnx"
    rc = train.main(["--input", str(FIX / "features.parquet"), "--out", str(out), "--window", "8",
                     "--max-fill-steps", "3", "--stride", "1", "--hidden", "10", "--epochs", "4", "--seed", "3",
                     "--pca-out", str(tmp_path / "pca.json"), *extra])
    assert rc == 0
    return json.loads(out.with_suffix(".json").read_text())


def check_runs(path: Path, T: int, k: int):
    s = session(path)
    for batch in (1, 7):
        y = s.run(["output"], {"input": np.zeros((batch, T, k), np.float32)})[0]
        assert y.shape == (batch, T, k) and np.isfinite(y).all()


def test_tiny_training_run_writes_card_and_model(tmp_path):
    card = run_train(tmp_path)
    assert card["detector"] == "lstm_ae" and card["name"] == "m" and card["T"] == 8 and card["format"] == 1
    assert card["signals"] == features.DEFAULT_SIGNALS and len(card["mean"]) == len(card["std"]) == 8
    assert card["pruned"] is None and card["hidden"] == 10 and card["layers"] == 1
    c = card["calibration"]
    qs = [e for _, e in c["quantiles"]]
    assert [q for q, _ in c["quantiles"]] == [0.5, 0.9, 0.99, 0.999, 1.0] and qs == sorted(qs) and qs[0] > 0
    assert c["warning_error"] == pytest.approx(1.5 * qs[3], rel=1e-6)
    assert c["critical_error"] == pytest.approx(3.0 * qs[3], rel=1e-6)
    assert card["training"]["windows"] > 50 and card["metrics"]["holdout_windows"] > 5
    assert card["metrics"]["onnx_max_abs_diff"] < 1e-5
    check_runs(tmp_path / "m.onnx", 8, 8)
    # The card's calibration maps onto the contract's level curve.
    assert features.level(qs[2], c) == pytest.approx(0.5)
    assert features.level(c["warning_error"], c) == pytest.approx(0.6)
    assert features.level(c["critical_error"], c) == pytest.approx(0.8)
    assert features.level(10 * c["critical_error"], c) == 1.0
    pca = json.loads((tmp_path / "pca.json").read_text())
    assert pca["detector"] == "pca" and len(pca["mean_vec"]) == 64
    assert 1 <= len(pca["components"]) <= 32 and all(len(r) == 64 for r in pca["components"])


def test_training_loss_goes_down(tmp_path, capsys):
    run_train(tmp_path)
    losses = [float(line.split("loss ")[1].split()[0]) for line in capsys.readouterr().out.splitlines()
              if line.startswith("train epoch")]
    assert len(losses) == 4 and losses[-1] < losses[0]


def test_pruning_keeps_the_top_units_by_l1():
    p = lstm.init_params(3, 10, seed=2)
    H = 10
    rows = np.concatenate([np.arange(4) * H + 7])
    p["enc_W"][rows] *= 50.0  # unit 7 of the encoder: by far the largest
    p["enc_W"][np.arange(4) * H + 2] = 0.0
    p["enc_R"][np.arange(4) * H + 2] = 0.0
    p["enc_R"][:, 2] = 0.0
    p["dec_W"][:, 2] = 0.0  # unit 2: all zero, pruned
    enc_l1, _ = lstm.unit_l1(p)
    q, kept = lstm.prune(p, 0.6)
    assert kept == math.ceil(0.6 * H) == 6
    assert q["enc_R"].shape == (24, 6) and q["dec_W"].shape == (24, 6) and q["out_W"].shape == (3, 6)
    keep = np.sort(np.argsort(-enc_l1)[:6])
    assert 7 in keep and 2 not in keep
    np.testing.assert_array_equal(q["enc_W"][:6], p["enc_W"][keep])
    x = np.random.default_rng(4).standard_normal((7, 8, 3)).astype(np.float32)
    y = session_from(onnx_export.build_model(q, 8)).run(None, {"input": x})[0]
    np.testing.assert_allclose(y, lstm.forward(q, x.astype(np.float64)), atol=1e-5)


def test_training_with_pruning(tmp_path):
    card = run_train(tmp_path, "--prune", "0.6", "--finetune-epochs", "2")
    assert card["pruned"] == {"kept_units": 6, "of": 10}
    model = onnx.load(str(tmp_path / "m.onnx"))
    lstms = [n for n in model.graph.node if n.op_type == "LSTM"]
    assert [a.i for n in lstms for a in n.attribute if a.name == "hidden_size"] == [6, 6]
    assert card["metrics"]["model_bytes"] < card["metrics"]["model_bytes_unpruned"]
    check_runs(tmp_path / "m.onnx", 8, 8)


# ---- committed default model -------------------------------------------------------------------


def test_committed_default_models_are_consistent():
    card = json.loads((ROOT / "models" / "lstm_ae_default.json").read_text())
    assert card["name"] == "lstm_ae_default" and card["T"] == 60 and card["signals"] == features.DEFAULT_SIGNALS
    assert (ROOT / "models" / "lstm_ae_default.onnx").stat().st_size < 1_000_000
    check_runs(ROOT / "models" / "lstm_ae_default.onnx", 60, 8)
    pca = json.loads((ROOT / "models" / "pca_default.json").read_text())
    assert pca["T"] == 60 and len(pca["mean_vec"]) == 480 and pca["mean"] == card["mean"]


# ---- the Rust wrapper ------------------------------------------------------------------------


def test_train_lstm_ae_without_numpy_names_the_fix(inferwatch_bin, tmp_path):
    help_ = subprocess.run([inferwatch_bin, "train-lstm-ae", "--help"], capture_output=True, text=True, timeout=30)
    if help_.returncode != 0:
        pytest.skip("this build has no train-lstm-ae subcommand")
    venv = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    proc = subprocess.run(
        [inferwatch_bin, "train-lstm-ae", "--input", str(FIX / "features.parquet"), "--out", str(tmp_path / "x.onnx"),
         "--python", str(venv / "bin" / "python")],
        capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode != 0
    err = proc.stderr + proc.stdout
    assert "numpy" in err and "pip install -r tests/e2e/requirements.txt" in err, err
    assert not (tmp_path / "x.onnx").exists()


# ---- the NAB models (scripts/lstm_ae/nab.py) ---------------------------------------------------------


def test_nab_training_uses_probationary_z_windows_at_each_files_step(tmp_path):
    import time

    import nab

    # Two files of 200 rows (probation floor(0.15*200) = 30 rows, 19 windows of 12 each): 5-minute rows far
    # from 0 and hourly rows; the last 20 % of each file's probationary windows (4) are held out.
    t0 = 1_400_000_000
    (tmp_path / "data" / "a").mkdir(parents=True)
    (tmp_path / "labels").mkdir()
    for name, step, f in (("x", 300, lambda i: 1000.0 + 5.0 * math.sin(i / 3.0)), ("y", 3600, lambda i: i % 7)):
        rows = ["timestamp,value"] + [
            f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(t0 + i * step))},{f(i)}" for i in range(200)]
        (tmp_path / "data" / "a" / f"{name}.csv").write_text("\n".join(rows) + "\n")
    (tmp_path / "labels" / "combined_windows.json").write_text(json.dumps({"a/x.csv": [], "a/y.csv": []}))
    out = tmp_path / "m.onnx"
    assert nab.main(["--nab", str(tmp_path), "--out", str(out), "--pca-out", str(tmp_path / "p.json"),
                     "--epochs", "1", "--hidden", "4"]) == 0
    card = json.loads(out.with_suffix(".json").read_text())
    assert card["signals"] == ["nab.value"] and card["mean"] == [0.0] and card["std"] == [1.0] and card["T"] == 12
    assert card["nab"]["file_steps_s"] == [300, 3600]
    assert card["training"]["windows"] == 30 and card["metrics"]["holdout_windows"] == 8
    check_runs(out, 12, 1)
    pca_card = json.loads((tmp_path / "p.json").read_text())
    assert pca_card["detector"] == "pca" and len(pca_card["mean_vec"]) == 12
    # The windows are z-values of the probationary rows, not the raw ~1000s.
    ts, vs = nab.read_csv(tmp_path / "data" / "a" / "x.csv")
    w = nab.file_windows("a/x.csv", ts, vs, 12, 10.0)
    assert len(w) == 19 and np.abs(w.x).max() < 3.0

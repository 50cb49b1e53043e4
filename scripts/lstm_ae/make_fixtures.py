#!/usr/bin/env python3
"""Write tests/fixtures/lstm_ae/: the shared-contract fixtures between this training stack and the
Rust processor (ml/).

* features.parquet (inferwatch metrics schema, written with pyarrow) + card.json -> windows.json:
  the feature windows features.py builds from the Parquet; the Rust feature code must give the same.
* tiny.onnx + tiny.json (T=8, k=3, hidden 4) -> forward.json: fixed input windows, their masks and
  the numpy forward pass output, score and level; ORT's output must equal it within 1e-5.

    python scripts/lstm_ae/make_fixtures.py [--out tests/fixtures/lstm_ae]

Deterministic: the same files every run.
"""

from __future__ import annotations

import argparse
import json
import sys
import zlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))

import features  # noqa: E402
import lstm  # noqa: E402
import onnx_export  # noqa: E402
import train  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
STEP_NS = 60 * 1_000_000_000
BASE_BUCKET = 29_462_880  # 2026-01-06T00:00Z in minutes


# ---- the inferwatch metrics schema (core/src/arrow/schema.rs), in pyarrow -------------------------------


def _any_value() -> pa.DataType:
    return pa.struct([
        pa.field("type", pa.uint8(), False),
        pa.field("str", pa.string()),
        pa.field("bool", pa.bool_()),
        pa.field("int", pa.int64()),
        pa.field("double", pa.float64()),
        pa.field("bytes", pa.binary()),
    ])


def _attrs() -> pa.DataType:
    return pa.map_(pa.field("key", pa.string(), False), pa.field("value", _any_value(), True))


def _ts() -> pa.DataType:
    return pa.timestamp("ns", tz="UTC")


def _list(item: pa.DataType) -> pa.DataType:
    return pa.list_(pa.field("item", item, True))


def metrics_schema() -> pa.Schema:
    """The metrics schema of core/src/arrow/schema.rs (field names, types, nullability, metadata)."""
    a = _attrs()
    fields = [
        ("resource_index", pa.uint32(), False), ("service.name", pa.string(), True),
        ("service.version", pa.string(), True), ("service.instance.id", pa.string(), True),
        ("resource_attributes", a, False), ("resource_dropped_attributes_count", pa.uint32(), False),
        ("resource_schema_url", pa.string(), False), ("scope_index", pa.uint32(), False),
        ("scope_name", pa.string(), False), ("scope_version", pa.string(), False),
        ("scope_attributes", a, False), ("scope_dropped_attributes_count", pa.uint32(), False),
        ("scope_schema_url", pa.string(), False), ("metric_index", pa.uint32(), False),
        ("series_id", pa.uint64(), False), ("metric_name", pa.string(), False),
        ("metric_description", pa.string(), False), ("metric_unit", pa.string(), False),
        ("metric_metadata", a, False), ("kind", pa.uint8(), False), ("temporality", pa.int32(), True),
        ("is_monotonic", pa.bool_(), True), ("time_unix_nano", _ts(), False),
        ("start_time_unix_nano", _ts(), False), ("attributes", a, False), ("flags", pa.uint32(), False),
        ("value", pa.float64(), True), ("int_value", pa.int64(), True), ("count", pa.uint64(), True),
        ("sum", pa.float64(), True), ("min", pa.float64(), True), ("max", pa.float64(), True),
        ("bucket_counts", _list(pa.uint64()), True), ("explicit_bounds", _list(pa.float64()), True),
        ("exp_scale", pa.int32(), True), ("exp_zero_count", pa.uint64(), True),
        ("exp_zero_threshold", pa.float64(), True), ("exp_positive_offset", pa.int32(), True),
        ("exp_positive_bucket_counts", _list(pa.uint64()), True), ("exp_negative_offset", pa.int32(), True),
        ("exp_negative_bucket_counts", _list(pa.uint64()), True),
        ("quantiles", _list(pa.struct([pa.field("quantile", pa.float64(), False),
                                       pa.field("value", pa.float64(), False)])), True),
        ("exemplars", _list(pa.struct([
            pa.field("time_unix_nano", _ts(), False), pa.field("value", pa.float64()),
            pa.field("int_value", pa.int64()), pa.field("span_id", pa.binary(), False),
            pa.field("trace_id", pa.binary(), False), pa.field("filtered_attributes", a, False)])), False),
    ]
    return pa.schema([pa.field(n, t, nullable) for n, t, nullable in fields],
                     metadata={"inferwatch.schema": "metrics", "inferwatch.schema.version": "1"})


def s(v: str) -> dict:
    """A string attribute value."""
    return {"type": 1, "str": v, "bool": None, "int": None, "double": None, "bytes": None}


def i64(v: int) -> dict:
    """An int attribute value."""
    return {"type": 3, "str": None, "bool": None, "int": v, "double": None, "bytes": None}


def point(name: str, t_ns: int, value: float | None, *, attrs=(), res_attrs=(), service="inferwatch",
          version=None, instance=None, kind=1, resource_index=0) -> dict:
    """One row of the metrics schema."""
    return {
        "resource_index": resource_index, "service.name": service, "service.version": version,
        "service.instance.id": instance, "resource_attributes": list(res_attrs),
        "resource_dropped_attributes_count": 0, "resource_schema_url": "", "scope_index": 0,
        "scope_name": "fixture", "scope_version": "", "scope_attributes": [], "scope_dropped_attributes_count": 0,
        "scope_schema_url": "", "metric_index": 0, "series_id": zlib.crc32(name.encode()),
        "metric_name": name, "metric_description": "", "metric_unit": "", "metric_metadata": [], "kind": kind,
        "temporality": 2 if kind == 2 else None, "is_monotonic": False if kind == 2 else None,
        "time_unix_nano": t_ns, "start_time_unix_nano": t_ns - STEP_NS, "attributes": list(attrs), "flags": 0,
        "value": value, "int_value": None, "count": None, "sum": None, "min": None, "max": None,
        "bucket_counts": None, "explicit_bounds": None, "exp_scale": None, "exp_zero_count": None,
        "exp_zero_threshold": None, "exp_positive_offset": None, "exp_positive_bucket_counts": None,
        "exp_negative_offset": None, "exp_negative_bucket_counts": None, "quantiles": None, "exemplars": [],
    }


LLM = features.DEFAULT_SIGNALS
LLM_ONLY = [n for n in LLM if not n.startswith("hw.gpu.")]
BASE = {"llm.ttft.p95": 0.3, "llm.tpot.p95": 0.04, "llm.e2e.p99": 6.0, "llm.queue.p99": 0.05,
        "llm.kv_cache.usage": 0.4, "hw.gpu.memory.usage": 2.0e10, "hw.gpu.utilization": 0.8, "llm.request.rate": 1.2}


def fixture_rows(rng: np.random.Generator) -> list[dict]:
    """The rows of features.parquet: 2 model groups + a model-less instance, with every edge case."""
    rows = []

    def val(name):
        return float(BASE[name] * (1.0 + 0.2 * rng.standard_normal()))

    def t_in(b):  # a time inside bucket b, not on its boundary
        return (BASE_BUCKET + b) * STEP_NS + int(rng.integers(1, STEP_NS - 1))

    # Group A: llm_signals-style points (group keys and source in point attributes).
    for b in range(0, 110):
        if b in (40, 41):  # no rows at all: a gap even though carry-forward could fill it
            continue
        for name in LLM_ONLY:
            if name == "llm.queue.p99" and 60 <= b < 80:  # missing beyond max_fill_steps
                continue
            if name == "llm.e2e.p99" and b % 7 == 3:  # short holes, filled forward
                continue
            if b == 20 and name in ("llm.tpot.p95", "llm.kv_cache.usage"):  # the duplicates below
                continue
            attrs = [("gen_ai.request.model", s("m1")), ("service.version", s("v1")),
                     ("service.instance.id", s("inst-a")), ("source", s("scrape"))]
            v = val(name)
            if name == "llm.ttft.p95" and b == 55:
                v = 50.0  # clipped at +clip
            rows.append(point(name, t_in(b), v, attrs=attrs, kind=2 if name == "llm.request.rate" else 1))
            if name == "llm.ttft.p95" and b % 10 == 5:
                # span-derived twin: must be skipped (source = spans)
                rows.append(point(name, t_in(b), 99.0, attrs=attrs[:3] + [("source", s("spans"))]))
        # GPU metrics of inst-a without a model (shared with group A), in the vLLM resource.
        if b < 100:
            for name in ("hw.gpu.memory.usage", "hw.gpu.utilization"):
                rows.append(point(name, t_in(b), val(name), attrs=[("hw.id", s("gpu-0"))], service="vllm",
                                  version="v1", instance="inst-a", resource_index=1))
    # Duplicates in one bucket of group A: the later time wins; at equal times the later row.
    t = (BASE_BUCKET + 20) * STEP_NS
    a_attrs = [("gen_ai.request.model", s("m1")), ("service.version", s("v1")), ("service.instance.id", s("inst-a"))]
    rows.append(point("llm.tpot.p95", t + 5 * 10**9, 0.02, attrs=a_attrs))
    rows.append(point("llm.tpot.p95", t + 50 * 10**9, 0.09, attrs=a_attrs))
    rows.append(point("llm.tpot.p95", t + 10 * 10**9, 0.01, attrs=a_attrs))  # earlier time: loses
    # Non-finite values, a null value (histogram) and an unlisted metric: all skipped.
    rows.append(point("llm.e2e.p99", (BASE_BUCKET + 30) * STEP_NS + 59 * 10**9, float("nan"), attrs=a_attrs))
    rows.append(point("llm.e2e.p99", (BASE_BUCKET + 31) * STEP_NS + 59 * 10**9, float("inf"), attrs=a_attrs))
    rows.append(point("llm.ttft.p95", (BASE_BUCKET + 32) * STEP_NS + 59 * 10**9, None, attrs=a_attrs, kind=3))
    rows.append(point("llm.ttft.p50", (BASE_BUCKET + 33) * STEP_NS, 7.0, attrs=a_attrs))
    # Group B: keys in the resource (promoted columns and the model in resource_attributes), no source
    # attribute (accepted), never any llm.kv_cache.usage.
    for b in range(5, 60):
        for name in LLM:
            if name == "llm.kv_cache.usage":
                continue
            attrs = [("hw.id", s("gpu-1"))] if name.startswith("hw.gpu.") else []
            res = [] if name.startswith("hw.gpu.") else [("gen_ai.request.model", s("m2"))]
            rows.append(point(name, t_in(b), val(name), attrs=attrs, res_attrs=res, service="vllm",
                              version="v2", instance="inst-b", resource_index=2))
    # A point attribute of the wrong type does not count: the resource's model applies.
    rows.append(point("llm.request.rate", t_in(30), 3.5, attrs=[("gen_ai.request.model", i64(5))],
                      res_attrs=[("gen_ai.request.model", s("m2"))], service="vllm", version="v2",
                      instance="inst-b", resource_index=2))
    # GPU metrics of an instance without any model group: their own group with model "".
    for b in range(0, 14):
        rows.append(point("hw.gpu.utilization", t_in(b), val("hw.gpu.utilization"), service="vllm",
                          version="v9", instance="inst-c", resource_index=3))
    # Input order is not time order.
    order = rng.permutation(len(rows))
    rows = [rows[i] for i in order]
    # Two points at the same time in one bucket: the later row wins (kept in this order, after the shuffle).
    rows.insert(len(rows) // 3, point("llm.kv_cache.usage", t + 59 * 10**9, 0.11, attrs=a_attrs))
    rows.insert(2 * len(rows) // 3, point("llm.kv_cache.usage", t + 59 * 10**9, 0.66, attrs=a_attrs))
    return rows


def fixture_card() -> dict:
    """card.json: the standardisation and window settings the windows.json fixture uses."""
    return {
        "format": 1, "name": "fixture_features", "detector": "lstm_ae", "signals": LLM, "source": "scrape",
        "T": 8, "step_s": 60, "max_fill_steps": 3,
        "mean": [BASE[n] for n in LLM], "std": [BASE[n] * 0.2 for n in LLM], "clip": 3.0, "error": "mse",
        "calibration": {"quantiles": [[0.5, 0.5], [0.9, 0.8], [0.99, 1.2], [0.999, 1.5], [1.0, 2.0]],
                        "warning_error": 2.25, "critical_error": 4.5},
        "hidden": 4, "layers": 1, "pruned": None,
        "training": {"inputs": [], "windows": 0, "epochs": 0, "seed": 0,
                     "command": "python scripts/lstm_ae/make_fixtures.py"},
        "metrics": {"train_mse": 0.0, "holdout_mse": 0.0, "holdout_p99_error": 0.0},
    }


def f9(v) -> float:
    """A float32 value as the shortest decimal that reads back to it."""
    return float(np.format_float_positional(np.float32(v), unique=True, trim="-")) if v != 0 else 0.0


def windows_json(w: features.Windows) -> dict:
    """The windows fixture document."""
    return {"windows": [
        {"group": list(g), "end_bucket": int(e), "x": [[f9(v) for v in row] for row in x],
         "mask": [[int(v) for v in row] for row in m]}
        for g, e, x, m in zip(w.groups, w.end_buckets, w.x, w.mask)]}


def tiny(out: Path) -> None:
    """tiny.onnx + tiny.json + forward.json."""
    T, k, H = 8, 3, 4
    rng = np.random.default_rng(8)
    p = lstm.init_params(k, H, seed=8)
    x = rng.standard_normal((64, T, k))
    m = np.ones_like(x)
    opt = lstm.Adam(p, lr=1e-2)
    for _ in range(20):  # a few steps, so the weights are not the initial ones
        _, g = lstm.loss_and_grads(p, x, m)
        opt.step(p, g)
    p = {n: v.astype(np.float32).astype(np.float64) for n, v in p.items()}  # the weights as stored
    onnx_export.export(p, T, out / "tiny.onnx", "tiny")
    xin = rng.standard_normal((5, T, k)).astype(np.float32)
    xin[1] *= 3.0
    mask = np.ones_like(xin)
    mask[2, :3, 1] = 0.0
    xin[2, :3, 1] = 0.0
    y = lstm.forward(p, xin.astype(np.float64))
    calib_x = rng.standard_normal((200, T, k)).astype(np.float32)
    calib = train.calibrate(features.score(calib_x, lstm.forward(p, calib_x.astype(np.float64)), np.ones_like(calib_x)))
    calib = {kk: ([[q, float(f"{e:.7g}")] for q, e in v] if kk == "quantiles" else
                  (float(f"{v:.7g}") if isinstance(v, float) else v)) for kk, v in calib.items()}
    card = {
        "format": 1, "name": "tiny", "detector": "lstm_ae",
        "signals": ["llm.ttft.p95", "llm.tpot.p95", "llm.request.rate"], "source": "scrape",
        "T": T, "step_s": 60, "max_fill_steps": 5, "mean": [0.3, 0.04, 1.2], "std": [0.06, 0.008, 0.24],
        "clip": 10.0, "error": "mse", "calibration": calib, "hidden": H, "layers": 1, "pruned": None,
        "training": {"inputs": ["random normal windows"], "windows": 64, "epochs": 20, "seed": 8,
                     "command": "python scripts/lstm_ae/make_fixtures.py"},
        "metrics": {"train_mse": 0.0, "holdout_mse": 0.0, "holdout_p99_error": 0.0},
    }
    (out / "tiny.json").write_text(json.dumps(card, indent=2) + "\n")
    sc = features.score(xin, y, mask)
    doc = {
        "model": "tiny.onnx", "card": "tiny.json", "tolerance": 1e-5,
        "input": [[[f9(v) for v in row] for row in w] for w in xin],
        "mask": [[[int(v) for v in row] for row in w] for w in mask],
        "output": [[[float(f"{v:.9g}") for v in row] for row in w] for w in y],
        "score": [float(f"{v:.9g}") for v in sc],
        "level": [float(f"{features.level(float(v), calib):.9g}") for v in sc],
    }
    (out / "forward.json").write_text(json.dumps(doc) + "\n")


def main() -> int:
    """Write every fixture."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(ROOT / "tests" / "fixtures" / "lstm_ae"))
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(2026)
    table = pa.Table.from_pylist(fixture_rows(rng), schema=metrics_schema())
    pq.write_table(table, out / "features.parquet", compression="zstd")
    card = fixture_card()
    (out / "card.json").write_text(json.dumps(card, indent=2) + "\n")
    w = features.card_windows([out / "features.parquet"], card)
    (out / "windows.json").write_text(json.dumps(windows_json(w)) + "\n")
    tiny(out)
    print(f"wrote {out}: {table.num_rows} rows, {len(w)} windows")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Feature windows of `lstm_ae` (docs/lstm-ae.md, "Feature windows"): the exact definition the Rust
processor (ml/) implements too; tests/fixtures/lstm_ae/windows.json proves that both agree.

Pipeline: Parquet files in the inferwatch metrics schema -> rows (group, signal, time, value) ->
per group, one raw value per signal and step bucket, carried forward at most `max_fill_steps` ->
standardised, clipped, masked windows of T consecutive non-gap buckets.

Attribute lookup: a key's value is the `str` of a string-typed (type 1) attribute value; point
attributes first, then the resource (the promoted `service.version` / `service.instance.id`
columns, then the `resource_attributes` map); missing or not a string -> "".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

GROUP_KEYS = ("service.instance.id", "service.version", "gen_ai.request.model")
DEFAULT_SIGNALS = [
    "llm.ttft.p95",
    "llm.tpot.p95",
    "llm.e2e.p99",
    "llm.queue.p99",
    "llm.kv_cache.usage",
    "hw.gpu.memory.usage",
    "hw.gpu.utilization",
    "llm.request.rate",
]
NUMBER_KINDS = (1, 2)  # gauge, sum


@dataclass
class Row:
    """One accepted number point."""

    instance: str
    version: str
    model: str
    signal: int
    time_ns: int
    value: float
    order: int  # position in input order (files in the given order, rows in file order)


@dataclass
class Series:
    """One group's bucketed signals: `raw[i, j]` is signal j in bucket `first + i` after fill (NaN missing)."""

    group: tuple[str, str, str]
    first: int
    raw: np.ndarray  # [n, k] float64
    has_rows: np.ndarray  # [n] bool: the bucket holds at least one row of this group

    @property
    def gap(self) -> np.ndarray:
        """Gap buckets: no rows at all, or every signal missing after fill."""
        return ~self.has_rows | np.all(np.isnan(self.raw), axis=1)


@dataclass
class Windows:
    """Windows of all groups: x and mask [n, T, k] float32, groups and end buckets aligned."""

    x: np.ndarray
    mask: np.ndarray
    groups: list[tuple[str, str, str]] = field(default_factory=list)
    end_buckets: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.end_buckets)


def expand_inputs(paths: list[str | Path]) -> list[Path]:
    """Files in input order: a directory expands to its `*.parquet` files (recursive), sorted by path."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            out += sorted(f for f in p.rglob("*.parquet") if f.is_file())
        elif p.is_file():
            out.append(p)
        else:
            raise FileNotFoundError(f"no such input: {p}")
    return out


def _attr(entries, key: str) -> str | None:
    """The string value of `key` in a map column's entries, None when absent or not a string."""
    if not entries:
        return None
    for k, v in entries:
        if k == key:
            if v is not None and v.get("type") == 1 and v.get("str") is not None:
                return v["str"]
            return None
    return None


def read_rows(paths: list[str | Path], signals: list[str], source: str) -> list[Row]:
    """Step 1-2 of the contract (without the model sharing): accepted rows with their group key."""
    index = {s: j for j, s in enumerate(signals)}
    rows: list[Row] = []
    order = 0
    for path in expand_inputs(paths):
        table = pq.read_table(path)
        if table.schema.metadata is None or table.schema.metadata.get(b"inferwatch.schema") != b"metrics":
            continue
        n = table.num_rows
        keep = pc.and_(
            pc.is_in(table["metric_name"], value_set=pa.array(signals, pa.string())),
            pc.is_in(table["kind"], value_set=pa.array(NUMBER_KINDS, pa.uint8())),
        )
        keep = pc.and_(keep, pc.is_valid(table["value"]))
        positions = np.nonzero(np.asarray(keep.fill_null(False)))[0]
        sub = table.take(pa.array(positions, pa.int64())) if len(positions) else table.slice(0, 0)
        names = sub["metric_name"].to_pylist()
        values = sub["value"].to_pylist()
        times = sub["time_unix_nano"].cast(pa.int64()).to_pylist()
        attrs = sub["attributes"].to_pylist()
        res = sub["resource_attributes"].to_pylist()
        ver_col = sub["service.version"].to_pylist()
        inst_col = sub["service.instance.id"].to_pylist()
        for i, pos in enumerate(positions):
            v = values[i]
            if not math.isfinite(v):
                continue
            a = attrs[i]
            src = _attr(a, "source")
            if src is not None and src != source:
                continue
            # A "source" attribute of another type is treated as absent (accepted).
            promoted = {"service.version": ver_col[i], "service.instance.id": inst_col[i]}
            key = []
            for k in GROUP_KEYS:
                got = _attr(a, k)
                if got is None:
                    got = promoted.get(k)
                if got is None:
                    got = _attr(res[i], k)
                key.append(got or "")
            rows.append(Row(key[0], key[1], key[2], index[names[i]], times[i], float(v), order + int(pos)))
        order += n
    return rows


def group_rows(rows: list[Row]) -> dict[tuple[str, str, str], list[Row]]:
    """Step 2: rows per group; model-less rows go to every (instance, version) group with a model."""
    with_model: dict[tuple[str, str], list[str]] = {}
    for r in rows:
        if r.model:
            models = with_model.setdefault((r.instance, r.version), [])
            if r.model not in models:
                models.append(r.model)
    groups: dict[tuple[str, str, str], list[Row]] = {}
    for r in rows:
        if r.model:
            targets = [r.model]
        else:
            targets = with_model.get((r.instance, r.version)) or [""]
        for m in targets:
            groups.setdefault((r.instance, r.version, m), []).append(r)
    return groups


def bucket_series(
    rows: list[Row], group: tuple[str, str, str], k: int, step_s: int, max_fill_steps: int
) -> Series:
    """Steps 3-4 (before standardisation): last point per bucket and signal, then bounded carry-forward."""
    step_ns = int(step_s) * 1_000_000_000
    latest: dict[tuple[int, int], tuple[int, int, float]] = {}
    for r in rows:
        b = r.time_ns // step_ns
        key = (b, r.signal)
        cand = (r.time_ns, r.order, r.value)
        cur = latest.get(key)
        if cur is None or (cand[0], cand[1]) > (cur[0], cur[1]):
            latest[key] = cand
    buckets = {b for b, _ in latest}
    first, last = min(buckets), max(buckets)
    n = last - first + 1
    has_rows = np.zeros(n, dtype=bool)
    for b in buckets:
        has_rows[b - first] = True
    raw = np.full((n, k), np.nan)
    for (b, j), (_, _, v) in latest.items():
        raw[b - first, j] = v
    # Carry forward at most max_fill_steps buckets.
    for j in range(k):
        last_v, last_i = math.nan, None
        for i in range(n):
            if not math.isnan(raw[i, j]):
                last_v, last_i = raw[i, j], i
            elif last_i is not None and i - last_i <= max_fill_steps:
                raw[i, j] = last_v
    return Series(group, first, raw, has_rows)


def build_series(
    paths: list[str | Path], signals: list[str], source: str = "scrape", step_s: int = 60, max_fill_steps: int = 5
) -> list[Series]:
    """Every group's series from the inputs, sorted by group key."""
    rows = read_rows(paths, signals, source)
    groups = group_rows(rows)
    return [bucket_series(groups[g], g, len(signals), step_s, max_fill_steps) for g in sorted(groups)]


def standardise(raw: np.ndarray, mean, std, clip: float) -> tuple[np.ndarray, np.ndarray]:
    """z = (x - mean) / std clipped to ±clip in float64, then float32; missing -> 0 with mask 0."""
    mean = np.asarray(mean, dtype=np.float64)
    std = np.maximum(np.asarray(std, dtype=np.float64), 1e-6)
    present = ~np.isnan(raw)
    z = np.clip((np.where(present, raw, 0.0) - mean) / std, -clip, clip)
    z = np.where(present, z, 0.0)
    return z.astype(np.float32), present.astype(np.float32)


def window_ends(s: Series, T: int) -> list[int]:
    """Step 5: indices i (bucket first + i) ending a run of T consecutive non-gap buckets."""
    ends, run = [], 0
    for i, g in enumerate(s.gap):
        run = 0 if g else run + 1
        if run >= T:
            ends.append(i)
    return ends


def make_windows(series: list[Series], T: int, mean, std, clip: float, stride: int = 1) -> Windows:
    """Step 6: window tensors [T, k] and masks for every end bucket (every `stride`-th end per group)."""
    xs, ms, groups, ends = [], [], [], []
    for s in series:
        z, m = standardise(s.raw, mean, std, clip)
        for e in window_ends(s, T)[::stride]:
            xs.append(z[e - T + 1 : e + 1])
            ms.append(m[e - T + 1 : e + 1])
            groups.append(s.group)
            ends.append(s.first + e)
    k = series[0].raw.shape[1] if series else 0
    if not xs:
        return Windows(np.zeros((0, T, k), np.float32), np.zeros((0, T, k), np.float32))
    return Windows(np.stack(xs), np.stack(ms), groups, ends)


def fit_standardisation(series: list[Series]) -> tuple[list[float], list[float]]:
    """Mean and std (floored at 1e-6) of each signal over the present cells of non-gap buckets."""
    k = series[0].raw.shape[1]
    vals = [np.concatenate([s.raw[~s.gap, j] for s in series]) for j in range(k)]
    mean, std = [], []
    for v in vals:
        v = v[~np.isnan(v)]
        mean.append(float(v.mean()) if len(v) else 0.0)
        std.append(max(float(v.std()) if len(v) else 1.0, 1e-6))
    return mean, std


def card_windows(paths: list[str | Path], card: dict, stride: int = 1) -> Windows:
    """The windows a card describes (signals, source, T, step_s, max_fill_steps, mean, std, clip)."""
    series = build_series(paths, card["signals"], card.get("source", "scrape"), card["step_s"], card["max_fill_steps"])
    return make_windows(series, card["T"], card["mean"], card["std"], card["clip"], stride)


def score(x: np.ndarray, xhat: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Per-window score: sum(mask (x - x̂)^2) / max(1, sum(mask)), shape [n]."""
    d = (x.astype(np.float64) - xhat.astype(np.float64)) ** 2 * mask
    return d.sum(axis=(1, 2)) / np.maximum(1.0, mask.sum(axis=(1, 2)))


def level(score_value: float, calibration: dict) -> float:
    """Step 7: piecewise-linear anomaly level in [0, 1] from a card's calibration."""
    q = dict((float(a), float(b)) for a, b in calibration["quantiles"])
    w, c = float(calibration["warning_error"]), float(calibration["critical_error"])
    xs = [0.0, q[0.99], w, c, 2 * c - w]
    ys = [0.0, 0.5, 0.6, 0.8, 1.0]
    if score_value >= xs[-1]:
        return 1.0
    for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
        if score_value <= x1:
            return y0 if x1 <= x0 else min(1.0, max(0.0, y0 + (y1 - y0) * (score_value - x0) / (x1 - x0)))
    return 1.0

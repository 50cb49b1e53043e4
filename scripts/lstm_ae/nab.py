#!/usr/bin/env python3
"""Train the univariate NAB models of `inferwatch eval --nab --detector lstm_ae | pca` (docs/eval-nab.md).

    python scripts/lstm_ae/nab.py --nab /work/shared/datasets/nab --out models/nab/lstm_ae_nab.onnx \
        --pca-out models/nab/pca_nab.json

NAB is CSV, not a recording, so this bypasses train.py's Parquet reader: it reads every file named in
`labels/combined_windows.json` directly and uses only each file's probationary rows (the first
min(floor(0.15 n), 750), which NAB never scores and allows for learning). Each file is standardised by
its own probationary mean and standard deviation (exactly what the runner sends: z-values), so the
card's mean is 0 and std 1. The rows then go through the shared feature code (features.bucket_series,
make_windows: bucket = the file's step, the median interval between rows, as the runner's `step`
override sets it), training and calibration reuse train.py's functions: the last `--holdout` of each
file's probationary windows is held out and calibrates the error. numpy only.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import math
import shlex
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import features  # noqa: E402
import lstm  # noqa: E402
import onnx_export  # noqa: E402
import pca  # noqa: E402
import train  # noqa: E402

SIGNAL = "nab.value"  # the gauge the NAB runner sends (eval/src/nab/run.rs METRIC)
PROBATION_PERCENT = 0.15  # NAB's probationary period (eval/src/nab/score.rs)
STD_FLOOR = 1e-6  # the card's floor; the runner floors the per-file std the same way


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nab", required=True, help="NAB directory holding data/ and labels/")
    ap.add_argument("--out", required=True, help="ONNX path; the card goes next to it as .json")
    ap.add_argument("--pca-out", default=None, help="also fit the PCA baseline and write its card here")
    ap.add_argument("--window", type=int, default=12, help="T, steps per window")
    ap.add_argument("--hidden", type=int, default=8)
    ap.add_argument("--epochs", type=int, default=40)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--stride", type=int, default=1, help="use every n-th training window")
    ap.add_argument("--clip", type=float, default=10.0)
    ap.add_argument("--holdout", type=float, default=0.2, help="fraction of each file's probationary windows")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--offset-augment", type=float, default=8.0,
                    help="lstm_ae: add a copy of each training window shifted by U(-A, A) (0: none)")
    return ap.parse_args(argv)


def probationary_length(n: int) -> int:
    """NAB's probationary rows: floor(0.15 n), at most 0.15 * 5000 = 750."""
    return int(min(math.floor(PROBATION_PERCENT * n), PROBATION_PERCENT * 5000))


def read_csv(path: Path) -> tuple[list[int], list[float]]:
    """Timestamps (UTC, ns) and values of a NAB CSV."""
    ts, vs = [], []
    with path.open(newline="") as f:
        rows = csv.reader(f)
        if next(rows, None) != ["timestamp", "value"]:
            raise ValueError(f"{path}: expected the header timestamp,value")
        for row in rows:
            if not row:
                continue
            t = dt.datetime.strptime(row[0], "%Y-%m-%d %H:%M:%S").replace(tzinfo=dt.timezone.utc)
            ts.append(int(t.timestamp()) * 1_000_000_000)
            vs.append(float(row[1]))
    return ts, vs


def step_ns(ts: list[int]) -> int:
    """The file's step: the (upper) median of the non-negative intervals, as NabFile::step_ns."""
    d = sorted(b - a for a, b in zip(ts, ts[1:]) if b >= a)
    return d[len(d) // 2] if d else 0


def file_stats(values: list[float]) -> tuple[float, float]:
    """Mean and population std (floored) of a file's probationary values, as the runner computes them."""
    head = np.asarray(values[: max(1, probationary_length(len(values)))], dtype=np.float64)
    mean = float(head.mean())
    std = max(float(head.std()), STD_FLOOR)
    return mean, std


def file_windows(name: str, ts: list[int], vs: list[float], T: int, clip: float) -> features.Windows:
    """The windows ending in the file's probationary period, built as the processor builds them."""
    n = probationary_length(len(vs))
    mean, std = file_stats(vs)
    step = step_ns(ts)
    if n == 0 or step <= 0 or step % 1_000_000_000:
        return features.Windows(np.zeros((0, T, 1), np.float32), np.zeros((0, T, 1), np.float32))
    rows = [features.Row(name, "", "", 0, t, (v - mean) / std, i) for i, (t, v) in enumerate(zip(ts[:n], vs[:n]))]
    s = features.bucket_series(rows, (name, "", ""), 1, step // 1_000_000_000, 0)
    return features.make_windows([s], T, [0.0], [1.0], clip, 1)


def split(w: features.Windows, holdout: float, stride: int) -> tuple[features.Windows, features.Windows]:
    """The first (1 - holdout) of a file's windows (every stride-th) and the rest."""
    cut = int(math.floor(len(w) * (1.0 - holdout)))

    def part(lo, hi, st):
        idx = list(range(lo, hi, st))
        return features.Windows(w.x[idx], w.mask[idx], [w.groups[i] for i in idx], [w.end_buckets[i] for i in idx])

    return part(0, cut, stride), part(cut, len(w), 1)


def concat(ws: list[features.Windows], T: int) -> features.Windows:
    """One Windows of many."""
    ws = [w for w in ws if len(w)]
    if not ws:
        return features.Windows(np.zeros((0, T, 1), np.float32), np.zeros((0, T, 1), np.float32))
    return features.Windows(np.concatenate([w.x for w in ws]), np.concatenate([w.mask for w in ws]),
                            [g for w in ws for g in w.groups], [e for w in ws for e in w.end_buckets])


def augment(w: features.Windows, a: float, clip: float, rng) -> features.Windows:
    """w plus a copy of each window shifted by one offset drawn from U(-a, a), clipped to ±clip.

    Each file is standardised by its probationary rows only, so later levels (drift, shifts) often
    lie far from the training range; a nonlinear autoencoder then misreconstructs every window at
    the new level. The shifted copies teach it the window's shape at any level; the windows that
    contain a level change still reconstruct badly.
    """
    if a <= 0 or not len(w):
        return w
    off = rng.uniform(-a, a, size=(len(w), 1, 1))
    shifted = (np.clip(w.x.astype(np.float64) + off, -clip, clip) * w.mask).astype(np.float32)
    return features.Windows(np.concatenate([w.x, shifted]), np.concatenate([w.mask, w.mask]),
                            w.groups + w.groups, w.end_buckets + w.end_buckets)


def calib(errors: np.ndarray) -> dict:
    """train.calibrate, rounded as the cards are."""
    return {k: ([[q, train.r(e)] for q, e in v] if k == "quantiles" else (train.r(v) if isinstance(v, float) else v))
            for k, v in train.calibrate(errors).items()}


def base_card(name: str, detector: str, args, steps: list[int]) -> dict:
    """The fields both cards share."""
    return {
        "format": 1,
        "name": name,
        "detector": detector,
        "signals": [SIGNAL],
        "source": None,
        "T": args.window,
        "step_s": 300,
        "max_fill_steps": 0,
        "mean": [0.0],
        "std": [1.0],
        "clip": args.clip,
        "error": "mse",
        "nab": {
            "note": "inputs are z-values: each NAB file standardised by its probationary mean/std; "
                    "the runner sets the processor's `step` to each file's step",
            "file_steps_s": sorted(set(steps)),
        },
    }


def main(argv: list[str] | None = None) -> int:
    """Build windows, train, calibrate, export; returns the exit status."""
    args = parse_args(argv)
    t_start = time.time()
    out = Path(args.out)
    if out.suffix != ".onnx":
        train.log(f"error: --out must end in .onnx, got {out}")
        return 2
    nab = Path(args.nab)
    windows = json.loads((nab / "labels" / "combined_windows.json").read_text())
    T = args.window
    tr, ho, steps = [], [], []
    for name in sorted(windows):
        ts, vs = read_csv(nab / "data" / name)
        steps.append(step_ns(ts) // 1_000_000_000)
        a, b = split(file_windows(name, ts, vs, T, args.clip), args.holdout, args.stride)
        tr.append(a)
        ho.append(b)
    tw, hw = concat(tr, T), concat(ho, T)
    train.log(f"{len(windows)} files: {len(tw)} training windows, {len(hw)} held out (T={T}, k=1)")
    if len(tw) == 0 or len(hw) == 0:
        train.log("error: no probationary windows")
        return 1
    command = "python " + " ".join(shlex.quote(a) for a in [sys.argv[0]] + (argv or sys.argv[1:]))
    training = {"inputs": [str(nab)], "files": len(windows), "windows": len(tw), "holdout_windows": len(hw),
                "holdout_fraction": args.holdout, "stride": args.stride, "seed": args.seed, "command": command}

    rng = np.random.default_rng(args.seed)
    p = lstm.init_params(1, args.hidden, args.seed)
    aw = augment(tw, args.offset_augment, args.clip, rng)
    train.log(f"lstm_ae: {len(aw)} training windows with the shifted copies (offset ±{args.offset_augment})")
    train.fit(p, aw, args.epochs, args.batch, args.lr, rng, "train")
    train_err, hold_err = train.scores(p, tw), train.scores(p, hw)
    c = calib(hold_err)
    out.parent.mkdir(parents=True, exist_ok=True)
    size = onnx_export.export(p, T, out, out.stem)
    check = train.verify_onnx(p, out, hw.x[:7])
    card = base_card(out.stem, "lstm_ae", args, steps)
    card.update(
        calibration=c, hidden=args.hidden, layers=1, pruned=None,
        training={**training, "offset_augment": args.offset_augment, "epochs": args.epochs, "batch": args.batch, "lr": args.lr,
                  "seconds": round(time.time() - t_start, 1)},
        metrics={"train_mse": train.r(float(train_err.mean())), "holdout_mse": train.r(float(hold_err.mean())),
                 "holdout_p99_error": train.r(float(np.quantile(hold_err, 0.99))), "holdout_windows": len(hw),
                 "train_fraction_above_warning": train.r(float((train_err >= c["warning_error"]).mean())),
                 "model_bytes": size, "onnx_max_abs_diff": check},
    )
    out.with_suffix(".json").write_text(json.dumps(card, indent=2) + "\n")
    train.log(f"wrote {out} ({size} bytes) and its card: holdout mse {card['metrics']['holdout_mse']}, "
              f"warning at {c['warning_error']}")

    if args.pca_out:
        mean_vec, comps, explained = pca.fit(tw.x)
        pt = features.score(tw.x, pca.reconstruct(tw.x, mean_vec, comps), tw.mask)
        ph = features.score(hw.x, pca.reconstruct(hw.x, mean_vec, comps), hw.mask)
        pc = calib(ph)
        path = Path(args.pca_out)
        pcard = base_card(path.stem, "pca", args, steps)
        pcard.update(
            calibration=pc, components_kept=int(len(comps)), explained_variance=train.r(explained),
            training=training,
            metrics={"train_mse": train.r(float(pt.mean())), "holdout_mse": train.r(float(ph.mean())),
                     "holdout_p99_error": train.r(float(np.quantile(ph, 0.99))), "holdout_windows": len(hw),
                     "train_fraction_above_warning": train.r(float((pt >= pc["warning_error"]).mean()))},
            mean_vec=[train.r(v) for v in mean_vec], components=[[train.r(v) for v in row] for row in comps],
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(pcard, indent=2) + "\n")
        train.log(f"wrote {path}: {len(comps)} components ({explained:.3f} of the variance), holdout mse "
                  f"{pcard['metrics']['holdout_mse']}")
    train.log(f"done in {time.time() - t_start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Train the `lstm_ae` model on Parquet recorded by inferwatch, export ONNX and write its card.

    python scripts/lstm_ae/train.py --input RECORDING... --out models/NAME.onnx [--prune 0.6]
        [--pca-out models/pca_NAME.json]

Each --input (a Parquet file or a directory of them, as the `parquet` exporter writes) is one
recording; its last `--holdout` fraction (by time) is held out for calibration and metrics. Wrapped
by `inferwatch train-lstm-ae`. numpy only; see docs/lstm-ae.md.
"""

from __future__ import annotations

import argparse
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

QUANTILES = (0.5, 0.9, 0.99, 0.999, 1.0)
WARNING_FACTOR = 1.5
CRITICAL_FACTOR = 3.0


def log(msg: str) -> None:
    """A progress line on stdout (the Rust wrapper streams it)."""
    print(msg, flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--input", nargs="+", required=True, help="recordings: Parquet files or directories")
    ap.add_argument("--out", required=True, help="ONNX path; the card goes next to it as .json")
    ap.add_argument("--signals", default=",".join(features.DEFAULT_SIGNALS), help="comma-separated metric names")
    ap.add_argument("--source", default="scrape", help="accepted `source` attribute of llm_signals points")
    ap.add_argument("--window", type=int, default=60, help="T, steps per window")
    ap.add_argument("--step", type=int, default=60, help="step in seconds")
    ap.add_argument("--max-fill-steps", type=int, default=5)
    ap.add_argument("--clip", type=float, default=10.0)
    ap.add_argument("--stride", type=int, default=2, help="use every n-th training window")
    ap.add_argument("--hidden", type=int, default=32)
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--finetune-epochs", type=int, default=None, help="after pruning (default epochs/3)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--prune", type=float, default=None, help="fraction of hidden units kept, e.g. 0.6")
    ap.add_argument("--holdout", type=float, default=0.2, help="fraction of each recording held out (by time)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--pca-out", default=None, help="also fit the PCA baseline and write its card here")
    ap.add_argument("--command", default=None, help="command recorded in the card (default: this one)")
    return ap.parse_args(argv)


def split_series(s: features.Series, cutoff: int) -> tuple[features.Series | None, features.Series | None]:
    """The part of s before bucket `cutoff` and the part from it on."""
    i = max(0, min(len(s.raw), cutoff - s.first))

    def part(lo, hi):
        if hi <= lo:
            return None
        return features.Series(s.group, s.first + lo, s.raw[lo:hi], s.has_rows[lo:hi])

    return part(0, i), part(i, len(s.raw))


def load(args, signals: list[str]) -> tuple[list[features.Series], list[features.Series]]:
    """Train and holdout series over all inputs (each input split at its own time cutoff)."""
    train, hold = [], []
    for inp in args.input:
        series = features.build_series([inp], signals, args.source, args.step, args.max_fill_steps)
        if not series:
            log(f"warning: {inp}: no points of the signals {signals}")
            continue
        lo = min(s.first for s in series)
        hi = max(s.first + len(s.raw) for s in series)
        cutoff = lo + int(math.floor((hi - lo) * (1.0 - args.holdout)))
        for s in series:
            a, b = split_series(s, cutoff)
            if a is not None:
                train.append(a)
            if b is not None:
                hold.append(b)
        log(f"{inp}: {len(series)} groups, buckets {lo}..{hi - 1}, holdout from bucket {cutoff}")
    return train, hold


def calibrate(errors: np.ndarray) -> dict:
    """Calibration of the card from holdout errors."""
    qs = [[q, float(np.quantile(errors, q))] for q in QUANTILES]
    q999 = qs[3][1]
    return {
        "quantiles": qs,
        "warning_error": WARNING_FACTOR * q999,
        "critical_error": CRITICAL_FACTOR * q999,
        "warning_factor": WARNING_FACTOR,
        "critical_factor": CRITICAL_FACTOR,
        "basis": "holdout 0.999-quantile error",
    }


def scores(p, w: features.Windows, batch: int = 256) -> np.ndarray:
    """Per-window score of the numpy model."""
    out = [features.score(w.x[i : i + batch], lstm.forward(p, w.x[i : i + batch].astype(np.float64)),
                          w.mask[i : i + batch]) for i in range(0, len(w), batch)]
    return np.concatenate(out) if out else np.zeros(0)


def fit(p, w: features.Windows, epochs: int, batch: int, lr: float, rng, tag: str) -> list[float]:
    """Minibatch Adam on the masked MSE; returns the mean loss of each epoch."""
    opt = lstm.Adam(p, lr=lr)
    x = w.x.astype(np.float64)
    m = w.mask.astype(np.float64)
    history = []
    for ep in range(epochs):
        t0 = time.time()
        order = rng.permutation(len(w))
        total, n = 0.0, 0
        for i in range(0, len(order), batch):
            idx = order[i : i + batch]
            loss, g = lstm.loss_and_grads(p, x[idx], m[idx])
            opt.step(p, g)
            total += loss * len(idx)
            n += len(idx)
        history.append(total / max(1, n))
        log(f"{tag} epoch {ep + 1}/{epochs}: loss {history[-1]:.5f} ({time.time() - t0:.1f} s)")
    return history


def r(v: float) -> float:
    """Rounded for the card."""
    return float(f"{v:.7g}")


def main(argv: list[str] | None = None) -> int:
    """Train, calibrate, export; returns the exit status."""
    args = parse_args(argv)
    t_start = time.time()
    signals = [s.strip() for s in args.signals.split(",") if s.strip()]
    out = Path(args.out)
    if out.suffix != ".onnx":
        log(f"error: --out must end in .onnx, got {out}")
        return 2
    if args.prune is not None and not 0.0 < args.prune <= 1.0:
        log(f"error: --prune is the fraction of units kept, in (0, 1]; got {args.prune}")
        return 2
    command = args.command or "python " + " ".join(shlex.quote(a) for a in [sys.argv[0]] + (argv or sys.argv[1:]))
    rng = np.random.default_rng(args.seed)

    train_s, hold_s = load(args, signals)
    if not train_s:
        log("error: no training data: none of the signals found in the inputs")
        return 1
    mean, std = features.fit_standardisation(train_s)
    mean, std = [r(v) for v in mean], [r(v) for v in std]  # the card's values are the ones used
    T = args.window
    tw = features.make_windows(train_s, T, mean, std, args.clip, args.stride)
    hw = features.make_windows(hold_s, T, mean, std, args.clip, 1)
    log(f"windows: {len(tw)} for training (stride {args.stride}), {len(hw)} held out; T={T}, k={len(signals)}")
    if len(tw) == 0 or len(hw) == 0:
        log(f"error: need windows of {T} consecutive steps in both the training and the holdout part")
        return 1

    p = lstm.init_params(len(signals), args.hidden, args.seed)
    fit(p, tw, args.epochs, args.batch, args.lr, rng, "train")
    size_full = len(onnx_export.build_model(p, T).SerializeToString())
    hold_full = scores(p, hw)
    pruned = None
    if args.prune is not None:
        p, kept = lstm.prune(p, args.prune)
        log(f"pruned to {kept} of {args.hidden} units per LSTM; holdout mse before fine-tuning "
            f"{float(scores(p, hw).mean()):.5f}")
        ft = args.finetune_epochs if args.finetune_epochs is not None else max(1, args.epochs // 3)
        fit(p, tw, ft, args.batch, args.lr / 3, rng, "fine-tune")
        pruned = {"kept_units": kept, "of": args.hidden}

    train_err = scores(p, tw)
    hold_err = scores(p, hw)
    calib = calibrate(hold_err)
    out.parent.mkdir(parents=True, exist_ok=True)
    size = onnx_export.export(p, T, out, out.stem)
    check = verify_onnx(p, out, hw.x[:7])
    card = {
        "format": 1,
        "name": out.stem,
        "detector": "lstm_ae",
        "signals": signals,
        "source": args.source,
        "T": T,
        "step_s": args.step,
        "max_fill_steps": args.max_fill_steps,
        "mean": mean,
        "std": std,
        "clip": args.clip,
        "error": "mse",
        "calibration": {k: ([[q, r(e)] for q, e in v] if k == "quantiles" else (r(v) if isinstance(v, float) else v))
                        for k, v in calib.items()},
        "hidden": args.hidden,
        "layers": 1,
        "pruned": pruned,
        "training": {
            "inputs": [str(i) for i in args.input],
            "windows": len(tw),
            "epochs": args.epochs,
            "finetune_epochs": (args.finetune_epochs if args.finetune_epochs is not None
                                else max(1, args.epochs // 3)) if pruned else 0,
            "seed": args.seed,
            "stride": args.stride,
            "batch": args.batch,
            "lr": args.lr,
            "holdout_fraction": args.holdout,
            "seconds": round(time.time() - t_start, 1),
            "command": command,
        },
        "metrics": {
            "train_mse": r(float(train_err.mean())),
            "holdout_mse": r(float(hold_err.mean())),
            "holdout_p99_error": r(float(np.quantile(hold_err, 0.99))),
            "holdout_windows": len(hw),
            "train_fraction_above_warning": r(float((train_err >= calib["warning_error"]).mean())),
            "holdout_mse_unpruned": r(float(hold_full.mean())),
            "model_bytes_unpruned": size_full,
            "model_bytes": size,
            "onnx_max_abs_diff": check,
        },
    }
    card_path = out.with_suffix(".json")
    card_path.write_text(json.dumps(card, indent=2) + "\n")
    log(f"wrote {out} ({size} bytes; unpruned {size_full}) and {card_path}: train mse "
        f"{card['metrics']['train_mse']}, holdout mse {card['metrics']['holdout_mse']}, "
        f"p99 {card['metrics']['holdout_p99_error']}, warning at {card['calibration']['warning_error']}")

    if args.pca_out:
        write_pca(args, card, tw, hw)
    log(f"done in {time.time() - t_start:.1f} s")
    return 0


def verify_onnx(p, path: Path, x: np.ndarray):
    """Max |ORT - numpy| on a few windows, or None without onnxruntime."""
    try:
        import onnxruntime as ort
    except ImportError:
        log("onnxruntime not installed: skipping the ONNX check")
        return None
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    y = sess.run(["output"], {"input": x.astype(np.float32)})[0]
    diff = float(np.abs(y - lstm.forward(p, x.astype(np.float64))).max())
    log(f"onnxruntime check: max abs diff {diff:.2e} on {len(x)} windows")
    return r(diff)


def write_pca(args, lstm_card: dict, tw: features.Windows, hw: features.Windows) -> None:
    """Fit the PCA baseline on the training windows, calibrate on the holdout, write its card."""
    mean_vec, comps, explained = pca.fit(tw.x)
    train_err = features.score(tw.x, pca.reconstruct(tw.x, mean_vec, comps), tw.mask)
    hold_err = features.score(hw.x, pca.reconstruct(hw.x, mean_vec, comps), hw.mask)
    calib = calibrate(hold_err)
    path = Path(args.pca_out)
    card = {k: lstm_card[k] for k in ("format", "signals", "source", "T", "step_s", "max_fill_steps", "mean",
                                      "std", "clip", "error")}
    card.update(
        name=path.stem,
        detector="pca",
        calibration={k: ([[q, r(e)] for q, e in v] if k == "quantiles" else (r(v) if isinstance(v, float) else v))
                     for k, v in calib.items()},
        components_kept=int(len(comps)),
        explained_variance=r(explained),
        training={**lstm_card["training"], "stride": args.stride},
        metrics={
            "train_mse": r(float(train_err.mean())),
            "holdout_mse": r(float(hold_err.mean())),
            "holdout_p99_error": r(float(np.quantile(hold_err, 0.99))),
            "holdout_windows": len(hw),
            "train_fraction_above_warning": r(float((train_err >= calib["warning_error"]).mean())),
        },
        mean_vec=[r(v) for v in mean_vec],
        components=[[r(v) for v in row] for row in comps],
    )
    for key in ("epochs", "finetune_epochs", "batch", "lr", "seconds"):
        card["training"].pop(key, None)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(card) + "\n")
    log(f"wrote {path}: {len(comps)} components ({explained:.3f} of the variance), holdout mse "
        f"{card['metrics']['holdout_mse']}, p99 {card['metrics']['holdout_p99_error']}")


if __name__ == "__main__":
    sys.exit(main())

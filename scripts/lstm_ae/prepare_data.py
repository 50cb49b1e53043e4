#!/usr/bin/env python3
"""Training data of the default `lstm_ae` model, from the scenario library.

For each scenario: `inferwatch sim --scenario FILE --out SIM` (simulated clock), then
`inferwatch replay --config scripts/lstm_ae/record.yaml --input SIM/metrics.jsonl` records the
llm_signals outputs plus the raw scraped metrics (hw.gpu.*) as Parquet under OUT/rec/<scenario>/.
Healthy scenarios are kept whole; of fault scenarios only the time before the fault onset is kept
(from ground_truth.json), and only when that is continuous (no duty-cycle sampling) and at least
`--min-pre-onset` long. Prints the recording directories, one per line, last.

    python scripts/lstm_ae/prepare_data.py --out target/lstm_ae_data
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[2]
HEALTHY = ["healthy_bursts_deploys", "healthy_ab_control"]
FAULTS = [
    "batch_saturation_strong", "batch_saturation_weak", "cold_start_strong", "cold_start_weak",
    "context_collapse_strong", "context_collapse_weak", "kv_pressure_strong", "kv_pressure_weak",
    "queue_blocking_strong", "queue_blocking_weak",
]


def run(cmd: list[str], env: dict | None = None) -> None:
    """Run a command, its stdout discarded (the simulator prints its summary), failing loudly."""
    proc = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        sys.exit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-4000:]}")


def cut_before(rec: Path, until_ns: int) -> int:
    """Keep only rows before `until_ns` in every Parquet file under rec (schema and metadata kept)."""
    kept = 0
    for f in sorted(rec.rglob("*.parquet")):
        t = pq.read_table(f)
        t2 = t.filter(pc.less(t["time_unix_nano"].cast(pa.int64()), pa.scalar(until_ns, pa.int64())))
        if t2.num_rows == 0:
            f.unlink()
        else:
            pq.write_table(t2, f, compression="zstd")
            kept += t2.num_rows
    return kept


def main() -> int:
    """Simulate, record, cut; print the recording directories."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(ROOT / "target" / "lstm_ae_data"))
    ap.add_argument("--bin", default=os.environ.get("INFERWATCH_BIN", str(ROOT / "target" / "release" / "inferwatch")))
    ap.add_argument("--healthy", nargs="*", default=HEALTHY, help="scenario names kept whole")
    ap.add_argument("--faults", nargs="*", default=FAULTS, help="scenario names whose pre-onset part is kept")
    ap.add_argument("--min-pre-onset", type=float, default=5400.0, help="seconds")
    args = ap.parse_args()
    out = Path(args.out)
    if not Path(args.bin).is_file():
        sys.exit(f"no inferwatch binary at {args.bin}: run `cargo build --release` or pass --bin")
    dirs = []
    for name in list(args.healthy) + list(args.faults):
        scenario = ROOT / "scenarios" / f"{name}.yaml"
        sim, rec = out / "sim" / name, out / "rec" / name
        shutil.rmtree(sim, ignore_errors=True)
        shutil.rmtree(rec, ignore_errors=True)
        run([args.bin, "sim", "--scenario", str(scenario), "--out", str(sim)])
        truth = json.loads((sim / "ground_truth.json").read_text())
        until = None
        if name in args.faults:
            onset = truth.get("fault_onset_unix_nano")
            if onset is None or truth.get("sampling") is not None:
                print(f"{name}: skipped (no onset or sampled)", file=sys.stderr)
                continue
            if (onset - truth["start_time_unix_nano"]) / 1e9 < args.min_pre_onset:
                print(f"{name}: skipped (less than {args.min_pre_onset} s before the onset)", file=sys.stderr)
                continue
            until = onset
        env = dict(os.environ, LSTM_AE_RECORD_DIR=str(rec))
        run([args.bin, "replay", "--config", str(ROOT / "scripts" / "lstm_ae" / "record.yaml"),
             "--input", str(sim / "metrics.jsonl")], env=env)
        if until is not None:
            rows = cut_before(rec, until)
            print(f"{name}: kept {rows} rows before the onset", file=sys.stderr)
        else:
            print(f"{name}: recorded", file=sys.stderr)
        shutil.rmtree(sim, ignore_errors=True)
        dirs.append(rec)
    for d in dirs:
        print(d)
    return 0


if __name__ == "__main__":
    sys.exit(main())

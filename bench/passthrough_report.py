#!/usr/bin/env python3
"""Summarises a bench/passthrough.sh results folder: one table, and summary.json beside the runs.

Usage: python3 bench/passthrough_report.py bench/results/passthrough-YYYYmmdd-HHMMSS
"""

import json
import os
import statistics
import sys

# Another process used more than this share of a core during the run (same knob as passthrough.sh).
NOISY_OTHER_PCT = float(os.environ.get("NOISY_PCT", "15"))


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def run_record(d):
    meta = load(os.path.join(d, "meta.json"))
    if meta is None:
        return None
    r = {k: meta.get(k) for k in ("case", "collector", "rep", "started", "stop", "exit_code")}
    hwm_mib = meta["vmhwm_kib"] / 1024 if meta.get("vmhwm_kib") else None
    r["busy_before_pct"] = meta.get("busy_before_pct")
    if meta["case"] == "idle":
        w = load(os.path.join(d, "watch.json")) or {}
        procs = w.get("procs") or [{}]
        c = procs[0]
        r["cpu_pct"] = c.get("cpu_pct")
        r["rss_mib"] = max(c.get("rss_peak_mib") or 0, hwm_mib or 0) or None
        r["other_pct"] = (w.get("host") or {}).get("other_pct")
        r["delivered_ok"] = None
        return r
    g = load(os.path.join(d, "gen.json"))
    chk = load(os.path.join(d, "check.json")) or {}
    sink = load(os.path.join(d, "sink.json")) or {}
    settle = load(os.path.join(d, "settle.json")) or {}
    if g is None:
        r.update(spans_per_s=None, cpu_pct=None, rss_mib=hwm_mib, delivered_ok=False, note="no generator output")
        return r
    procs = g["watch"]["procs"]
    c = procs[0] if procs else {}
    s = procs[1] if len(procs) > 1 else {}
    r["spans_per_s"] = g["spans_per_s"]
    r["spans_acked"] = g["spans_acked"]
    r["rate_target"] = g.get("rate_target")
    r["rate_reached"] = g.get("rate_reached")
    r["errors"] = g["errors"]
    r["p50_ms"] = g["latency_ms"]["p50"]
    r["p99_ms"] = g["latency_ms"]["p99"]
    r["cpu_pct"] = c.get("cpu_pct")
    r["rss_mib"] = max(c.get("rss_peak_mib") or 0, hwm_mib or 0) or None
    r["sink_cpu_pct"] = s.get("cpu_pct")
    r["gen_cpu_pct"] = g["watch"].get("self_cpu_pct")
    r["other_pct"] = (g["watch"].get("host") or {}).get("other_pct")
    if r["cpu_pct"] and g["spans_per_s"]:
        r["cpu_us_per_span"] = r["cpu_pct"] / 100.0 / g["spans_per_s"] * 1e6
    r["missing"] = chk.get("missing")
    r["duplicates"] = sink.get("duplicates")
    r["sink_encodings"] = sink.get("request_encodings")
    r["delivered_before_stop"] = settle.get("reached")
    r["exact_check"] = g.get("exact_check")
    r["delivered_ok"] = bool(
        meta.get("started") and g["spans_acked"] > 0 and chk.get("ok") is True and sink.get("duplicates") == 0
    )
    return r


def fmt(v, nd=0, suffix=""):
    if v is None:
        return "-"
    if isinstance(v, float) or isinstance(v, int):
        return f"{v:,.{nd}f}{suffix}"
    return str(v)


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    runs = []
    rejected = 0
    for name in sorted(os.listdir(out)):
        d = os.path.join(out, name)
        if ".rejected" in name:
            rejected += 1
            continue
        if os.path.isdir(d):
            r = run_record(d)
            if r:
                runs.append(r)
    if not runs:
        sys.exit(f"no runs in {out}")

    known = ["grpc", "http", "rate10k", "rate10k-http", "idle"]
    cases = sorted({r["case"] for r in runs}, key=lambda c: (known.index(c) if c in known else len(known), c))
    collectors = sorted({r["collector"] for r in runs}, key=lambda c: (c != "inferwatch", c))

    agg = {}
    for case in cases:
        for coll in collectors:
            rs = [r for r in runs if r["case"] == case and r["collector"] == coll]
            if not rs:
                continue
            ok = [r["delivered_ok"] for r in rs if r["delivered_ok"] is not None]
            agg[(case, coll)] = {
                "runs": len(rs),
                "spans_per_s": median([r.get("spans_per_s") for r in rs]),
                "spans_per_s_min": min([r["spans_per_s"] for r in rs if r.get("spans_per_s") is not None], default=None),
                "spans_per_s_max": max([r["spans_per_s"] for r in rs if r.get("spans_per_s") is not None], default=None),
                "cpu_pct": median([r.get("cpu_pct") for r in rs]),
                "cpu_us_per_span": median([r.get("cpu_us_per_span") for r in rs]),
                "rss_mib": median([r.get("rss_mib") for r in rs]),
                "p99_ms": median([r.get("p99_ms") for r in rs]),
                "delivered": f"{sum(ok)}/{len(ok)}" if ok else "n/a",
                "delivered_all": all(ok) if ok else None,
                "noisy_runs": sum(1 for r in rs if (r.get("other_pct") or 0) > NOISY_OTHER_PCT),
                "failed_runs": sum(1 for r in rs if not r.get("started")),
            }

    def ratio(case, key):
        a, b = agg.get((case, "inferwatch")), agg.get((case, "rotel"))
        if not a or not b or a.get(key) is None or not b.get(key):
            return None
        return a[key] / b[key]

    ratios = {
        case: {k: ratio(case, k) for k in ("spans_per_s", "cpu_pct", "cpu_us_per_span", "rss_mib")} for case in cases
    }

    env = load(os.path.join(out, "env.json")) or {}
    print()
    print(
        f"OTLP pass-through, medians of {max(a['runs'] for a in agg.values())} run(s) of {env.get('dur', '?')}"
        f" ({'collector pinned to core 1' if env.get('pinned') else 'unpinned'}; results in {out})"
    )
    hdr = ("case", "collector", "spans/s", "CPU %", "CPU us/span", "peak RSS MiB", "p99 ms", "delivered", "noisy")
    rows = [hdr]
    for case in cases:
        for coll in collectors:
            a = agg.get((case, coll))
            if not a:
                continue
            rows.append(
                (
                    case,
                    coll,
                    fmt(a["spans_per_s"]),
                    fmt(a["cpu_pct"], 1),
                    fmt(a["cpu_us_per_span"], 2),
                    fmt(a["rss_mib"], 1),
                    fmt(a["p99_ms"], 1),
                    a["delivered"],
                    str(a["noisy_runs"]) if a["noisy_runs"] else "",
                )
            )
        rt = ratios[case]
        if any(v is not None for v in rt.values()):
            rows.append(
                (
                    "",
                    "inferwatch/rotel",
                    fmt(rt["spans_per_s"], 2, "x"),
                    fmt(rt["cpu_pct"], 2, "x"),
                    fmt(rt["cpu_us_per_span"], 2, "x"),
                    fmt(rt["rss_mib"], 2, "x"),
                    "",
                    "",
                    "",
                )
            )
    widths = [max(len(r[i]) for r in rows) for i in range(len(hdr))]
    for i, r in enumerate(rows):
        print("  ".join(c.ljust(w) if j < 2 else c.rjust(w) for j, (c, w) in enumerate(zip(r, widths))))
        if i == 0:
            print("  ".join("-" * w for w in widths))
    print()
    print("CPU % is a share of one core over the load window; CPU us/span = CPU time per acked span.")
    print("At saturation the pinned collector sits near 100 %, so compare spans/s there; at a fixed rate compare CPU %.")
    print(f"noisy: kept runs in which other processes used more than {NOISY_OTHER_PCT:.0f} % of a core", end="")
    print(f"; {rejected} noisy run(s) were set aside and repeated." if rejected else ".")
    bad = [r for r in runs if r.get("delivered_ok") is False]
    for r in bad:
        print(
            f"NOT DELIVERED: {r['case']}/{r['collector']}/rep {r['rep']}: missing={r.get('missing')}"
            f" duplicates={r.get('duplicates')} started={r.get('started')} {r.get('note', '')}"
        )

    summary = {
        "env": env,
        "aggregates": [{"case": c, "collector": k, **v} for (c, k), v in agg.items()],
        "ratios_inferwatch_over_rotel": ratios,
        "runs": runs,
        "rejected_runs": rejected,
    }
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(f"summary: {os.path.join(out, 'summary.json')}")


if __name__ == "__main__":
    main()

"""Quality signals reach the pipeline (issue 20, item 7), end to end.

Two `inferwatch sim` processes serve one model as versions A and B; B runs with
`--quality-noise 0.4` (40 % of its output tokens come from another answer, its top
log-probability is flattened). The references are A's own answers, fetched with the openai
client. `inferwatch bench` drives both with `--logprobs 5` and `--reference`, sending its spans
and its OTLP metrics (`service.version` from `OTEL_RESOURCE_ATTRIBUTES`) to an agent where

- `llm_signals` turns the span attributes and the bench's `inferwatch.bench.tle_bits` /
  `inferwatch.bench.rci` histograms into `llm.quality.*` per version (both sources);
- `delta_ab kind: quality` on the per-request `llm.request.quality` (1 − RCI) flags B;
- `coupled_model` with `quality_metric: llm.quality.score` fits a γ term for B.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import threading

import openai

from support import otlp
from support.agent import Ports, otlp_exporter
from support.prometheus import wait_until
from support.sim import FAST_ANSWERS, sim_bin, sims  # noqa: F401 (fixtures)

MODEL = "llama-quality"
PROMPTS = [f"Question {i}: what should I consider about topic number {i}?" for i in range(24)]
MAX_TOKENS = 24
BENCH_S = 30


def agent_config(ports: Ports, sink: str) -> dict:
    return {
        "receivers": {"otlp": {"protocols": {"grpc": {"endpoint": ports.grpc_endpoint}}}},
        "connectors": {"llm_signals": {"window": "2s", "flush_interval": "2s", "allowed_lateness": "1s",
                                       "per_request": True}},
        "processors": {
            "delta_ab": {"metric": "llm.request.quality", "kind": "quality", "statistic": "mean",
                         "baseline": "A", "candidate": "B", "window": "5s", "lookback": "30s",
                         "min_samples": 20, "allowed_lateness": "2s"},
            "coupled_model": {"quality_metric": "llm.quality.score", "latency_metric": "llm.e2e.p95",
                              "ttft_metric": "llm.ttft.p95", "throughput_metric": "llm.tokens.output.rate",
                              "group_by": ["gen_ai.request.model", "service.version", "service.instance.id",
                                           "source"],
                              "align": "2s", "min_updates": 3, "allowed_lateness": "2s"},
        },
        "exporters": {"otlp": otlp_exporter(sink)},
        "service": {
            "telemetry": {"metrics": {"address": f"127.0.0.1:{ports.metrics}"}},
            "pipelines": {
                "traces": {"receivers": ["otlp"], "exporters": ["llm_signals"]},
                "metrics": {"receivers": ["otlp"], "exporters": ["llm_signals"]},
                "metrics/signals": {"receivers": ["llm_signals"], "exporters": ["otlp"]},
                "metrics/ab": {"receivers": ["llm_signals"], "processors": ["delta_ab"], "exporters": ["otlp"]},
                "metrics/coupled": {"receivers": ["llm_signals"], "processors": ["coupled_model"],
                                    "exporters": ["otlp"]},
            },
        },
    }


def points(sink, name: str) -> list[dict]:
    """Every point of metric `name` the sink received: its attributes and value."""
    out = []
    for _, _, m in sink.metrics():
        if m.name != name:
            continue
        for p in otlp.data_points(m):
            value = p.as_double if p.WhichOneof("value") == "as_double" else float(p.as_int)
            out.append({**otlp.attrs(p.attributes), "value": value, "time": p.time_unix_nano})
    return out


def mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def test_quality_signals_flag_the_worse_version(sims, sim_bin, agents, grpc_sink, tmp_path):
    sink = grpc_sink()
    ports = Ports()
    agents("agent", agent_config(ports, sink.endpoint), ports)
    a = sims("a", "--served-model-name", MODEL, "--version", "A", "--seed", "7", config=FAST_ANSWERS)
    b = sims("b", "--served-model-name", MODEL, "--version", "B", "--seed", "7", "--quality-noise", "0.4",
             config=FAST_ANSWERS)

    # The references: A's answers, through the real openai client.
    client = openai.OpenAI(base_url=a.url + "/v1", api_key="none")
    dataset = tmp_path / "prompts.jsonl"
    with dataset.open("w") as f:
        for p in PROMPTS:
            r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": p}],
                                               max_tokens=MAX_TOKENS)
            answer = r.choices[0].message.content
            assert answer, r
            f.write(json.dumps({"prompt": p, "reference": answer, "max_tokens": MAX_TOKENS}) + "\n")

    reports: dict[str, dict] = {}
    errors: list[str] = []

    def bench(version: str, url: str) -> None:
        out = tmp_path / f"bench-{version}.json"
        env = dict(os.environ, OTEL_RESOURCE_ATTRIBUTES=f"service.version={version}")
        r = subprocess.run([sim_bin, "bench", "--endpoint", url, "--model", MODEL, "--rate", "4",
                            "--duration", f"{BENCH_S}s", "--dataset", str(dataset), "--logprobs", "5",
                            "--stream", "--otlp-endpoint", f"http://{ports.grpc_endpoint}", "--otlp-interval", "1s",
                            "--json", str(out), "--quiet"], capture_output=True, text=True, timeout=BENCH_S + 60,
                           env=env)
        if r.returncode != 0:
            errors.append(f"bench {version}: {r.returncode} {r.stderr}")
            return
        reports[version] = json.loads(out.read_text())

    threads = [threading.Thread(target=bench, args=(v, s.url)) for v, s in (("A", a), ("B", b))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors

    # --- the bench itself: B is worse on both, and the TLE threshold is K's -----------------
    qa, qb = reports["A"]["quality"], reports["B"]["quality"]
    print("bench A:", json.dumps(qa["rci"]["rci"]), json.dumps(qa["tle"]["bits"]))
    print("bench B:", json.dumps(qb["rci"]["rci"]), json.dumps(qb["tle"]["bits"]))
    assert qa["tle"]["k"] == 5 and math.isclose(qa["tle"]["threshold_bits"], 0.5 * math.log2(5)), qa["tle"]
    assert qa["rci"]["rci"]["mean"] < 0.01, "A answers as its own references"
    assert qb["rci"]["rci"]["mean"] > 0.2, qb["rci"]
    assert qb["tle"]["bits"]["mean"] > qa["tle"]["bits"]["mean"] + 0.1, (qa["tle"], qb["tle"])
    assert qb["tle"]["share_uncertain"] > qa["tle"]["share_uncertain"], (qa["tle"], qb["tle"])

    # --- llm_signals: per-version quality signals from the spans and from the bench's metrics ---
    def by(name: str, source: str, version: str) -> list[float]:
        return [p["value"] for p in points(sink, name)
                if p.get("source") == source and p.get("service.version") == version
                and p.get("gen_ai.request.model") == MODEL]

    for source in ("spans", "scrape"):
        wait_until(lambda: by("llm.quality.score", source, "A") and by("llm.quality.score", source, "B"), 60,
                   f"llm.quality.score of both versions from {source}")
        sa, sb = mean(by("llm.quality.score", source, "A")), mean(by("llm.quality.score", source, "B"))
        ta, tb = mean(by("llm.quality.tle.mean", source, "A")), mean(by("llm.quality.tle.mean", source, "B"))
        print(f"llm_signals ({source}): score A {sa:.3f} B {sb:.3f}; TLE mean A {ta:.3f} B {tb:.3f} bits")
        assert sa > 0.99 and sb < 0.8, (source, sa, sb)
        assert tb > ta + 0.1, (source, ta, tb)
        assert by("llm.quality.rci.p50", source, "B") and by("llm.quality.tle.p50", source, "A")
    # The windows of the bench's histograms hold the bench's own totals (none lost to a baseline).
    for v in ("A", "B"):
        # 1 − RCI mean, over windows weighted alike: close to the bench's own mean.
        bench_rci = reports[v]["quality"]["rci"]["rci"]["mean"]
        assert abs(mean(by("llm.quality.rci.mean", "scrape", v)) - bench_rci) < 0.15, v

    # --- delta_ab kind: quality flags B -----------------------------------------------------
    def verdicts() -> list[dict]:
        return [p for p in points(sink, "llm.anomaly.level") if p.get("detector") == "delta_ab"]

    wait_until(lambda: any(v.get("delta_ab.verdict") == "regression" for v in verdicts()), 60,
               "delta_ab's quality regression of B")
    reg = next(v for v in verdicts() if v.get("delta_ab.verdict") == "regression")
    print("delta_ab:", {k: reg[k] for k in reg if k.startswith("delta_ab.")})
    assert (reg["delta_ab.baseline"], reg["delta_ab.candidate"], reg["delta_ab.kind"]) == ("A", "B", "quality")
    assert reg["value"] >= 0.6 and reg["gen_ai.request.model"] == MODEL, reg
    assert reg["delta_ab.value_candidate"] < reg["delta_ab.value_baseline"] - 0.2, reg
    assert reg["delta_ab.n_baseline"] >= 20 and reg["delta_ab.n_candidate"] >= 20, reg

    # --- coupled_model fits a γ term on Q ---------------------------------------------------
    def gammas(version: str) -> list[float]:
        return [p["value"] for p in points(sink, "llm.coupled.gamma")
                if p.get("service.version") == version and p.get("source") == "spans"]

    wait_until(lambda: len(gammas("B")) >= 5, 60, "llm.coupled.gamma of B")
    g = gammas("B")
    print(f"coupled_model: γ of B over {len(g)} buckets, last {g[-1]:.4f} (initial 0.29)")
    assert all(math.isfinite(x) for x in g), g
    assert abs(g[-1] - 0.29) > 1e-6, "γ was fitted, not left at its starting value"
    assert a.stop() == 0 and b.stop() == 0

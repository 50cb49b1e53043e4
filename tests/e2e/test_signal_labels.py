"""Conventions of the derived series on the Prometheus endpoint (docs/llm-signals.md, "Groups" and
"Renamed in this version"), against the binary and `inferwatch sim` (which emits both request
spans over OTLP and vLLM's /metrics):

- a span-derived and a scrape-derived series of the same simulated server carry the same labels
  (model, service, version, instance; they differ only in `source`), so a dashboard filter on
  any of them keeps both;
- every derived family the shipped pipeline.yaml exports follows Prometheus' naming rules: no
  `_total` / `_count` / `_sum` / `_bucket` on a gauge, `_total` on every counter, `_ratio` only
  on true ratios, base units; none of the old names is left.
"""

from __future__ import annotations

import subprocess

import requests

from support.agent import REPO, Ports, free_port
from support.prometheus import wait_until
from support.sim import FAST_ANSWERS, parse_prometheus, sim_bin, sims  # noqa: F401 (fixtures)

MODEL = "labels-model"
VERSION = "0.9.1"
SERVICE = "vllm"

#: Derived gauges of unit `1` that are fractions 0-1 of something (the only `_ratio` names).
TRUE_RATIOS = {
    "llm_request_error_rate_ratio",
    "llm_kv_cache_usage_ratio",
    "llm_prefix_cache_hit_rate_ratio",
    "llm_slo_error_budget_remaining_ratio",
    "llm_slo_objective_ratio",
    "llm_coupled_r2_ratio",
}
#: Names of earlier versions (docs/llm-signals.md, "Renamed in this version").
OLD_NAMES = {
    "llm_request_count",
    "llm_prefix_cache_low_ratio",
    "llm_queue_blocking_ratio",
    "llm_anomaly_score_ratio",
    "llm_anomaly_level_ratio",
    "llm_coupled_alpha_ratio",
    "llm_coupled_beta_ratio",
    "llm_coupled_gamma_ratio",
}
#: Non-base units (Prometheus: seconds, bytes, ratio).
NON_BASE_UNITS = ("_milliseconds", "_microseconds", "_nanoseconds", "_minutes", "_hours", "_days", "_percent",
                  "_kilobytes", "_megabytes", "_gigabytes", "_kibibytes", "_mebibytes", "_gibibytes")


def scrape(port: int) -> dict:
    """The exporter's families ({} while its listener is not up yet: it may start after health)."""
    try:
        return parse_prometheus(requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text)
    except requests.ConnectionError:
        return {}


def series(fams: dict, name: str, **match) -> list[dict]:
    f = fams.get(name)
    if f is None:
        return []
    return [labels for (_, labels, _) in f.samples if all(labels.get(k) == v for k, v in match.items())]


def bench(sim_bin: str, url: str, seconds: int) -> subprocess.Popen:
    return subprocess.Popen([sim_bin, "bench", "--endpoint", url, "--model", MODEL, "--rate", "6",
                             "--duration", f"{seconds}s", "--max-tokens", "12", "--prompt-tokens", "200", "--stream",
                             "--quiet"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def test_span_and_scrape_derived_series_of_one_server_carry_the_same_labels(sims, agents, sim_bin):
    ports = Ports()
    prom_port = free_port()
    # The server as docs/llm-signals.md tells the operator to run it: its service name is the
    # scrape's job name, its version in its resource; vLLM V1 spans name no model.
    sim = sims("vllm", "--gpu", "a10g", "--served-model-name", MODEL, "--version", VERSION,
               "--otlp-traces-endpoint", f"grpc://{ports.grpc_endpoint}", "--otlp-batch-delay-ms", "100",
               config=FAST_ANSWERS,
               env={"OTEL_SERVICE_NAME": SERVICE, "OTEL_RESOURCE_ATTRIBUTES": f"gen_ai.request.model={MODEL}"})
    target = f"{sim.host}:{sim.port}"
    cfg = {
        "receivers": {
            "otlp": {"protocols": {"grpc": {"endpoint": ports.grpc_endpoint}}},
            "prometheus": {"config": {"scrape_configs": [
                {"job_name": SERVICE, "scrape_interval": "1s", "scrape_timeout": "1s",
                 "static_configs": [{"targets": [target], "labels": {"service_version": VERSION}}]},
            ]}},
        },
        # The agent beside one server: the spans get the scrape target as their instance.
        "processors": {"resource/instance": {"attributes": [
            {"key": "service.instance.id", "value": target, "action": "insert"}]}},
        "connectors": {"llm_signals": {"window": "2s", "flush_interval": "1s", "allowed_lateness": "1s"}},
        "exporters": {"prometheus": {"endpoint": f"127.0.0.1:{prom_port}"}},
        "extensions": {"health_check": {"endpoint": f"127.0.0.1:{ports.health}"}},
        "service": {
            "extensions": ["health_check"],
            "telemetry": {"metrics": {"address": f"127.0.0.1:{ports.metrics}"}},
            "pipelines": {
                "traces": {"receivers": ["otlp"], "processors": ["resource/instance"], "exporters": ["llm_signals"]},
                "metrics/scrape": {"receivers": ["prometheus"], "exporters": ["llm_signals"]},
                "metrics/signals": {"receivers": ["llm_signals"], "exporters": ["prometheus"]},
            },
        },
    }
    agents("agent", cfg, ports)
    load = bench(sim_bin, sim.url, 40)
    try:
        families = ["llm_request_rate_per_second", "llm_ttft_p95_seconds", "llm_queue_blocking"]

        def both():
            fams = scrape(prom_port)
            got = {(f, src): series(fams, f, gen_ai_request_model=MODEL, source=src)
                   for f in families for src in ("spans", "scrape")}
            return got if all(got.values()) else None

        got = wait_until(both, 60, lambda: f"span- and scrape-derived series: {both() or scrape(prom_port).keys()}")
    finally:
        load.terminate()
        load.wait(timeout=30)
    want = {"gen_ai_request_model": MODEL, "service_name": SERVICE, "service_version": VERSION,
            "service_instance_id": target}
    for f in families:
        spans = got[(f, "spans")][-1]
        scraped = got[(f, "scrape")][-1]
        print(f"{f}: spans {spans}\n{' ' * len(f)}  scrape {scraped}")
        for labels in (spans, scraped):
            assert {k: labels.get(k) for k in want} == want, f"{f}: {labels}"
        without_source = lambda d: {k: v for k, v in d.items() if k != "source"}  # noqa: E731
        assert without_source(spans) == without_source(scraped), f"{f}: the label sets differ"


def test_shipped_pipeline_exports_derived_names_that_follow_prometheus_rules(sims, agents, sim_bin, tmp_path):
    ports = Ports()
    prom_port = free_port()
    # As pipeline.yaml's header says to run vLLM: the model and an instance in its resource.
    sim = sims("vllm", "--gpu", "a10g", "--served-model-name", MODEL,
               "--otlp-traces-endpoint", f"grpc://{ports.grpc_endpoint}", "--otlp-batch-delay-ms", "100",
               config=FAST_ANSWERS,
               env={"OTEL_RESOURCE_ATTRIBUTES": f"gen_ai.request.model={MODEL},service.instance.id=sim-0"})
    env = {
        "INFERWATCH_GRPC_ENDPOINT": ports.grpc_endpoint,
        "INFERWATCH_HTTP_ENDPOINT": f"127.0.0.1:{ports.http}",
        "INFERWATCH_HEALTH_ENDPOINT": f"127.0.0.1:{ports.health}",
        "INFERWATCH_METRICS_ADDRESS": f"127.0.0.1:{ports.metrics}",
        "INFERWATCH_PROMETHEUS_ENDPOINT": f"127.0.0.1:{prom_port}",
        "VLLM_METRICS_TARGET": f"{sim.host}:{sim.port}",
        "VLLM_SCRAPE_INTERVAL": "1s",
        "LLM_SIGNALS_WINDOW": "2s",
        "INFERWATCH_STATE_DIR": str(tmp_path / "state"),
        "INFERWATCH_LSTM_AE_MODEL": str(REPO / "models" / "lstm_ae_default.onnx"),
    }
    agents("agent", (REPO / "pipeline.yaml").read_text(), ports, env=env)
    load = bench(sim_bin, sim.url, 60)
    # What a short run gives: golden signals of both sources (flags included) and the detectors'
    # scores and levels (slo_burn on every window, kv_pressure on every KV point).
    expected = {"llm_requests_finished", "llm_queue_blocking", "llm_prefix_cache_low", "llm_anomaly_score",
                "llm_anomaly_level", "llm_request_error_rate_ratio", "llm_kv_cache_usage_ratio",
                "gen_ai_server_time_to_first_token_seconds", "llm_slo_events_total"}
    try:
        fams = wait_until(lambda: (lambda f: f if expected <= f.keys() else None)(scrape(prom_port)), 90,
                          lambda: f"missing: {sorted(expected - scrape(prom_port).keys())}")
    finally:
        load.terminate()
        load.wait(timeout=30)
    derived = {n: f for n, f in fams.items() if n.startswith(("llm_", "gen_ai_"))}
    print("derived families:", ", ".join(f"{n} ({f.type})" for n, f in sorted(derived.items())))
    problems = []
    for n, f in derived.items():
        if f.type == "gauge" and n.endswith(("_total", "_count", "_sum", "_bucket", "_created")):
            problems.append(f"gauge {n} has a counter's or histogram's suffix")
        if f.type == "counter" and not n.endswith("_total"):
            problems.append(f"counter {n} lacks _total")
        if f.type in ("histogram", "summary") and n.endswith(("_total", "_ratio")):
            problems.append(f"{f.type} {n} has a gauge's or counter's suffix")
        if n.endswith("_ratio") and n not in TRUE_RATIOS:
            problems.append(f"{n} is named a ratio but is not one")
        if any(u in n for u in NON_BASE_UNITS):
            problems.append(f"{n} is not in base units")
    assert not problems, "\n".join(problems)
    assert not OLD_NAMES & fams.keys(), f"old names still exported: {sorted(OLD_NAMES & fams.keys())}"
    # Every span- and scrape-derived golden signal carries the same identifying label names.
    keys = {src: {k for labels in series(fams, "llm_request_rate_per_second", source=src) for k in labels}
            for src in ("spans", "scrape")}
    print("label names of llm_request_rate_per_second by source:", {k: sorted(v) for k, v in keys.items()})
    assert {"gen_ai_request_model", "service_name", "service_instance_id"} <= keys["spans"] & keys["scrape"], keys

"""Golden signals end to end: `inferwatch sim` (vLLM flavour, and TGI flavour) → the agent (its
OTLP spans, plus a scrape of its /metrics) → llm_signals → the prometheus exporter → a real
Prometheus. The per-model p95 TTFT Prometheus computes agrees with the bench client's own
measurement of the same run within the histogram's resolution; the TGI-flavoured server gives
the signals TGI can give (no TTFT); the Grafana dashboard's golden-signal queries all return data
(its SLO, anomaly, alert and GPU rows: test_dashboard.py)."""

from __future__ import annotations

import bisect
import json
import subprocess
from pathlib import Path

import pytest

from support import agent as agent_mod
from support import dashboard
from support.agent import Agent, Ports, free_port
from support.prometheus import Prometheus, wait_until
from support.sim import FAST_ANSWERS, sim_bin, sims  # noqa: F401 (fixtures)

REPO = Path(__file__).resolve().parents[2]
MODEL = "golden-model"
TGI_MODEL = "tgi-model"
# gen_ai.server.time_to_first_token buckets (semconv), the resolution of the Prometheus estimate.
TTFT_BOUNDS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0]


def bucket_of(v: float) -> tuple[float, float]:
    i = bisect.bisect_left(TTFT_BOUNDS, v)
    lo = TTFT_BOUNDS[i - 1] if i > 0 else 0.0
    hi = TTFT_BOUNDS[i] if i < len(TTFT_BOUNDS) else float("inf")
    return lo, hi


def agent_config(ports: Ports, prom_port: int, vllm_target: str, tgi_target: str) -> dict:
    return {
        "receivers": {
            "otlp": {"protocols": {"grpc": {"endpoint": ports.grpc_endpoint}}},
            "prometheus": {"config": {"scrape_configs": [
                {"job_name": "vllm", "scrape_interval": "1s", "scrape_timeout": "1s",
                 "static_configs": [{"targets": [vllm_target]}]},
                {"job_name": "tgi", "scrape_interval": "1s", "scrape_timeout": "1s",
                 "static_configs": [{"targets": [tgi_target]}]},
            ]}},
        },
        "processors": {"batch": {"timeout": "100ms"}},
        "connectors": {"llm_signals": {"window": "5s", "flush_interval": "1s", "allowed_lateness": "1s"}},
        "exporters": {"prometheus": {"endpoint": f"127.0.0.1:{prom_port}"}},
        "extensions": {"health_check": {"endpoint": f"127.0.0.1:{ports.health}"}},
        "service": {
            "extensions": ["health_check"],
            "telemetry": {"metrics": {"address": f"127.0.0.1:{ports.metrics}"}},
            "pipelines": {
                "traces": {"receivers": ["otlp"], "processors": ["batch"], "exporters": ["llm_signals"]},
                "metrics/scrape": {"receivers": ["prometheus"], "exporters": ["llm_signals", "prometheus"]},
                "metrics/signals": {"receivers": ["llm_signals"], "exporters": ["prometheus"]},
            },
        },
    }


def names(prom: Prometheus, pattern: str) -> list[str]:
    return sorted({s["__name__"] for s in prom.series(f'{{__name__=~"{pattern}"}}')})


def test_sim_agent_prometheus_ttft_matches_the_bench_client(sims, sim_bin, tmp_path, request, monkeypatch):
    ports = Ports()
    prom_port = free_port()
    monkeypatch.setattr(agent_mod, "binary", lambda: sim_bin)
    # vLLM V1 spans carry no model: the operator names it in the resource, as docs/llm-signals.md says.
    # The simulators start first (their span exporter connects when the first span is due).
    sim = sims("vllm", "--gpu", "a10g", "--served-model-name", MODEL,
               "--otlp-traces-endpoint", f"grpc://{ports.grpc_endpoint}", "--otlp-batch-delay-ms", "100",
               config=FAST_ANSWERS, env={"OTEL_RESOURCE_ATTRIBUTES": f"gen_ai.request.model={MODEL}"})
    tgi = sims("tgi", "--flavor", "tgi", "--gpu", "a10g", "--served-model-name", TGI_MODEL, config=FAST_ANSWERS)
    agent = Agent("agent", agent_config(ports, prom_port, f"127.0.0.1:{sim.port}", f"127.0.0.1:{tgi.port}"),
                  ports, tmp_path)
    request.node._inferwatch_agents = [agent]
    prom = Prometheus(tmp_path, {"inferwatch": f"127.0.0.1:{prom_port}"}, remote_write_receiver=False)
    try:
        agent.start()
        prom.start()
        out = tmp_path / "bench.json"
        r = subprocess.run([sim_bin, "bench", "--endpoint", sim.url, "--model", MODEL, "--rate", "8",
                            "--duration", "12s", "--max-tokens", "12", "--prompt-tokens", "300", "--stream",
                            "--json", str(out), "--quiet"], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        tr = subprocess.run([sim_bin, "bench", "--endpoint", tgi.url, "--model", TGI_MODEL, "--rate", "4",
                             "--duration", "4s", "--max-tokens", "8", "--quiet"], capture_output=True, text=True,
                            timeout=60)
        assert tr.returncode == 0, tr.stderr
        # Event time moves only with data: a little trailing traffic moves the watermark past the
        # main run's last requests, so their flush is due (data-driven, not a wait).
        trail = subprocess.run([sim_bin, "bench", "--endpoint", sim.url, "--model", MODEL, "--rate", "4",
                                "--duration", "3s", "--max-tokens", "4", "--quiet"], capture_output=True, text=True,
                               timeout=60)
        assert trail.returncode == 0, trail.stderr
        report = json.loads(out.read_text())
        n = report["ttft"]["count"]
        bench_p95 = report["ttft"]["p95"]
        assert n >= 60, report["requests"]

        # --- spans → cumulative semconv histogram → Prometheus -------------------------------
        model = f'gen_ai_request_model="{MODEL}"'

        def hist_count():
            rows = prom.query(f'sum({{__name__=~"gen_ai_server_time_to_first_token.*_count",{model}}})')
            return rows and rows[0]["value"] >= n

        wait_until(hist_count, 60, lambda: f"TTFT histogram count; names: {names(prom, 'gen_ai.*|llm.*')}")
        bucket_name = names(prom, "gen_ai_server_time_to_first_token.*_bucket")[0]
        est = prom.query(f'histogram_quantile(0.95, sum by (le) ({bucket_name}{{{model}}}))')[0]["value"]
        lo, hi = bucket_of(bench_p95)
        # The estimate interpolates inside the bucket holding the 95th rank; the client's TTFT adds
        # its HTTP overhead to the server's, so allow the neighbouring bucket below.
        i = TTFT_BOUNDS.index(hi) if hi in TTFT_BOUNDS else len(TTFT_BOUNDS)
        lower = TTFT_BOUNDS[i - 2] if i >= 2 else 0.0
        print(f"TTFT p95: bench {bench_p95:.4f} s over {n} requests, Prometheus histogram_quantile {est:.4f} s")
        assert lower <= est <= hi, f"Prometheus p95 {est} vs bench p95 {bench_p95} (bucket {lo}..{hi})"

        # --- windowed DDSketch p95 from spans, and from the scraped vllm histogram -------------
        def gauge(pattern: str, extra: str):
            ns = names(prom, pattern)
            if not ns:
                return None
            rows = prom.query(f'max_over_time({ns[0]}{{{extra}}}[5m])')
            return rows

        spans_p95 = wait_until(lambda: gauge("llm_ttft_p95.*", f'{model},source="spans"'), 60, "llm.ttft.p95 spans")
        print(f"llm.ttft.p95 (spans, per window) max {max(r['value'] for r in spans_p95):.4f} s")
        assert 0 < max(r["value"] for r in spans_p95) < 2 * bench_p95 + 0.05
        scrape_p95 = wait_until(lambda: gauge("llm_ttft_p95.*", f'{model},source="scrape"'), 60, "llm.ttft.p95 scrape")
        assert max(r["value"] for r in scrape_p95) > 0
        for pat in ("llm_kv_cache_usage.*", "llm_requests_running.*", "llm_requests_waiting.*",
                    "llm_request_rate.*", "llm_tokens_output_rate.*"):
            wait_until(lambda: gauge(pat, model), 60, f"{pat} for {MODEL}")

        # --- TGI flavour: what TGI can give, under the model from /info ------------------------
        tgi_model = f'gen_ai_request_model="{TGI_MODEL}"'
        for pat in ("llm_requests_waiting.*", "llm_requests_running.*", "llm_e2e_p95.*", "llm_request_rate.*"):
            wait_until(lambda: gauge(pat, tgi_model), 60, f"{pat} for {TGI_MODEL}")
        assert not gauge("llm_ttft_p95.*", tgi_model), "TGI has no TTFT, none may be invented"

        # --- the Grafana dashboard's golden-signal queries return data ------------------------
        # (the SLO, anomaly, alert and GPU rows need the full agent: test_dashboard.py)
        golden = dashboard.rows(dashboard.load())["Golden signals"]
        exprs = dashboard.queries(golden)
        assert len(exprs) >= 8
        for _, e in exprs:
            q = dashboard.substitute(e, {"model": MODEL})
            wait_until(lambda: prom.query(q), 60, f"dashboard query returns data: {q}")
        assert sim.stop() == 0 and tgi.stop() == 0
        assert agent.stop() == 0
    finally:
        prom.stop()
        agent.kill()


def test_dashboard_json_is_importable_and_its_queries_parse(tmp_path):
    """The dashboard's structure as Grafana's import needs it, and every query accepted by promtool."""
    import shutil

    from support import yamlgen

    dash = dashboard.load()
    for key in ("uid", "title", "panels", "templating", "schemaVersion", "__inputs"):
        assert key in dash, key
    variables = dashboard.variables(dash)
    assert {"datasource", "model", "version", "instance", "slo", "detector", "gpu"} <= variables
    for v in dash["templating"]["list"]:
        if v["type"] == "query":
            used = dashboard.used_variables(v["definition"])
            assert used <= variables, f"variable {v['name']}: undefined variables {used - variables}"
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    assert set(dashboard.rows(dash)) == {"Golden signals", "SLOs", "Anomaly levels", "Active alerts", "GPU"}
    # No two panels overlap on Grafana's 24-column grid.
    cells: dict[tuple[int, int], str] = {}
    exprs = []
    for p in dash["panels"]:
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24 and g["h"] > 0, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = p["title"]
        if p["type"] == "row":
            assert g["w"] == 24 and g["h"] == 1 and "targets" not in p, p["title"]
            continue
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)) and p["targets"], p["title"]
        for t in p["targets"]:
            used = dashboard.used_variables(t["expr"])
            assert used <= variables, f"{p['title']}: undefined variables {used - variables}"
            exprs.append(t["expr"])
    promtool = shutil.which("promtool") or "/usr/bin/promtool"
    if not Path(promtool).exists():
        pytest.skip("promtool not installed (scripts/test.sh installs it)")
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query{i}", "expr": dashboard.substitute(e, {"model": "m"})}
        for i, e in enumerate(exprs)]}]}
    f = tmp_path / "rules.yml"
    f.write_text(yamlgen.dump(rules))
    r = subprocess.run([promtool, "check", "rules", str(f)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"{len(exprs)} rules found" in r.stdout + r.stderr


@pytest.mark.parametrize("role,pipelines", [("sidecar", 4), ("node-agent", 5)])
def test_deploy_pipeline_example_is_valid(run_cli, role, pipelines):
    r = run_cli("validate", "--config", str(REPO / "deploy" / "pipelines" / f"{role}.yaml"))
    assert r.returncode == 0, r.stderr
    assert f"{pipelines} pipelines" in r.stdout

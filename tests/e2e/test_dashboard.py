"""The whole Grafana dashboard against the early-warning agent: `inferwatch sim` (vLLM flavour, its
spans and a scrape of its /metrics) → llm_signals → the `slo` processor and the `zscore_skew` and
`kv_pressure` detectors → the `alerts` connector and the prometheus exporter, plus an `nvml`
receiver on its scripted fake GPUs (`source: fake`) → a real Prometheus that also evaluates
deploy/prometheus/inferwatch-rules.yml. Every query of every panel returns data, and the rows show
what the agent was made to do: one SLO that is always broken and one that always holds, detector
levels at and above warning, alerts held by the connector and pending or firing in Prometheus, the
fake GPUs' exact readings and their throttling episode.

The Prometheus rules themselves: `promtool check` of the deploy config and `promtool test rules`
of deploy/prometheus/inferwatch-rules.test.yml."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from support import agent as agent_mod
from support import dashboard
from support.agent import Agent, Ports, free_port
from support.prometheus import Prometheus, wait_until
from support.sim import FAST_ANSWERS, sim_bin, sims  # noqa: F401 (fixtures)

REPO = Path(__file__).resolve().parents[2]
PROM_DIR = REPO / "deploy" / "prometheus"
MODEL = "dash-model"
GIB = 1 << 30
#: Always broken: no TTFT is 1 µs or less.
BAD_SLO = "ttft-p95-strict"
#: Always held: no request of the run takes a minute.
GOOD_SLO = "e2e-p99-loose"
WINDOWS = {"5m", "30m", "1h", "2h", "6h", "1d", "3d"}
#: The embedded forecast on seconds-long aggregates, so that a breach (already breached: ETA 0) is
#: reported within the run instead of after days of hourly history.
FAST_FORECAST = {"aggregate": "1s", "history": "20s", "min_history": "3s", "recent": [], "seasonality": []}


def agent_config(ports: Ports, prom_port: int, vllm_target: str) -> dict:
    return {
        "receivers": {
            "otlp": {"protocols": {"grpc": {"endpoint": ports.grpc_endpoint}}},
            "prometheus": {"config": {"scrape_configs": [
                {"job_name": "vllm", "scrape_interval": "1s", "scrape_timeout": "1s",
                 "static_configs": [{"targets": [vllm_target]}]},
            ]}},
            "nvml": {"source": "fake", "fake_gpus": 2, "collection_interval": "200ms", "host_name": "gpu-host"},
        },
        "processors": {
            "batch": {"timeout": "100ms"},
            "slo": {"objectives": [
                {"name": BAD_SLO, "signal": "llm.ttft.p95", "threshold": "1us", "target": "99%", "period": "28d",
                 "source": "spans", "by": ["gen_ai.request.model"], "forecast": FAST_FORECAST},
                {"name": GOOD_SLO, "signal": "llm.e2e.p99", "threshold": "60s", "target": "99%", "period": "28d",
                 "source": "spans", "by": ["gen_ai.request.model"], "forecast": FAST_FORECAST},
            ]},
            "zscore_skew": {"metrics": ["llm.ttft.p95", "llm.tpot.p95"], "window": 3},
            # Thresholds every healthy server crosses: usage >= 0 always holds (level >= 0.6, a
            # warning), queue p99 > 0 s whenever a request queued at all (critical).
            "kv_pressure": {"thresholds": {"usage": 0.0, "queue_p99_s": 0.0}},
        },
        "connectors": {
            "llm_signals": {"window": "2s", "flush_interval": "1s", "allowed_lateness": "1s"},
            "alerts": {},
        },
        "exporters": {
            "prometheus": {"endpoint": f"127.0.0.1:{prom_port}"},
            "debug": {"verbosity": "basic"},
        },
        "extensions": {"health_check": {"endpoint": f"127.0.0.1:{ports.health}"}},
        "service": {
            "extensions": ["health_check"],
            "telemetry": {"metrics": {"address": f"127.0.0.1:{ports.metrics}"}},
            "pipelines": {
                "traces": {"receivers": ["otlp"], "processors": ["batch"], "exporters": ["llm_signals"]},
                "metrics/scrape": {"receivers": ["prometheus"], "exporters": ["llm_signals", "prometheus"]},
                "metrics/detect": {"receivers": ["llm_signals"],
                                   "processors": ["slo", "zscore_skew", "kv_pressure"],
                                   "exporters": ["alerts", "prometheus"]},
                "metrics/gpu": {"receivers": ["nvml"], "exporters": ["prometheus"]},
                "logs/alerts": {"receivers": ["alerts"], "exporters": ["debug"]},
            },
        },
    }


def test_every_dashboard_panel_has_data_from_the_early_warning_agent(sims, sim_bin, tmp_path, request,
                                                                     monkeypatch):
    ports = Ports()
    prom_port = free_port()
    monkeypatch.setattr(agent_mod, "binary", lambda: sim_bin)
    sim = sims("vllm", "--gpu", "a10g", "--served-model-name", MODEL,
               "--otlp-traces-endpoint", f"grpc://{ports.grpc_endpoint}", "--otlp-batch-delay-ms", "100",
               config=FAST_ANSWERS, env={"OTEL_RESOURCE_ATTRIBUTES": f"gen_ai.request.model={MODEL}"})
    agent = Agent("agent", agent_config(ports, prom_port, f"127.0.0.1:{sim.port}"), ports, tmp_path)
    request.node._inferwatch_agents.append(agent)
    # The job names of deploy/prometheus/prometheus.yml, which the rules' agent-down alerts name.
    prom = Prometheus(tmp_path, {"inferwatch-signals": f"127.0.0.1:{prom_port}",
                                 "inferwatch-self": f"127.0.0.1:{ports.metrics}"},
                      remote_write_receiver=False, rule_files=(PROM_DIR / "inferwatch-rules.yml",))
    bench = None
    try:
        agent.start()
        prom.start()
        # Traffic for the whole check (event time moves only with data); stopped once all holds.
        bench = subprocess.Popen([sim_bin, "bench", "--endpoint", sim.url, "--model", MODEL, "--rate", "8",
                                  "--duration", "120s", "--max-tokens", "12", "--prompt-tokens", "300", "--stream",
                                  "--quiet"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        model = f'gen_ai_request_model="{MODEL}"'

        # --- SLOs: one always broken, one always held ----------------------------------------
        def slo_rows(name: str, slo: str, extra: str = ""):
            return prom.query(f'{name}{{{model},slo="{slo}"{extra}}}')

        burn = wait_until(lambda: {r["metric"]["window"] for r in slo_rows("llm_slo_burn_rate", BAD_SLO)} == WINDOWS
                          and slo_rows("llm_slo_burn_rate", BAD_SLO, ',window="5m"'), 90,
                          lambda: f"burn rates of {BAD_SLO}: {slo_rows('llm_slo_burn_rate', BAD_SLO)}")
        # Every event bad: burn rate = 1 / (1 - 0.99) on every window, the budget 1 - 100 = -99.
        bad_burn = wait_until(lambda: [r for r in slo_rows("llm_slo_burn_rate", BAD_SLO) if r["value"] > 0]
                              and slo_rows("llm_slo_burn_rate", BAD_SLO), 30, f"burn of {BAD_SLO}")
        assert all(abs(r["value"] - 100.0) < 1e-6 for r in bad_burn), bad_burn
        assert burn[0]["metric"]["slo_signal"] == "llm.ttft.p95", burn
        good_burn = wait_until(lambda: slo_rows("llm_slo_burn_rate", GOOD_SLO), 30, f"burn rates of {GOOD_SLO}")
        assert {r["metric"]["window"] for r in good_burn} == WINDOWS, good_burn
        assert all(r["value"] == 0 for r in good_burn), good_burn
        good_budget = wait_until(lambda: slo_rows("llm_slo_error_budget_remaining_ratio", GOOD_SLO), 30,
                                 f"budget of {GOOD_SLO}")
        assert [r["value"] for r in good_budget] == [1.0], good_budget
        bad_budget = wait_until(lambda: slo_rows("llm_slo_error_budget_remaining_ratio", BAD_SLO), 30,
                                f"budget of {BAD_SLO}")
        assert all(abs(r["value"] + 99.0) < 1e-6 for r in bad_budget), bad_budget
        objective = wait_until(lambda: slo_rows("llm_slo_objective_ratio", BAD_SLO), 30, "objective")
        assert abs(objective[0]["value"] - 0.99) < 1e-9, objective
        assert objective[0]["metric"].get("slo_signal") == "llm.ttft.p95", objective

        # --- anomaly levels: the three detectors, a warning at least --------------------------
        def detectors():
            return {r["metric"].get("detector") for r in prom.query(f"llm_anomaly_level{{{model}}}")}

        wait_until(lambda: {"slo_burn", "zscore_skew", "kv_pressure"} <= detectors(), 60,
                   lambda: f"detectors with levels: {detectors()}")
        wait_until(lambda: prom.query(f'llm_anomaly_level{{{model},detector="kv_pressure"}} >= 0.6'), 60,
                   "kv_pressure at warning (usage >= 0)")
        # The agent's alerts connector holds the alerts of those levels.
        wait_until(lambda: prom.query('inferwatch_processor_series{processor="alerts"} >= 1'), 60,
                   lambda: f"alerts held: {prom.query('inferwatch_processor_series')}")
        # Prometheus' rules on the same series: the broken SLO pages (pending: for 2m) and its
        # breach is forecast (ETA 0, already breached: firing at once); the held SLO raises nothing.
        def rule_alerts() -> set[tuple[str, str, str]]:
            return {(a["labels"]["alertname"], a["labels"].get("slo", ""), a["state"]) for a in prom.alerts()
                    if a["labels"].get("model") == MODEL}

        want = {("LLMSLOBurnRatePage", BAD_SLO, "pending"), ("LLMSLOBreachForecast", BAD_SLO, "firing")}
        wait_until(lambda: want <= rule_alerts(), 60, lambda: f"Prometheus alerts: {rule_alerts()}")
        assert not {a for a in rule_alerts() if a[1] == GOOD_SLO}, rule_alerts()

        # --- GPU: the fake's exact readings, both GPUs ----------------------------------------
        used = wait_until(lambda: len(prom.query("hw_gpu_memory_usage_bytes")) == 2
                          and prom.query("hw_gpu_memory_usage_bytes"), 60, "hw_gpu_memory_usage_bytes of 2 GPUs")
        assert sorted(r["metric"]["gpu_index"] for r in used) == ["0", "1"], used
        assert all(r["value"] == 40 * GIB for r in used), used
        assert [r["value"] for r in prom.query("hw_gpu_memory_limit_bytes")] == [80 * GIB] * 2
        assert [r["value"] for r in prom.query("hw_gpu_utilization_ratio")] == [0.75] * 2
        assert [r["value"] for r in prom.query("hw_power_watts")] == [350.5] * 2
        # Samples 50..99 (10 s to 20 s at 200 ms) are throttled by sw_power_cap, nothing else ever.
        wait_until(lambda: len(prom.query(
            'max_over_time(hw_gpu_throttle_ratio{hw_gpu_throttle_reason="sw_power_cap"}[5m]) == 1')) == 2, 60,
            "the fake GPUs' sw_power_cap episode")
        assert not prom.query('max_over_time(hw_gpu_throttle_ratio{hw_gpu_throttle_reason!="sw_power_cap"}[5m]) > 0')

        # --- every query of every panel returns data ------------------------------------------
        def show(q: str) -> str:
            return ", ".join(f"{r['metric'].get('slo') or r['metric'].get('detector')}"
                             f"{'/' + r['metric']['window'] if 'window' in r['metric'] else ''}={r['value']:.4g}"
                             for r in prom.query(q))
        print(f"burn rates: {show(f'llm_slo_burn_rate{{{model}}}')}")
        print(f"budget remaining: {show(f'llm_slo_error_budget_remaining_ratio{{{model}}}')}")
        print(f"breach ETA (s): {show(f'llm_slo_breach_eta_seconds{{{model}}}')}")
        print(f"levels: {show(f'max by (detector) (llm_anomaly_level{{{model}}})')}")
        print("Prometheus alerts: " + ", ".join(sorted({f"{a['labels']['alertname']} {a['state']}"
                                                        for a in prom.alerts()})))
        by_row = dashboard.rows(dashboard.load())
        for row, panels in by_row.items():
            for panel, expr in dashboard.queries(panels):
                q = dashboard.substitute(expr, {"model": MODEL})
                wait_until(lambda: prom.query(q), 60, f"{row} / {panel['title']}: no data for {q}")
        bench.terminate()
        bench.wait(timeout=30)
        assert sim.stop() == 0
        assert agent.stop() == 0
    finally:
        if bench is not None and bench.poll() is None:
            bench.kill()
            bench.wait(timeout=10)
        prom.stop()
        agent.kill()


def promtool() -> str:
    p = shutil.which("promtool") or "/usr/bin/promtool"
    if not Path(p).exists():
        pytest.skip("promtool not installed (scripts/test.sh installs it)")
    return p


def test_deploy_prometheus_config_and_rules_are_valid():
    """deploy/prometheus/prometheus.yml loads inferwatch-rules.yml, and both check."""
    r = subprocess.run([promtool(), "check", "config", str(PROM_DIR / "prometheus.yml")], capture_output=True,
                       text=True, timeout=60)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "inferwatch-rules.yml" in out and "6 rules found" in out, out


def test_prometheus_rules_unit_tests():
    """promtool test rules: burn-rate pairs (page, ticket, and the one-window cases that must not
    fire), the breach forecast, anomaly levels, the agent down or absent (inferwatch-rules.test.yml)."""
    r = subprocess.run([promtool(), "test", "rules", str(PROM_DIR / "inferwatch-rules.test.yml")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout + r.stderr

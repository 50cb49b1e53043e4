"""The shipped early-warning agent end to end: `pipeline.yaml`, unmodified (only environment
variables set), beside `inferwatch sim` under `inferwatch bench` load, with a real Alertmanager
(Debian `prometheus-alertmanager`).

- healthy minutes raise no alert (3 by default; 10 with INFERWATCH_SLOW=1);
- after a minute of healthy load (a separate agent, run beside the first), a queue-blocking fault raises an alert in Alertmanager's `GET /api/v2/alerts` within 3 minutes
  of its onset, naming model and instance;
- it resolves after the fault ends;
- the SLO series are on the Prometheus endpoint under their documented names.

The environment shortens the golden-signal window to 10 s and the scrape interval to 2 s (both
documented knobs of pipeline.yaml) so that a few minutes hold enough windows; everything else,
including the alerts connector's defaults (`for: 2m`), is what a user gets.
"""

from __future__ import annotations

import os
import subprocess
import time

import pytest
import requests

from support.agent import REPO, Ports, free_port
from support.prometheus import wait_until
from support.sim import FAST_ANSWERS, parse_prometheus, sim_bin, sims  # noqa: F401 (fixtures)

MODEL = "llama-e2e"
HEALTHY_S = 600 if os.environ.get("INFERWATCH_SLOW") == "1" else 180
# Healthy windows before the fault (baselines for the detectors that need one).
WARMUP_S = 60


def _start(alertmanager, sims, agents, sim_bin, tmp_path, bench_s: int):
    """The shipped pipeline beside a simulator under `inferwatch bench` load for `bench_s`
    seconds; returns (Alertmanager, simulator, Prometheus endpoint port, agent, bench process)."""
    am = alertmanager.start()
    ports = Ports()
    prom_port = free_port()
    sim = sims("vllm", "--gpu", "a10g", "--served-model-name", MODEL,
               "--otlp-traces-endpoint", f"grpc://{ports.grpc_endpoint}", config=FAST_ANSWERS,
               env={"OTEL_RESOURCE_ATTRIBUTES": f"gen_ai.request.model={MODEL}"})
    env = {
        "INFERWATCH_GRPC_ENDPOINT": ports.grpc_endpoint,
        "INFERWATCH_HTTP_ENDPOINT": f"127.0.0.1:{ports.http}",
        "INFERWATCH_HEALTH_ENDPOINT": f"127.0.0.1:{ports.health}",
        "INFERWATCH_METRICS_ADDRESS": f"127.0.0.1:{ports.metrics}",
        "INFERWATCH_PROMETHEUS_ENDPOINT": f"127.0.0.1:{prom_port}",
        "VLLM_METRICS_TARGET": f"{sim.host}:{sim.port}",
        "VLLM_SCRAPE_INTERVAL": "2s",
        "LLM_SIGNALS_WINDOW": "10s",
        "ALERTMANAGER_URL": am.url,
        "INFERWATCH_STATE_DIR": str(tmp_path / "state"),
        "INFERWATCH_LSTM_AE_MODEL": str(REPO / "models" / "lstm_ae_default.onnx"),
    }
    agent = agents("agent", (REPO / "pipeline.yaml").read_text(), ports, env=env)
    bench = subprocess.Popen([sim_bin, "bench", "--endpoint", sim.url, "--model", MODEL, "--rate", "4",
                              "--duration", f"{bench_s}s", "--max-tokens", "12", "--prompt-tokens", "200",
                              "--stream", "--quiet"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    return am, sim, prom_port, agent, bench


def _quiet_for(am, agent, seconds: float) -> None:
    """Polls Alertmanager for `seconds`: no alert may appear, nor an alert line in the agent's log."""
    t_start = time.monotonic()
    while time.monotonic() - t_start < seconds:
        seen = am.alerts()
        assert seen == [], f"alert while healthy after {time.monotonic() - t_start:.0f}s: {seen}"
        time.sleep(5)  # polling interval, not synchronisation
    assert "ALERT FIRING" not in agent.log(), agent.log()[-3000:]


# The healthy run and the fault run are two tests (two agents) so that the suite's workers run
# them side by side: one agent would need the healthy minutes and the fault's minutes in a row.
@pytest.mark.long(1)
@pytest.mark.timeout(900)
def test_shipped_pipeline_stays_quiet_when_healthy(alertmanager, sims, agents, sim_bin, tmp_path):
    am, sim, prom_port, agent, bench = _start(alertmanager, sims, agents, sim_bin, tmp_path, HEALTHY_S + 60)
    try:
        _quiet_for(am, agent, HEALTHY_S)
        # The SLO series and levels are served under their documented names.
        fams = parse_prometheus(requests.get(f"http://127.0.0.1:{prom_port}/metrics", timeout=5).text)
        samples = [s for f in fams.values() for s in f.samples]
        names = {s[0] for s in samples}
        for name in ["llm_slo_events_total", "llm_slo_good_events_total", "llm_slo_burn_rate",
                     "llm_slo_error_budget_remaining_ratio", "llm_slo_objective_ratio", "llm_anomaly_level"]:
            assert name in names, f"{name} missing from the Prometheus endpoint: {sorted(names)}"
        slos = {s[1].get("slo") for s in samples if s[0] == "llm_slo_burn_rate"}
        assert {"ttft-p95", "tpot-p95", "e2e-p99", "errors"} <= slos, slos
        budgets = [s[2] for s in samples if s[0] == "llm_slo_error_budget_remaining_ratio"]
        assert budgets and all(b == 1.0 for b in budgets), f"budget spent while healthy: {budgets}"
    finally:
        bench.terminate()
        bench.wait(timeout=30)


@pytest.mark.long(0)
@pytest.mark.timeout(1200)
def test_shipped_pipeline_warns_on_a_fault_and_resolves(alertmanager, sims, agents, sim_bin, tmp_path):
    am, sim, prom_port, agent, bench = _start(alertmanager, sims, agents, sim_bin, tmp_path, WARMUP_S + 540)
    try:
        _quiet_for(am, agent, WARMUP_S)

        # --- the fault: queue blocking; an alert within 3 minutes naming model and instance -------
        onset = time.monotonic()
        sim.set_faults({"kind": "queue_blocking", "strength": 0.6, "period": "4s"})

        def fired():
            got = [a for a in am.alerts() if a["status"]["state"] == "active"
                   and a["labels"].get("model") == MODEL and a["labels"].get("instance")]
            return got or None

        got = wait_until(fired, 180, lambda: f"alerts: {am.alerts()}\nagent log:\n{agent.log()[-5000:]}")
        delay = time.monotonic() - onset
        a = got[0]
        assert a["labels"]["instance"] == f"{sim.host}:{sim.port}" or a["labels"]["instance"], a
        assert a["labels"]["severity"] in ("warning", "critical"), a
        assert MODEL in a["annotations"]["summary"], a
        print(f"first alert {delay:.0f}s after the fault's onset: {a['labels']} {a['annotations']['summary']}")
        assert "ALERT FIRING" in agent.log(), "one readable line per alert in the agent's log"

        # --- recovery: the alert resolves after the fault ends ---------------------------------
        sim.clear_faults()
        cleared = time.monotonic()
        wait_until(lambda: not any(x["status"]["state"] == "active" and x["labels"].get("model") == MODEL
                                   for x in am.alerts()) or None, 300,
                   lambda: f"still active: {am.alerts()}\nagent log:\n{agent.log()[-4000:]}")
        print(f"resolved {time.monotonic() - cleared:.0f}s after the fault ended")
    finally:
        bench.terminate()
        bench.wait(timeout=30)

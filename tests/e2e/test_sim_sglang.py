"""`inferwatch sim --flavor sglang` as an SGLang 0.5.23 server (`--enable-metrics --enable-trace`)
appears to its clients and to the agent (tests/fixtures/servers/sglang-0.5.23.*, issue 20):

- the real openai Python client against its OpenAI API (chat and completions, whole and streamed),
  SGLang's own `/model_info`, `/get_model_info`, `/health`, `/health_generate`, and `/metrics`
  counting exactly those requests;
- its OTLP spans in SGLang's shape (root span `" Req <rid[:8]>"`, the finish reason as a JSON
  string, ERROR only on the scheduler thread span of an aborted request), through a real agent;
- the agent (`inferwatch run`: a prometheus receiver scraping the sim, llm_signals, the prometheus
  exporter) derives TTFT, e2e, queue and KV signals for the SGLang model from `sglang:*` alone, and
  its TTFT agrees with what the bench client measured within the histogram's resolution.
"""

from __future__ import annotations

import bisect
import json
import statistics
import subprocess
import threading

import requests

from support import agent as agent_mod
from support.agent import Agent, Ports, free_port, make_config, otlp_exporter
from support.otlp import attrs
from support.prometheus import wait_until
from support.sim import FAST_ANSWERS, parse_prometheus, sample_value, sim_bin, sims, stream_call  # noqa: F401

MODEL = "sglang-model"
# sglang:time_to_first_token_seconds buckets (from 0.1 s) and e2e buckets
TTFT_BOUNDS = [0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400]
E2E_BOUNDS = [0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 600, 1200, 1800, 2400]


def around(bounds: list[float], v: float) -> tuple[float, float]:
    """The bucket holding `v` widened by one bucket on each side: what a histogram of these bounds
    can resolve of a quantile at `v`."""
    i = bisect.bisect_left(bounds, v)
    lo = bounds[i - 2] if i >= 2 else 0.0
    hi = bounds[i + 1] if i + 1 < len(bounds) else float("inf")
    return lo, hi


def test_openai_client_and_sglang_endpoints(sims):
    sim = sims("sglang", "--flavor", "sglang", "--gpu", "a10g", "--served-model-name", MODEL, config=FAST_ANSWERS)
    c = sim.client()
    assert [m.id for m in c.models.list().data] == [MODEL]
    r = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hello there"}], max_tokens=6)
    assert r.choices[0].message.content and r.usage.completion_tokens <= 6
    cmpl = c.completions.create(model=MODEL, prompt="one two three", max_tokens=5, extra_body={"ignore_eos": True})
    assert cmpl.usage.completion_tokens == 5 and cmpl.choices[0].finish_reason == "length"
    s = stream_call(c.chat.completions.create, True, model=MODEL, messages=[{"role": "user", "content": "stream"}],
                    max_tokens=7, stream_options={"include_usage": True})
    assert s.usage.completion_tokens == len(s.content) > 0

    info = requests.get(sim.url + "/model_info", timeout=5)
    assert info.status_code == 200, info.text
    body = info.json()
    assert list(body)[:4] == ["model_path", "served_model_name", "tokenizer_path", "is_generation"]
    assert body["served_model_name"] == MODEL and body["is_generation"] is True
    assert requests.get(sim.url + "/get_model_info", timeout=5).json() == body
    assert requests.get(sim.url + "/health", timeout=5).status_code == 200
    assert requests.get(sim.url + "/health_generate", timeout=10).status_code == 200
    assert requests.get(sim.url + "/info", timeout=5).status_code == 404, "TGI's /info is not SGLang's"

    fams = parse_prometheus(sim.metrics_text())
    assert not any(n.startswith("vllm:") for n in fams), "an SGLang server shows no vllm: family"
    val = lambda fam, **kw: sample_value(fams, fam, **kw)  # noqa: E731
    assert val("sglang:num_requests_total", is_streaming="false") == 2
    assert val("sglang:num_requests_total", is_streaming="true") == 1
    assert val("sglang:generation_tokens_total") == r.usage.completion_tokens + 5 + s.usage.completion_tokens
    assert val("sglang:prompt_tokens_total") == r.usage.prompt_tokens + cmpl.usage.prompt_tokens + \
        s.usage.prompt_tokens
    assert val("sglang:http_responses_total", endpoint="/v1/chat/completions", status_code="200") == 2
    assert val("sglang:http_requests_total", endpoint="/model_info", method="GET") == 1
    assert val("sglang:time_to_first_token_seconds", sample="sglang:time_to_first_token_seconds_count") == 3
    assert val("sglang:num_running_reqs") == 0 and val("sglang:num_queue_reqs") == 0
    assert "sglang:num_aborted_requests_total" not in fams, "nothing aborted"


def test_sglang_spans_through_the_agent(sims, grpc_sink, tmp_path, request, monkeypatch, sim_bin):
    sink = grpc_sink()
    cfg, ports = make_config({"otlp": otlp_exporter(sink.endpoint)}, signals=("traces",))
    monkeypatch.setattr(agent_mod, "binary", lambda: sim_bin)
    agent = Agent("agent", cfg, ports, tmp_path)
    request.node._inferwatch_agents = getattr(request.node, "_inferwatch_agents", [])
    request.node._inferwatch_agents.append(agent)
    try:
        agent.start()
        sim = sims("sglang", "--flavor", "sglang", "--gpu", "a10g", "--served-model-name", MODEL,
                   "--otlp-traces-endpoint", f"grpc://{ports.grpc_endpoint}", "--otlp-batch-delay-ms", "100",
                   config=FAST_ANSWERS)
        c = sim.client()
        ok = c.completions.create(model=MODEL, prompt="a b c d", max_tokens=4, extra_body={"ignore_eos": True})
        # a client that goes away mid-stream: SGLang aborts the request
        with requests.post(sim.url + "/v1/completions", stream=True, timeout=30,
                           json={"model": MODEL, "prompt": "long answer", "max_tokens": 2000, "stream": True,
                                 "ignore_eos": True}) as resp:
            next(resp.iter_lines())
        roots = lambda: [s for _, _, s in sink.spans() if s.name.startswith(" Req ")]  # noqa: E731
        sink.wait_for(lambda: len(roots()) >= 2, 30, "two root spans")
        fams = parse_prometheus(sim.metrics_text())
        assert sample_value(fams, "sglang:num_aborted_requests_total") == 1
        assert sim.stop() == 0
        assert agent.stop() == 0
    finally:
        agent.kill()
    spans = sink.spans()
    by_trace: dict = {}
    for rs, ss, s in spans:
        by_trace.setdefault(s.trace_id, []).append((rs, ss, s))
    finished = {}
    for rs, ss, root in [t for t in spans if t[2].name.startswith(" Req ")]:
        a = attrs(root.attributes)
        assert ss.scope.name == "sglang server"
        assert attrs(rs.resource.attributes)["service.name"] == "sglang"
        assert root.name == f" Req {a['rid'][:8]}" and len(a["rid"]) == 32
        assert root.kind == 1, root.kind  # SPAN_KIND_INTERNAL
        assert root.status.code == 0, "the root span carries no status"
        assert a["module"] == "sglang::request" and a["gen_ai.response.model"] == MODEL
        assert isinstance(a["gen_ai.response.finish_reasons"], str), "a JSON string, not an array"
        reason = json.loads(a["gen_ai.response.finish_reasons"])
        assert "gen_ai.latency.time_in_queue" not in a
        threads = [s for _, _, s in by_trace[root.trace_id] if s.parent_span_id == root.span_id]
        scheduler = [s for s in threads if s.name.startswith("Scheduler [TP 0]")]
        assert len(scheduler) == 1 and any(s.name.startswith("Tokenizer (host:") for s in threads), threads
        finished[reason[0]] = (a, scheduler[0])
    assert set(finished) == {"length", "abort"}, finished.keys()
    a, sched = finished["length"]
    assert a["gen_ai.usage.completion_tokens"] == ok.usage.completion_tokens == 4
    assert a["gen_ai.usage.prompt_tokens"] == ok.usage.prompt_tokens
    assert 0 < a["gen_ai.latency.time_to_first_token"] <= a["gen_ai.latency.e2e"]
    assert sched.status.code == 0
    _, sched = finished["abort"]
    assert sched.status.code == 2, "ERROR on the aborted request's scheduler thread span"
    assert attrs(sched.attributes)["type"] == "abort"


def test_faults_move_the_sglang_metrics(sims):
    """The engine under SGLang's metrics is the simulator's: its faults show in `sglang:*` as they do
    in `vllm:*` (pinned KV blocks in token_usage, admission stalls in queue_time_seconds)."""
    sim = sims("sglang", "--flavor", "sglang", "--gpu", "a10g", "--served-model-name", MODEL, config=FAST_ANSWERS)
    c = sim.client()
    gauge = lambda name: sample_value(sim.families(), name)  # noqa: E731
    c.completions.create(model=MODEL, prompt="warm up", max_tokens=2)
    assert wait_until(lambda: gauge("sglang:num_running_reqs") == 0, 10, "idle") and gauge("sglang:token_usage") < 0.1

    sim.set_faults({"kind": "kv_pressure", "strength": 0.5})
    c.completions.create(model=MODEL, prompt="under pressure", max_tokens=2)
    usage = wait_until(lambda: (lambda u: u if u >= 0.4 else None)(gauge("sglang:token_usage")), 10,
                       lambda: f"token_usage with half the pool pinned: {gauge('sglang:token_usage')}")
    assert usage <= 1.0
    free = gauge("sglang:kv_available_tokens")
    assert free <= 0.6 * gauge("sglang:max_total_num_tokens"), free

    sim.set_faults({"kind": "queue_blocking", "strength": 0.5, "period": "4s"})
    fams = sim.families()
    before = sample_value(fams, "sglang:queue_time_seconds", "sglang:queue_time_seconds_sum")
    n0 = sample_value(fams, "sglang:queue_time_seconds", "sglang:queue_time_seconds_count")
    # the stall holds admission for the first 2 s of every 4 s, from now on
    for i in range(3):
        c.completions.create(model=MODEL, prompt=f"stalled {i}", max_tokens=2)
    fams = sim.families()
    waited = sample_value(fams, "sglang:queue_time_seconds", "sglang:queue_time_seconds_sum") - before
    assert sample_value(fams, "sglang:queue_time_seconds", "sglang:queue_time_seconds_count") == n0 + 3
    assert waited > 0.5, f"queue time under the stall: {waited} s over 3 requests"
    sim.clear_faults()


def agent_config(ports: Ports, prom_port: int, target: str) -> dict:
    return {
        "receivers": {
            "prometheus": {"config": {"scrape_configs": [
                {"job_name": "sglang", "scrape_interval": "1s", "scrape_timeout": "1s",
                 "static_configs": [{"targets": [target]}]},
            ]}},
        },
        "connectors": {"llm_signals": {"window": "5s", "flush_interval": "1s", "allowed_lateness": "1s"}},
        "exporters": {"prometheus": {"endpoint": f"127.0.0.1:{prom_port}"}},
        "extensions": {"health_check": {"endpoint": f"127.0.0.1:{ports.health}"}},
        "service": {
            "extensions": ["health_check"],
            "telemetry": {"metrics": {"address": f"127.0.0.1:{ports.metrics}"}},
            "pipelines": {
                "metrics/scrape": {"receivers": ["prometheus"], "exporters": ["llm_signals"]},
                "metrics/signals": {"receivers": ["llm_signals"], "exporters": ["prometheus"]},
            },
        },
    }


def scrape(port: int) -> dict:
    try:
        return parse_prometheus(requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text)
    except requests.ConnectionError:
        return {}


def signal(fams: dict, prefix: str) -> list[float]:
    """Values of the first derived family named `prefix*` for the SGLang model, from the scrape."""
    for name in sorted(fams):
        if name.startswith(prefix):
            return [v for (_, labels, v) in fams[name].samples
                    if labels.get("gen_ai_request_model") == MODEL and labels.get("source") == "scrape"]
    return []


def test_agent_derives_sglang_golden_signals_that_agree_with_the_bench(sims, sim_bin, tmp_path, request,
                                                                       monkeypatch):
    ports = Ports()
    prom_port = free_port()
    monkeypatch.setattr(agent_mod, "binary", lambda: sim_bin)
    # An L4 and 1000-token prompts: TTFTs of a few hundred ms, spread over SGLang's buckets
    # (which start at 0.1 s) so that the derived percentile is a real interpolation.
    sim = sims("sglang", "--flavor", "sglang", "--gpu", "l4", "--served-model-name", MODEL, config=FAST_ANSWERS)
    agent = Agent("agent", agent_config(ports, prom_port, f"127.0.0.1:{sim.port}"), ports, tmp_path)
    request.node._inferwatch_agents.append(agent)
    # every value each derived gauge took during the run (the exporter shows the latest window's)
    seen: dict[str, list[float]] = {"ttft": [], "e2e": [], "queue": [], "kv": []}
    stop = threading.Event()

    def collect():
        while not stop.is_set():
            fams = scrape(prom_port)
            for key, prefix in (("ttft", "llm_ttft_p95"), ("e2e", "llm_e2e_p95"), ("queue", "llm_queue_p95"),
                                ("kv", "llm_kv_cache_usage")):
                seen[key] += signal(fams, prefix)
            stop.wait(0.5)  # sampling period of the derived gauges, not synchronisation

    try:
        agent.start()
        watcher = threading.Thread(target=collect, daemon=True)
        watcher.start()
        out = tmp_path / "bench.json"
        r = subprocess.run([sim_bin, "bench", "--endpoint", sim.url, "--model", MODEL, "--rate", "2",
                            "--duration", "15s", "--max-tokens", "16", "--prompt-tokens", "1000", "--stream",
                            "--json", str(out), "--quiet"], capture_output=True, text=True, timeout=180)
        assert r.returncode == 0, r.stderr
        report = json.loads(out.read_text())
        assert report["ttft"]["count"] >= 20, report["requests"]
        wait_until(lambda: all(seen[k] for k in ("ttft", "e2e", "queue", "kv")), 60,
                   lambda: f"derived SGLang signals; seen {seen}, exporter has {sorted(scrape(prom_port))[:40]}")
    finally:
        stop.set()
    fams = parse_prometheus(sim.metrics_text())
    n = sample_value(fams, "sglang:time_to_first_token_seconds", "sglang:time_to_first_token_seconds_count")
    assert n == report["ttft"]["count"], "the server saw every request the bench measured"
    server_mean = sample_value(fams, "sglang:time_to_first_token_seconds", "sglang:time_to_first_token_seconds_sum") / n
    bench_p95, bench_mean = report["ttft"]["p95"], report["ttft"]["mean"]
    # the typical 5 s window's p95 (over the time each window was shown)
    ttft = statistics.median(seen["ttft"])
    lo, hi = around(TTFT_BOUNDS, bench_p95)
    print(f"TTFT: bench p95 {bench_p95:.3f} s mean {bench_mean:.3f} s; server mean {server_mean:.3f} s; "
          f"llm.ttft.p95 (scrape) median {ttft:.3f} s max {max(seen['ttft']):.3f} s; e2e median "
          f"{statistics.median(seen['e2e']):.3f} s vs bench p95 {report['e2e']['p95']:.3f} s;"
          f" queue {max(seen['queue']):.4f} s; kv max {max(seen['kv']):.3f}")
    assert 0.1 < server_mean <= bench_mean, "the client's TTFT adds HTTP time to the server's"
    assert lo <= ttft <= hi, f"llm.ttft.p95 {ttft} vs bench p95 {bench_p95} (resolution {lo}..{hi})"
    e2e = statistics.median(seen["e2e"])
    lo, hi = around(E2E_BOUNDS, report["e2e"]["p95"])
    assert lo <= e2e <= hi, f"llm.e2e.p95 {e2e} vs bench e2e p95 {report['e2e']['p95']}"
    assert 0 <= max(seen["queue"]) < ttft, "queueing is part of the TTFT"
    assert 0 < max(seen["kv"]) <= 1, "the KV cache held the running requests"
    assert sim.stop() == 0
    assert agent.stop() == 0

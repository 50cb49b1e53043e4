"""The `llm_request` spans of `inferwatch sim`, sent over OTLP/gRPC to an inferwatch agent
(otlp receiver -> batch -> otlp exporter) and received by the Python sink: names and
attributes as vLLM V1 emits them (tests/fixtures/servers/vllm-*.spans.json), consistent timings,
and token counts equal to the usage the OpenAI client saw, matched by request id."""

from __future__ import annotations

import math
import secrets

from support import agent as agent_mod
from support.agent import Agent, make_config, otlp_exporter
from support.otlp import attrs
from support.sim import FAST_ANSWERS, run_load, sim_bin, sims, stream_call  # noqa: F401 (fixtures)

MODEL = "span-model"
SERVICE = "sim-under-test"


def _call(c, i: int) -> dict:
    """Request i of a fixed mix; returns what the client saw and sent."""
    tp_trace, tp_span = secrets.token_hex(16), secrets.token_hex(8)
    headers = {}
    sent: dict = {"max_tokens": 200, "n": 1, "temperature": None, "top_p": None, "parent": None}
    prompt = f"Question {i}: what limits the throughput of a continuous-batching server?"
    kind = ["chat", "chat_stream", "cmpl", "cmpl_stream", "cmpl_n2"][i % 5]
    kw: dict = {"model": MODEL, "max_tokens": sent["max_tokens"]}
    if i == 0:
        kw.update(temperature=0.7, top_p=0.9)
        sent.update(temperature=0.7, top_p=0.9)
    if i == 2:
        kw.update(temperature=0.0)
        sent.update(temperature=0.0)
    if i == 1:
        headers["traceparent"] = f"00-{tp_trace}-{tp_span}-01"
        headers["tracestate"] = "vendor=e2e"
        sent["parent"] = (tp_trace, tp_span)
    if i == 3:
        headers["x-request-id"] = "e2e-fixed-id-3"
    if i % 5 == 4:
        kw.update(n=2, max_tokens=30)
        sent.update(n=2, max_tokens=30)
    if headers:
        kw["extra_headers"] = headers
    out = {"i": i, "kind": kind, "sent": sent}
    if kind == "chat":
        r = c.chat.completions.create(messages=[{"role": "user", "content": prompt}], **kw)
        out.update(id=r.id, usage=r.usage, finish=[ch.finish_reason for ch in r.choices])
    elif kind in ("cmpl", "cmpl_n2"):
        r = c.completions.create(prompt=prompt, **kw)
        out.update(id=r.id, usage=r.usage, finish=[ch.finish_reason for ch in sorted(r.choices, key=lambda x: x.index)])
    else:
        chat = kind == "chat_stream"
        body = {"messages": [{"role": "user", "content": prompt}]} if chat else {"prompt": prompt}
        create = c.chat.completions.create if chat else c.completions.create
        s = stream_call(create, chat, stream_options={"include_usage": True}, **body, **kw)
        assert s.usage.completion_tokens == len(s.content)
        out.update(id=s.id, usage=s.usage, finish=[s.finish_reasons[-1][1]], client_e2e=s.e2e,
                   client_ttft=s.ttft, wall=(s.wall_send, s.wall_done))
    return out


def test_spans_match_client_usage(sims, grpc_sink, tmp_path, request, monkeypatch, sim_bin):
    sink = grpc_sink()
    cfg, ports = make_config({"otlp": otlp_exporter(sink.endpoint)}, signals=("traces",))
    monkeypatch.setattr(agent_mod, "binary", lambda: sim_bin)  # the agent runs from the binary under test
    agent = Agent("agent", cfg, ports, tmp_path)
    request.node._inferwatch_agents = getattr(request.node, "_inferwatch_agents", [])
    request.node._inferwatch_agents.append(agent)
    try:
        agent.start()
        # max-num-seqs 2 under 4 concurrent callers: some requests queue
        sim = sims("sim", "--gpu", "a10g", "--served-model-name", MODEL, "--max-num-seqs", "2",
                   "--otlp-traces-endpoint", f"grpc://{ports.grpc_endpoint}", "--otlp-batch-delay-ms", "100",
                   config=FAST_ANSWERS, env={"OTEL_SERVICE_NAME": SERVICE})
        c = sim.client()
        seen = run_load(lambda i: _call(c, i), 10, workers=4)

        def engine_ids(s: dict) -> list[str]:
            return [f"{k}_{s['id']}" for k in range(2)] if s["sent"]["n"] == 2 else [s["id"]]

        want = {rid for s in seen for rid in engine_ids(s)}
        assert len(want) == 12
        assert "cmpl-e2e-fixed-id-3" in want, "x-request-id is not the response id"

        def by_id() -> dict:
            out: dict = {}
            for rs, ss, span in sink.spans():
                out.setdefault(attrs(span.attributes).get("gen_ai.request.id"), []).append((rs, ss, span))
            return out

        sink.wait_for(lambda: want <= set(by_id()), 30, "a span for every request id")
        # the same spans over OTLP/HTTP protobuf (vLLM with OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf)
        http_sim = sims("sim-http", "--gpu", "a10g", "--served-model-name", MODEL, "--otlp-batch-delay-ms", "100",
                        "--otlp-traces-endpoint", f"{ports.http_url}/v1/traces", config=FAST_ANSWERS)
        r = http_sim.client().completions.create(model=MODEL, prompt="over http", max_tokens=3)
        sink.wait_for(lambda: r.id in by_id(), 30, "the span sent over OTLP/HTTP")
        (_, _, hspan), = by_id()[r.id]
        assert attrs(hspan.attributes)["gen_ai.usage.completion_tokens"] == r.usage.completion_tokens == 3
        assert http_sim.stop() == 0
        assert sim.stop() == 0
        assert agent.stop() == 0
    finally:
        agent.kill()

    spans = by_id()
    spans.pop(r.id)
    assert set(spans) == want, f"unexpected span ids {set(spans) - want}"
    dups = {k: len(v) for k, v in spans.items() if len(v) != 1}
    assert not dups, f"more than one span per request: {dups}"
    queued = 0
    for s in seen:
        ids = engine_ids(s)
        got = [spans[rid][0] for rid in ids]
        total_completion = 0
        for (rs, ss, span), fr in zip(got, s["finish"]):
            a = attrs(span.attributes)
            where = f"request {s['i']} ({s['kind']}) span {a['gen_ai.request.id']}: {a}"
            assert span.name == "llm_request" and span.kind == 2, where  # SPAN_KIND_SERVER
            assert ss.scope.name == "vllm.llm_engine", ss.scope
            assert attrs(rs.resource.attributes).get("service.name") == SERVICE
            # tokens: what the client was told
            assert a["gen_ai.usage.prompt_tokens"] == s["usage"].prompt_tokens, where
            total_completion += a["gen_ai.usage.completion_tokens"]
            # vLLM never writes a finish reason (nor a status) on llm_request: how it ended is only in
            # vllm:request_success_total{finished_reason} (tests/fixtures/servers/vllm-*.spans.json)
            assert fr in ("stop", "length") and "gen_ai.response.finish_reasons" not in a, where
            assert not span.HasField("status") or span.status.code == 0, where
            # request parameters (temperature and top_p only when truthy, as vLLM)
            assert a["gen_ai.request.max_tokens"] == s["sent"]["max_tokens"], where
            assert a.get("gen_ai.request.n") == s["sent"]["n"], where
            if s["sent"]["temperature"]:
                assert a["gen_ai.request.temperature"] == s["sent"]["temperature"], where
            elif s["sent"]["temperature"] == 0.0:
                assert "gen_ai.request.temperature" not in a, where
            if s["sent"]["top_p"]:
                assert a["gen_ai.request.top_p"] == s["sent"]["top_p"], where
            assert "gen_ai.response.model" not in a and "gen_ai.request.model" not in a, "V1 has no model attribute"
            # timings, seconds as doubles
            lat = {k[len("gen_ai.latency."):]: v for k, v in a.items() if k.startswith("gen_ai.latency.")}
            assert set(lat) == {"time_to_first_token", "e2e", "time_in_queue", "time_in_model_prefill",
                                "time_in_model_decode", "time_in_model_inference"}, where
            assert all(isinstance(v, float) and v >= 0 for v in lat.values()), where
            e2e, ttft = lat["e2e"], lat["time_to_first_token"]
            q, pre, dec = lat["time_in_queue"], lat["time_in_model_prefill"], lat["time_in_model_decode"]
            assert 0 < ttft <= e2e, where
            assert math.isclose(q + pre + dec, e2e, rel_tol=0.005, abs_tol=0.001), where
            assert math.isclose(q + pre, ttft, rel_tol=0.005, abs_tol=0.001), where
            assert math.isclose(lat["time_in_model_inference"], pre + dec, rel_tol=0.005, abs_tol=0.001), where
            assert math.isclose((span.end_time_unix_nano - span.start_time_unix_nano) / 1e9, e2e, abs_tol=0.001), where
            queued += q > 0.005
            if "client_e2e" in s:
                # the server's view lies inside the client's
                assert e2e <= s["client_e2e"] + 0.002 and ttft <= s["client_ttft"] + 0.002, (where, s)
                t0, t1 = s["wall"]
                assert t0 - 0.05 <= span.start_time_unix_nano / 1e9 <= span.end_time_unix_nano / 1e9 <= t1 + 0.05
            # trace context
            if s["sent"]["parent"]:
                trace, parent = s["sent"]["parent"]
                assert span.trace_id.hex() == trace and span.parent_span_id.hex() == parent, where
                assert span.trace_state == "vendor=e2e"
                assert span.flags == 0x301, hex(span.flags)  # sampled; the parent is remote (OTLP flag bits 8, 9)
            else:
                assert span.parent_span_id == b"" and len(span.trace_id) == 16, where
        assert total_completion == s["usage"].completion_tokens, s
    assert queued >= 1, "no request queued although max-num-seqs 2 was shared by 4 callers"
    traces = [spans[rid][0][2].trace_id for rid in want]
    assert len(set(traces)) == len(traces), "root spans share a trace id"

"""TGI's own API in `inferwatch sim --flavor tgi` (TGI 3.3.7's shapes), driven by the real
clients: huggingface_hub's `InferenceClient` (`text_generation` posts to `POST /`, the compat
route; `chat_completion` to `/v1/chat/completions`), the openai client on the same server,
raw `/generate`, `/generate_stream` and `/tokenize`, and `inferwatch bench --api tgi`.

The natural answer length is set far above the asked `max_new_tokens`, so every generation
ends by length and has exactly the number of tokens asked for.
"""

from __future__ import annotations

import json
import subprocess
import threading
from pathlib import Path

import pytest
import requests
from huggingface_hub import InferenceClient
from huggingface_hub.errors import OverloadedError, ValidationError

from support.otlp import attrs
from support.sim import FAST_GPU, sim_bin, sims, wait_until  # noqa: F401

MODEL = "tgi-e2e-model"
# answers would run ~400 tokens by themselves: max_new_tokens always decides
CONFIG = {"median_output_tokens": 400, "engine": {"gpu": FAST_GPU}}
PROMPT = "Explain what a KV cache is"


def _tgi(sims, *extra, name="tgi"):
    return sims(name, "--flavor", "tgi", "--served-model-name", MODEL, "--seed", "3", *extra, config=CONFIG)


def _metric(sim, line_prefix: str) -> float:
    for line in sim.metrics_text().splitlines():
        if line.startswith(line_prefix + " "):
            return float(line.split()[-1])
    return 0.0


def test_huggingface_hub_and_openai_on_the_native_api(sims):
    sim = _tgi(sims)
    hf = InferenceClient(base_url=sim.url, timeout=60)
    n = 6

    out = hf.text_generation(PROMPT, max_new_tokens=n, details=True)
    d = out.details
    assert d.generated_tokens == n and len(d.tokens) == n, d
    assert d.finish_reason == "length"
    assert all(not t.special for t in d.tokens)
    text = "".join(t.text for t in d.tokens)
    assert text, "no text"
    # POST / defaults return_full_text to true for a text-generation model, as TGI does
    assert out.generated_text == PROMPT + text
    assert d.seed is None, "greedy (do_sample not set): TGI reports no seed"
    assert d.prefill == []
    # the same prompt answers the same way (synthetic but deterministic)
    assert hf.text_generation(PROMPT, max_new_tokens=n, return_full_text=False) == text

    events = list(hf.text_generation(PROMPT, max_new_tokens=n, details=True, stream=True))
    assert len(events) == n, events
    assert [e.index for e in events] == list(range(1, n + 1))
    assert all(e.generated_text is None and e.details is None for e in events[:-1])
    last = events[-1]
    assert last.generated_text == PROMPT + text
    assert last.details.generated_tokens == n and last.details.finish_reason == "length"
    assert last.details.input_length > 0
    assert "".join(e.token.text for e in events) == text
    assert list(hf.text_generation(PROMPT, max_new_tokens=n, stream=True)) == [t.text for t in d.tokens]

    # TGI's Messages API (huggingface_hub sends model "dummy"; TGI ignores it)
    chat = hf.chat_completion([{"role": "user", "content": PROMPT}], max_tokens=n)
    assert chat.usage.completion_tokens == n and chat.choices[0].finish_reason == "length"
    assert chat.model == MODEL
    chunks = [c for c in hf.chat_completion([{"role": "user", "content": PROMPT}], max_tokens=n, stream=True)
              if c.choices and c.choices[0].delta.content]
    assert len(chunks) == n

    # the openai client on the same server
    oa = sim.client()
    r = oa.completions.create(model=MODEL, prompt=PROMPT, max_tokens=n)
    assert r.usage.completion_tokens == n
    r = oa.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": PROMPT}], max_tokens=n)
    assert r.usage.completion_tokens == n

    # the raw wire: `data:` without a space, /generate's headers, /tokenize's offsets
    with requests.post(sim.url + "/generate_stream", json={"inputs": PROMPT, "parameters": {"max_new_tokens": 3}},
                       stream=True, timeout=30) as resp:
        assert resp.status_code == 200 and resp.headers["content-type"] == "text/event-stream"
        raw = resp.text
    lines = [x for x in raw.split("\n\n") if x]
    assert len(lines) == 3 and all(x.startswith("data:{") for x in lines), raw
    assert list(json.loads(lines[0][5:])) == ["index", "token", "generated_text", "details"]
    g = requests.post(sim.url + "/generate", json={"inputs": PROMPT, "parameters": {"max_new_tokens": 3}}, timeout=30)
    assert g.status_code == 200 and g.headers["x-generated-tokens"] == "3"
    assert list(g.json()) == ["generated_text"], "no details unless asked"
    toks = requests.post(sim.url + "/tokenize", json={"inputs": PROMPT}, timeout=10).json()
    assert int(g.headers["x-prompt-tokens"]) == len(toks) == last.details.input_length
    assert [(t["start"], t["stop"]) for t in toks[:2]] == [(0, 0), (0, len("Explai"))]
    assert all(PROMPT.encode()[t["start"]:t["stop"]].decode() == t["text"] for t in toks)


def test_a_validation_error_reaches_huggingface_hub_and_is_counted(sims):
    sim = _tgi(sims)
    hf = InferenceClient(base_url=sim.url, timeout=60)
    before = _metric(sim, 'tgi_request_failure{err="validation"}')
    assert before == 0
    with pytest.raises(ValidationError, match="`temperature` must be strictly positive"):
        hf.text_generation(PROMPT, max_new_tokens=4, temperature=0.0)
    r = requests.post(sim.url + "/generate", json={"inputs": PROMPT, "parameters": {"top_k": 0}}, timeout=10)
    assert r.status_code == 422
    assert r.json() == {"error": "Input validation error: `top_k` must be strictly positive", "error_type": "validation"}
    # in a stream the error is an event of a 200 answer; huggingface_hub raises it all the same
    with pytest.raises(ValidationError, match="`stop` supports up to 4 stop sequences"):
        list(hf.text_generation(PROMPT, max_new_tokens=4, stop=["a", "b", "c", "d", "e"], stream=True))
    # the server keeps serving
    assert len(hf.text_generation(PROMPT, max_new_tokens=4, details=True).details.tokens) == 4
    assert _metric(sim, 'tgi_request_failure{err="validation"}') == 3
    assert _metric(sim, "tgi_request_success") == 1


def test_overloaded_beyond_max_concurrent_requests(sims):
    # an A10G decodes slowly enough that the held stream outlives the second request
    sim = _tgi(sims, "--max-concurrent-requests", "1", "--gpu", "a10g")
    hf = InferenceClient(base_url=sim.url, timeout=60)
    assert requests.get(sim.url + "/info", timeout=5).json()["max_concurrent_requests"] == 1
    first = threading.Event()

    def hold():
        with requests.post(sim.url + "/generate_stream", stream=True, timeout=60,
                           json={"inputs": PROMPT, "parameters": {"max_new_tokens": 300}}) as r:
            for _ in r.iter_lines():
                first.set()

    t = threading.Thread(target=hold, daemon=True)
    t.start()
    assert first.wait(30), "the held stream produced no token"
    with pytest.raises(OverloadedError, match="Model is overloaded"):
        hf.text_generation(PROMPT, max_new_tokens=2)
    t.join(60)
    assert not t.is_alive()
    assert _metric(sim, 'tgi_request_failure{err="overloaded"}') == 1
    # the permit came back with the stream's end
    assert hf.text_generation(PROMPT, max_new_tokens=2, details=True).details.generated_tokens == 2


def test_spans_are_named_by_the_native_handler(sims, grpc_sink):
    sink = grpc_sink()
    sim = _tgi(sims, "--otlp-traces-endpoint", f"grpc://{sink.endpoint}", "--otlp-batch-delay-ms", "100")
    requests.post(sim.url + "/generate", json={"inputs": PROMPT, "parameters": {"max_new_tokens": 3}}, timeout=30)
    requests.post(sim.url + "/generate_stream", json={"inputs": PROMPT, "parameters": {"max_new_tokens": 3}},
                  timeout=30).close()
    sink.wait_for(lambda: {"generate", "generate_stream"} <= {s.name for _, _, s in sink.spans()}, 30,
                  "generate and generate_stream spans")
    for _, _, s in sink.spans():
        a = attrs(s.attributes)
        assert a["parameters"].startswith("GenerateParameters { best_of: None"), a
        assert a["time_per_token"].endswith("s") and a["seed"] == "None", a


def _bench(sim_bin, sim, tmp_path: Path, name: str, *extra: str) -> dict:
    out = tmp_path / f"{name}.json"
    r = subprocess.run([sim_bin, "bench", "--endpoint", sim.url, "--model", MODEL, "--api", "tgi",
                        "--concurrency", "2", "--requests", "6", "--max-tokens", "7", "--prompt-tokens", "30",
                        "--json", str(out), "--quiet", *extra],
                       capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL, cwd=tmp_path)
    assert r.returncode == 0, f"exit {r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    return json.loads(out.read_text())


def test_bench_drives_the_native_api(sims, sim_bin, tmp_path):
    sim = _tgi(sims)
    rep = _bench(sim_bin, sim, tmp_path, "stream")
    assert rep["api"] == "tgi" and rep["url"].endswith("/generate_stream"), (rep["api"], rep["url"])
    assert rep["requests"]["completed"] == 6 and rep["requests"]["failed"] == 0, rep["errors"]
    assert rep["tokens"]["output_total"] == 6 * 7 and rep["tokens"]["usage_reported"] == 6, rep["tokens"]
    assert rep["ttft"]["count"] == 6 and rep["ttft"]["p50"] > 0, rep["ttft"]
    assert rep["itl"]["count"] == 6 * 6, rep["itl"]
    # the input lengths are the server's (details.input_length)
    assert rep["tokens"]["input_mean"] > 0
    assert _metric(sim, "tgi_request_generated_tokens_sum") == 6 * 7
    whole = _bench(sim_bin, sim, tmp_path, "whole", "--no-stream")
    assert whole["url"].endswith("/generate"), whole["url"]
    assert whole["requests"]["completed"] == 6 and whole["tokens"]["output_total"] == 6 * 7, whole["tokens"]
    assert whole["tokens"]["input_mean"] == rep["tokens"]["input_mean"], "x-prompt-tokens read"
    assert _metric(sim, "tgi_request_success") == 12

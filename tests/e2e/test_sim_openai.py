"""The `openai` Python client against `inferwatch sim`: chat and completions, whole and streamed
(every chunk parsed), usage accounting, /v1/models, logprobs and deterministic output.

How the simulator streams (as vLLM does): a chat stream opens with one chunk carrying
`delta.role = "assistant"` and empty content, then one chunk per generated token; the token
that ends a choice carries `finish_reason`; with `stream_options.include_usage` one more chunk
follows with `choices: []` and the usage. So `usage.completion_tokens` is exactly the number
of content chunks. Completion streams have no role chunk.
"""

from __future__ import annotations

import math

import openai
import pytest
import requests

from support.sim import FAST_ANSWERS, FAST_GPU, Streamed, run_load, sim_bin, sims, stream_call  # noqa: F401

MODEL = "sim-e2e-model"
# The API does not depend on the speed: a GPU ten times an A10G and short natural answers.
CONFIG = {**FAST_ANSWERS, "engine": {"gpu": FAST_GPU}}


def _sim(sims, name="sim", seed=7):
    return sims(name, "--served-model-name", MODEL, "--seed", str(seed), config=CONFIG)


def _check_stream_shape(s: Streamed, chat: bool, include_usage: bool) -> None:
    """The invariants of one single-choice stream."""
    assert s.chunks, "empty stream"
    obj = "chat.completion.chunk" if chat else "text_completion"
    for ch in s.chunks:
        assert ch.object == obj, ch
        assert ch.model == MODEL, ch
    if chat:
        assert s.role_chunks == 1, f"{s.role_chunks} role chunks"
        assert s.chunks[0].choices and s.chunks[0].choices[0].delta.role == "assistant"
    else:
        assert s.role_chunks == 0
    assert s.content, "no content chunks"
    assert all(piece for piece in s.content), "a content chunk with empty text"
    # exactly one finish_reason, on the last chunk that has a choice
    last_choice = max(i for i, ch in enumerate(s.chunks) if ch.choices)
    assert [i for i, _ in s.finish_reasons] == [last_choice], s.finish_reasons
    assert s.finish_reasons[0][1] in ("stop", "length")
    if include_usage:
        assert s.usage is not None, "no usage chunk despite include_usage"
        assert s.usage_chunk_index == len(s.chunks) - 1, "the usage chunk is not the last one"
        assert s.chunks[-1].choices == [], "the usage chunk has choices"
        u = s.usage
        assert u.prompt_tokens > 0
        # one generated token per content chunk, as vLLM counts them
        assert u.completion_tokens == len(s.content), (u, len(s.content))
        assert u.total_tokens == u.prompt_tokens + u.completion_tokens
    else:
        assert s.usage is None, "usage sent without include_usage"


def test_models_lists_the_served_names(sims):
    sim = sims("sim", "--gpu", "a10g", "--served-model-name", MODEL, "alias-b", config=FAST_ANSWERS)
    c = sim.client()
    models = c.models.list()
    ids = [m.id for m in models.data]
    assert ids == [MODEL, "alias-b"], ids
    for m in models.data:
        assert m.object == "model" and m.owned_by == "vllm"
        assert m.max_model_len == 8192  # vLLM's extra field, the default --max-model-len
    # the alias answers too, and an unknown model is a 404 as in vLLM
    r = c.completions.create(model="alias-b", prompt="Hello", max_tokens=2)
    assert r.model == "alias-b" and r.usage.completion_tokens == 2
    with pytest.raises(openai.NotFoundError):
        c.completions.create(model="no-such-model", prompt="Hello", max_tokens=2)
    assert requests.get(sim.url + "/health", timeout=5).status_code == 200


def test_chat_whole_and_streamed(sims):
    sim = _sim(sims)
    c = sim.client()
    msgs = [{"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Recommend a book about distributed systems, please."}]

    whole = c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=200)
    assert whole.object == "chat.completion" and whole.id.startswith("chatcmpl-")
    assert len(whole.choices) == 1
    ch = whole.choices[0]
    assert ch.message.role == "assistant" and ch.message.content
    assert ch.finish_reason == "stop", "a natural answer (median 12 tokens) should stop before 200 tokens"
    u = whole.usage
    assert u.prompt_tokens > 0 and 0 < u.completion_tokens < 200
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens

    s = stream_call(c.chat.completions.create, True, model=MODEL, messages=msgs, max_tokens=200,
                    stream_options={"include_usage": True})
    _check_stream_shape(s, chat=True, include_usage=True)
    assert s.id != whole.id and s.id.startswith("chatcmpl-")
    # same prompt, same seed: the same answer, whether streamed or not
    assert s.text == ch.message.content
    assert (s.usage.prompt_tokens, s.usage.completion_tokens) == (u.prompt_tokens, u.completion_tokens)
    assert s.finish_reasons[0][1] == "stop"

    plain = stream_call(c.chat.completions.create, True, model=MODEL, messages=msgs, max_tokens=200)
    _check_stream_shape(plain, chat=True, include_usage=False)
    assert plain.text == s.text

    # max_tokens cuts the answer: finish_reason length, exactly max_tokens chunks
    cut = stream_call(c.chat.completions.create, True, model=MODEL, messages=msgs, max_tokens=3,
                      stream_options={"include_usage": True})
    _check_stream_shape(cut, chat=True, include_usage=True)
    assert cut.finish_reasons[0][1] == "length"
    assert cut.usage.completion_tokens == 3 == len(cut.content)
    assert s.text.startswith(cut.text), (s.text, cut.text)
    # a longer conversation is a longer prompt
    longer = c.chat.completions.create(model=MODEL, messages=msgs + [
        {"role": "assistant", "content": whole.choices[0].message.content},
        {"role": "user", "content": "And one about databases?"}], max_tokens=2)
    assert longer.usage.prompt_tokens > u.prompt_tokens


def test_completions_whole_and_streamed(sims):
    sim = _sim(sims)
    c = sim.client()
    prompt = "The three most useful latency percentiles are"

    whole = c.completions.create(model=MODEL, prompt=prompt, max_tokens=200)
    assert whole.object == "text_completion" and whole.id.startswith("cmpl-")
    ch = whole.choices[0]
    assert ch.text and ch.finish_reason == "stop"
    u = whole.usage
    assert u.prompt_tokens > 0 and 0 < u.completion_tokens < 200
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens

    s = stream_call(c.completions.create, False, model=MODEL, prompt=prompt, max_tokens=200,
                    stream_options={"include_usage": True})
    _check_stream_shape(s, chat=False, include_usage=True)
    assert s.text == ch.text
    assert (s.usage.prompt_tokens, s.usage.completion_tokens) == (u.prompt_tokens, u.completion_tokens)

    plain = stream_call(c.completions.create, False, model=MODEL, prompt=prompt, max_tokens=200)
    _check_stream_shape(plain, chat=False, include_usage=False)
    assert plain.text == s.text

    cut = stream_call(c.completions.create, False, model=MODEL, prompt=prompt, max_tokens=4,
                      stream_options={"include_usage": True})
    _check_stream_shape(cut, chat=False, include_usage=True)
    assert cut.finish_reasons[0][1] == "length" and cut.usage.completion_tokens == 4
    # the completions default max_tokens is 16 (OpenAI's and vLLM's)
    d = c.completions.create(model=MODEL, prompt="Count slowly:", extra_body={"ignore_eos": True})
    assert d.usage.completion_tokens == 16 and d.choices[0].finish_reason == "length"


def _check_chat_logprobs(content, tokens: list[str], k: int) -> None:
    assert [t.token for t in content] == tokens
    for t in content:
        assert t.logprob <= 0.0
        assert len(t.top_logprobs) == k, f"{len(t.top_logprobs)} alternatives for top_logprobs={k}"
        lps = [a.logprob for a in t.top_logprobs]
        assert all(x <= 0.0 for x in lps)
        assert lps == sorted(lps, reverse=True), "alternatives not in rank order"
        assert t.logprob <= lps[0] + 1e-12, "the sampled token is more likely than the top alternative"
        assert sum(math.exp(x) for x in lps) <= 1.0 + 1e-9
        assert list(t.bytes) == list(t.token.encode())


def test_logprobs_top_k(sims):
    sim = _sim(sims)
    c = sim.client()
    k = 4
    msgs = [{"role": "user", "content": "Name a fast sorting algorithm."}]
    whole = c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=12, logprobs=True, top_logprobs=k,
                                      extra_body={"ignore_eos": True})
    content = whole.choices[0].logprobs.content
    assert len(content) == whole.usage.completion_tokens == 12
    _check_chat_logprobs(content, [t.token for t in content], k)
    assert "".join(t.token for t in content) == whole.choices[0].message.content

    s = stream_call(c.chat.completions.create, True, model=MODEL, messages=msgs, max_tokens=12, logprobs=True,
                    top_logprobs=k, stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    _check_stream_shape(s, chat=True, include_usage=True)
    assert len(s.logprobs) == len(s.content) == 12, "every content chunk carries its token's logprobs"
    streamed = [lp.content[0] for lp in s.logprobs]
    assert all(len(lp.content) == 1 for lp in s.logprobs)
    _check_chat_logprobs(streamed, s.content, k)
    assert [(t.token, t.logprob) for t in streamed] == [(t.token, t.logprob) for t in content]
    # without logprobs there are none
    assert c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=2).choices[0].logprobs is None
    with pytest.raises(openai.BadRequestError):
        c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=2, logprobs=True, top_logprobs=21)

    # completions: logprobs=K
    cw = c.completions.create(model=MODEL, prompt="Name a fast sorting algorithm.", max_tokens=12, logprobs=k,
                              extra_body={"ignore_eos": True})
    lp = cw.choices[0].logprobs
    n = cw.usage.completion_tokens
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == n == 12
    assert "".join(lp.tokens) == cw.choices[0].text
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(n)]
    for tok, tlp, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert 1 <= len(top) <= k + 1, top  # vLLM: the top K plus the sampled token if not among them
        assert tok in top and top[tok] == tlp
        assert tlp <= max(top.values()) + 1e-12
    cs = stream_call(c.completions.create, False, model=MODEL, prompt="Name a fast sorting algorithm.",
                     max_tokens=12, logprobs=k, stream_options={"include_usage": True},
                     extra_body={"ignore_eos": True})
    assert [x.tokens[0] for x in cs.logprobs] == lp.tokens
    assert [x.top_logprobs[0] for x in cs.logprobs] == lp.top_logprobs


def test_logprobs_alternatives_are_distinct(sims):
    """Top-k alternatives are K different tokens (a model's top-k are distinct token ids)."""
    sim = _sim(sims)
    c = sim.client()
    k = 5
    r = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Tell me more."}],
                                  max_tokens=40, logprobs=True, top_logprobs=k, extra_body={"ignore_eos": True})
    dups = [[a.token for a in t.top_logprobs] for t in r.choices[0].logprobs.content
            if len({a.token for a in t.top_logprobs}) != k]
    cr = c.completions.create(model=MODEL, prompt="Tell me more.", max_tokens=40, logprobs=k,
                              extra_body={"ignore_eos": True})
    short = [top for top in cr.choices[0].logprobs.top_logprobs if len(top) < k]
    assert not dups and not short, f"chat: {len(dups)}/40 tokens with repeated alternatives, e.g. {dups[:2]}; " \
                                   f"completions: {len(short)}/40 top_logprobs with fewer than {k} entries"


def test_same_seed_same_text(sims):
    a = _sim(sims, "a")
    b = _sim(sims, "b")
    other = _sim(sims, "other", seed=8)
    prompts = ["Where should I travel in spring?", "Summarise the plot of a heist movie.", "Pick a number."]

    def answers(sim, **kw):
        c = sim.client()

        def one(i):
            p = prompts[i // 2]
            if i % 2 == 0:
                r = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": p}], max_tokens=8,
                                              extra_body={"ignore_eos": True}, **kw)
                return r.choices[0].message.content
            return stream_call(c.completions.create, False, model=MODEL, prompt=p, max_tokens=8,
                               extra_body={"ignore_eos": True}, **kw).text

        return run_load(one, 2 * len(prompts), workers=2 * len(prompts))

    first = answers(a)
    assert answers(a) == first, "the same server answered the same prompt differently"
    assert answers(b) == first, "two servers with the same --seed answered differently"
    diff = answers(other)
    assert sum(x != y for x, y in zip(diff, first)) >= len(first) - 1, "--seed 8 gave (almost) the --seed 7 answers"
    # the request's own `seed` varies the answer, reproducibly
    s1 = answers(a, seed=1)
    assert answers(b, seed=1) == s1
    assert sum(x != y for x, y in zip(s1, first)) >= len(first) - 1
    assert sum(x != y for x, y in zip(answers(a, seed=2), s1)) >= len(first) - 1


@pytest.mark.xfail(strict=True, reason="sim bug: `stop` sequences are ignored (sim/src/server/api/wire.rs Common has no "
                   "`stop`): generation runs on to max_tokens with finish_reason length")
def test_stop_sequences(sims):
    """vLLM ends a choice at the first stop string (not included): finish_reason stop, stop_reason the string."""
    sim = _sim(sims)
    c = sim.client()
    # the synthetic text is full of "," and "." tokens: 40 tokens without either are unlikely
    r = c.completions.create(model=MODEL, prompt="List some things", max_tokens=40, stop=[",", "."],
                             extra_body={"ignore_eos": True})
    ch = r.choices[0]
    assert "," not in ch.text and "." not in ch.text, ch.text
    assert ch.finish_reason == "stop" and ch.stop_reason in (",", "."), (ch.finish_reason, ch.stop_reason)
    assert r.usage.completion_tokens < 40

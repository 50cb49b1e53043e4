"""Multimodal load (issue 20 item 5, the study's §2.4) against the real simulator.

- The openai Python client sends `image_url` parts — a base64 data URL and an http URL served
  here — and `usage.prompt_tokens` is the text's tokens plus Qwen2-VL's image tokens
  ((h'/28)·(w'/28) + 2, sim/src/server/api/media.rs), exactly; the images pass through
  `vllm:mm_cache_*` (the same image twice hits).
- Broken images (bad base64, not an image, a truncated PNG, a URL that 404s, a non-http URL)
  get HTTP 400 with the reason, and the server keeps serving.
- `inferwatch bench --images-per-request` (base64 and url transports) reports the expected
  prompt tokens per request; the sim's prefill time and the bench's TTFT grow with them.
- `--image-mask-ratio` beside `--perturb` reports per-type rows (text, image_mask,
  text+image_mask) with answer change rate, ΔTTFT and ΔRCI; the processor-cache hits prove the
  masked images are new pixels and the unmasked twins the same ones.

The PNGs of the client tests are written here with zlib (no imaging library), independently of
the bench's encoder.
"""

from __future__ import annotations

import base64
import http.server
import json
import struct
import subprocess
import threading
import zlib
from pathlib import Path

import openai
import pytest

from support.sim import FAST_ANSWERS, histogram, sample_value, sim_bin, sims  # noqa: F401

MODEL = "sim-vl"


def png(width: int, height: int, seed: int = 0) -> bytes:
    """An 8-bit RGB PNG of a seeded gradient."""
    rows = bytearray()
    for y in range(height):
        rows.append(0)  # filter: none
        for x in range(width):
            rows += bytes(((x * 7 + seed) % 256, (y * 5 + seed) % 256, (x + y + 3 * seed) % 256))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(bytes(rows))) + chunk(b"IEND", b"")


def data_url(b: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(b).decode()


def qwen2_vl_tokens(width: int, height: int) -> int:
    """Qwen2-VL's smart_resize (factor 28; no scaling needed for these sizes) + vision_start/end."""
    h, w = round(height / 28) * 28, round(width / 28) * 28
    assert 3136 <= h * w <= 12845056
    return (h // 28) * (w // 28) + 2


class _Images(http.server.BaseHTTPRequestHandler):
    files: dict = {}

    def do_GET(self):  # noqa: N802 (http.server's name)
        body = self.files.get(self.path)
        if body is None:
            self.send_response(404)
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def image_server():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Images)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield srv, f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def _sim(sims):
    return sims("sim", "--served-model-name", MODEL, "--seed", "11", config=FAST_ANSWERS)


def _usage(client, content, **kw) -> int:
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": content}],
                                       max_tokens=3, **kw)
    return r.usage.prompt_tokens


def _mm(sim) -> tuple[float, float]:
    fams = sim.families()
    return (sample_value(fams, "vllm:mm_cache_queries_total"),
            sample_value(fams, "vllm:mm_cache_hits_total"))


def test_openai_client_images_cost_qwen2_vl_tokens(sims, image_server):
    sim = _sim(sims)
    c = sim.client()
    srv, base = image_server
    text = {"type": "text", "text": "What is in this picture? Describe it in one sentence."}
    t = _usage(c, [text])
    assert t == _usage(c, text["text"]), "a text part counts as the plain string"

    a = png(448, 448, seed=1)
    b = png(640, 480, seed=2)
    _Images.files = {"/b.png": b}
    ta, tb = qwen2_vl_tokens(448, 448), qwen2_vl_tokens(640, 480)
    assert (ta, tb) == (258, 23 * 17 + 2)
    q0, h0 = _mm(sim)

    inline = {"type": "image_url", "image_url": {"url": data_url(a)}}
    by_url = {"type": "image_url", "image_url": {"url": base + "/b.png", "detail": "high"}}
    assert _usage(c, [inline, text]) == t + ta
    assert _usage(c, [by_url, text]) == t + tb
    assert _usage(c, [inline, by_url, text]) == t + ta + tb
    # streamed usage counts the same
    s = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": [by_url, text]}], max_tokens=3,
                                  stream=True, stream_options={"include_usage": True})
    last = [ch for ch in s][-1]
    assert last.usage.prompt_tokens == t + tb

    # four requests, five image items: a, b, a, b, b — the first a and the first b miss
    q1, h1 = _mm(sim)
    assert (q1 - q0, h1 - h0) == (5, 3)
    fams = sim.families()
    prompt_total = sample_value(fams, "vllm:prompt_tokens_total")
    # two text-only calls, then the four above
    assert prompt_total == 2 * t + (t + ta) + (t + tb) + (t + ta + tb) + (t + tb)


def test_broken_images_get_400_and_the_server_keeps_serving(sims, image_server):
    sim = _sim(sims)
    c = sim.client()
    srv, base = image_server
    good = png(56, 56)
    _Images.files = {"/ok.png": good}
    text = {"type": "text", "text": "describe"}
    cases = {
        "data:image/png;base64,@@not base64@@": "base64",
        data_url(b"hello, this is not an image"): "cannot identify image file",
        data_url(good[:-20]): "truncated",
        data_url(good[:30] + bytes([good[30] ^ 0xFF]) + good[31:]): "CRC",
        base + "/missing.png": "404",
        "file:///etc/passwd": "neither a data: URL nor http",
    }
    for url, reason in cases.items():
        with pytest.raises(openai.BadRequestError) as e:
            _usage(c, [{"type": "image_url", "image_url": {"url": url}}, text])
        assert e.value.status_code == 400
        msg = e.value.body["message"] if isinstance(e.value.body, dict) else str(e.value)
        assert reason in msg, f"{url[:40]}: {msg}"
        assert "image" in msg.lower(), msg
    with pytest.raises(openai.BadRequestError) as e:
        _usage(c, [{"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}])
    assert "input_audio" in str(e.value)
    # nothing reached the engine or the cache, and the server still answers
    q, h = _mm(sim)
    assert (q, h) == (0, 0)
    assert _usage(c, [{"type": "image_url", "image_url": {"url": base + "/ok.png"}}, text]) == \
        _usage(c, [text]) + qwen2_vl_tokens(56, 56)


def _bench(sim_bin, sim, tmp_path: Path, name: str, *extra: str) -> dict:
    out = tmp_path / f"{name}.json"
    r = subprocess.run([sim_bin, "bench", "--endpoint", sim.url, "--model", MODEL, "--concurrency", "1",
                        "--requests", "6", "--max-tokens", "4", "--prompt-tokens", "64", "--seed", "3",
                        "--json", str(out), "--quiet", *extra],
                       capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL, cwd=tmp_path)
    assert r.returncode == 0, f"exit {r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    return json.loads(out.read_text())


def _prefill(sim):
    return histogram(sim.families(), "vllm:request_prefill_time_seconds")


def test_bench_images_add_their_tokens_and_prefill_time(sims, sim_bin, tmp_path):
    # The default simulated GPU: prefill time is clearly a function of the prompt's length.
    sim = sims("sim", "--served-model-name", MODEL, "--seed", "11", config=FAST_ANSWERS)
    p0 = _prefill(sim)
    plain = _bench(sim_bin, sim, tmp_path, "plain")
    p1 = _prefill(sim)
    inline = _bench(sim_bin, sim, tmp_path, "inline", "--images-per-request", "2", "--image-size", "448x448")
    p2 = _prefill(sim)
    by_url = _bench(sim_bin, sim, tmp_path, "url", "--images-per-request", "2", "--image-size", "448x336",
                    "--image-transport", "url")
    for r in (plain, inline, by_url):
        assert r["requests"]["completed"] == 6 and r["requests"]["failed"] == 0, r["requests"]
        assert r["tokens"]["usage_reported"] == 6
    base = plain["tokens"]["input_mean"]
    # same seed, same prompts: exactly two images' tokens more per request
    assert inline["tokens"]["input_mean"] == base + 2 * qwen2_vl_tokens(448, 448), inline["tokens"]
    assert by_url["tokens"]["input_mean"] == base + 2 * qwen2_vl_tokens(448, 336), by_url["tokens"]
    # the sim's (simulated) prefill time per request grows with the image tokens ...
    plain_prefill = p1.minus(p0)
    img_prefill = p2.minus(p1)
    assert plain_prefill.count == 6 and img_prefill.count == 6
    ratio = (img_prefill.sum / 6) / (plain_prefill.sum / 6)
    assert ratio > 2.0, f"prefill per request with images / without: {ratio:.2f}"
    # ... and so does the TTFT the bench measures
    assert inline["ttft"]["mean"] > plain["ttft"]["mean"], (inline["ttft"], plain["ttft"])


def test_perturbation_with_image_masking_reports_per_type_rows(sims, sim_bin, tmp_path):
    sim = _sim(sims)
    refs = tmp_path / "refs.jsonl"
    refs.write_text("".join(json.dumps({"index": i, "reference": "a short plain answer about the picture"}) + "\n"
                            for i in range(6)))
    q0, h0 = _mm(sim)
    r = _bench(sim_bin, sim, tmp_path, "perturb", "--images-per-request", "1", "--image-size", "224x224",
               "--image-transport", "url", "--perturb", "light", "--image-mask-ratio", "0.2",
               "--reference", str(refs))
    p = r["perturb"]
    assert p["profile"] == "light, image_mask:0.2, light+image_mask:0.2", p["profile"]
    rows = {t["type"]: t for t in p["by_type"]}
    assert list(rows) == ["text", "image_mask", "text+image_mask"], p["by_type"]
    for kind, row in rows.items():
        assert row["pairs"] == 6, row
        assert row["mean_ttft_delta_s"] is not None and row["mean_e2e_delta_s"] is not None, row
        assert row["mean_rci_delta"] is not None, row
        # the sim's answers follow the prompt (text and image content): every twin differs
        assert row["answer_changed_share"] == 1.0, row
    assert p["pairs"] == 18
    # per prompt: baseline (miss), text twin (same image: hit), masked (new pixels: miss),
    # text+masked (the same masked pixels again: hit)
    q1, h1 = _mm(sim)
    assert (q1 - q0, h1 - h0) == (24, 12)
    # masking keeps the size, hence the tokens; text adds only distractor tokens
    assert r["tokens"]["input_mean"] > qwen2_vl_tokens(224, 224)

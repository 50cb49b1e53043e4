#!/usr/bin/env python3
"""An `inferwatch bench` plug-in hook (probe/README.md, "Plug-in hooks"), standard library only.

- pre_inference: puts a system message first in every chat request (replacing one that is
  there; a completions prompt gets it as a prefix), optionally sets `max_tokens` and extra body
  parameters, and tags the request with metadata.
- post_decode: keeps, per request, the number of streamed chunks and the longest gap between
  two of them.
- metric_finalize: reports per-request metrics: output characters per output token, the
  chunks seen, the longest gap (ms).

    inferwatch bench --endpoint http://127.0.0.1:8000 --model M --rate 2 --duration 30s \\
        --hook "python3 probe/examples/hooks/system_prompt.py --system 'Answer in one sentence.'"

The protocol: one JSON object per line on stdin; answer hello, pre_inference and
metric_finalize with one line each (same "type" and "id"), flushed; nothing else goes to
stdout (log to stderr).
"""

from __future__ import annotations

import argparse
import json
import sys


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--system", default="You are a concise assistant. Answer briefly.",
                    help="the system message to put first")
    ap.add_argument("--max-tokens", type=int, default=None, help="set max_tokens of every request")
    ap.add_argument("--param", action="append", default=[], metavar="KEY=JSON",
                    help="an extra body parameter, e.g. ignore_eos=true or temperature=0 (repeatable)")
    ap.add_argument("--name", default="system_prompt", help="the hook's name in the report")
    args = ap.parse_args()
    params = {}
    for p in args.param:
        key, _, value = p.partition("=")
        params[key] = json.loads(value)

    gaps: dict[str, tuple[int, float]] = {}  # request id -> (chunks, longest gap in s)

    def send(msg: dict) -> None:
        sys.stdout.write(json.dumps(msg) + "\n")
        sys.stdout.flush()

    for line in sys.stdin:
        if not line.strip():
            continue
        msg = json.loads(line)
        kind, rid = msg.get("type"), msg.get("id")
        if kind == "hello":
            print(f"hook {args.name}: bench {msg['bench']['model']} at {msg['bench']['url']}", file=sys.stderr)
            send({"type": "hello", "name": args.name, "wants": ["pre_inference", "post_decode", "metric_finalize"]})
        elif kind == "pre_inference":
            req = msg["request"]
            out: dict = {"params": {**req.get("params", {}), **params}}
            if "messages" in req:
                rest = [m for m in req["messages"] if m.get("role") != "system"]
                replaced = len(rest) != len(req["messages"])
                out["messages"] = [{"role": "system", "content": args.system}] + rest
            else:
                replaced = False
                out["prompt"] = f"{args.system}\n\n{req['prompt']}"
            if args.max_tokens is not None:
                out["max_tokens"] = args.max_tokens
            send({"type": "pre_inference", "id": rid, "request": out,
                  "metadata": {"system_prompt": "replaced" if replaced else "added",
                               "system_chars": len(args.system)}})
        elif kind == "post_decode":
            times = [t["t"] for t in msg["tokens"]]
            longest = max((b - a for a, b in zip(times, times[1:])), default=0.0)
            gaps[rid] = (len(times), longest)
        elif kind == "metric_finalize":
            o = msg["outcome"]
            chunks, longest = gaps.pop(rid, (0, 0.0))
            metrics = {"chunks": chunks, "max_chunk_gap_ms": longest * 1000.0}
            if o["ok"] and o["output_tokens"] > 0:
                metrics["chars_per_token"] = len(o["text"]) / o["output_tokens"]
            send({"type": "metric_finalize", "id": rid, "metrics": metrics})
        elif kind == "shutdown":
            break
    return 0


if __name__ == "__main__":
    sys.exit(main())

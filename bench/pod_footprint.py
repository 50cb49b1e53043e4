#!/usr/bin/env python3
"""CPU and memory of one deployment role's pipeline, as its pod would run it.

    .venv/bin/python bench/pod_footprint.py [--bin target/release/inferwatch] [--role sidecar]
        [--rates 0,20,100] [--secs 45]

Runs `deploy/kubernetes/overlays/<role>/pipeline.yaml` as a local process (listeners on free
local ports, the pod's Downward API environment set, the state on a temporary directory) beside
`inferwatch sim` (a simulated GPU ten times an A10G) loaded by `inferwatch bench` (open loop,
Poisson arrivals, 256-token prompts, 16 output tokens, streamed), one phase per rate (0 = idle).
The sidecar scrapes the simulator every 15 s (its default) and receives its spans; the gateway
receives the spans (its backend unset; `k8s_attributes` in passthrough mode, no API server
here); the node agent scrapes a static target (no API server
here) with NVML idle (no GPU). Each phase samples `/proc/<pid>/stat` (utime + stime) and
`/proc/<pid>/status` (VmRSS, VmHWM) once a second and prints one row: the mean CPU in
millicores, the mean RSS and the peak RSS, in MiB.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "e2e"))

from support.agent import free_port  # noqa: E402
from support.sim import FAST_ANSWERS, FAST_GPU, Sim  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def status_kib(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def wait_listening(port: int, proc: subprocess.Popen, log: Path, timeout: float = 30) -> None:
    import socket

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"agent exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.2)  # polling interval
    raise SystemExit(f"agent not listening on {port} after {timeout}s:\n{log.read_text()[-3000:]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=str(ROOT / "target" / "release" / "inferwatch"))
    ap.add_argument("--role", default="sidecar", choices=["sidecar", "node-agent", "gateway"])
    ap.add_argument("--rates", default="0,20,100", help="requests/s per phase; 0 = idle")
    ap.add_argument("--secs", type=int, default=45, help="seconds per phase")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="inferwatch-footprint-"))
    grpc, http, health, metrics, prom = (free_port() for _ in range(5))
    sim = Sim(args.bin, work, "sim", ("--served-model-name", "llama-footprint",
                                      "--otlp-traces-endpoint", f"grpc://127.0.0.1:{grpc}"),
              config={**FAST_ANSWERS, "engine": {"gpu": FAST_GPU}}).start()
    env = dict(os.environ)
    env.update({
        "INFERWATCH_GRPC_ENDPOINT": f"127.0.0.1:{grpc}",
        "INFERWATCH_HTTP_ENDPOINT": f"127.0.0.1:{http}",
        "INFERWATCH_HEALTH_ENDPOINT": f"127.0.0.1:{health}",
        "INFERWATCH_METRICS_ADDRESS": f"127.0.0.1:{metrics}",
        "INFERWATCH_PROMETHEUS_ENDPOINT": f"127.0.0.1:{prom}",
        "INFERWATCH_STATE_DIR": str(work / "state"),
        "VLLM_METRICS_TARGET": f"{sim.host}:{sim.port}",
        "K8S_POD_NAME": "vllm-0", "K8S_NAMESPACE_NAME": "inference", "K8S_NODE_NAME": "gpu-node-1",
        "K8S_POD_UID": "00000000-0000-0000-0000-000000000001", "K8S_CONTAINER_NAME": "inferwatch",
        "K8S_POD_IP": "127.0.0.1",
    })
    cmd = [args.bin, "run", "--config", str(ROOT / "deploy" / "kubernetes" / "overlays" / args.role / "pipeline.yaml")]
    if args.role == "node-agent":
        # No API server here: one static target in place of kubernetes_sd_configs.
        cmd += ["--set", "receivers::prometheus::config::scrape_configs=[{job_name: vllm, scrape_interval: 15s, "
                f"static_configs: [{{targets: ['{sim.host}:{sim.port}']}}]}}]"]
    if args.role == "gateway":
        # No API server here: k8s_attributes only adds k8s.pod.ip from the connection.
        cmd += ["--set", "processors::k8s_attributes::passthrough=true"]
    log = work / "agent.log"
    with open(log, "wb") as out:
        agent = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=work)
    try:
        wait_listening(grpc, agent, log)
        print(f"role {args.role}, binary {args.bin}, {args.secs} s per phase")
        print(f"{'phase':>14} {'requests':>9} {'CPU (m)':>8} {'RSS MiB':>8} {'peak MiB':>9}")
        for rate in (float(r) for r in args.rates.split(",")):
            bench = None
            if rate > 0:
                bench = subprocess.Popen([args.bin, "bench", "--endpoint", sim.url, "--model", "llama-footprint",
                                          "--rate", str(rate), "--duration", f"{args.secs}s", "--max-tokens", "16",
                                          "--prompt-tokens", "256", "--stream", "--quiet", "--json",
                                          str(work / f"bench-{rate}.json")],
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            c0, t0, rss = cpu_seconds(agent.pid), time.monotonic(), []
            while time.monotonic() - t0 < args.secs:
                time.sleep(1)  # sampling interval
                rss.append(status_kib(agent.pid, "VmRSS"))
            cpu_m = (cpu_seconds(agent.pid) - c0) / (time.monotonic() - t0) * 1000
            done = "-"
            if bench is not None:
                bench.wait(timeout=args.secs + 60)
                try:
                    import json
                    done = str(json.loads((work / f"bench-{rate}.json").read_text())["requests"]["completed"])
                except (OSError, ValueError, KeyError):
                    done = "?"
            phase = "idle" if rate == 0 else f"{rate:g} req/s"
            print(f"{phase:>14} {done:>9} {cpu_m:8.1f} {sum(rss) / len(rss) / 1024:8.1f} "
                  f"{status_kib(agent.pid, 'VmHWM') / 1024:9.1f}", flush=True)
    finally:
        agent.terminate()
        agent.wait(timeout=30)
        sim.stop()


if __name__ == "__main__":
    main()

"""Starting, probing and stopping `inferwatch` processes, and writing their configs."""

from __future__ import annotations

import os
import re
import signal as _signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import requests

from . import yamlgen

REPO = Path(__file__).resolve().parents[3]


def binary() -> str:
    """The agent binary: $INFERWATCH_BIN, else target/release/inferwatch."""
    return os.environ.get("INFERWATCH_BIN") or str(REPO / "target" / "release" / "inferwatch")


_issued: set[int] = set()
_issued_lock = threading.Lock()


def with_nofile(args: list, soft: int, hard: int) -> list:
    """`args` run under RLIMIT_NOFILE (soft, hard), set by a shell that then execs them (same pid);
    the soft limit goes first when it can (a hard limit below the current soft one is refused).

    Not `preexec_fn`: it makes subprocess fork and run Python in the child, and a child forked
    while grpcio's threads run can abort before it execs (an agent "exited with -6" in CI)."""
    return ["/bin/sh", "-c", 'h=$0 s=$1; shift; ulimit -Sn "$s" 2>/dev/null; ulimit -Hn "$h" && ulimit -Sn "$s" && exec "$@"', str(hard), str(soft), *map(str, args)]


def free_port() -> int:
    """A currently free TCP port on 127.0.0.1 (never the same one twice in this test run)."""
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        with _issued_lock:
            if port not in _issued:
                _issued.add(port)
                return port
    raise RuntimeError("no free port")


def closed_port() -> int:
    """A port nothing listens on (for a dead downstream)."""
    return free_port()


@dataclass
class Ports:
    grpc: int = field(default_factory=free_port)
    http: int = field(default_factory=free_port)
    health: int = field(default_factory=free_port)
    metrics: int = field(default_factory=free_port)

    @property
    def grpc_endpoint(self) -> str:
        return f"127.0.0.1:{self.grpc}"

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http}"


SIGNALS = ("traces", "metrics", "logs")


def fast_retry(**over) -> dict:
    """retry_on_failure with short intervals, so tests do not wait long between tries."""
    r = {
        "enabled": True,
        "initial_interval": "100ms",
        "max_interval": "1s",
        "max_elapsed_time": "60s",
        "multiplier": 1.5,
        "randomization_factor": 0.1,
    }
    r.update(over)
    return r


def otlp_exporter(endpoint: str, **over) -> dict:
    """An `otlp` (gRPC) exporter to a plaintext endpoint with fast retries."""
    e: dict[str, Any] = {
        "endpoint": endpoint,
        "tls": {"insecure": True},
        "timeout": "5s",
        "retry_on_failure": fast_retry(),
        "sending_queue": {"enabled": True, "num_consumers": 4, "queue_size": 1000},
    }
    e.update(over)
    return e


def otlphttp_exporter(endpoint: str, **over) -> dict:
    """An `otlphttp` exporter with fast retries."""
    e: dict[str, Any] = {
        "endpoint": endpoint,
        "timeout": "5s",
        "retry_on_failure": fast_retry(),
        "sending_queue": {"enabled": True, "num_consumers": 4, "queue_size": 1000},
    }
    e.update(over)
    return e


def make_config(
    exporters: dict,
    *,
    ports: Optional[Ports] = None,
    processors: Optional[dict] = None,
    pipeline_processors: tuple = ("batch",),
    signals: tuple = SIGNALS,
    protocols: tuple = ("grpc", "http"),
    health: bool = True,
    shutdown_timeout: Optional[str] = None,
    batch: Optional[dict] = None,
) -> tuple[dict, Ports]:
    """An otlp receiver -> processors -> `exporters` config on fresh ports, one pipeline per signal."""
    ports = ports or Ports()
    protos: dict[str, Any] = {}
    if "grpc" in protocols:
        protos["grpc"] = {"endpoint": ports.grpc_endpoint}
    if "http" in protocols:
        protos["http"] = {"endpoint": f"127.0.0.1:{ports.http}"}
    procs = dict(processors or {})
    if "batch" in pipeline_processors and "batch" not in procs:
        procs["batch"] = batch or {"timeout": "200ms", "send_batch_size": 512}
    cfg: dict[str, Any] = {
        "receivers": {"otlp": {"protocols": protos}},
        "processors": procs,
        "exporters": exporters,
        "service": {
            "telemetry": {"metrics": {"address": f"127.0.0.1:{ports.metrics}"}},
            "pipelines": {
                s: {"receivers": ["otlp"], "processors": list(pipeline_processors), "exporters": list(exporters)}
                for s in signals
            },
        },
    }
    if not procs:
        del cfg["processors"]
    if health:
        cfg["extensions"] = {"health_check": {"endpoint": f"127.0.0.1:{ports.health}"}}
        cfg["service"]["extensions"] = ["health_check"]
    if shutdown_timeout:
        cfg["service"]["shutdown_timeout"] = shutdown_timeout
    return cfg, ports


_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)(\s+\S+)?$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


@dataclass
class Sample:
    name: str
    labels: dict
    value: float


def parse_openmetrics(text: str) -> list[Sample]:
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        labels = {k: v for k, v in _LABEL.findall(m.group(3) or "")}
        out.append(Sample(m.group(1), labels, float(m.group(4))))
    return out


class Agent:
    """One `inferwatch run` process with its config file and log."""

    def __init__(self, name: str, cfg: dict | str, ports: Optional[Ports], workdir: Path,
                 extra_args: tuple = (), env: Optional[dict] = None, log_level: Optional[str] = None,
                 nofile: Optional[int] = None) -> None:
        self.name = name
        self.ports = ports
        self.workdir = workdir
        self.config_path = workdir / f"{name}.yaml"
        self.config_path.write_text(cfg if isinstance(cfg, str) else yamlgen.dump(cfg))
        self.log_path = workdir / f"{name}.log"
        self.extra_args = tuple(extra_args)
        self.env = env
        # RLIMIT_NOFILE (soft and hard) for the process, e.g. 1024 as a default systemd unit leaves it.
        self.nofile = nofile
        # INFERWATCH_E2E_LOG_LEVEL=debug turns up every agent's logging when chasing a failure.
        self.log_level = log_level or os.environ.get("INFERWATCH_E2E_LOG_LEVEL", "info")
        self.proc: Optional[subprocess.Popen] = None
        self.returncode: Optional[int] = None
        self.stop_seconds: Optional[float] = None
        self._log_file = None

    # --- life cycle -------------------------------------------------------------------------

    def start(self, wait: bool = True, timeout: float = 30.0) -> "Agent":
        args = [binary(), "--log-level", self.log_level, "run", "--config", str(self.config_path), *self.extra_args]
        self._log_file = open(self.log_path, "ab")
        env = dict(os.environ)
        env.pop("RUST_LOG", None)
        if self.env:
            env.update(self.env)
        if self.nofile is not None:
            args = with_nofile(args, self.nofile, self.nofile)
        self.proc = subprocess.Popen(args, stdout=self._log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     cwd=self.workdir, env=env)
        if wait:
            self.wait_ready(timeout)
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Polls the health endpoint (or the receiver ports) until the agent serves."""
        deadline = time.monotonic() + timeout
        last = "not polled"
        while time.monotonic() < deadline:
            if not self.running():
                raise AssertionError(f"agent {self.name} exited with {self.proc.poll()} while starting:\n{self.log()}")
            try:
                if self.ports is not None and self._has_health():
                    r = requests.get(f"http://127.0.0.1:{self.ports.health}/", timeout=1)
                    last = f"health {r.status_code}"
                    if r.status_code == 200 and self._ports_open():
                        return
                elif self._ports_open():
                    return
            except requests.RequestException as e:
                last = f"health: {e.__class__.__name__}"
            time.sleep(0.05)  # polling interval, not synchronisation
        raise AssertionError(f"agent {self.name} not ready after {timeout}s ({last}):\n{self.log()}")

    def _has_health(self) -> bool:
        """Whether the config enables a health_check served at `/` on ports.health."""
        text = self.config_path.read_text()
        return self.ports is not None and f"127.0.0.1:{self.ports.health}" in text and "health_check:" in text

    def _ports_open(self) -> bool:
        if self.ports is None:
            return True
        text = self.config_path.read_text()
        for p in (self.ports.grpc, self.ports.http, self.ports.metrics):
            if f":{p}" not in text:
                continue
            try:
                with socket.create_connection(("127.0.0.1", p), timeout=0.5):
                    pass
            except OSError:
                return False
        return True

    def send_signal(self, sig: int = _signal.SIGTERM) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def stop(self, timeout: float = 20.0, sig: int = _signal.SIGTERM) -> int:
        """Sends `sig`, waits for exit; returns the exit code (kills and fails after `timeout`)."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            t0 = time.monotonic()
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
                self.returncode = self.proc.returncode
                self.stop_seconds = time.monotonic() - t0
                raise AssertionError(f"agent {self.name} did not exit within {timeout}s of signal {sig}; killed")
            self.stop_seconds = time.monotonic() - t0
        self.returncode = self.proc.returncode
        if self._log_file:
            self._log_file.close()
            self._log_file = None
        return self.returncode

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return "(no log)"

    # --- probes -----------------------------------------------------------------------------

    def health(self) -> int:
        assert self.ports is not None
        return requests.get(f"http://127.0.0.1:{self.ports.health}/", timeout=2).status_code

    def metrics_text(self) -> str:
        assert self.ports is not None
        r = requests.get(f"http://127.0.0.1:{self.ports.metrics}/metrics", timeout=5)
        r.raise_for_status()
        return r.text

    def samples(self) -> list[Sample]:
        return parse_openmetrics(self.metrics_text())

    def metric(self, name: str, **labels) -> float:
        """Sum of the samples named `name` whose labels include `labels` (0 when none)."""
        return sum(s.value for s in self.samples() if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))

    def wait_metric(self, name: str, pred, timeout: float = 20.0, **labels) -> float:
        """Polls /metrics until `pred(value)` holds."""
        deadline = time.monotonic() + timeout
        v = None
        while time.monotonic() < deadline:
            v = self.metric(name, **labels)
            if pred(v):
                return v
            time.sleep(0.1)  # polling interval
        raise AssertionError(f"{name}{labels} = {v} did not satisfy the condition within {timeout}s")

    def proc_status(self) -> dict[str, int]:
        """VmRSS / VmHWM / ... from /proc/PID/status, in KiB."""
        out = {}
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            k, _, v = line.partition(":")
            if k.startswith("Vm"):
                out[k] = int(v.split()[0])
        return out

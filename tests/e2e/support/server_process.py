"""A server binary from a Debian package (Prometheus, Alertmanager) run by a test: started in its
work directory with its output in a log file, ready once `/-/ready` answers 200, stopped with
SIGTERM (SIGKILL after a timeout)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Optional

import requests


class ServerProcess:
    """Subclasses set `name`, `workdir`, `url`, `log_path` and implement `command()`."""

    name = "server"
    workdir: Path
    url: str
    log_path: Path
    proc: Optional[subprocess.Popen] = None
    _log = None

    def command(self) -> list[str]:
        raise NotImplementedError

    def start(self, timeout: float = 60.0):
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.command(), stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, cwd=self.workdir)
        deadline = time.monotonic() + timeout
        last = "not polled"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.name} exited with {self.proc.returncode} while starting:\n{self.log()}")
            try:
                r = requests.get(f"{self.url}/-/ready", timeout=1)
                last = f"/-/ready {r.status_code}"
                if r.status_code == 200:
                    return self
            except requests.RequestException as e:
                last = f"/-/ready: {e.__class__.__name__}"
            time.sleep(0.1)  # polling interval, not synchronisation
        raise AssertionError(f"{self.name} not ready after {timeout}s ({last}):\n{self.log()}")

    def stop(self, timeout: float = 20.0) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if self._log:
            self._log.close()
            self._log = None

    def log(self, tail: int = 20000) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return "(no log)"
        return text if len(text) <= tail else "...(cut)...\n" + text[-tail:]

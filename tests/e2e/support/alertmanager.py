"""A real Prometheus Alertmanager (Debian package `prometheus-alertmanager`) for the e2e tests:
started on free ports in a temporary directory with clustering off, ready once `/-/ready`
answers 200, read through its API v2 (`GET /api/v2/alerts`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any, Optional

import pytest
import requests

from .agent import REPO, free_port

DEPLOY_CONFIG = REPO / "deploy" / "alertmanager" / "alertmanager.yml"


def binary() -> str:
    """The Alertmanager binary; without it the test skips, or fails when CI=true."""
    candidates = [os.environ.get("ALERTMANAGER_BIN"), shutil.which("prometheus-alertmanager"),
                  shutil.which("alertmanager"), "/usr/bin/prometheus-alertmanager"]
    for p in candidates:
        if p and os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    msg = "alertmanager not found (Debian package `prometheus-alertmanager`; scripts/test.sh installs it)"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(msg + " and CI=true", pytrace=False)
    pytest.skip(msg)


class Alertmanager:
    """One Alertmanager process: its config, storage and log live under `workdir`."""

    def __init__(self, workdir: Path, config_text: str) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config_path = workdir / "alertmanager.yml"
        self.data_dir = workdir / "alertmanager-data"
        self.log_path = workdir / "alertmanager.log"
        self.config_path.write_text(config_text)
        self.proc: Optional[subprocess.Popen] = None
        self._log = None

    def start(self, timeout: float = 60.0) -> "Alertmanager":
        args = [
            binary(),
            f"--config.file={self.config_path}",
            f"--storage.path={self.data_dir}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--cluster.listen-address=",  # no gossip: a single, isolated instance
            "--log.level=info",
        ]
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     cwd=self.workdir)
        deadline = time.monotonic() + timeout
        last = "not polled"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"alertmanager exited with {self.proc.returncode} while starting:\n{self.log()}")
            try:
                r = requests.get(f"{self.url}/-/ready", timeout=1)
                last = f"/-/ready {r.status_code}"
                if r.status_code == 200:
                    return self
            except requests.RequestException as e:
                last = f"/-/ready: {e.__class__.__name__}"
            time.sleep(0.1)  # polling interval, not synchronisation
        raise AssertionError(f"alertmanager not ready after {timeout}s ({last}):\n{self.log()}")

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

    # --- API v2 ---------------------------------------------------------------------------------

    def alerts(self, **labels: str) -> list[dict[str, Any]]:
        """Alerts Alertmanager lists now (active, silenced, inhibited, unprocessed; not resolved
        ones), optionally only those whose labels include `labels`."""
        r = requests.get(f"{self.url}/api/v2/alerts", timeout=5)
        if r.status_code != 200:
            raise AssertionError(f"GET /api/v2/alerts: HTTP {r.status_code}: {r.text[:500]}")
        out = r.json()
        return [a for a in out if all(a["labels"].get(k) == v for k, v in labels.items())]

    def post(self, alerts: list[dict]) -> requests.Response:
        """Posts alerts directly (for checking the server itself)."""
        return requests.post(f"{self.url}/api/v2/alerts", json=alerts, timeout=5)


def deploy_config(webhook_port: int) -> str:
    """deploy/alertmanager/alertmanager.yml with its webhooks pointed at `webhook_port`."""
    return DEPLOY_CONFIG.read_text().replace("127.0.0.1:5001", f"127.0.0.1:{webhook_port}")

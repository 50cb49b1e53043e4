"""A real Prometheus Alertmanager (Debian package `prometheus-alertmanager`) for the e2e tests:
started on free ports in a temporary directory with clustering off, ready once `/-/ready`
answers 200, read through its API v2 (`GET /api/v2/alerts`).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import requests

from .agent import REPO, free_port
from .server_process import ServerProcess

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


class Alertmanager(ServerProcess):
    """One Alertmanager process: its config, storage and log live under `workdir`."""

    name = "alertmanager"

    def __init__(self, workdir: Path, config_text: str) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config_path = workdir / "alertmanager.yml"
        self.data_dir = workdir / "alertmanager-data"
        self.log_path = workdir / "alertmanager.log"
        self.config_path.write_text(config_text)

    def command(self) -> list[str]:
        args = [
            binary(),
            f"--config.file={self.config_path}",
            f"--storage.path={self.data_dir}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--cluster.listen-address=",  # no gossip: a single, isolated instance
            "--log.level=info",
        ]
        return args

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

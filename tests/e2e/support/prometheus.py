"""A real Prometheus server (Debian package `prometheus`) for the e2e tests: started on free ports in
a temporary directory, ready once `/-/ready` answers 200, queried through its HTTP API
(`/api/v1/query`, `/api/v1/series`).
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any, Callable, Optional

import pytest
import requests

from . import yamlgen
from .agent import free_port
from .server_process import ServerProcess


def binary() -> str:
    """The prometheus binary; without it the test skips, or fails when CI=true."""
    p = os.environ.get("PROMETHEUS_BIN") or shutil.which("prometheus") or "/usr/bin/prometheus"
    if os.path.isfile(p) and os.access(p, os.X_OK):
        return p
    msg = "prometheus not found (Debian package `prometheus`; scripts/test.sh installs it)"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(msg + " and CI=true", pytrace=False)
    pytest.skip(msg)


class Prometheus(ServerProcess):
    """One Prometheus process: its config, TSDB directory and log live under `workdir`."""

    name = "prometheus"

    def __init__(self, workdir: Path, scrape: dict[str, str], *, interval: str = "1s",
                 remote_write_receiver: bool = True, rule_files: tuple[Path, ...] = ()) -> None:
        """`scrape`: job name -> `host:port` target, each scraped every `interval` with honor_labels
        (the agent's `job` / `instance` labels are kept, as otelcol's docs advise). `rule_files`:
        rule files copied into `workdir` and evaluated every `interval`."""
        self.workdir = workdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config_path = workdir / "prometheus.yml"
        self.data_dir = workdir / "prometheus-data"
        self.log_path = workdir / "prometheus.log"
        self.remote_write_receiver = remote_write_receiver
        cfg = {
            "global": {"scrape_interval": interval, "evaluation_interval": interval},
            "scrape_configs": [
                {
                    "job_name": job,
                    "honor_labels": True,
                    "scrape_interval": interval,
                    "scrape_timeout": interval,
                    "static_configs": [{"targets": [target]}],
                }
                for job, target in scrape.items()
            ],
        }
        if rule_files:
            cfg["rule_files"] = []
            for f in rule_files:
                dst = workdir / f"rules-{len(cfg['rule_files'])}-{Path(f).name}"
                shutil.copyfile(f, dst)
                cfg["rule_files"].append(str(dst))
        self.config_path.write_text(yamlgen.dump(cfg))

    @property
    def remote_write_url(self) -> str:
        return f"{self.url}/api/v1/write"

    def command(self) -> list[str]:
        args = [
            binary(),
            f"--config.file={self.config_path}",
            f"--storage.tsdb.path={self.data_dir}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--log.level=info",
        ]
        if self.remote_write_receiver:
            args.append("--web.enable-remote-write-receiver")
        return args

    # --- HTTP API -------------------------------------------------------------------------------

    def _get(self, path: str, params: Any) -> Any:
        r = requests.get(f"{self.url}{path}", params=params, timeout=5)
        body = r.json()
        if r.status_code != 200 or body.get("status") != "success":
            raise AssertionError(f"GET {path} {params}: HTTP {r.status_code}: {body}")
        return body["data"]

    def query(self, expr: str) -> list[dict]:
        """An instant query now: the result vector as [{"metric": {...}, "value": float}]."""
        data = self._get("/api/v1/query", {"query": expr})
        if data["resultType"] != "vector":
            raise AssertionError(f"{expr}: expected a vector, got {data['resultType']}")
        return [{"metric": r["metric"], "value": float(r["value"][1])} for r in data["result"]]

    def series(self, match: str) -> list[dict]:
        """Label sets of the series matching `match` (over the last hour)."""
        now = time.time()
        return self._get("/api/v1/series", {"match[]": match, "start": now - 3600, "end": now + 60})

    def alerts(self) -> list[dict]:
        """The pending and firing alerts of the loaded rules (`/api/v1/alerts`): [{labels, state, ...}]."""
        return self._get("/api/v1/alerts", {})["alerts"]

    def targets_health(self) -> dict[str, str]:
        """job -> health of the active scrape targets ("up", "down", "unknown")."""
        data = self._get("/api/v1/targets", {"state": "active"})
        return {t["labels"].get("job", "?"): t["health"] for t in data["activeTargets"]}


def wait_until(pred: Callable[[], Any], timeout: float, what: Callable[[], str] | str, interval: float = 0.2):
    """Polls `pred` until it returns a truthy value (returned); fails with `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    err: Optional[BaseException] = None
    while time.monotonic() < deadline:
        try:
            v = pred()
            if v:
                return v
            err = None
        except AssertionError as e:  # a query that is not ready yet
            err = e
        time.sleep(interval)  # polling interval, not synchronisation
    detail = what() if callable(what) else what
    raise AssertionError(f"not true within {timeout}s: {detail}" + (f"\nlast error: {err}" if err else ""))

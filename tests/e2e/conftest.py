"""Fixtures for the inferwatch end-to-end tests.

- `agents`: a factory starting `inferwatch run` processes on temp configs; every agent still
  running at the end of a test is stopped with SIGTERM and must exit 0. The agents' logs are
  attached to the report of a failed test.
- `grpc_sink` / `http_sink`: factories of scriptable OTLP sinks (support/sink.py).
- `inferwatch_bin`: the binary ($INFERWATCH_BIN, default target/release/inferwatch).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from support import agent as agent_mod
from support import alertmanager as am_mod
from support.agent import Agent, Ports, closed_port, make_config
from support.sink import Behavior, GrpcSink, HttpSink

SLOW = os.environ.get("INFERWATCH_SLOW") == "1"


def pytest_collection_modifyitems(config, items):
    _spread_long_tests(config, items)
    if SLOW:
        return
    skip = pytest.mark.skip(reason="slow test: set INFERWATCH_SLOW=1")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


def _spread_long_tests(config, items) -> None:
    """Puts the tests marked `long` at the heads of the blocks xdist's schedulers first hand the
    workers (worker i gets the next `remaining // (workers - i)` items), the longest first, so
    that they start at once on different workers instead of queueing behind each other. Every
    worker collects the same order: the order depends only on the items and the worker count."""
    # Workers collect (the controller does not); xdist gives each the worker count.
    workers = getattr(config, "workerinput", {}).get("workercount")
    if not isinstance(workers, int) or workers < 2:
        return
    long_items = sorted((i for i in items if i.get_closest_marker("long")),
                        key=lambda i: i.get_closest_marker("long").args[0])
    if not long_items:
        return
    starts, pos, remaining = [], 0, len(items)
    for w in range(workers):
        starts.append(pos)
        take = remaining // (workers - w)
        pos, remaining = pos + take, remaining - take
    slots: dict[int, pytest.Item] = {}
    for k, item in enumerate(long_items):
        at = starts[k % workers] + k // workers
        while at in slots:
            at += 1
        slots[at] = item
    others = iter(i for i in items if not i.get_closest_marker("long"))
    items[:] = [slots[p] if p in slots else next(others) for p in range(len(items))]


@pytest.fixture(scope="session")
def inferwatch_bin() -> str:
    b = agent_mod.binary()
    if not Path(b).is_file() or not os.access(b, os.X_OK):
        pytest.exit(f"inferwatch binary not found at {b}: build it (cargo build --release --bin inferwatch) "
                    "or set INFERWATCH_BIN", returncode=3)
    return b


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.failed:
        for a in getattr(item, "_inferwatch_agents", []):
            text = a.log()
            if len(text) > 20000:
                text = "...(cut)...\n" + text[-20000:]
            rep.sections.append((f"inferwatch {a.name} log ({a.log_path})", text))


class AgentFactory:
    def __init__(self, tmp_path: Path, item) -> None:
        self.tmp_path = tmp_path
        self.started: list[Agent] = []
        self.item = item
        item._inferwatch_agents = self.started

    def __call__(self, name: str, cfg, ports: Ports | None = None, start: bool = True, **kw) -> Agent:
        a = Agent(name, cfg, ports, self.tmp_path, **kw)
        self.started.append(a)
        if start:
            a.start()
        return a

    def config(self, *args, **kw):
        return make_config(*args, **kw)


@pytest.fixture
def agents(inferwatch_bin, tmp_path, request, grpc_sink, http_sink):
    # Depends on the sink fixtures so that agents stop (and drain) before the sinks go away.
    f = AgentFactory(tmp_path, request.node)
    yield f
    problems = []
    for a in reversed(f.started):
        if a.running():
            try:
                rc = a.stop(timeout=20)
            except AssertionError as e:
                problems.append(str(e))
                continue
            if rc != 0:
                problems.append(f"agent {a.name} exited with {rc} after SIGTERM")
            print(f"agent {a.name} stopped in {a.stop_seconds or 0:.2f}s (exit {rc}); log {a.log_path}")
    if problems:
        pytest.fail("; ".join(problems), pytrace=False)


@pytest.fixture
def grpc_sink():
    sinks: list[GrpcSink] = []

    def make(behavior: Behavior | None = None, port: int = 0, start: bool = True, **kw) -> GrpcSink:
        s = GrpcSink(port=port, behavior=behavior, **kw)
        sinks.append(s)
        if start:
            s.start()
        return s

    yield make
    for s in sinks:
        s.stop()


@pytest.fixture
def http_sink():
    sinks: list[HttpSink] = []

    def make(behavior: Behavior | None = None, port: int = 0) -> HttpSink:
        s = HttpSink(port=port, behavior=behavior).start()
        sinks.append(s)
        return s

    yield make
    for s in sinks:
        s.stop()


@pytest.fixture
def run_cli(inferwatch_bin, tmp_path):
    """Runs the binary with arguments; returns CompletedProcess (text)."""

    def run(*args, timeout: float = 30, env: dict | None = None, cwd: Path | None = None):
        e = dict(os.environ)
        e.pop("RUST_LOG", None)
        if env:
            e.update(env)
        return subprocess.run([inferwatch_bin, *args], capture_output=True, text=True, timeout=timeout,
                              env=e, cwd=cwd or tmp_path, stdin=subprocess.DEVNULL)

    return run


@pytest.fixture
def alertmanager(tmp_path):
    """A real Alertmanager (Debian `prometheus-alertmanager`) with the shipped routing, sending
    its notifications nowhere; not started (`.start()`)."""
    am_mod.binary()  # skips (or fails under CI=true) without the Debian package
    am = am_mod.Alertmanager(tmp_path, am_mod.deploy_config(closed_port()))
    yield am
    am.stop()

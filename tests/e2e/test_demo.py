"""`inferwatch demo`: the simulator's queue blocks, the agent's detectors raise an alert while the
fault lasts, and the alert resolves after it ends — within the run, in this order."""

from __future__ import annotations

import re


def test_demo_alert_fires_during_the_fault_and_resolves_after(run_cli):
    r = run_cli("demo", "--fault-after", "20", "--fault-for", "12", "--duration", "62", timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout
    fired = [int(m) for m in re.findall(r"t=\s*(\d+)s\s+ALERT FIRING\s+critical\s+kv_pressure on llm\.queue\.p99", out)]
    resolved = [int(m) for m in re.findall(r"t=\s*(\d+)s\s+ALERT RESOLVED\s+critical\s+kv_pressure on llm\.queue\.p99", out)]
    assert fired, out[-4000:]
    assert resolved, out[-4000:]
    # Fired after the fault began (t = 20 s) and within a minute; resolved after it fired and after
    # the fault ended (t = 32 s).
    assert 20 <= fired[0] <= 60, out[-4000:]
    assert resolved[0] > fired[0] and resolved[0] >= 32, out[-4000:]
    # Healthy before the fault: no alert line before t = 20 s.
    early = [int(m) for m in re.findall(r"t=\s*(\d+)s\s+ALERT", out) if int(m) < 20]
    assert not early, out[-4000:]
    assert "spans received by the agent:" in out

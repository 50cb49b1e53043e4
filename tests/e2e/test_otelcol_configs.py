"""Real OpenTelemetry Collector configurations load in inferwatch.

tests/fixtures/otelcol/ holds copies of deployment configs (the official helm chart's rendered
examples, collector-releases' distribution configs, the OpenTelemetry demo, Grafana's LGTM image,
Tempo's example, vLLM production-stack's), each with a first line naming its origin and licence.

Each file is validated as it is, then again after removing ONLY the components inferwatch does
not have: the removal is done here, from the list `inferwatch components` prints (plus otelcol's
names the registry aliases), on the tree `inferwatch print-config --format json` prints, and
what was removed is printed. The result must pass `inferwatch validate` (exit 0), except the
files in REFUSED, which ask for something inferwatch refuses on purpose: those must fail with
the stated reason (and nothing is silently ignored).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "otelcol"
FILES = sorted(p.name for p in FIXTURES.glob("*.yaml"))

# otelcol names inferwatch's registry maps onto its own types (core/src/registry.rs).
ALIASES = {
    "exporter": {"otlp_grpc": "otlp", "otlp_http": "otlphttp", "logging": "debug"},
    "processor": {"resource_detection": "resourcedetection", "k8s_attributes": "k8sattributes"},
}
SECTIONS = {"receivers": "receiver", "processors": "processor", "exporters": "exporter",
            "connectors": "connector", "extensions": "extension"}

# Files that keep asking for something inferwatch refuses after the removal, with the reason
# each error must give. Every other file must validate.
REFUSED = {
    "demo-otelcol-config.yaml": [
        "service.telemetry.logs.processors: not supported by inferwatch: exporting the agent's own logs",
        "processors.filter/sanitize_profiles.profiles: unknown field `profiles`",
        "processors.resource_detection.detectors[1]: detector \"docker\" is not available",
    ],
    "helm-internalTelemetryViaOTLP.yaml": [
        "service.telemetry.logs.processors: not supported by inferwatch: exporting the agent's own logs",
        "service.telemetry.traces.processors: not supported by inferwatch: inferwatch does not trace itself",
    ],
    "helm-daemonset-resource-detection-agent.yaml": [
        "processors.resourcedetection/env.detectors[1]: detector \"k8s_api\" is not available",
        "processors.resourcedetection/env.eks: unknown field `eks`",
    ],
}

# Upstream configs otelcol itself refuses (kept, since they are what users copy).
REFUSED["helm-kubernetesAttributes.yaml"] = [
    # The chart's example lists a `resource` processor it never defines.
    "service.pipelines.traces.processors[0]: references processor \"resource\" which is not defined",
]
# Everything in it is a component inferwatch lacks (Kubernetes cluster and object receivers).
REFUSED["helm-alternate-config.yaml"] = ["service.pipelines: at least one pipeline is required"]

# Pipeline types (signals) inferwatch does not carry: removed with their pipelines.
SIGNALS = {"traces", "metrics", "logs"}

_ERR = re.compile(r"^\s+\S+:\d+:\d+: (?P<rest>.*)$")


def env_for(text: str) -> dict[str, str]:
    """A value for every variable the file references, as a pod's environment would give."""
    names = sorted(set(re.findall(r"\$\{(?:env:)?([A-Za-z_][A-Za-z0-9_]*)", text)))
    return {n: (str(14000 + i) if "PORT" in n else "10.0.0.1") for i, n in enumerate(names)}


@pytest.fixture(scope="module")
def known(inferwatch_bin) -> dict[str, set[str]]:
    import subprocess
    out = subprocess.run([inferwatch_bin, "components"], capture_output=True, text=True, check=True).stdout
    types: dict[str, set[str]] = {}
    for line in out.splitlines()[1:]:
        kind, name = line.split()[:2]
        types.setdefault(kind, set()).add(name)
    for kind, aliases in ALIASES.items():
        types[kind] |= {a for a, target in aliases.items() if target in types.get(kind, set())}
    return types


def remove_unknown(tree: dict, known: dict[str, set[str]]) -> list[str]:
    """Removes components of types inferwatch lacks, their uses, and pipelines left without a
    receiver or an exporter; returns what was removed."""
    removed: list[str] = []
    gone: set[str] = set()
    for section, kind in SECTIONS.items():
        comps = tree.get(section) or {}
        for cid in list(comps):
            if cid.split("/", 1)[0] not in known.get(kind, set()):
                del comps[cid]
                gone.add(cid)
                removed.append(f"{section}.{cid}")
    service = tree.get("service") or {}
    if service.get("extensions"):
        service["extensions"] = [e for e in service["extensions"] if e not in gone]
    pipelines = service.get("pipelines") or {}
    for pid in list(pipelines):
        if pid.split("/", 1)[0] not in SIGNALS:
            del pipelines[pid]
            removed.append(f"service.pipelines.{pid} (signal)")
            continue
        p = pipelines[pid] or {}
        for role in ("receivers", "processors", "exporters"):
            if p.get(role):
                p[role] = [c for c in p[role] if c not in gone]
        if not p.get("receivers") or not p.get("exporters"):
            del pipelines[pid]
            removed.append(f"service.pipelines.{pid}")
    return removed


def errors(stderr: str) -> list[str]:
    return [m.group("rest") for m in map(_ERR.match, stderr.splitlines()) if m]


def test_fixtures_name_their_origin():
    assert len(FILES) >= 18, FILES
    for name in FILES:
        first = (FIXTURES / name).read_text().splitlines()[0]
        assert re.match(r"# origin: https://github\.com/\S+ \S+ @ [0-9a-f]{12} \(licence: [\w.-]+\)", first), name


@pytest.mark.parametrize("name", FILES)
def test_otelcol_config_loads(run_cli, known, tmp_path, name):
    src = FIXTURES / name
    env = env_for(src.read_text())
    unchanged = run_cli("validate", "--config", str(src), env=env)
    printed = run_cli("print-config", "--mode", "unredacted", "--format", "json", "--config", str(src), env=env)
    assert printed.stdout.strip(), printed.stderr
    tree = json.loads(printed.stdout)
    removed = remove_unknown(tree, known)
    print(f"{name}: unchanged exit {unchanged.returncode}; removed {len(removed)}: {', '.join(removed) or '-'}")
    if not removed:
        # Removing nothing leaves the same verdict as the file itself.
        assert unchanged.returncode == (2 if name in REFUSED else 0), unchanged.stderr
    stripped = tmp_path / name.replace(".yaml", ".json")
    stripped.write_text(json.dumps(tree))
    r = run_cli("validate", "--config", str(stripped), env=env)
    if name not in REFUSED:
        assert r.returncode == 0, f"removed {removed}\n{r.stderr}"
        return
    assert r.returncode == 2, r.stderr
    got = errors(r.stderr)
    want = REFUSED[name]
    assert len(got) == len(want), "\n".join(got)
    for w in want:
        assert any(g.startswith(w) for g in got), f"{w!r} not in\n" + "\n".join(got)


def test_counts(run_cli, known, tmp_path, capsys):
    """The figures: how many load unchanged, how many after the removal (printed with -s)."""
    unchanged = after = 0
    for name in FILES:
        src = FIXTURES / name
        env = env_for(src.read_text())
        if run_cli("validate", "--config", str(src), env=env).returncode == 0:
            unchanged += 1
        printed = run_cli("print-config", "--mode", "unredacted", "--format", "json", "--config", str(src), env=env)
        tree = json.loads(printed.stdout)
        remove_unknown(tree, known)
        p = tmp_path / f"{name}.json"
        p.write_text(json.dumps(tree))
        if run_cli("validate", "--config", str(p), env=env).returncode == 0:
            after += 1
    with capsys.disabled():
        print(f"\notelcol configs: {len(FILES)}; load unchanged: {unchanged}; load after removing "
              f"components inferwatch lacks: {after}; refused on purpose: {len(REFUSED)}")
    assert after == len(FILES) - len(REFUSED)

"""Reading the Kubernetes manifests (deploy/kubernetes) as the kubelet would run them: rendering an
overlay with `kubectl kustomize`, finding the agent's workload and container, the environment the
kubelet gives it (envFrom, env, Downward API fields emulated from POD) and the pipeline ConfigMap
it runs. Shared by test_kubernetes.py and test_node_agent_pod.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import requests
import yaml

from .sim import wait_until

REPO = Path(__file__).resolve().parents[3]
K8S = REPO / "deploy" / "kubernetes"
CI = os.environ.get("CI") == "true"
AGENT = "inferwatch"          # the agent's container name in every role
# What the kubelet would put in the Downward API fields of a pod of the sidecar Deployment.
POD = {"metadata.name": "vllm-5d8f7c9b6-x2k9q", "spec.nodeName": "gpu-node-7",
       "metadata.uid": "3f1c2b9e-8d4a-4e4b-9a57-0c2d1e6f7a88"}


def tool(name: str, *candidates: Path | str | None) -> str:
    """The path of a tool: the first existing candidate, else PATH; skip (fail under CI=true) without it."""
    for c in candidates:
        if c and Path(c).is_file() and os.access(c, os.X_OK):
            return str(c)
    found = shutil.which(name)
    if found:
        return found
    msg = f"{name} is not installed (see docs/kubernetes.md, 'Checking the manifests')"
    if CI:
        pytest.fail(msg + "; CI=true requires it", pytrace=False)
    pytest.skip(msg)


def kubectl() -> str:
    return tool("kubectl")


def render(role: str) -> tuple[str, list[dict]]:
    r = subprocess.run([kubectl(), "kustomize", str(K8S / "overlays" / role)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, f"kubectl kustomize overlays/{role}:\n{r.stderr}"
    docs = [d for d in yaml.safe_load_all(r.stdout) if d]
    return r.stdout, docs


def objects(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[dict], kind: str, name: str) -> dict:
    found = [d for d in objects(docs, kind) if d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found among {[d['metadata']['name'] for d in objects(docs, kind)]}"
    return found[0]


def agent_workload(docs: list[dict]) -> tuple[dict, dict, dict]:
    """(workload, pod spec, agent container) of the workload that runs the agent."""
    found = []
    for d in docs:
        if d["kind"] in ("Deployment", "DaemonSet", "StatefulSet"):
            spec = d["spec"]["template"]["spec"]
            found += [(d, spec, c) for c in spec["containers"] if c["name"] == AGENT]
    assert len(found) == 1, f"{len(found)} workloads with a container named {AGENT}"
    return found[0]


def pod_env(docs: list[dict], workload: dict, container: dict) -> dict[str, str]:
    """The environment the kubelet gives `container`: envFrom ConfigMaps, then env (Downward API
    fields from POD, the namespace from the object)."""
    env: dict[str, str] = {}
    for src in container.get("envFrom", []):
        ref = src["configMapRef"]["name"]
        env.update({k: str(v) for k, v in one(docs, "ConfigMap", ref).get("data", {}).items()})
    fields = dict(POD, **{"metadata.namespace": workload["metadata"]["namespace"]})
    for e in container.get("env", []):
        if "value" in e:
            env[e["name"]] = str(e["value"])
        else:
            path = e["valueFrom"]["fieldRef"]["fieldPath"]
            assert path in fields, f"env {e['name']}: Downward API field {path} not emulated here"
            env[e["name"]] = fields[path]
    return env


def pipeline_text(docs: list[dict], spec: dict, container: dict) -> str:
    """The pipeline config the container runs: the ConfigMap mounted where --config points."""
    args = container.get("args", [])
    assert "--config" in args, args
    path = Path(args[args.index("--config") + 1])
    mount = next(m for m in container["volumeMounts"] if Path(m["mountPath"]) == path.parent)
    volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
    return one(docs, "ConfigMap", volume["configMap"]["name"])["data"][path.name]


def off_cluster(text: str, gateways: list[str]) -> str:
    """An agent's pipeline run on this box: its `loadbalancing` exporter's resolver.k8s (the
    gateway's EndpointSlices, from an API server there is none of here) replaced by
    resolver.static over `gateways` (host:port); everything else as shipped."""
    cfg = yaml.safe_load(text)
    lb = cfg["exporters"]["loadbalancing"]
    assert set(lb["resolver"]) == {"k8s"}, lb["resolver"]
    lb["resolver"] = {"static": {"hostnames": list(gateways)}}
    return yaml.safe_dump(cfg, sort_keys=False)


def wait_for(what: str, pred, timeout: float):
    """Polls `pred` until it returns a truthy value (returned); fails naming `what`."""
    return wait_until(pred, timeout, what, interval=0.1)


def start_healthy(agent, ports, timeout: float = 30) -> None:
    """Starts `agent` and waits until its health_check answers 200 (fails at once if it exits)."""
    agent.start(wait=False)

    def healthy():
        assert agent.running(), f"agent exited with {agent.proc.poll()}:\n{agent.log()[-4000:]}"
        try:
            return requests.get(f"http://127.0.0.1:{ports.health}/", timeout=1).status_code == 200
        except requests.RequestException:
            return False

    wait_for("health_check answers 200", healthy, timeout)

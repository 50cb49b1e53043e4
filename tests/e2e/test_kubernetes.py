"""The Kubernetes manifests (deploy/kubernetes): a kustomize base and the overlays sidecar,
node-agent and gateway, checked with the real tools and the real binary.

- `kubectl kustomize` renders every overlay (skipped when kubectl is missing, failed under CI);
- the three overlays apply to one cluster in any order: no object rendered twice with different
  content, the node agent's namespace privileged and the others' restricted, bindings naming
  their overlay's service account, every `<svc>.<ns>.svc` in the docs a rendered Service;
- the agent's pod in each: probes on health_check, listeners on 0.0.0.0, non-root, read-only
  root, no capabilities, RuntimeDefault seccomp, a writable state volume, requests and limits
  (memory_limiter below the limit), the settings ConfigMap through envFrom, the Downward API
  identity, monitors whose ports exist;
- checkov's Kubernetes (and Dockerfile) checks pass on the rendered objects, every skip is a
  `checkov.io/skip` annotation with its justification, and a weakened copy fails (so the scan is
  live);
- every pipeline ConfigMap passes `inferwatch validate` with exactly the environment its pod
  gets (envFrom + env + Downward API), nothing else;
- the PrometheusRule's groups pass `promtool check rules` and keep the groups of
  deploy/prometheus/inferwatch-rules.yml unchanged;
- "pod on a box": the rendered sidecar config runs as a local process with the pod's
  environment (listeners moved to free ports on 127.0.0.1) beside `inferwatch sim` serving the
  manifest's model, under `inferwatch bench` load; k8s.pod.name / namespace / node reach the
  golden-signal series it exports and the spans it passes on.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import requests
import yaml

from support.agent import Ports, free_port, parse_openmetrics
from support.kube import (AGENT, POD, REPO, agent_workload, objects, off_cluster, one, pipeline_text, pod_env,  # noqa: F401
                          render, start_healthy, tool, wait_for)
from support.sim import FAST_ANSWERS, FAST_GPU, sim_bin, sims  # noqa: F401 (fixtures)

ROLES = ("sidecar", "node-agent", "gateway")
# Each role's namespace: the node agent's hostPath volumes need Pod Security `privileged`, which
# the others' namespace must not get (test_overlays_apply_to_one_cluster_in_any_order).
NAMESPACE = {"sidecar": "inferwatch", "node-agent": "inferwatch-node", "gateway": "inferwatch"}
STATE_DIR = "/var/lib/inferwatch/state"
DOWNWARD_ENV = ("K8S_POD_NAME", "K8S_NAMESPACE_NAME", "K8S_NODE_NAME", "K8S_POD_UID", "K8S_CONTAINER_NAME")
EXPECTED_KINDS = {
    "sidecar": {"Namespace", "ConfigMap", "Deployment", "Service", "PodMonitor", "PrometheusRule", "NetworkPolicy",
                "ServiceAccount"},
    "node-agent": {"Namespace", "ConfigMap", "DaemonSet", "Service", "PodMonitor", "PrometheusRule", "NetworkPolicy",
                   "ServiceAccount", "ClusterRole", "ClusterRoleBinding"},
    "gateway": {"Namespace", "ConfigMap", "Deployment", "Service", "ServiceMonitor", "PrometheusRule", "NetworkPolicy",
                "PodDisruptionBudget", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
                "HorizontalPodAutoscaler"},
}
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding"}
# Golden-signal families (llm_signals; docs/llm-signals.md) the sidecar's exporter must carry the
# pod identity on: from the spans (TTFT, e2e), the request rate, and from the scrape (KV cache).
GOLDEN = ("llm_ttft_p95", "llm_e2e_p95", "llm_request_rate", "llm_kv_cache_usage", "llm_requests_running")


def checkov() -> str:
    # checkov pins packaging<24, which pytest 9 cannot use: it lives in a venv of its own.
    return tool("checkov", os.environ.get("CHECKOV"), REPO / ".venv" / "checkov" / "bin" / "checkov")


def promtool() -> str:
    return tool("promtool")


@pytest.fixture(scope="module")
def rendered() -> dict[str, tuple[str, list[dict]]]:
    return {role: render(role) for role in ROLES}


# --- reading the rendered objects ------------------------------------------------------------


def mib(quantity: str) -> float:
    units = {"Ki": 1 / 1024, "Mi": 1, "Gi": 1024}
    for u, f in units.items():
        if quantity.endswith(u):
            return float(quantity[: -len(u)]) * f
    return float(quantity) / (1 << 20)


# --- rendering and the shape of the pods ----------------------------------------------------


@pytest.mark.parametrize("role", ROLES)
def test_overlay_renders_every_object_in_the_namespace(rendered, role):
    _, docs = rendered[role]
    kinds = {d["kind"] for d in docs}
    assert kinds == EXPECTED_KINDS[role], f"missing {EXPECTED_KINDS[role] - kinds}, unexpected {kinds - EXPECTED_KINDS[role]}"
    for d in docs:
        if d["kind"] not in CLUSTER_SCOPED:
            assert d["metadata"].get("namespace") == NAMESPACE[role], f"{d['kind']}/{d['metadata']['name']}"
    # The settings reach the agent by envFrom (the reference follows the generated name).
    _, _, c = agent_workload(docs)
    refs = [s["configMapRef"]["name"] for s in c.get("envFrom", [])]
    assert any(r.startswith("inferwatch-settings-") for r in refs), refs
    settings = one(docs, "ConfigMap", next(r for r in refs if r.startswith("inferwatch-settings-")))["data"]
    assert settings["ALERTMANAGER_URL"].startswith("http"), settings
    for k in ("SLO_TTFT_P95", "SLO_TPOT_P95", "SLO_E2E_P99", "SLO_LATENCY_TARGET", "SLO_ERROR_TARGET", "GATEWAY_SERVICE"):
        assert settings[k], k


@pytest.mark.parametrize("role", ROLES)
def test_agent_pod_is_hardened_probed_and_sized(rendered, role):
    _, docs = rendered[role]
    workload, spec, c = agent_workload(docs)
    psc = spec["securityContext"]
    assert psc["runAsNonRoot"] is True and psc["runAsUser"] >= 10000
    assert psc["seccompProfile"]["type"] == "RuntimeDefault"
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"] and not sc["capabilities"].get("add")
    assert not spec.get("hostNetwork") and not spec.get("hostPID") and not sc.get("privileged")

    env = pod_env(docs, workload, c)
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    # Listeners the kubelet and Prometheus reach are on all interfaces, on the declared ports.
    for var, port in (("INFERWATCH_HEALTH_ENDPOINT", "health"), ("INFERWATCH_METRICS_ADDRESS", "self-metrics"),
                      ("INFERWATCH_PROMETHEUS_ENDPOINT", "signals")):
        assert env[var] == f"0.0.0.0:{ports[port]}", (var, env[var])
    if role == "sidecar":   # OTLP only from vLLM, on the pod's localhost
        assert env["INFERWATCH_GRPC_ENDPOINT"].startswith("127.0.0.1:")
    else:
        assert env["INFERWATCH_GRPC_ENDPOINT"] == f"0.0.0.0:{ports['otlp-grpc']}"
    for probe in ("livenessProbe", "readinessProbe"):
        get = c[probe]["httpGet"]
        assert get["path"] == "/" and ports.get(get["port"], get["port"]) == ports["health"], (probe, get)

    # State (checkpoints + sending queue) on a writable volume, the config read-only.
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    assert env["INFERWATCH_STATE_DIR"] == STATE_DIR and STATE_DIR in mounts
    vol = next(v for v in spec["volumes"] if v["name"] == mounts[STATE_DIR]["name"])
    assert "emptyDir" in vol or "persistentVolumeClaim" in vol, vol
    assert not mounts[STATE_DIR].get("readOnly")
    assert mounts["/etc/inferwatch"]["readOnly"] is True

    res = c["resources"]
    for k in ("cpu", "memory"):
        assert k in res["requests"] and k in res["limits"], res
    limit = mib(res["limits"]["memory"])
    # memory_limiter refuses before the kernel kills: its hard limit stays below the container's.
    assert int(env["INFERWATCH_MEMORY_LIMIT_MIB"]) <= 0.85 * limit, (env["INFERWATCH_MEMORY_LIMIT_MIB"], limit)
    assert mib(res["requests"]["memory"]) <= limit

    # Identity: the sidecar's pod is the data's pod; the node agent only adds its node.
    if role == "sidecar":
        assert set(DOWNWARD_ENV) <= env.keys()
        assert env["K8S_POD_NAME"] == POD["metadata.name"] and env["K8S_CONTAINER_NAME"] == AGENT
        assert env["K8S_NAMESPACE_NAME"] == "inferwatch" and env["K8S_NODE_NAME"] == POD["spec.nodeName"]
        vllm = next(x for x in spec["containers"] if x["name"] == "vllm")
        assert "--otlp-traces-endpoint=grpc://" + env["INFERWATCH_GRPC_ENDPOINT"] in vllm["args"]
        assert env["VLLM_METRICS_TARGET"] == f"127.0.0.1:{vllm['ports'][0]['containerPort']}"
    if role == "node-agent":
        assert env["K8S_NODE_NAME"] == POD["spec.nodeName"] and "K8S_POD_NAME" not in env
        # NVML as dcgm-exporter gets it: the nvidia runtime with every GPU visible, no GPU claimed.
        assert spec["runtimeClassName"] == "nvidia"
        assert env["NVIDIA_VISIBLE_DEVICES"] == "all" and "utility" in env["NVIDIA_DRIVER_CAPABILITIES"]
        assert "nvidia.com/gpu" not in res["limits"] and "nvidia.com/gpu" not in res["requests"]
        assert spec["serviceAccountName"] == "inferwatch-node-agent"
        role_rules = one(docs, "ClusterRole", "inferwatch-node-agent")["rules"]
        assert role_rules == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]
        svc = one(docs, "Service", "inferwatch-node-agent")
        assert svc["spec"]["internalTrafficPolicy"] == "Local"
    if role == "gateway":
        svc = one(docs, "Service", "inferwatch-gateway")
        assert svc["spec"]["clusterIP"] == "None"
        # The autoscaler owns the replica count (test_gateway_scales_with_an_hpa_on_cpu_only).
        assert "replicas" not in workload["spec"], workload["spec"].get("replicas")
        # k8s_attributes: read-only pods and namespaces, bound to the gateway's service account.
        assert spec["serviceAccountName"] == "inferwatch-gateway" and spec["automountServiceAccountToken"] is True
        role_rules = one(docs, "ClusterRole", "inferwatch-gateway")["rules"]
        assert role_rules == [{"apiGroups": [""], "resources": ["pods", "namespaces"], "verbs": ["get", "list", "watch"]}]
        binding = one(docs, "ClusterRoleBinding", "inferwatch-gateway")
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "inferwatch-gateway", "namespace": "inferwatch"}]
        pipeline = yaml.safe_load(pipeline_text(docs, spec, c))
        rules = pipeline["processors"]["k8s_attributes"]["pod_association"]
        assert [r["sources"] for r in rules] == [[{"from": "resource_attribute", "name": "k8s.pod.uid"}],
                                                 [{"from": "connection"}]], rules
        # Every pipeline reading the agents' data associates it (the others read connectors fed by those).
        from_agents = [p for p in pipeline["service"]["pipelines"].values() if "otlp" in p["receivers"]]
        assert len(from_agents) >= 3 and all("k8s_attributes" in p["processors"] for p in from_agents), from_agents
        # Forwarding agents (whose connection is their own pod) are excluded from association.
        excluded = [p["name"] for p in pipeline["processors"]["k8s_attributes"]["exclude"]["pods"]]
        for agent_pod in ["inferwatch-node-agent-7xk2p", "inferwatch-gateway-5d9c8-abcde"]:
            assert any(re.search(n, agent_pod) for n in excluded), (agent_pod, excluded)
        assert not any(re.search(n, "vllm-5d8f7c9b6-x2k9q") for n in excluded), excluded

    # Every monitor scrapes named ports the selected pods have, with the rules' job names.
    monitors = objects(docs, "PodMonitor") + objects(docs, "ServiceMonitor")
    assert monitors
    labels = workload["spec"]["template"]["metadata"]["labels"]
    for m in monitors:
        sel = m["spec"]["selector"]["matchLabels"]
        if m["kind"] == "PodMonitor":
            assert sel.items() <= labels.items(), (sel, labels)
            endpoints, have = m["spec"]["podMetricsEndpoints"], set(ports)
        else:
            svc = next(s for s in objects(docs, "Service") if sel.items() <= s["metadata"].get("labels", {}).items())
            assert svc["spec"]["selector"].items() <= labels.items()
            endpoints, have = m["spec"]["endpoints"], {p["name"] for p in svc["spec"]["ports"]}
        jobs = set()
        for ep in endpoints:
            assert ep["port"] in have, (m["metadata"]["name"], ep["port"], have)
            jobs |= {r["replacement"] for r in ep.get("relabelings", []) if r.get("targetLabel") == "job"}
        assert jobs == {"inferwatch-signals", "inferwatch-self"}, jobs


# --- the overlays on one cluster --------------------------------------------------------------


PSA = "pod-security.kubernetes.io/"


def object_key(d: dict) -> tuple[str, str | None, str]:
    """What `kubectl apply` identifies an object by: kind, namespace (None: cluster-scoped), name."""
    return d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]


def test_overlays_apply_to_one_cluster_in_any_order(rendered):
    # (a) An object two overlays render must be the same in both: else the last `kubectl apply`
    # wins and changes what the other overlay deployed (its namespace's Pod Security level, a
    # binding's subjects, a shared ConfigMap, ...), so the outcome depends on the order.
    seen: dict[tuple, tuple[str, dict]] = {}
    conflicts = []
    for role in ROLES:
        for d in rendered[role][1]:
            k = object_key(d)
            if k in seen and seen[k][1] != d:
                conflicts.append(f"{'/'.join(x or '-' for x in k)}: {seen[k][0]} and {role} render it differently")
            seen.setdefault(k, (role, d))
    assert not conflicts, "\n".join(conflicts)

    # (b) Each agent's pods run in a namespace whose Pod Security admits them and no more, in
    # every overlay that renders that namespace: privileged for the node agent (hostPath volumes,
    # which baseline and restricted refuse), restricted for the others; where privileged is
    # enforced, restricted is still audited and warned about.
    pod_ns = {}
    for role in ROLES:
        workload, spec, _ = agent_workload(rendered[role][1])
        ns = pod_ns[role] = workload["metadata"]["namespace"]
        host_path = [v["name"] for v in spec["volumes"] if "hostPath" in v]
        want = "privileged" if host_path else "restricted"
        assert (role == "node-agent") == bool(host_path), (role, host_path)
        renders = [(r, d) for r in ROLES for d in rendered[r][1] if object_key(d) == ("Namespace", None, ns)]
        assert any(r == role for r, _ in renders), f"overlays/{role} does not create its namespace {ns}"
        for r, d in renders:
            labels = d["metadata"].get("labels", {})
            assert labels.get(PSA + "enforce") == want, f"overlays/{r}: namespace {ns} ({role}'s pods): {labels}"
            if want == "privileged":
                assert labels.get(PSA + "audit") == labels.get(PSA + "warn") == "restricted", labels
    assert pod_ns == NAMESPACE, pod_ns

    # Every binding names service accounts an overlay creates: its own, in its pods' namespace,
    # or (the gateway's EndpointSlices, for the agents' `loadbalancing`) the account an agent
    # overlay's pods run as, in that overlay's namespace.
    accounts = {role: {object_key(d)[1:] for d in objects(rendered[role][1], "ServiceAccount")} for role in ROLES}
    runs_as = {}
    for role in ROLES:
        workload, spec, _ = agent_workload(rendered[role][1])
        runs_as[role] = (workload["metadata"]["namespace"], spec.get("serviceAccountName", "default"))
    for role in ROLES:
        docs = rendered[role][1]
        for b in objects(docs, "ClusterRoleBinding") + objects(docs, "RoleBinding"):
            for s in b["subjects"]:
                key = (s.get("namespace"), s["name"])
                assert s["kind"] == "ServiceAccount", (role, b["metadata"]["name"], s)
                owner = role if key in accounts[role] else next((r for r in ROLES if runs_as[r] == key), None)
                assert owner is not None and key in accounts[owner], \
                    f"overlays/{role} binding {b['metadata']['name']} names {key}, which no overlay's pods run as"
                assert s["namespace"] == pod_ns[owner], (role, s)


def test_service_dns_names_in_docs_and_manifests_exist(rendered):
    # `<service>.<namespace>.svc` named where users copy it from (vLLM's OTLP endpoint, the
    # agents' OTLP_ENDPOINT) must be a Service an overlay renders in that namespace.
    services = {(d["metadata"]["name"], d["metadata"]["namespace"]) for _, docs in rendered.values()
                for d in objects(docs, "Service")}
    files = [REPO / "README.md", REPO / "docs" / "kubernetes.md", *sorted((REPO / "deploy" / "kubernetes").rglob("*.yaml"))]
    named = set()
    for f in files:
        for name, ns in re.findall(r"\b(inferwatch-[a-z0-9-]+)\.([a-z0-9-]+)\.svc\b", f.read_text()):
            named.add((name, ns))
            assert (name, ns) in services, f"{f.relative_to(REPO)} names {name}.{ns}.svc, no overlay renders it"
    assert {s for s in named if s[0] in ("inferwatch-gateway", "inferwatch-node-agent")} == \
        {s for s in services if s[0] in ("inferwatch-gateway", "inferwatch-node-agent")}, named


# --- the fleet tier ---------------------------------------------------------------------------


AGENTS = ("sidecar", "node-agent")
TOKEN_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
_ENV_REF = re.compile(r"\$\{env:([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def expand(text: str, env: dict[str, str]) -> str:
    """`${env:VAR:-default}` as core substitutes it: the default only when VAR is unset."""
    return _ENV_REF.sub(lambda m: env[m.group(1)] if m.group(1) in env else (m.group(2) or ""), text)


def pod_pipeline(docs: list[dict]) -> dict:
    """The agent's pipeline as its pod reads it (the pod's environment substituted)."""
    workload, spec, c = agent_workload(docs)
    return yaml.safe_load(expand(pipeline_text(docs, spec, c), pod_env(docs, workload, c)))


def grants(rules: list[dict], group: str, resource: str, verbs: set[str]) -> bool:
    return any(group in r.get("apiGroups", []) and resource in r.get("resources", []) and verbs <= set(r["verbs"])
               for r in rules)


@pytest.mark.parametrize("role", AGENTS)
def test_agents_route_by_model_to_the_gateways_headless_service_with_rbac_for_it(rendered, role):
    _, docs = rendered[role]
    _, gw_docs = rendered["gateway"]
    pipeline = pod_pipeline(docs)
    lb = pipeline["exporters"]["loadbalancing"]
    assert lb["routing_key"] == "attributes" and lb["routing_attributes"] == ["gen_ai.request.model"], lb
    assert "endpoint" not in lb["protocol"]["otlp"], "the resolver gives the endpoints"
    # The resolver's Service is the gateway's headless Service, on its OTLP/gRPC port.
    k8s = lb["resolver"]["k8s"]
    assert set(lb["resolver"]) == {"k8s"}, lb["resolver"]
    name, _, ns = k8s["service"].partition(".")
    svc = one(gw_docs, "Service", name)
    assert svc["metadata"]["namespace"] == ns == NAMESPACE["gateway"], (k8s, svc["metadata"])
    assert svc["spec"]["clusterIP"] == "None", "a ClusterIP Service would hide the replicas behind one address"
    gw_workload, gw_spec, gw_c = agent_workload(gw_docs)
    assert svc["spec"]["selector"].items() <= gw_workload["spec"]["template"]["metadata"]["labels"].items()
    # EndpointSlices list the pods' ports (the Service port's target), which the ring dials.
    target = next(p["targetPort"] for p in svc["spec"]["ports"] if p["name"] == "otlp-grpc")
    container_port = next(p["containerPort"] for p in gw_c["ports"] if target in (p["name"], p["containerPort"]))
    assert k8s["ports"] == [container_port], (k8s, gw_c["ports"])
    gw_grpc = pod_env(gw_docs, gw_workload, gw_c)["INFERWATCH_GRPC_ENDPOINT"]
    assert gw_grpc == f"0.0.0.0:{container_port}", gw_grpc
    # Spans, golden-signal series and alerts all go to the tier.
    used = {n for n, p in pipeline["service"]["pipelines"].items() if "loadbalancing" in p["exporters"]}
    assert used == {"traces", "metrics/detect", "logs/alerts"}, used

    # RBAC: the account the agent's pods run as exists in its overlay and is bound, in the
    # gateway's namespace, to a Role with list/watch on discovery.k8s.io EndpointSlices.
    workload, spec, c = agent_workload(docs)
    sa = spec.get("serviceAccountName")
    assert sa and one(docs, "ServiceAccount", sa)["metadata"]["namespace"] == workload["metadata"]["namespace"]
    subject = {"kind": "ServiceAccount", "name": sa, "namespace": workload["metadata"]["namespace"]}
    bound = [b for b in objects(gw_docs, "RoleBinding") if subject in b["subjects"]]
    assert bound, f"no RoleBinding of overlays/gateway names {subject}"
    for b in bound:
        assert b["metadata"]["namespace"] == ns and b["roleRef"]["kind"] == "Role"
        role_obj = one(gw_docs, "Role", b["roleRef"]["name"])
        assert role_obj["metadata"]["namespace"] == ns
        assert grants(role_obj["rules"], "discovery.k8s.io", "endpointslices", {"list", "watch"}), role_obj
        # What the resolver does (list + watch), EndpointSlices only: not even `get`.
        assert all(set(r["verbs"]) <= {"list", "watch"} and r["resources"] == ["endpointslices"]
                   for r in role_obj["rules"]), role_obj["rules"]
    # The token reaches the agent's container (where in-cluster clients read it), and only it.
    if spec.get("automountServiceAccountToken") is not False:
        assert [x["name"] for x in spec["containers"]] == [AGENT], "a pod-wide token would reach other containers"
    else:
        mount = next((m for m in c["volumeMounts"] if m["mountPath"] == TOKEN_DIR), None)
        assert mount, f"no service account token at {TOKEN_DIR} in the agent's container"
        vol = next(v for v in spec["volumes"] if v["name"] == mount["name"])
        sources = vol["projected"]["sources"]
        assert any("serviceAccountToken" in x for x in sources), sources
        assert any(x.get("configMap", {}).get("name") == "kube-root-ca.crt" for x in sources), sources
        others = [m for x in spec["containers"] if x["name"] != AGENT for m in x.get("volumeMounts", [])]
        assert not [m for m in others if m["name"] == mount["name"] or m["mountPath"].startswith(TOKEN_DIR)], others


def selects(selector: dict | None, labels: dict[str, str]) -> bool:
    """A LabelSelector as the API server reads it: matchLabels and matchExpressions, ANDed."""
    if selector is None:
        return True
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for e in selector.get("matchExpressions") or []:
        present, value = e["key"] in labels, labels.get(e["key"])
        ok = {"In": present and value in e.get("values", []), "NotIn": not present or value not in e.get("values", []),
              "Exists": present, "DoesNotExist": not present}[e["operator"]]
        if not ok:
            return False
    return True


def admits(policy: dict, policy_ns: str, ns_labels: dict[str, str], pod_labels: dict[str, str], port: int) -> bool:
    """Whether an Ingress NetworkPolicy admits a pod (labels, its namespace's labels) to `port`."""
    for rule in policy["spec"].get("ingress", []):
        ports = rule.get("ports")
        if ports and not any(p.get("port") == port and p.get("protocol", "TCP") == "TCP" for p in ports):
            continue
        peers = rule.get("from")
        if not peers:
            return True
        for peer in peers:
            assert "ipBlock" not in peer, peer
            if "namespaceSelector" in peer:
                ns_ok = selects(peer["namespaceSelector"], ns_labels)
            else:  # a podSelector alone: the policy's own namespace
                ns_ok = ns_labels.get("kubernetes.io/metadata.name") == policy_ns
            if ns_ok and selects(peer.get("podSelector"), pod_labels):
                return True
    return False


def test_gateway_network_policy_admits_otlp_from_the_agents_only(rendered):
    _, gw_docs = rendered["gateway"]
    gw_workload, _, _ = agent_workload(gw_docs)
    gw_ns = gw_workload["metadata"]["namespace"]
    policies = [p for p in objects(gw_docs, "NetworkPolicy")
                if selects(p["spec"]["podSelector"], gw_workload["spec"]["template"]["metadata"]["labels"])]
    assert len(policies) == 1, policies
    policy = policies[0]
    assert policy["spec"]["policyTypes"] == ["Ingress"], policy["spec"]

    def ns_labels(docs: list[dict], name: str) -> dict[str, str]:
        # The API server adds kubernetes.io/metadata.name to every namespace.
        ns = one(docs, "Namespace", name)
        return {**(ns["metadata"].get("labels") or {}), "kubernetes.io/metadata.name": name}

    def ok(nsl: dict[str, str], pod: dict[str, str], port: int) -> bool:
        return admits(policy, gw_ns, nsl, pod, port)

    otlp = (4317, 4318)
    agent_pods = {}
    for role in AGENTS:
        _, docs = rendered[role]
        workload, _, _ = agent_workload(docs)
        ns = workload["metadata"]["namespace"]
        pod = workload["spec"]["template"]["metadata"]["labels"]
        agent_pods[role] = pod
        for port in otlp:
            assert ok(ns_labels(docs, ns), pod, port), f"{role}'s pods in {ns} cannot reach the gateway on {port}"
    # vLLM (the sidecar overlay) in a namespace of the user's: admitted once it carries the label
    # docs/kubernetes.md names, not before.
    label = "inferwatch.io/gateway-client"
    assert label in (REPO / "docs" / "kubernetes.md").read_text(), f"docs/kubernetes.md does not name {label}"
    user_ns = {"kubernetes.io/metadata.name": "team-llm"}
    assert not ok(user_ns, agent_pods["sidecar"], 4317)
    assert ok({**user_ns, label: "true"}, agent_pods["sidecar"], 4317)
    # Not an arbitrary pod: not in the agents' namespaces, not with the agents' labels elsewhere,
    # not a node agent's labels outside inferwatch-node, not a claimed namespace name label.
    _, sc_docs = rendered["sidecar"]
    _, na_docs = rendered["node-agent"]
    for port in otlp:
        assert not ok(ns_labels(sc_docs, "inferwatch"), {"app": "curl"}, port)
        assert not ok(ns_labels(na_docs, "inferwatch-node"), {"app": "curl"}, port)
        assert not ok({"kubernetes.io/metadata.name": "default"}, agent_pods["sidecar"], port)
        assert not ok({"kubernetes.io/metadata.name": "default"}, agent_pods["node-agent"], port)
        assert not ok({**user_ns, label: "true"}, agent_pods["node-agent"], port)
        assert not ok({**user_ns, label: "true"}, {"app": "curl"}, port)
        assert not ok(ns_labels(sc_docs, "inferwatch"), gw_workload["spec"]["template"]["metadata"]["labels"], port)
    # Prometheus (any namespace, any pod) still scrapes the self-metrics and the signals.
    for port in (8888, 8889):
        assert ok({"kubernetes.io/metadata.name": "monitoring"}, {"app.kubernetes.io/name": "prometheus"}, port)
    # Nothing else is open.
    assert not ok(ns_labels(sc_docs, "inferwatch"), agent_pods["sidecar"], 13133)


def test_gateway_scales_with_an_hpa_on_cpu_only(rendered):
    _, docs = rendered["gateway"]
    workload, spec, c = agent_workload(docs)
    hpas = objects(docs, "HorizontalPodAutoscaler")
    assert len(hpas) == 1, hpas
    hpa = hpas[0]
    assert hpa["apiVersion"] == "autoscaling/v2", hpa["apiVersion"]
    ref = hpa["spec"]["scaleTargetRef"]
    assert (ref["apiVersion"], ref["kind"], ref["name"]) == ("apps/v1", workload["kind"], workload["metadata"]["name"])
    assert hpa["metadata"]["namespace"] == workload["metadata"]["namespace"]
    assert 2 <= hpa["spec"]["minReplicas"] < hpa["spec"]["maxReplicas"], hpa["spec"]
    pdb = one(docs, "PodDisruptionBudget", "inferwatch-gateway")
    assert pdb["spec"]["minAvailable"] < hpa["spec"]["minReplicas"], "a drain could never evict a gateway"
    # CPU only: memory is bounded by the memory_limiter, far above the request, and does not fall
    # with the load, so a memory target would pin the tier at maxReplicas (each step a state split).
    assert all(m["type"] == "Resource" for m in hpa["spec"]["metrics"]), hpa["spec"]["metrics"]
    targets = {m["resource"]["name"]: m["resource"]["target"] for m in hpa["spec"]["metrics"]}
    assert set(targets) == {"cpu"}, hpa["spec"]["metrics"]
    t = targets["cpu"]
    assert t["type"] == "Utilization" and 0 < t["averageUtilization"] <= 90, t
    # Utilisation is against the requests: every container must have one.
    assert all("cpu" in x["resources"]["requests"] for x in spec["containers"]), spec["containers"]
    # Why memory is left out holds: the limiter's bound is above the request's memory.
    limiter = float(pod_env(docs, workload, c)["INFERWATCH_MEMORY_LIMIT_MIB"])
    assert limiter > mib(c["resources"]["requests"]["memory"]), (limiter, c["resources"])
    # A scaled-down pod drains its queue before the kubelet kills it.
    pipeline = yaml.safe_load(pipeline_text(docs, spec, c))
    drain = pipeline["service"]["shutdown_timeout"]
    assert drain.endswith("s") and float(drain[:-1]) < spec["terminationGracePeriodSeconds"], drain
    # Scale-down moves a gateway's models to the others: slower than scale-up, one pod at a time.
    down = hpa["spec"]["behavior"]["scaleDown"]
    assert down["stabilizationWindowSeconds"] >= 300, down
    assert all(p["type"] == "Pods" and p["value"] == 1 for p in down["policies"]), down


def test_gateway_overlay_runs_the_gateway_pipeline_plus_k8s_attributes(rendered, inferwatch_bin, tmp_path):
    """deploy/pipelines/gateway.yaml is the gateway; the overlay's ConfigMap is the same pipeline
    with k8s_attributes in front (kustomize cannot read a file outside the overlay, so there are
    two files): compared as the binary reads them, with the pod's environment."""
    _, docs = rendered["gateway"]
    workload, spec, c = agent_workload(docs)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **pod_env(docs, workload, c)}
    env["INFERWATCH_STATE_DIR"] = str(tmp_path / "state")
    pod_cfg = tmp_path / "overlay.yaml"
    pod_cfg.write_text(pipeline_text(docs, spec, c))

    def effective(cfg: Path) -> dict:
        r = subprocess.run([inferwatch_bin, "print-config", "--config", str(cfg)], capture_output=True, text=True,
                           timeout=60, env=env, cwd=tmp_path, stdin=subprocess.DEVNULL)
        assert r.returncode == 0, f"{cfg}:\n{r.stdout}{r.stderr}"
        return yaml.safe_load(r.stdout)

    overlay = effective(pod_cfg)
    host = effective(REPO / "deploy" / "pipelines" / "gateway.yaml")
    assert "k8s_attributes" in overlay["processors"] and "k8s_attributes" not in host["processors"]
    del overlay["processors"]["k8s_attributes"]
    for p in overlay["service"]["pipelines"].values():
        p["processors"] = [x for x in p.get("processors", []) if x != "k8s_attributes"]
    for p in host["service"]["pipelines"].values():
        p["processors"] = p.get("processors", [])
    assert overlay == host, "overlays/gateway/pipeline.yaml and deploy/pipelines/gateway.yaml differ"
    # The fleet detectors read what the agents send.
    peers = host["service"]["pipelines"]["metrics/peers"]
    assert peers["receivers"] == ["otlp"] and "peer_outlier" in peers["processors"] and "alerts" in peers["exporters"]
    ab = host["service"]["pipelines"]["metrics/ab"]
    assert "delta_ab" in ab["processors"] and "alerts" in ab["exporters"]
    assert host["processors"]["delta_ab"]["group_by"] == ["gen_ai.request.model"], "pooled over the replicas"
    assert host["exporters"]["otlp"]["sending_queue"]["storage"] == "file_storage/queue"


def test_gateway_host_pipeline_validates_as_shipped(inferwatch_bin, tmp_path):
    r = subprocess.run([inferwatch_bin, "validate", "--config", str(REPO / "deploy" / "pipelines" / "gateway.yaml")],
                       capture_output=True, text=True, timeout=60, cwd=tmp_path, stdin=subprocess.DEVNULL,
                       env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
    assert r.returncode == 0 and "configuration is valid" in r.stdout, r.stdout + r.stderr


# --- checkov ------------------------------------------------------------------------------------


def skip_annotations(docs: list[dict]) -> dict[tuple[str, str], str]:
    """{(object name, check id): justification} of every checkov.io/skip* annotation."""
    out = {}
    for d in docs:
        for k, v in (d["metadata"].get("annotations") or {}).items():
            if k.startswith("checkov.io/skip"):
                check, _, why = v.partition("=")
                out[(d["metadata"]["name"], check.strip())] = why.strip()
    return out


def test_checkov_passes_every_overlay_with_each_skip_justified(rendered, tmp_path):
    scan = tmp_path / "scan"
    scan.mkdir()
    for role in ROLES:
        (scan / f"{role}.yaml").write_text(rendered[role][0])
    shutil.copy(REPO / "deploy" / "Dockerfile", scan / "Dockerfile")
    # A weakened sidecar: the agent's root filesystem writable. The scan must catch it.
    docs = rendered["sidecar"][1]
    weak = json.loads(json.dumps(docs))
    _, _, c = agent_workload(weak)
    c["securityContext"]["readOnlyRootFilesystem"] = False
    (scan / "weakened.yaml").write_text(yaml.safe_dump_all(weak))

    r = subprocess.run([checkov(), "-d", str(scan), "--framework", "kubernetes", "dockerfile", "--skip-download",
                        "--soft-fail", "-o", "json"], capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    reports = json.loads(r.stdout)
    reports = reports if isinstance(reports, list) else [reports]
    assert {x["check_type"] for x in reports} == {"kubernetes", "dockerfile"}, [x.get("check_type") for x in reports]
    failed, skipped, passed = [], [], 0
    for rep in reports:
        res = rep["results"]
        failed += res["failed_checks"]
        skipped += res["skipped_checks"]
        passed += len(res["passed_checks"])
    weak_failures = {f["check_id"] for f in failed if f["file_path"].endswith("weakened.yaml")}
    assert "CKV_K8S_22" in weak_failures, f"checkov did not flag a writable root filesystem: {weak_failures}"
    real = [f"{f['file_path']}: {f['check_id']} {f['check_name']} ({f['resource']})" for f in failed
            if not f["file_path"].endswith("weakened.yaml")]
    assert not real, "checkov failures:\n" + "\n".join(real)
    assert passed > 200

    # Every skip is an annotation on the object it skips, with a justification, and none is unused.
    annotated = {}
    for role in ROLES:
        annotated.update({(role, *k): v for k, v in skip_annotations(rendered[role][1]).items()})
    used = set()
    for s in skipped:
        path = s["file_path"]
        if path.endswith("weakened.yaml"):
            continue
        if path.endswith("Dockerfile"):
            assert s["check_result"].get("suppress_comment"), s
            continue
        role = Path(path).stem
        name = s["resource"].split(".")[2]       # Kind.namespace.name
        key = (role, name, s["check_id"])
        assert key in annotated, f"skip {key} has no checkov.io/skip annotation"
        assert len(annotated[key]) > 20, f"skip {key} lacks a justification: {annotated[key]!r}"
        used.add(key)
    assert used == set(annotated), f"annotations checkov did not use: {set(annotated) - used}"


# --- the pipelines in the ConfigMaps ------------------------------------------------------------


@pytest.mark.parametrize("role", ROLES)
def test_pipeline_configmap_validates_with_the_pods_environment(rendered, role, inferwatch_bin, tmp_path):
    _, docs = rendered[role]
    workload, spec, c = agent_workload(docs)
    cfg = tmp_path / f"{role}.yaml"
    cfg.write_text(pipeline_text(docs, spec, c))
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **pod_env(docs, workload, c)}
    r = subprocess.run([inferwatch_bin, "validate", "--config", str(cfg)], capture_output=True, text=True, timeout=60,
                       env=env, cwd=tmp_path, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, f"overlays/{role} pipeline ConfigMap:\n{r.stdout}{r.stderr}"
    assert "configuration is valid" in r.stdout


def test_node_agent_pipeline_validates_off_the_cluster_and_selects_no_node_then(rendered, inferwatch_bin, tmp_path):
    # `inferwatch validate` on a laptop (no Downward API): K8S_NODE_NAME defaults to empty. The
    # field selector must then stay `spec.nodeName=` (the API server's "not scheduled": no Running
    # pod), not vanish or become a selector of every node's pods.
    _, docs = rendered["node-agent"]
    workload, spec, c = agent_workload(docs)
    cfg = tmp_path / "node-agent.yaml"
    cfg.write_text(pipeline_text(docs, spec, c))

    def sd_selectors(env: dict[str, str]) -> list[dict]:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "INFERWATCH_STATE_DIR": str(tmp_path / "st"), **env}
        for cmd in ("validate", "print-config"):
            r = subprocess.run([inferwatch_bin, cmd, "--config", str(cfg)], capture_output=True, text=True,
                               timeout=60, env=env, cwd=tmp_path, stdin=subprocess.DEVNULL)
            assert r.returncode == 0, f"{cmd} with {sorted(env)}:\n{r.stdout}{r.stderr}"
        job = yaml.safe_load(r.stdout)["receivers"]["prometheus"]["config"]["scrape_configs"][0]
        return [s for sd in job["kubernetes_sd_configs"] for s in sd["selectors"]]

    off = sd_selectors({})
    assert [s.get("field") for s in off] == ["spec.nodeName="], off
    on = sd_selectors({"K8S_NODE_NAME": POD["spec.nodeName"]})
    assert [s.get("field") for s in on] == [f"spec.nodeName={POD['spec.nodeName']}"], on
    assert [s["label"] for s in off] == [s["label"] for s in on] == ["app.kubernetes.io/name=vllm"]


# --- the PrometheusRule -----------------------------------------------------------------------


def test_prometheus_rule_passes_promtool_and_keeps_the_shipped_rules(rendered, tmp_path):
    rules = {role: one(docs, "PrometheusRule", "inferwatch") for role, (_, docs) in rendered.items()}
    first = rules["sidecar"]["spec"]
    assert all(r["spec"] == first for r in rules.values()), "the roles render different rules"
    f = tmp_path / "rules.yml"
    f.write_text(yaml.safe_dump({"groups": first["groups"]}, sort_keys=False))
    r = subprocess.run([promtool(), "check", "rules", str(f)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    n = sum(len(g["rules"]) for g in first["groups"])
    assert f"SUCCESS: {n} rules found" in r.stdout + r.stderr, r.stdout + r.stderr
    shipped = yaml.safe_load((REPO / "deploy" / "prometheus" / "inferwatch-rules.yml").read_text())["groups"]
    by_name = {g["name"]: g for g in first["groups"]}
    for g in shipped:
        assert by_name.get(g["name"]) == g, f"group {g['name']} differs from deploy/prometheus/inferwatch-rules.yml"
    extra = [g["name"] for g in first["groups"] if g["name"] not in {s["name"] for s in shipped}]
    assert extra == ["inferwatch-kubernetes"], extra


# --- pod on a box -----------------------------------------------------------------------------


def test_sidecar_pod_on_a_box_puts_the_pod_identity_on_the_golden_signals(
        rendered, agents, grpc_sink, sims, sim_bin, tmp_path):
    _, docs = rendered["sidecar"]
    workload, spec, c = agent_workload(docs)
    env = pod_env(docs, workload, c)
    vllm = next(x for x in spec["containers"] if x["name"] == "vllm")
    vllm_env = {e["name"]: e["value"] for e in vllm["env"] if "value" in e}
    model = next(a.split("=", 1)[1] for a in vllm["args"] if a.startswith("--served-model-name="))

    ports, prom_port = Ports(), free_port()
    sink, gateway = grpc_sink(), grpc_sink()
    sim = sims("vllm", "--served-model-name", model, "--otlp-traces-endpoint", f"grpc://{ports.grpc_endpoint}",
               "--otlp-batch-delay-ms", "100", config={**FAST_ANSWERS, "engine": {"gpu": FAST_GPU}},
               env={"OTEL_RESOURCE_ATTRIBUTES": vllm_env["OTEL_RESOURCE_ATTRIBUTES"]})
    # The pod's environment, with the listeners moved from the pod's ports to free local ones,
    # the state on a temp dir, short windows, and the spans passed on to a local OTLP sink.
    env.update({
        "INFERWATCH_GRPC_ENDPOINT": ports.grpc_endpoint, "INFERWATCH_HTTP_ENDPOINT": f"127.0.0.1:{ports.http}",
        "INFERWATCH_HEALTH_ENDPOINT": f"127.0.0.1:{ports.health}",
        "INFERWATCH_METRICS_ADDRESS": f"127.0.0.1:{ports.metrics}",
        "INFERWATCH_PROMETHEUS_ENDPOINT": f"127.0.0.1:{prom_port}", "INFERWATCH_STATE_DIR": str(tmp_path / "state"),
        "VLLM_METRICS_TARGET": f"127.0.0.1:{sim.port}", "VLLM_SCRAPE_INTERVAL": "1s",
        "LLM_SIGNALS_WINDOW": "2s", "LLM_SIGNALS_FLUSH_INTERVAL": "1s", "LLM_SIGNALS_ALLOWED_LATENESS": "1s",
        "ALERTMANAGER_URL": "", "OTLP_ENDPOINT": sink.endpoint,
    })
    # Nothing of this machine's environment leaks in that a pod would not have.
    for k in list(os.environ):
        if k.startswith(("K8S_", "INFERWATCH_", "SLO_", "LLM_SIGNALS_", "OTEL_")) and k not in env:
            env[k] = ""
    # The gateway tier: a local sink in place of the EndpointSlices of its Service (no API server).
    agent = agents("sidecar", off_cluster(pipeline_text(docs, spec, c), [gateway.endpoint]), ports, start=False, env=env)
    start_healthy(agent, ports)
    bench = subprocess.Popen([sim_bin, "bench", "--endpoint", sim.url, "--model", model, "--rate", "10",
                              "--duration", "30s", "--max-tokens", "8", "--prompt-tokens", "64", "--quiet"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    want = {"k8s_pod_name": POD["metadata.name"], "k8s_namespace_name": "inferwatch",
            "k8s_node_name": POD["spec.nodeName"], "k8s_pod_uid": POD["metadata.uid"]}
    try:
        def golden():
            text = requests.get(f"http://127.0.0.1:{prom_port}/metrics", timeout=5).text
            llm = [s for s in parse_openmetrics(text) if s.name.startswith("llm_")]
            hits = {s.name for s in llm if all(s.labels.get(k) == v for k, v in want.items())}
            missing = {s.name for s in llm} - hits
            have = {g for g in GOLDEN if any(h.startswith(g) for h in hits)}
            return (hits, missing) if have == set(GOLDEN) else None

        hits, missing = wait_for("golden signals with the pod's k8s_* labels", golden, 30)
        print(f"golden-signal series with the pod identity: {sorted(hits)}")
        assert not missing, f"golden-signal series without the pod identity: {sorted(missing)}"

        def spans_with_identity(at):
            def find():
                for resource_spans, _, _ in at.spans():
                    attrs = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
                    if attrs.get("k8s.pod.name"):
                        return attrs
                return None
            return find

        # Passed on to OTLP_ENDPOINT and, routed by model, to the gateway tier.
        for name, at in (("OTLP sink", sink), ("gateway", gateway)):
            attrs = wait_for(f"spans at the {name} with k8s.pod.name", spans_with_identity(at), 20)
            assert attrs["k8s.pod.name"] == POD["metadata.name"] and attrs["k8s.namespace.name"] == "inferwatch"
            assert attrs["k8s.node.name"] == POD["spec.nodeName"] and attrs["k8s.container.name"] == AGENT
            assert attrs.get("gen_ai.request.model") == model   # vLLM's own resource is kept
        # The golden signals reach the gateway tier too (its fleet detectors' input).
        wait_for("llm.ttft.p95 at the gateway", lambda: any(
            m.name == "llm.ttft.p95" for _, _, m in gateway.metrics()), 30)
    finally:
        bench.terminate()
        bench.wait(20)

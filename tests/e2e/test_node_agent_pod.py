""""Pod on a box" for the node-agent role: the rendered node-agent pipeline ConfigMap
(deploy/kubernetes/overlays/node-agent) runs as a local process with the DaemonSet's environment
(Downward API K8S_NODE_NAME emulated), the fake GPU source with two GPUs and a scripted NVML
process list, a fixture host procfs whose cgroup files put those pids in two pods (systemd driver
+ cgroup v2 + containerd, and cgroupfs driver + cgroup v1), and a fake kubelet pod-resources
endpoint (real gRPC on a unix socket, messages built from the vendored proto) assigning each GPU
to its pod by UUID.

The shipped file is not edited: what only a test needs (the fake source and its processes, the
fixture paths, an unreachable API server for kubernetes_sd, the GPU pipeline also sent over OTLP)
comes in with `--set`.

Asserted: the GPU series and the per-process series carry the right pod (k8s.pod.name,
k8s.namespace.name, k8s.container.name, k8s.pod.uid, container.id) both at the OTLP sink and in
the Prometheus exposition, a host daemon's series none; the agent's resource carries
k8s.node.name from the Downward env; without the socket, one warning (not one per refresh or
sample) and the pods by UID only.
"""

from __future__ import annotations

import json
import os
import re

import requests
import yaml

from support.agent import Ports, closed_port, free_port, parse_openmetrics
from support.kube import POD, agent_workload, off_cluster, pipeline_text, pod_env, render, start_healthy, wait_for
from support.kubelet import PodResources, ProcFs, cgroupfs_v1, systemd_v2

GPU0 = "GPU-00000000-0000-0000-0000-fa4e00000000"   # the fake source's UUIDs (docs/nvml.md)
GPU1 = "GPU-00000000-0000-0000-0000-fa4e00000001"
UID_A = "5b1e7c3a-2f4d-4c8e-9a1b-6d7e8f9a0b1c"
UID_B = "c0ffee00-1234-4abc-8def-0123456789ab"
CID_A = "a" * 16 + "0123456789abcdef" * 3
CID_B = "b" * 16 + "fedcba9876543210" * 3
GIB = 1 << 30
# NVML's process list: two vLLM engines (one per pod), a host daemon on GPU 1.
PROCESSES = [
    {"gpu": 0, "pid": 1001, "used_bytes": 30 * GIB},
    {"gpu": 1, "pid": 2001, "used_bytes": 20 * GIB},
    {"gpu": 1, "pid": 3001, "used_bytes": 1 << 20},
]
KUBELET_PODS = [
    {"namespace": "llm", "name": "vllm-0", "containers": [
        {"name": "vllm", "cpu_ids": [2, 3], "devices": [{"resource_name": "nvidia.com/gpu", "device_ids": [GPU0]}]}]},
    {"namespace": "llm", "name": "vllm-1", "containers": [
        {"name": "engine", "devices": [{"resource_name": "nvidia.com/gpu", "device_ids": [GPU1]}]},
        {"name": "proxy"}]},
    {"namespace": "kube-system", "name": "coredns-7db6d8ff4d-abcde", "containers": [{"name": "coredns"}]},
]
# (pod, container, uid, container id) of each GPU and process.
WANT_GPU = {GPU0: ("vllm-0", "vllm", UID_A), GPU1: ("vllm-1", "engine", UID_B)}
WANT_PROC = {"1001": ("vllm-0", "vllm", UID_A, CID_A), "2001": ("vllm-1", "engine", UID_B, CID_B)}
UNAVAILABLE = "kubelet pod-resources unavailable"


def start_node_agent(agents, tmp_path, sink_endpoint: str, socket):
    """The node agent as the DaemonSet runs it, on this box; returns (agent, ports, prometheus port)."""
    _, docs = render("node-agent")
    workload, spec, c = agent_workload(docs)
    text = off_cluster(pipeline_text(docs, spec, c), [sink_endpoint])   # the gateway tier: the sink
    shipped = yaml.safe_load(text)
    assert shipped["receivers"]["nvml"]["pod_attribution"]["proc_root"] == "/host/proc", "the shipped proc_root"
    mounts = {m["mountPath"] for m in c["volumeMounts"]}
    assert {"/host/proc", "/var/lib/kubelet/pod-resources"} <= mounts, mounts

    proc = ProcFs(tmp_path / "host" / "proc")
    proc.process(1001, systemd_v2(UID_A, CID_A), comm="python3 -m vllm.entrypoints.openai.api_server")
    proc.process(2001, cgroupfs_v1(UID_B, CID_B))
    proc.process(3001, "0::/system.slice/nvidia-persistenced.service\n", comm="nvidia-persistenced")

    ports, prom_port = Ports(), free_port()
    env = pod_env(docs, workload, c)
    env.update({
        "INFERWATCH_GRPC_ENDPOINT": ports.grpc_endpoint, "INFERWATCH_HTTP_ENDPOINT": f"127.0.0.1:{ports.http}",
        "INFERWATCH_HEALTH_ENDPOINT": f"127.0.0.1:{ports.health}",
        "INFERWATCH_METRICS_ADDRESS": f"127.0.0.1:{ports.metrics}",
        "INFERWATCH_PROMETHEUS_ENDPOINT": f"127.0.0.1:{prom_port}", "INFERWATCH_STATE_DIR": str(tmp_path / "state"),
        "ALERTMANAGER_URL": "", "OTLP_ENDPOINT": sink_endpoint,
    })
    for k in list(os.environ):   # nothing of this machine's environment a pod would not have
        if k.startswith(("K8S_", "INFERWATCH_", "SLO_", "LLM_SIGNALS_", "OTEL_", "KUBERNETES_")) and k not in env:
            env[k] = ""
    # kubernetes_sd has no API server here: point it at a closed port (it retries; not under test).
    scrape = shipped["receivers"]["prometheus"]["config"]["scrape_configs"]
    for job in scrape:
        for sd in job.get("kubernetes_sd_configs", []):
            sd["api_server"] = f"http://127.0.0.1:{closed_port()}"
    sets = {
        "receivers::prometheus::config::scrape_configs": json.dumps(scrape),
        "receivers::nvml::collection_interval": "200ms",
        "receivers::nvml::source": "fake",
        "receivers::nvml::fake_gpus": "2",
        "receivers::nvml::fake_processes": json.dumps(PROCESSES),
        "receivers::nvml::pod_attribution::proc_root": str(proc.root),
        "receivers::nvml::pod_attribution::pod_resources_socket": str(socket),
        "receivers::nvml::pod_attribution::refresh_interval": "1s",
        "receivers::nvml::pod_attribution::timeout": "1s",
        "service::pipelines::metrics/gpu::exporters": "[prometheus, otlp]",
    }
    args = [f"--set={k}={v}" for k, v in sets.items()]
    agent = agents("node-agent", text, ports, start=False, env=env, extra_args=tuple(args))
    start_healthy(agent, ports)
    return agent, ports, prom_port


def attrs_of(kvs) -> dict[str, str]:
    out = {}
    for a in kvs:
        v = a.value
        out[a.key] = v.string_value if v.HasField("string_value") else str(v.int_value)
    return out


def otlp_points(sink, name: str) -> list[tuple[dict, dict]]:
    """(resource attributes, point attributes) of every delivered point of `name`."""
    out = []
    for rm, _, m in sink.metrics():
        if m.name != name:
            continue
        data = m.sum if m.HasField("sum") else m.gauge
        res = attrs_of(rm.resource.attributes)
        out += [(res, attrs_of(p.attributes)) for p in data.data_points]
    return out


def exposition(prom_port: int, name: str) -> list:
    text = requests.get(f"http://127.0.0.1:{prom_port}/metrics", timeout=5).text
    return [s for s in parse_openmetrics(text) if s.name == name]


def test_node_agent_pod_on_a_box_attributes_gpus_and_processes_to_their_pods(agents, grpc_sink, tmp_path):
    sock_dir = tmp_path / "pod-resources"
    sock_dir.mkdir()
    kubelet = PodResources(sock_dir / "kubelet.sock", KUBELET_PODS).start()
    sink = grpc_sink()
    try:
        agent, ports, prom_port = start_node_agent(agents, tmp_path, sink.endpoint, sock_dir / "kubelet.sock")

        # OTLP: the GPU series of each GPU carry its pod; the resource the node.
        def both_gpus():
            pts = otlp_points(sink, "hw.gpu.memory.usage")
            seen = {a.get("gpu.uuid"): (r, a) for r, a in pts if a.get("k8s.pod.name")}
            return seen if set(seen) == set(WANT_GPU) else None

        seen = wait_for("hw.gpu.memory.usage of both GPUs with k8s.pod.name at the OTLP sink", both_gpus, 30)
        for uuid, (pod, container, uid) in WANT_GPU.items():
            res, a = seen[uuid]
            assert res.get("k8s.node.name") == POD["spec.nodeName"], res
            assert "k8s.pod.name" not in res, f"the agent's own pod is not on the data: {res}"
            got = (a.get("k8s.pod.name"), a.get("k8s.namespace.name"), a.get("k8s.container.name"), a.get("k8s.pod.uid"))
            assert got == (pod, "llm", container, uid), (uuid, a)
        procs = {a["process.pid"]: a for _, a in otlp_points(sink, "process.gpu.memory.usage")}
        assert set(procs) >= {"1001", "2001", "3001"}, procs
        for pid, (pod, container, uid, cid) in WANT_PROC.items():
            a = procs[pid]
            got = (a.get("k8s.pod.name"), a.get("k8s.namespace.name"), a.get("k8s.container.name"),
                   a.get("k8s.pod.uid"), a.get("container.id"))
            assert got == (pod, "llm", container, uid, cid), (pid, a)
        assert not {k for k in procs["3001"] if k.startswith("k8s.") or k == "container.id"}, procs["3001"]

        # Prometheus: the same labels, with k8s_node_name from the resource.
        def exposed():
            s = exposition(prom_port, "hw_gpu_memory_usage_bytes")
            return s if len([x for x in s if x.labels.get("k8s_pod_name")]) == 2 else None

        for s in wait_for("hw_gpu_memory_usage_bytes of both GPUs with k8s_pod_name", exposed, 30):
            pod, container, uid = WANT_GPU[s.labels["gpu_uuid"]]
            assert (s.labels["k8s_pod_name"], s.labels["k8s_namespace_name"], s.labels["k8s_container_name"],
                    s.labels["k8s_pod_uid"], s.labels["k8s_node_name"]) == (pod, "llm", container, uid,
                                                                            POD["spec.nodeName"]), s.labels
        for name in ("hw_gpu_utilization_ratio", "hw_temperature_celsius"):
            pods = {s.labels.get("gpu_uuid"): s.labels.get("k8s_pod_name") for s in exposition(prom_port, name)}
            assert pods == {GPU0: "vllm-0", GPU1: "vllm-1"}, (name, pods)
        by_pid = {s.labels["process_pid"]: s for s in exposition(prom_port, "process_gpu_memory_usage_bytes")}
        for pid, (pod, container, uid, cid) in WANT_PROC.items():
            lb = by_pid[pid].labels
            assert (lb.get("k8s_pod_name"), lb.get("k8s_container_name"), lb.get("k8s_pod_uid"),
                    lb.get("container_id")) == (pod, container, uid, cid), lb
        assert by_pid["1001"].value == 30 * GIB and by_pid["2001"].value == 20 * GIB
        assert "k8s_pod_name" not in by_pid["3001"].labels and "k8s_pod_uid" not in by_pid["3001"].labels

        assert kubelet.calls >= 1
        assert UNAVAILABLE not in agent.log(), agent.log()[-3000:]
    finally:
        kubelet.stop()


def test_node_agent_without_the_socket_warns_once_and_names_pods_by_uid(agents, grpc_sink, tmp_path):
    sink = grpc_sink()
    agent, ports, prom_port = start_node_agent(agents, tmp_path, sink.endpoint,
                                               tmp_path / "pod-resources" / "kubelet.sock")
    errors = 'inferwatch_nvml_pod_resources_errors_total'

    def refreshed_thrice():
        n = agent.metric(errors, reason="missing_socket")
        return n if n >= 3 else None

    wait_for("three failed List calls (refresh_interval 1s)", refreshed_thrice, 30)
    warnings = [line for line in agent.log().splitlines() if UNAVAILABLE in line]
    assert len(warnings) == 1, warnings
    assert re.search(r"WARN", warnings[0]) and 'reason="missing_socket"' in warnings[0], warnings[0]

    def by_uid():
        s = exposition(prom_port, "hw_gpu_memory_usage_bytes")
        return s if len([x for x in s if x.labels.get("k8s_pod_uid")]) == 2 else None

    for s in wait_for("hw_gpu_memory_usage_bytes with k8s_pod_uid", by_uid, 30):
        assert s.labels["k8s_pod_uid"] == WANT_GPU[s.labels["gpu_uuid"]][2], s.labels
        assert "k8s_pod_name" not in s.labels, s.labels
        assert s.labels["k8s_node_name"] == POD["spec.nodeName"]
    by_pid = {s.labels["process_pid"]: s.labels for s in exposition(prom_port, "process_gpu_memory_usage_bytes")}
    assert by_pid["2001"].get("container_id") == CID_B and by_pid["2001"].get("k8s_pod_uid") == UID_B

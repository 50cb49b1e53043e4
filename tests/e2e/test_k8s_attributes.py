"""The `k8s_attributes` processor end to end: the real binary, spans from the OpenTelemetry
Python SDK, and a Kubernetes API server fixture (support/kube_fixture.py: a PodList and a watch
stream of the API reference's shapes; the API server itself cannot run here).

- spans sent from 127.0.0.1 get the pod whose status.podIP is 127.0.0.1 (association by the
  connection): pod name, uid, namespace, node, the Deployment from its ReplicaSet owner;
- spans carrying `k8s.pod.uid` get that pod, whatever the connection (the first rule decides);
- a watch MODIFIED event that changes a label is reflected in later spans;
- the pod identity reaches the golden signals llm_signals derives from the spans.
"""

from __future__ import annotations


import pytest
import requests

from support import sdk
from support.kube import wait_for as _wait_for
from support.agent import free_port, otlp_exporter, parse_openmetrics
from support.kube_fixture import KubeApi, pod

# The pod this machine's loopback stands for, owned by ReplicaSet vllm-6d4f9c8b7 of Deployment vllm.
LOCAL = pod("vllm-6d4f9c8b7-q2x9z", "6f1c2b9e-8d4a-4e4b-9a57-0c2d1e6f7a01", "127.0.0.1", node="gpu-node-3",
            replicaset="vllm-6d4f9c8b7", labels={"app.kubernetes.io/name": "vllm", "rollout": "blue"},
            annotations={"inferwatch.io/owner": "team-llm"})
# Another pod (another IP), found only by its uid.
OTHER = pod("router-7c5d4b3a2-m8n7p", "0b5e6c1e-3f9a-4d59-9a43-6c3e1f0a9b22", "10.42.0.17", namespace="gateway",
            node="cpu-node-1", replicaset="router-7c5d4b3a2", labels={"rollout": "red"})
RULES = [{"sources": [{"from": "resource_attribute", "name": "k8s.pod.uid"}]},
         {"sources": [{"from": "connection"}]}]
DEADLINE = 20.0


def wait_for(what: str, pred, timeout: float = DEADLINE):
    return _wait_for(what, pred, timeout)


@pytest.fixture
def kube():
    api = KubeApi(pods=(LOCAL, OTHER)).start()
    yield api
    api.stop()


def processor(kube: KubeApi) -> dict:
    return {"auth_type": "none", "api_server": kube.url, "wait_for_metadata": True, "pod_association": RULES,
            "extract": {"labels": [{"tag_name": "rollout", "key": "rollout"}],
                        "annotations": [{"tag_name": "owner", "key": "inferwatch.io/owner"}]}}


def start(agents, kube: KubeApi, sink, **cfg):
    config, ports = agents.config({"otlp": otlp_exporter(sink.endpoint)},
                                  processors={"k8s_attributes": processor(kube)},
                                  pipeline_processors=("k8s_attributes",), signals=("traces",), **cfg)
    return agents("k8s", config, ports), ports


def resources(sink, marker: str) -> list[dict]:
    """The resource attributes of the exported spans named `marker`."""
    return [{a.key: a.value.string_value for a in rs.resource.attributes}
            for rs, _, span in sink.spans() if span.name == marker]


def send(ports, marker: str, resource: dict | None = None) -> None:
    sender = sdk.trace_sender("grpc", ports.grpc_endpoint, {"service.name": "vllm", **(resource or {})})
    with sender.tracer().start_as_current_span(marker):
        pass
    assert sender.flush()
    sender.shutdown()


def identity(p: dict) -> dict:
    m = p["metadata"]
    return {"k8s.pod.name": m["name"], "k8s.namespace.name": m["namespace"], "k8s.node.name": p["spec"]["nodeName"],
            "k8s.pod.uid": m["uid"], "k8s.deployment.name": m["ownerReferences"][0]["name"].rsplit("-", 1)[0]}


def test_spans_from_a_pods_ip_get_that_pods_identity(agents, grpc_sink, kube):
    sink = grpc_sink()
    a, ports = start(agents, kube, sink)
    send(ports, "by-connection")
    sink.wait_spans(1)
    (res,) = resources(sink, "by-connection")
    want = identity(LOCAL)
    assert want["k8s.deployment.name"] == "vllm"
    assert {k: res.get(k) for k in want} == want, res
    assert res["k8s.pod.ip"] == "127.0.0.1"
    assert res["rollout"] == "blue" and res["owner"] == "team-llm"
    assert res["service.name"] == "vllm", "the sender's own attributes are kept"
    assert "k8s.pod.start_time" in res
    lists = [q for q in kube.requests if "watch" not in q]
    assert lists and lists[0].get("limit") == ["500"], kube.requests
    wait_for("the pod watch", lambda: kube.watches())
    not_cached = [s.value for s in a.samples() if s.name == "inferwatch_k8sattributes_pods_not_cached_total"]
    assert not_cached == [0], not_cached


def test_spans_naming_a_pod_uid_get_that_pod_whatever_the_connection(agents, grpc_sink, kube):
    sink = grpc_sink()
    _, ports = start(agents, kube, sink)
    send(ports, "by-uid", {"k8s.pod.uid": OTHER["metadata"]["uid"]})
    sink.wait_spans(1)
    (res,) = resources(sink, "by-uid")
    want = identity(OTHER)
    assert {k: res.get(k) for k in want} == want, res
    assert res["rollout"] == "red"
    assert "k8s.pod.ip" not in res, "not associated by the connection"


def test_a_watched_label_change_reaches_later_spans(agents, grpc_sink, kube):
    sink = grpc_sink()
    _, ports = start(agents, kube, sink)
    send(ports, "before")
    sink.wait_spans(1)
    assert resources(sink, "before")[0]["rollout"] == "blue"
    wait_for("the pod watch", lambda: kube.watches())
    changed = dict(LOCAL, metadata=dict(LOCAL["metadata"], labels=dict(LOCAL["metadata"]["labels"], rollout="green")))
    kube.modify(changed)
    sent = 0

    def relabelled():
        nonlocal sent
        sent += 1
        send(ports, f"after-{sent}")
        sink.wait_spans(1 + sent)
        return resources(sink, f"after-{sent}")[0]["rollout"] == "green"

    wait_for("a span with the MODIFIED label", relabelled)
    res = resources(sink, f"after-{sent}")[0]
    assert res["k8s.pod.name"] == LOCAL["metadata"]["name"] and res["k8s.deployment.name"] == "vllm"
    assert kube.watches()[0]["resourceVersion"][0].isdigit(), "the watch starts from the list's version"


def test_the_pod_identity_reaches_the_golden_signals(agents, grpc_sink, kube):
    sink = grpc_sink()
    prom = free_port()
    config, ports = agents.config({"otlp": otlp_exporter(sink.endpoint)},
                                  processors={"k8s_attributes": processor(kube)}, pipeline_processors=(),
                                  signals=("traces",))
    config["connectors"] = {"llm_signals": {"window": "1s", "flush_interval": "1s", "allowed_lateness": "1s"}}
    config["exporters"]["prometheus"] = {"endpoint": f"127.0.0.1:{prom}"}
    config["service"]["pipelines"] = {
        "traces": {"receivers": ["otlp"], "processors": ["k8s_attributes"], "exporters": ["llm_signals", "otlp"]},
        "metrics/signals": {"receivers": ["llm_signals"], "exporters": ["prometheus"]},
    }
    agents("k8s-signals", config, ports)
    sender = sdk.trace_sender("grpc", ports.grpc_endpoint, {"service.name": "vllm"})
    tracer = sender.tracer()
    want = {"k8s_pod_name": LOCAL["metadata"]["name"], "k8s_namespace_name": "ml", "k8s_node_name": "gpu-node-3"}

    def derived():
        # GenAI-semconv request spans (one per poll) keep event time moving past the windows.
        with tracer.start_as_current_span("chat m", attributes={"gen_ai.operation.name": "chat",
                                                                 "gen_ai.request.model": "m"}):
            pass
        sender.flush()
        text = requests.get(f"http://127.0.0.1:{prom}/metrics", timeout=5).text
        llm = [s for s in parse_openmetrics(text) if s.name.startswith("llm_request")]
        return [s for s in llm if all(s.labels.get(k) == v for k, v in want.items())]

    try:
        hits = wait_for("an llm_request* series with the pod's k8s_* labels", derived, 30)
    finally:
        sender.shutdown()
    assert hits[0].labels["gen_ai_request_model"] == "m", hits[0]

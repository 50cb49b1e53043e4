""""Pod on a box" for the sidecar's alerts: the rendered sidecar pipeline ConfigMap
(deploy/kubernetes/overlays/sidecar, `kubectl kustomize`) runs as a local process with the pod's
environment (envFrom settings + Downward API K8S_POD_NAME / K8S_NAMESPACE_NAME / K8S_NODE_NAME /
K8S_POD_UID emulated), beside `inferwatch sim` serving the manifest's model under `inferwatch
bench` load, with ALERTMANAGER_URL pointed at a real Alertmanager (Debian
`prometheus-alertmanager`; skipped without it, failed under CI=true).

The shipped file is not edited. The environment moves the listeners to free local ports and
shortens the golden-signal window to 10 s and the scrape interval to 2 s (documented knobs of the
pipeline); `--set connectors::alerts::for=5s` shortens the alerts connector's `for` (default 2m)
so that the fault's alert fires within a minute. Nothing else is overridden.

A queue-blocking fault in the simulator raises an alert; asserted:
- the alert Alertmanager lists (`GET /api/v2/alerts`) names the model, and carries the pod as
  its Kubernetes context: annotations `pod`, `namespace`, `node` equal to the Downward API values
  (docs/alerts.md: a pod changes on every restart, so it is never a label, and none is);
- the alert log record the agent passes on over OTLP has `k8s.pod.name` / `k8s.namespace.name` /
  `k8s.node.name` as record attributes and on its resource;
- the agent logs one `ALERT FIRING` line.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from support.agent import Ports, free_port
from support.kube import POD, agent_workload, off_cluster, pipeline_text, pod_env, render, start_healthy, wait_for
from support.sim import FAST_ANSWERS, sim_bin, sims  # noqa: F401 (fixtures)

EVENT_NAME = "llm.degradation.alert"
NAMESPACE = "inferwatch"   # the sidecar overlay's namespace (the Deployment's metadata.namespace)


def _str_attrs(kvs) -> dict[str, str]:
    return {kv.key: kv.value.string_value for kv in kvs if kv.value.HasField("string_value")}


@pytest.mark.timeout(240)
def test_sidecar_pod_on_a_box_puts_the_pod_identity_on_its_alerts(
        alertmanager, agents, grpc_sink, sims, sim_bin, tmp_path):
    _, docs = render("sidecar")
    workload, spec, c = agent_workload(docs)
    env = pod_env(docs, workload, c)
    assert workload["metadata"]["namespace"] == NAMESPACE
    assert env["K8S_POD_NAME"] == POD["metadata.name"] and env["K8S_NODE_NAME"] == POD["spec.nodeName"], env
    vllm = next(x for x in spec["containers"] if x["name"] == "vllm")
    vllm_env = {e["name"]: e["value"] for e in vllm["env"] if "value" in e}
    model = next(a.split("=", 1)[1] for a in vllm["args"] if a.startswith("--served-model-name="))

    am = alertmanager.start()
    ports, prom_port = Ports(), free_port()
    sink = grpc_sink()
    sim = sims("vllm", "--gpu", "a10g", "--served-model-name", model,
               "--otlp-traces-endpoint", f"grpc://{ports.grpc_endpoint}", "--otlp-batch-delay-ms", "100",
               config=FAST_ANSWERS, env={"OTEL_RESOURCE_ATTRIBUTES": vllm_env["OTEL_RESOURCE_ATTRIBUTES"]})
    # The pod's environment with the listeners on free local ports, the state on a temp dir, the
    # scrape at the simulator, a 10 s window, the alerts to the real Alertmanager, and what the
    # pipeline passes on over OTLP to a local sink.
    env.update({
        "INFERWATCH_GRPC_ENDPOINT": ports.grpc_endpoint, "INFERWATCH_HTTP_ENDPOINT": f"127.0.0.1:{ports.http}",
        "INFERWATCH_HEALTH_ENDPOINT": f"127.0.0.1:{ports.health}",
        "INFERWATCH_METRICS_ADDRESS": f"127.0.0.1:{ports.metrics}",
        "INFERWATCH_PROMETHEUS_ENDPOINT": f"127.0.0.1:{prom_port}", "INFERWATCH_STATE_DIR": str(tmp_path / "state"),
        "VLLM_METRICS_TARGET": f"127.0.0.1:{sim.port}", "VLLM_SCRAPE_INTERVAL": "2s",
        "LLM_SIGNALS_WINDOW": "10s", "ALERTMANAGER_URL": am.url, "OTLP_ENDPOINT": sink.endpoint,
    })
    # Nothing of this machine's environment leaks in that a pod would not have.
    for k in list(os.environ):
        if k.startswith(("K8S_", "INFERWATCH_", "SLO_", "LLM_SIGNALS_", "OTEL_", "ALERTMANAGER_")) and k not in env:
            env[k] = ""
    agent = agents("sidecar", off_cluster(pipeline_text(docs, spec, c), [grpc_sink().endpoint]), ports, start=False, env=env,
                   extra_args=("--set", "connectors::alerts::for=5s"))
    start_healthy(agent, ports)
    bench = subprocess.Popen([sim_bin, "bench", "--endpoint", sim.url, "--model", model, "--rate", "4",
                              "--duration", "150s", "--max-tokens", "12", "--prompt-tokens", "200", "--stream",
                              "--quiet"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        # Admission stalled 60 % of every 4 s: requests queue for up to 2.4 s (kv_pressure's
        # queue-blocking condition, p99 above 0.8 s, in every 10 s window).
        sim.set_faults({"kind": "queue_blocking", "strength": 0.6, "period": "4s"})

        def fired():
            return [a for a in am.alerts() if a["status"]["state"] == "active"
                    and a["labels"].get("model") == model] or None

        got = wait_for("an active alert naming the model in Alertmanager", fired, 120)
        print("alerts in Alertmanager:", [(a["labels"], a["annotations"].get("pod")) for a in got])
        for a in got:
            labels, ann = a["labels"], a["annotations"]
            assert labels.get("detector") and labels["severity"] in ("warning", "critical"), a
            assert (ann.get("pod"), ann.get("namespace"), ann.get("node")) == \
                (POD["metadata.name"], NAMESPACE, POD["spec.nodeName"]), f"the pod's identity missing: {a}"
            # Context, not identity: a restarted pod must not become another alert.
            assert not [k for k in labels if k.startswith(("k8s", "pod", "namespace", "node"))], labels
            assert model in ann["summary"], a

        # The same alert as an OTLP log record, with the pod on the record and on its resource.
        def otlp_alert():
            for rl, _, rec in sink.logs():
                attrs = _str_attrs(rec.attributes)
                if EVENT_NAME in (rec.event_name, attrs.get("event.name")) and attrs.get("alert.state") == "firing":
                    return _str_attrs(rl.resource.attributes), attrs
            return None

        resource, attrs = wait_for("a firing alert record at the OTLP sink", otlp_alert, 30)
        for where in (attrs, resource):
            assert where.get("k8s.pod.name") == POD["metadata.name"], where
            assert where.get("k8s.namespace.name") == NAMESPACE, where
            assert where.get("k8s.node.name") == POD["spec.nodeName"], where
        assert resource.get("k8s.pod.uid") == POD["metadata.uid"], resource
        assert attrs.get("gen_ai.request.model") == model, attrs
        assert "ALERT FIRING" in agent.log(), "one readable line per alert in the agent's log"
    finally:
        bench.terminate()
        bench.wait(20)

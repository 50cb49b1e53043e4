"""A Kubernetes API server fixture for the components that list and watch pods.

The Kubernetes API cannot run here, so this serves what its `GET /api/v1/pods` answers, in the
shapes of the API reference (core/v1): a `PodList` (`metadata.resourceVersion`, `items`), and
with `?watch=1&resourceVersion=N` a chunked stream of newline-delimited `WatchEvent`s
(`{"type": "ADDED"|"MODIFIED"|"DELETED"|"BOOKMARK"|"ERROR", "object": ...}`) holding every change
after version N, then each later one as the test makes it. Changes are made with `add`,
`modify` and `delete`; each bumps the resourceVersion as the API server's etcd revision does.
Every request's query is kept in `requests`.
"""

from __future__ import annotations

import copy
import http.server
import json
import threading
from typing import Any, Optional
from urllib.parse import parse_qs, urlparse


def pod(name: str, uid: str, ip: str, *, namespace: str = "ml", node: str = "gpu-node-1",
        labels: Optional[dict] = None, annotations: Optional[dict] = None,
        replicaset: Optional[str] = None, created: str = "2025-01-01T00:00:00Z",
        containers: tuple = ("vllm",)) -> dict:
    """A running Pod object of the API's shape; `replicaset` names its ReplicaSet owner, whose
    pod-template hash (the name's last segment) is also the `pod-template-hash` label."""
    labels = dict(labels or {})
    owners = []
    if replicaset:
        labels.setdefault("pod-template-hash", replicaset.rsplit("-", 1)[1])
        owners.append({"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": replicaset,
                       "uid": f"rs-{uid}", "controller": True, "blockOwnerDeletion": True})
    return {
        "kind": "Pod", "apiVersion": "v1",
        "metadata": {"name": name, "namespace": namespace, "uid": uid, "creationTimestamp": created,
                     "labels": labels, "annotations": dict(annotations or {}), "ownerReferences": owners},
        "spec": {"nodeName": node, "restartPolicy": "Always", "serviceAccountName": "default",
                 "containers": [{"name": c, "image": "vllm/vllm-openai:v0.8.5" if c == "vllm" else "busybox:1.36"}
                                for c in containers]},
        "status": {"phase": "Running", "hostIP": "10.0.0.5", "podIP": ip, "podIPs": [{"ip": ip}],
                   "startTime": created,
                   "conditions": [{"type": "Ready", "status": "True"}],
                   "containerStatuses": [{"name": c, "ready": True, "restartCount": 0,
                                          "image": "vllm/vllm-openai:v0.8.5",
                                          "containerID": f"containerd://{uid[:8]}{i:056x}"}
                                         for i, c in enumerate(containers)]},
    }


class KubeApi:
    """The fixture server on 127.0.0.1 (a thread); `url` is its base URL."""

    def __init__(self, pods: tuple = ()) -> None:
        self.cond = threading.Condition()
        self.rv = 100
        self.pods: dict[str, dict] = {}
        self.events: list[tuple[int, str]] = []     # (resourceVersion, JSON line)
        self.requests: list[dict[str, list[str]]] = []
        self.stopped = False
        for p in pods:
            self.add(p)
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, name="kube-api", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> "KubeApi":
        self.thread.start()
        return self

    def stop(self) -> None:
        with self.cond:
            self.stopped = True
            self.cond.notify_all()
        self.server.shutdown()
        self.server.server_close()

    # --- changes ------------------------------------------------------------------------------

    def _change(self, kind: str, obj: dict) -> dict:
        with self.cond:
            self.rv += 1
            obj = copy.deepcopy(obj)
            obj["metadata"]["resourceVersion"] = str(self.rv)
            uid = obj["metadata"]["uid"]
            if kind == "DELETED":
                self.pods.pop(uid, None)
            else:
                self.pods[uid] = obj
            self.events.append((self.rv, json.dumps({"type": kind, "object": obj}) + "\n"))
            self.cond.notify_all()
            return obj

    def add(self, p: dict) -> dict:
        return self._change("ADDED", p)

    def modify(self, p: dict) -> dict:
        return self._change("MODIFIED", p)

    def delete(self, uid: str) -> dict:
        with self.cond:
            p = self.pods[uid]
        return self._change("DELETED", p)

    def watches(self) -> list[dict[str, list[str]]]:
        with self.cond:
            return [q for q in self.requests if q.get("watch") == ["1"]]

    # --- serving ------------------------------------------------------------------------------

    def _list(self) -> bytes:
        with self.cond:
            items = list(self.pods.values())
            return json.dumps({"kind": "PodList", "apiVersion": "v1",
                               "metadata": {"resourceVersion": str(self.rv)}, "items": items}).encode()

    def _handler(self):
        api = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def do_GET(self) -> None:
                u = urlparse(self.path)
                q = parse_qs(u.query)
                with api.cond:
                    api.requests.append(q)
                if u.path != "/api/v1/pods":
                    body = json.dumps({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                       "reason": "NotFound", "code": 404}).encode()
                    self._send(404, body)
                    return
                if q.get("watch") != ["1"]:
                    self._send(200, api._list())
                    return
                self._watch(int((q.get("resourceVersion") or ["0"])[0] or 0))

            def _send(self, code: int, body: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _watch(self, since: int) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                self.wfile.flush()
                sent = since
                try:
                    while True:
                        with api.cond:
                            api.cond.wait_for(lambda: api.stopped or (bool(api.events) and api.events[-1][0] > sent),
                                              timeout=1.0)
                            if api.stopped:
                                break
                            lines = [(rv, line) for rv, line in api.events if rv > sent]
                        for rv, line in lines:
                            data = line.encode()
                            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                            sent = rv
                        self.wfile.flush()
                    self.wfile.write(b"0\r\n\r\n")
                    self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    pass
                self.close_connection = True

        return Handler

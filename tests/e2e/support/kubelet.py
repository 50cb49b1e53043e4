"""What a GPU node's kubelet and kernel show the node agent, for tests on a machine that is not one:

- `PodResources`: a real gRPC server of the kubelet's `v1.PodResourcesLister/List` on a unix
  socket, its message classes built at run time from the vendored
  proto/kubelet/podresources/v1/api.proto (no protoc here), answering in the real shape (pods,
  containers, devices of a resource with device ids = GPU UUIDs);
- `ProcFs`: a fixture procfs tree, `<root>/<pid>/cgroup` and `<root>/<pid>/stat`, in the line
  formats the kernel writes (cgroup v2 `0::<path>`, v1 `<id>:<controllers>:<path>`) under the
  paths the kubelet's two cgroup drivers give pods.
"""

from __future__ import annotations

import re
import threading
from concurrent import futures
from pathlib import Path

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

REPO = Path(__file__).resolve().parents[3]
PROTO = REPO / "proto" / "kubelet" / "podresources" / "v1" / "api.proto"
SERVICE = "v1.PodResourcesLister"

_FIELD = re.compile(r"^(repeated\s+)?(\w+)\s+(\w+)\s*=\s*(\d+)\s*;")
_SCALARS = {
    "string": descriptor_pb2.FieldDescriptorProto.TYPE_STRING,
    "int64": descriptor_pb2.FieldDescriptorProto.TYPE_INT64,
}


def _messages() -> dict[str, type]:
    """The message classes of the vendored .proto, by name."""
    fdp = descriptor_pb2.FileDescriptorProto(name="inferwatch/kubelet/podresources/v1/api.proto", package="v1",
                                             syntax="proto3")
    current = None
    for raw in PROTO.read_text().splitlines():
        line = raw.split("//", 1)[0].strip()
        if line.startswith("message "):
            name = line[len("message "):].split("{", 1)[0].strip()
            current = fdp.message_type.add(name=name)
            if line.endswith("{}"):
                current = None
        elif line.startswith("}"):
            current = None
        elif current is not None and (m := _FIELD.match(line)):
            repeated, ty, fname, num = m.groups()
            f = current.field.add(name=fname, number=int(num), json_name=fname)
            f.label = (descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED if repeated
                       else descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL)
            if ty in _SCALARS:
                f.type = _SCALARS[ty]
            else:
                f.type = descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE
                f.type_name = f".v1.{ty}"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return {m.name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"v1.{m.name}"))
            for m in fdp.message_type}


MESSAGES = _messages()


def list_response(pods: list[dict]):
    """A ListPodResourcesResponse from `[{"namespace", "name", "containers": [{"name", "devices":
    [{"resource_name", "device_ids"}]}]}]`."""
    m = MESSAGES
    out = m["ListPodResourcesResponse"]()
    for p in pods:
        pr = out.pod_resources.add(name=p["name"], namespace=p["namespace"])
        for c in p.get("containers", []):
            cr = pr.containers.add(name=c["name"])
            cr.cpu_ids.extend(c.get("cpu_ids", []))
            for d in c.get("devices", []):
                cd = cr.devices.add(resource_name=d["resource_name"])
                cd.device_ids.extend(d["device_ids"])
                cd.topology.nodes.add(ID=0)
    return out


class PodResources:
    """A fake kubelet pod-resources endpoint on the unix socket `path`."""

    def __init__(self, path: Path, pods: list[dict]) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._answer = list_response(pods)
        self.calls = 0
        req, resp = MESSAGES["ListPodResourcesRequest"], MESSAGES["ListPodResourcesResponse"]
        handler = grpc.method_handlers_generic_handler(SERVICE, {
            "List": grpc.unary_unary_rpc_method_handler(self._list, request_deserializer=req.FromString,
                                                        response_serializer=resp.SerializeToString),
        })
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        self._server.add_generic_rpc_handlers((handler,))
        self._server.add_insecure_port(f"unix:{path}")

    def _list(self, request, context):
        with self._lock:
            self.calls += 1
            return self._answer

    def start(self) -> "PodResources":
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop(grace=None)


class ProcFs:
    """A fixture procfs at `root`."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def process(self, pid: int, cgroup: str, comm: str = "python3") -> None:
        d = self.root / str(pid)
        d.mkdir(parents=True, exist_ok=True)
        (d / "cgroup").write_text(cgroup)
        # Field 22 is the start time (clock ticks since boot); the name may hold spaces.
        (d / "stat").write_text(f"{pid} ({comm}) S 1 {pid} {pid} 0 -1 4194560 0 0 0 0 5 1 0 0 20 0 4 0 {pid * 10} "
                                "1000000 500 18446744073709551615\n")


def systemd_v2(uid: str, container_id: str, qos: str = "burstable") -> str:
    """/proc/<pid>/cgroup of a container under the systemd cgroup driver, cgroup v2, containerd."""
    u = uid.replace("-", "_")
    return (f"0::/kubepods.slice/kubepods-{qos}.slice/kubepods-{qos}-pod{u}.slice/"
            f"cri-containerd-{container_id}.scope\n")


def cgroupfs_v1(uid: str, container_id: str, qos: str = "besteffort") -> str:
    """/proc/<pid>/cgroup of a container under the cgroupfs driver, cgroup v1 (one line per hierarchy)."""
    path = f"/kubepods/{qos}/pod{uid}/{container_id}"
    return "".join(f"{i}:{c}:{path}\n" for i, c in
                   ((12, "pids"), (11, "memory"), (10, "cpu,cpuacct"), (4, "devices"), (1, "name=systemd")))

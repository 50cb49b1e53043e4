"""OTLP helpers: flattening export requests, attribute decoding, OTLP/JSON <-> protobuf."""

from __future__ import annotations

import base64
import copy
from typing import Any, Iterator

from google.protobuf import json_format
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.common.v1 import common_pb2

TraceRequest = trace_service_pb2.ExportTraceServiceRequest
MetricsRequest = metrics_service_pb2.ExportMetricsServiceRequest
LogsRequest = logs_service_pb2.ExportLogsServiceRequest

REQUEST_TYPES = {"traces": TraceRequest, "metrics": MetricsRequest, "logs": LogsRequest}
RESPONSE_TYPES = {
    "traces": trace_service_pb2.ExportTraceServiceResponse,
    "metrics": metrics_service_pb2.ExportMetricsServiceResponse,
    "logs": logs_service_pb2.ExportLogsServiceResponse,
}
GRPC_METHODS = {
    "traces": "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
    "metrics": "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export",
    "logs": "/opentelemetry.proto.collector.logs.v1.LogsService/Export",
}


def any_value(v: common_pb2.AnyValue) -> Any:
    """An AnyValue as a plain Python value (bytes stay bytes; kvlists become dicts)."""
    kind = v.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [any_value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return attrs(v.kvlist_value.values)
    return getattr(v, kind)


def attrs(kvs) -> dict[str, Any]:
    """A repeated KeyValue as a dict."""
    return {kv.key: any_value(kv.value) for kv in kvs}


def iter_spans(req: TraceRequest) -> Iterator[tuple[Any, Any, Any]]:
    """(resource_spans, scope_spans, span) for every span."""
    for rs in req.resource_spans:
        for ss in rs.scope_spans:
            for span in ss.spans:
                yield rs, ss, span


def iter_metrics(req: MetricsRequest) -> Iterator[tuple[Any, Any, Any]]:
    """(resource_metrics, scope_metrics, metric) for every metric."""
    for rm in req.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                yield rm, sm, m


def iter_logs(req: LogsRequest) -> Iterator[tuple[Any, Any, Any]]:
    """(resource_logs, scope_logs, log_record) for every record."""
    for rl in req.resource_logs:
        for sl in rl.scope_logs:
            for rec in sl.log_records:
                yield rl, sl, rec


def data_points(metric) -> list:
    """The data points of a metric, whatever its kind."""
    kind = metric.WhichOneof("data")
    if kind is None:
        return []
    return list(getattr(metric, kind).data_points)


def count_items(signal: str, req) -> int:
    """Spans, metric data points or log records in a request."""
    if signal == "traces":
        return sum(1 for _ in iter_spans(req))
    if signal == "metrics":
        return sum(len(data_points(m)) for _, _, m in iter_metrics(req))
    return sum(1 for _ in iter_logs(req))


# --- OTLP/JSON -------------------------------------------------------------------------------
# OTLP/JSON differs from protobuf's canonical JSON mapping in one way that matters here:
# trace and span ids are hex strings, not base64.

_ID_KEYS = {"traceId", "spanId", "parentSpanId", "trace_id", "span_id", "parent_span_id"}


def _walk_ids(obj: Any, conv) -> Any:
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            if k in _ID_KEYS and isinstance(v, str):
                out[k] = conv(v)
            else:
                out[k] = _walk_ids(v, conv)
        return out
    if isinstance(obj, list):
        return [_walk_ids(x, conv) for x in obj]
    return obj


def otlp_json_to_proto(signal: str, data: dict):
    """Parses an OTLP/JSON document (hex ids) into the signal's export request."""
    fixed = _walk_ids(copy.deepcopy(data), lambda h: base64.b64encode(bytes.fromhex(h)).decode())
    msg = REQUEST_TYPES[signal]()
    json_format.ParseDict(fixed, msg)
    return msg


def proto_to_otlp_json(msg) -> dict:
    """Renders an export request as OTLP/JSON (hex ids, integer enums, int64 as strings)."""
    d = json_format.MessageToDict(msg, use_integers_for_enums=True)
    return _walk_ids(d, lambda b: base64.b64decode(b).hex())

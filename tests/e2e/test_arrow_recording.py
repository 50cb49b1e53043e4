"""Recording to Parquet and Arrow IPC: OTel Python SDK -> agent (otlp receiver -> parquet +
arrow_ipc exporters) -> files, read back with pyarrow and DuckDB.

Every value the SDK sent (names, values, bucket counts, attributes, span ids and times) must be
in the files exactly, in the documented layout
DIRECTORY/<signal>/<YYYY-MM-DD>/<signal>-<first event time>-<seq>.<ext>. The agent is stopped
with SIGTERM first so that the exporters close their files; the SDK's force_flush returns once
the agent accepted the data, which the recording exporters write synchronously.
"""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.trace import SpanKind, Status, StatusCode

from support import otlp, sdk
from support.agent import make_config

RESOURCE = {"service.name": "e2e-recording", "deployment.environment": "test", "host.cores": 64}
# Span attributes the Arrow schema promotes to typed columns (core/src/arrow/schema.rs).
PROMOTED = {"gen_ai.request.model", "gen_ai.usage.output_tokens"}
PROMOTED_RESOURCE = ("service.name", "service.version", "service.instance.id")
NAME_RE = re.compile(r"^(traces|metrics)-(\d{8}T\d{6})\.(\d{9})Z-(\d{6})\.(parquet|arrows)$")
KIND = {"gauge": 1, "sum": 2, "histogram": 3}


# ---- reading the files ----------------------------------------------------------------------


def _no_timestamps(ty: pa.DataType) -> pa.DataType:
    """`ty` with every timestamp replaced by int64 (nanoseconds stay exact in Python ints)."""
    if pa.types.is_timestamp(ty):
        return pa.int64()
    if pa.types.is_list(ty):
        f = ty.value_field
        return pa.list_(pa.field(f.name, _no_timestamps(f.type), f.nullable))
    if pa.types.is_struct(ty):
        return pa.struct([pa.field(f.name, _no_timestamps(f.type), f.nullable) for f in ty])
    return ty


def rows(table: pa.Table) -> list[dict]:
    cols = {f.name: table.column(f.name).cast(_no_timestamps(f.type)) for f in table.schema}
    return pa.table(cols).to_pylist()


def value(v: dict):
    """An attribute value struct {type, str, bool, int, double, bytes} as a Python value."""
    t = v["type"]
    if t == 0:
        return None
    if t in (6, 7):  # array / kvlist: the AnyValue protobuf-encoded
        return otlp.any_value(common_pb2.AnyValue.FromString(v["bytes"]))
    return v[{1: "str", 2: "bool", 3: "int", 4: "double", 5: "bytes"}[t]]


def attrs(entries) -> dict:
    return {k: value(v) for k, v in entries}


def recorded_files(root: Path, signal: str, ext: str) -> list[Path]:
    """The files of one signal; checks the layout and that nothing is left in progress."""
    assert not list(root.rglob("*.inprogress")), "files left in progress after shutdown"
    files = sorted((root / signal).glob(f"*/*.{ext}"))
    assert files, f"no {signal} files under {root}"
    for f in files:
        m = NAME_RE.match(f.name)
        assert m and m.group(1) == signal and m.group(5) == ext, f.name
        day = dt.datetime.strptime(m.group(2), "%Y%m%dT%H%M%S").date()
        assert f.parent.name == day.isoformat(), f"{f} is not in its event day's folder"
    return files


def check_first_time(path: Path, table: pa.Table) -> None:
    """The file name holds the minimum event time of its rows (UTC, ns)."""
    m = NAME_RE.match(path.name)
    t_min = min(table.column("time_unix_nano").cast(pa.int64()).to_pylist())
    secs, nanos = divmod(t_min, 1_000_000_000)
    stamp = dt.datetime.fromtimestamp(secs, dt.timezone.utc).strftime("%Y%m%dT%H%M%S")
    assert (m.group(2), int(m.group(3))) == (stamp, nanos), f"{path.name} vs first event time {t_min}"


def read_parquet(root: Path, signal: str) -> list[dict]:
    out = []
    for f in recorded_files(root, signal, "parquet"):
        t = pq.read_table(f)
        assert t.schema.metadata[b"inferwatch.schema"] == (b"spans" if signal == "traces" else b"metrics")
        check_first_time(f, t)
        out += rows(t)
    return out


def read_ipc(root: Path, signal: str) -> list[dict]:
    out = []
    for f in recorded_files(root, signal, "arrows"):
        with ipc.open_stream(pa.OSFile(str(f))) as r:
            t = r.read_all()
        check_first_time(f, t)
        out += rows(t)
    return out


# ---- what the SDK sends -----------------------------------------------------------------


def make_spans(tracer) -> None:
    with tracer.start_as_current_span(
        "chat.completions",
        kind=SpanKind.SERVER,
        attributes={"gen_ai.request.model": "llama-3-8b", "http.status_code": 200, "ratio": 0.25,
                    "cache.hit": False, "tags": ["a", "b"]},
    ) as root:
        root.add_event("first_token", {"ttft_ms": 83.5})
        for i in range(3):
            with tracer.start_as_current_span(f"decode.{i}", kind=SpanKind.INTERNAL,
                                              attributes={"gen_ai.usage.output_tokens": 100 + i, "step": i}):
                pass
        with tracer.start_as_current_span("kv.evict", kind=SpanKind.CLIENT) as s:
            s.set_status(Status(StatusCode.ERROR, "cache full"))


def instrument(provider) -> None:
    meter = provider.get_meter("e2e.recording.metrics", "0.3.0")
    counter = meter.create_counter("llm.requests", unit="{request}", description="requests served")
    ttft = meter.create_histogram("llm.ttft", unit="ms", description="time to first token")
    kv = meter.create_gauge("gpu.kv_cache.usage", unit="1")
    counter.add(5, {"model": "a", "status": "ok"})
    counter.add(7, {"model": "a", "status": "ok"})
    counter.add(3, {"model": "b", "status": "error"})
    for v in (1.0, 5.0, 50.0, 1200.0):
        ttft.record(v, {"model": "a"})
    kv.set(0.875, {"gpu": "0"})
    kv.set(0.25, {"gpu": "1"})


# ---- expectations --------------------------------------------------------------------------


def check_resource(r: dict, res) -> None:
    """Resource attributes: the promoted `service.*` ones in their columns, the rest in the map."""
    a = otlp.attrs(res.resource.attributes)
    for k in PROMOTED_RESOURCE:
        assert r[k] == a.pop(k, None), k
    assert attrs(r["resource_attributes"]) == a


def check_spans(got: list[dict], expected) -> None:
    want = {}
    for rs, ss, s in otlp.iter_spans(expected):
        want[s.span_id] = (rs, ss, s)
    assert len(got) == len(want) == 5
    by_id = {r["span_id"]: r for r in got}
    assert set(by_id) == set(want), "span ids differ"
    for sid, (rs, ss, s) in want.items():
        r = by_id[sid]
        check_resource(r, rs)
        assert (r["scope_name"], r["scope_version"]) == (ss.scope.name, ss.scope.version)
        assert r["trace_id"] == s.trace_id and r["parent_span_id"] == s.parent_span_id
        assert r["name"] == s.name and r["kind"] == s.kind
        assert r["start_time_unix_nano"] == s.start_time_unix_nano
        assert r["time_unix_nano"] == s.end_time_unix_nano
        assert r["duration_ns"] == s.end_time_unix_nano - s.start_time_unix_nano
        assert (r["status_code"], r["status_message"]) == (s.status.code, s.status.message)
        sent = otlp.attrs(s.attributes)
        for k in PROMOTED:
            assert r[k] == sent.pop(k, None), k
        assert attrs(r["attributes"]) == sent, s.name
        assert [(e["name"], e["time_unix_nano"], attrs(e["attributes"])) for e in r["events"]] == [
            (e.name, e.time_unix_nano, otlp.attrs(e.attributes)) for e in s.events]
    names = {r["name"]: r for r in got}
    assert names["decode.1"]["parent_span_id"] == names["chat.completions"]["span_id"]
    assert names["decode.2"]["gen_ai.usage.output_tokens"] == 102
    assert attrs(names["chat.completions"]["attributes"])["tags"] == ["a", "b"]


def check_metrics(got: list[dict], expected: list) -> None:
    want = {}
    for req in expected:
        for rm, sm, m in otlp.iter_metrics(req):
            kind = m.WhichOneof("data")
            for p in otlp.data_points(m):
                key = (m.name, tuple(sorted(otlp.attrs(p.attributes).items())), p.time_unix_nano)
                assert key not in want
                want[key] = (rm, sm, m, kind, p)
    assert len(got) == len(want)
    for r in got:
        key = (r["metric_name"], tuple(sorted(attrs(r["attributes"]).items())), r["time_unix_nano"])
        rm, sm, m, kind, p = want.pop(key)
        check_resource(r, rm)
        assert (r["scope_name"], r["scope_version"]) == (sm.scope.name, sm.scope.version)
        assert (r["metric_unit"], r["metric_description"]) == (m.unit, m.description)
        assert r["kind"] == KIND[kind]
        assert r["start_time_unix_nano"] == p.start_time_unix_nano
        if kind == "histogram":
            assert (r["count"], r["sum"], r["min"], r["max"]) == (p.count, p.sum, p.min, p.max)
            assert r["bucket_counts"] == list(p.bucket_counts)
            assert r["explicit_bounds"] == list(p.explicit_bounds)
            assert r["temporality"] == m.histogram.aggregation_temporality
        elif p.WhichOneof("value") == "as_int":
            assert r["int_value"] == p.as_int and r["value"] == float(p.as_int)
        else:
            assert r["value"] == p.as_double and r["int_value"] is None
        if kind == "sum":
            assert r["is_monotonic"] == m.sum.is_monotonic and r["temporality"] == m.sum.aggregation_temporality
    assert not want
    # The values themselves, spelled out.
    last = max(r["time_unix_nano"] for r in got)
    final = [r for r in got if r["time_unix_nano"] == last]
    req = {tuple(sorted(attrs(r["attributes"]).items())): r["int_value"] for r in final
           if r["metric_name"] == "llm.requests"}
    assert req == {(("model", "a"), ("status", "ok")): 12, (("model", "b"), ("status", "error")): 3}
    [h] = [r for r in final if r["metric_name"] == "llm.ttft"]
    assert (h["count"], h["sum"], h["min"], h["max"]) == (4, 1256.0, 1.0, 1200.0)
    assert sum(h["bucket_counts"]) == 4 and len(h["bucket_counts"]) == len(h["explicit_bounds"]) + 1
    kv = {attrs(r["attributes"])["gpu"]: r["value"] for r in final if r["metric_name"] == "gpu.kv_cache.usage"}
    assert kv == {"0": 0.875, "1": 0.25}


# ---- the test ------------------------------------------------------------------------------


def test_sdk_data_recorded_to_parquet_and_arrow_ipc(agents, tmp_path):
    rec = tmp_path / "recording"
    cfg, ports = make_config(
        {
            "parquet": {"directory": str(rec / "parquet"), "compression": "zstd", "row_group_size": 4},
            "arrow_ipc": {"directory": str(rec / "ipc"), "rotation": {"max_bytes": 1 << 20, "max_age": "1h"}},
        },
        signals=("traces", "metrics"),
        pipeline_processors=(),
        protocols=("grpc",),
    )
    agent = agents("recorder", cfg, ports)

    spans = sdk.trace_sender("grpc", ports.grpc_endpoint, RESOURCE)
    try:
        make_spans(spans.tracer())
        assert spans.flush(), "SDK could not export spans"
        expected_spans = spans.expected()
    finally:
        spans.shutdown()
    meters = sdk.meter_sender("grpc", ports.grpc_endpoint, RESOURCE)
    instrument(meters.provider)
    assert meters.provider.force_flush(30_000)
    meters.provider.shutdown()  # a second, later collection of the same instruments
    assert meters.all_succeeded(), "SDK could not export metrics"
    expected_metrics = meters.expected()
    n_points = sum(otlp.count_items("metrics", e) for e in expected_metrics)

    for exporter in ("parquet", "arrow_ipc"):
        assert agent.metric("otelcol_exporter_sent_spans_total", exporter=exporter) == 5
        assert agent.metric("otelcol_exporter_sent_metric_points_total", exporter=exporter) == n_points
        assert agent.metric("otelcol_exporter_send_failed_spans_total", exporter=exporter) == 0
        assert agent.metric("inferwatch_arrow_conversions_total", component=f"exporter {exporter}") >= 2
    assert agent.stop() == 0, "agent did not exit cleanly"

    check_spans(read_parquet(rec / "parquet", "traces"), expected_spans)
    check_spans(read_ipc(rec / "ipc", "traces"), expected_spans)
    check_metrics(read_parquet(rec / "parquet", "metrics"), expected_metrics)
    check_metrics(read_ipc(rec / "ipc", "metrics"), expected_metrics)

    # DuckDB reads the whole parquet recording (both schemas) straight from the directory.
    con = duckdb.connect()
    glob = str(rec / "parquet" / "*" / "*" / "*.parquet")
    total = con.execute(f"SELECT count(*) FROM read_parquet('{glob}', union_by_name = true)").fetchone()[0]
    assert total == 5 + n_points
    spans_glob = str(rec / "parquet" / "traces" / "*" / "*.parquet")
    names = con.execute(
        f"SELECT name FROM read_parquet('{spans_glob}') WHERE \"gen_ai.usage.output_tokens\" >= 101 ORDER BY name"
    ).fetchall()
    assert names == [("decode.1",), ("decode.2",)]
    metrics_glob = str(rec / "parquet" / "metrics" / "*" / "*.parquet")
    total_requests = con.execute(
        f"SELECT sum(int_value) FROM read_parquet('{metrics_glob}') WHERE metric_name = 'llm.requests' "
        f"AND time_unix_nano = (SELECT max(time_unix_nano) FROM read_parquet('{metrics_glob}'))"
    ).fetchone()[0]
    assert total_requests == 15

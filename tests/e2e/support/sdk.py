"""OpenTelemetry Python SDK senders that also keep an in-memory copy of what they export.

The copy is encoded with the same OTLP encoder the exporters use, so a test can compare what
arrived downstream with exactly what the SDK sent, field by field.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import BatchLogRecordProcessor, SimpleLogRecordProcessor

try:  # renamed in newer SDKs
    from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter as InMemoryLogExporter
except ImportError:  # pragma: no cover
    from opentelemetry.sdk._logs.export import InMemoryLogExporter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from . import otlp


def _exporters(kind: str, transport: str, endpoint: str, compression: str | None = None):
    """An SDK OTLP exporter of `kind` (span, metric, log) for `transport` (grpc, http)."""
    if transport == "grpc":
        import grpc

        from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        comp = grpc.Compression.Gzip if compression == "gzip" else None
        cls = {"span": OTLPSpanExporter, "metric": OTLPMetricExporter, "log": OTLPLogExporter}[kind]
        return cls(endpoint=endpoint, insecure=True, timeout=10, compression=comp)
    from opentelemetry.exporter.otlp.proto.http import Compression
    from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter as HL
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HM
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HS

    comp = Compression.Gzip if compression == "gzip" else Compression.NoCompression
    path = {"span": "/v1/traces", "metric": "/v1/metrics", "log": "/v1/logs"}[kind]
    cls = {"span": HS, "metric": HM, "log": HL}[kind]
    return cls(endpoint=endpoint.rstrip("/") + path, timeout=10, compression=comp)


@dataclass
class TraceSender:
    provider: TracerProvider
    memory: InMemorySpanExporter

    def tracer(self, name: str = "e2e.tests", version: str = "1.2.3"):
        return self.provider.get_tracer(name, version)

    def flush(self) -> bool:
        return self.provider.force_flush(30_000)

    def shutdown(self) -> None:
        self.provider.shutdown()

    def expected(self) -> otlp.TraceRequest:
        """The OTLP request equivalent to everything exported so far."""
        return encode_spans(self.memory.get_finished_spans())


def trace_sender(transport: str, endpoint: str, resource: dict[str, Any], compression: str | None = None) -> TraceSender:
    tp = TracerProvider(resource=Resource.create(resource))
    mem = InMemorySpanExporter()
    tp.add_span_processor(SimpleSpanProcessor(mem))
    tp.add_span_processor(BatchSpanProcessor(_exporters("span", transport, endpoint, compression),
                                             schedule_delay_millis=200, max_export_batch_size=64))
    return TraceSender(tp, mem)


@dataclass
class LogSender:
    provider: LoggerProvider
    memory: InMemoryLogExporter

    def logger(self, name: str = "e2e.tests.logs"):
        return self.provider.get_logger(name, "0.9.0")

    def flush(self) -> bool:
        return self.provider.force_flush(30_000)

    def shutdown(self) -> None:
        self.provider.shutdown()

    def expected(self) -> otlp.LogsRequest:
        return encode_logs(self.memory.get_finished_logs())


def log_sender(transport: str, endpoint: str, resource: dict[str, Any], compression: str | None = None) -> LogSender:
    lp = LoggerProvider(resource=Resource.create(resource))
    mem = InMemoryLogExporter()
    lp.add_log_record_processor(SimpleLogRecordProcessor(mem))
    lp.add_log_record_processor(BatchLogRecordProcessor(_exporters("log", transport, endpoint, compression),
                                                        schedule_delay_millis=200))
    return LogSender(lp, mem)


@dataclass
class MetricSender:
    provider: MeterProvider
    sent: list  # (MetricsData, MetricExportResult) of every export the SDK made

    def expected(self) -> list[otlp.MetricsRequest]:
        """One OTLP request per successful SDK export, encoded as the exporter encoded it."""
        from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
        from opentelemetry.sdk.metrics.export import MetricExportResult

        return [encode_metrics(md) for md, r in self.sent if r == MetricExportResult.SUCCESS]

    def all_succeeded(self) -> bool:
        from opentelemetry.sdk.metrics.export import MetricExportResult

        return bool(self.sent) and all(r == MetricExportResult.SUCCESS for _, r in self.sent)


def meter_sender(transport: str, endpoint: str, resource: dict[str, Any],
                 compression: str | None = None) -> MetricSender:
    """A MeterProvider whose reader exports only on force_flush / shutdown (long interval), with
    every exported MetricsData kept."""
    exporter = _exporters("metric", transport, endpoint, compression)
    sent: list = []
    orig = exporter.export

    def export(metrics_data, timeout_millis: float = 10_000, **kw):
        result = orig(metrics_data, timeout_millis=timeout_millis, **kw)
        sent.append((metrics_data, result))
        return result

    exporter.export = export
    reader = PeriodicExportingMetricReader(exporter, export_interval_millis=3_600_000)
    return MetricSender(MeterProvider(resource=Resource.create(resource), metric_readers=[reader]), sent)

//! Sending queue and retry with back-off shared by every exporter (otelcol's exporterhelper).

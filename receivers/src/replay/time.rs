//! Event times of replayed data, for ordering files and pacing.
//!
//! The event time of an item is the one the Arrow schemas use: a span's end time, a data
//! point's `time_unix_nano`, a log record's time (its observed time when unset). Zero means
//! unset and is ignored.

use arrow_array::{Array, RecordBatch};
use inferwatch_core::pdata::Payload;
use opentelemetry_proto::tonic::metrics::v1::metric::Data;

/// The earliest event time in a payload, if any item has one.
pub(crate) fn payload_min(p: &Payload) -> Option<u64> {
    let mut min: Option<u64> = None;
    let mut see = |t: u64| {
        if t != 0 {
            min = Some(min.map_or(t, |m| m.min(t)));
        }
    };
    match p {
        Payload::Traces(r) => {
            for s in r.resource_spans.iter().flat_map(|r| &r.scope_spans).flat_map(|s| &s.spans) {
                see(s.end_time_unix_nano);
            }
        }
        Payload::Metrics(r) => {
            for m in r.resource_metrics.iter().flat_map(|r| &r.scope_metrics).flat_map(|s| &s.metrics) {
                match &m.data {
                    Some(Data::Gauge(g)) => g.data_points.iter().for_each(|d| see(d.time_unix_nano)),
                    Some(Data::Sum(g)) => g.data_points.iter().for_each(|d| see(d.time_unix_nano)),
                    Some(Data::Histogram(g)) => g.data_points.iter().for_each(|d| see(d.time_unix_nano)),
                    Some(Data::ExponentialHistogram(g)) => g.data_points.iter().for_each(|d| see(d.time_unix_nano)),
                    Some(Data::Summary(g)) => g.data_points.iter().for_each(|d| see(d.time_unix_nano)),
                    None => {}
                }
            }
        }
        Payload::Logs(r) => {
            for l in r.resource_logs.iter().flat_map(|r| &r.scope_logs).flat_map(|s| &s.log_records) {
                see(if l.time_unix_nano != 0 { l.time_unix_nano } else { l.observed_time_unix_nano });
            }
        }
        Payload::Encoded(_) => {}
    }
    min
}

/// The earliest event time in a batch of an inferwatch schema (the OTLP bit pattern as u64).
pub(crate) fn batch_min(batch: &RecordBatch) -> Option<u64> {
    let col = inferwatch_core::arrow::time_column(batch).ok()?;
    (0..col.len()).filter(|&i| col.is_valid(i)).map(|i| col.value(i) as u64).filter(|&t| t != 0).min()
}

/// The event time of a batch's first row.
pub(crate) fn batch_first(batch: &RecordBatch) -> Option<u64> {
    let col = inferwatch_core::arrow::time_column(batch).ok()?;
    (!col.is_empty() && col.is_valid(0)).then(|| col.value(0) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
    use opentelemetry_proto::tonic::logs::v1::{LogRecord, ResourceLogs, ScopeLogs};

    #[test]
    fn logs_fall_back_to_observed_time_and_zero_is_unset() {
        let rec = |t, o| LogRecord { time_unix_nano: t, observed_time_unix_nano: o, ..Default::default() };
        let p = Payload::Logs(ExportLogsServiceRequest {
            resource_logs: vec![ResourceLogs {
                scope_logs: vec![ScopeLogs {
                    log_records: vec![rec(50, 1), rec(0, 30), rec(0, 0)],
                    ..Default::default()
                }],
                ..Default::default()
            }],
        });
        assert_eq!(payload_min(&p), Some(30));
        assert_eq!(payload_min(&Payload::Logs(Default::default())), None);
    }
}

//! The detectors' output: derived gauge points written straight into a metrics-schema Arrow
//! batch ([`MetricsBatchBuilder`]), with no OTLP request in between.
//!
//! Points are grouped as an OTLP request would hold them: consecutive points of the same
//! resource and scope share a ResourceMetrics / ScopeMetrics, in which the points of one name
//! share a Metric (in the order the names first appear). A scope's rows are written to the
//! builder when the next point leaves that resource and scope (or at [`Output::emit`]), since
//! the rows of one metric must be adjacent and detectors alternate score and level.

use super::{LEVEL, SCORE, SCORE_UNIT, kv_str};
use inferwatch_core::arrow::metrics::{MetricsBatchBuilder, from_batch};
use inferwatch_core::arrow::{ConvError, RecordBatch};
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::resource::v1::Resource;

/// One derived gauge point: where it comes from and what it says.
#[derive(Debug, Clone)]
pub struct Point {
    /// Resource of the input series (kept so the output joins the input).
    pub resource: Resource,
    /// Scope of the input series.
    pub scope: InstrumentationScope,
    /// Gauge name (`llm.anomaly.score`, `llm.anomaly.level`, `llm.slo.breach_eta`, ...).
    pub name: &'static str,
    /// Unit of the gauge (`s`, `1` for a true ratio, empty for none).
    pub unit: &'static str,
    /// Event time (ns): the input point's timestamp.
    pub time_ns: u64,
    /// The value.
    pub value: f64,
    /// Attributes: `detector`, `metric`, the input point's attributes, evidence.
    pub attributes: Vec<KeyValue>,
}

/// The points of one gauge in the open scope: its unit (the first point's) and rows.
#[derive(Debug)]
struct Pending {
    name: &'static str,
    unit: &'static str,
    rows: Vec<(u64, f64, Vec<KeyValue>)>,
}

/// The resource and scope the last point went to, and its points not yet written.
#[derive(Debug)]
struct OpenScope {
    resource: Resource,
    scope: InstrumentationScope,
    metrics: Vec<Pending>,
}

impl OpenScope {
    fn add(&mut self, name: &'static str, unit: &'static str, row: (u64, f64, Vec<KeyValue>)) {
        match self.metrics.iter_mut().find(|m| m.name == name) {
            Some(m) => m.rows.push(row),
            None => self.metrics.push(Pending { name, unit, rows: vec![row] }),
        }
    }
}

/// Collects derived points into one metrics-schema batch.
#[derive(Default)]
pub struct Output {
    batch: MetricsBatchBuilder,
    open: Option<OpenScope>,
    len: usize,
    /// The first error the builder gave (reported by [`Output::emit`]).
    error: Option<ConvError>,
}

impl std::fmt::Debug for Output {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Output").field("len", &self.len).finish_non_exhaustive()
    }
}

impl Output {
    /// An empty output.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a point.
    pub fn push(&mut self, p: Point) {
        let open = self.open_for(&p.resource, &p.scope);
        open.add(p.name, p.unit, (p.time_ns, p.value, p.attributes));
        self.len += 1;
    }

    /// Adds a score and its level for one input point: `detector`, `metric` and the input's
    /// attributes first, then `evidence`.
    #[allow(clippy::too_many_arguments)]
    pub fn score(
        &mut self,
        resource: &Resource,
        scope: &InstrumentationScope,
        input_attributes: &[KeyValue],
        time_ns: u64,
        detector: &str,
        metric: &str,
        score: f64,
        level: f64,
        evidence: &[KeyValue],
    ) {
        let mut attrs = Vec::with_capacity(2 + input_attributes.len() + evidence.len());
        attrs.push(kv_str("detector", detector));
        attrs.push(kv_str("metric", metric));
        attrs.extend(input_attributes.iter().filter(|kv| kv.key != "detector" && kv.key != "metric").cloned());
        attrs.extend(evidence.iter().cloned());
        let open = self.open_for(resource, scope);
        open.add(SCORE, SCORE_UNIT, (time_ns, score, attrs.clone()));
        open.add(LEVEL, SCORE_UNIT, (time_ns, level, attrs));
        self.len += 2;
    }

    /// The open scope for `resource` and `scope`: the current one when both are the same,
    /// else a new one (the current one written first; a new resource when it differs).
    fn open_for(&mut self, resource: &Resource, scope: &InstrumentationScope) -> &mut OpenScope {
        let same = self.open.as_ref().map(|o| (o.resource == *resource, o.scope == *scope));
        if same != Some((true, true)) {
            self.close();
            self.open = None;
            let new_resource = same.is_none_or(|(r, _)| !r);
            let started = if new_resource { self.batch.resource(Some(resource), "") } else { Ok(()) };
            let started = started.and_then(|()| self.batch.scope(Some(scope), ""));
            self.keep(started);
        }
        self.open.get_or_insert_with(|| OpenScope {
            resource: resource.clone(),
            scope: scope.clone(),
            metrics: Vec::new(),
        })
    }

    /// Writes the open scope's points into the batch (the resource and scope stay current).
    fn close(&mut self) {
        let Some(open) = self.open.as_mut() else { return };
        for m in std::mem::take(&mut open.metrics) {
            let mut r = self.batch.gauge(m.name, "", m.unit);
            for (time_ns, value, attrs) in &m.rows {
                r = r.and_then(|()| self.batch.double_point(attrs, *time_ns, *value));
            }
            self.keep(r);
        }
    }

    fn keep(&mut self, r: Result<(), ConvError>) {
        if let Err(e) = r {
            self.error.get_or_insert(e);
        }
    }

    /// Number of points collected.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when nothing was collected.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The points as one metrics-schema batch (no rows when empty).
    pub fn into_batch(mut self) -> Result<RecordBatch, ConvError> {
        self.close();
        if let Some(e) = self.error {
            return Err(e);
        }
        self.batch.finish()
    }

    /// The points as the OTLP request the pipeline sends on (the batch read back: consecutive
    /// points of the same resource and scope share a ResourceMetrics / ScopeMetrics, in which
    /// the points of one name share a Metric).
    pub fn into_request(self) -> Result<ExportMetricsServiceRequest, ConvError> {
        from_batch(&self.into_batch()?)
    }

    /// The points as a metrics-schema batch (none when empty), appended to `out`.
    pub fn emit(self, out: &mut Vec<RecordBatch>) -> Result<(), ConvError> {
        if self.is_empty() {
            return Ok(());
        }
        out.push(self.into_batch()?);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::{BREACH_ETA, kv_i64};
    use super::*;
    use inferwatch_core::arrow::metrics::to_batch;
    use inferwatch_core::arrow::same_bytes;
    use opentelemetry_proto::tonic::metrics::v1::{
        Gauge, Metric, NumberDataPoint, ResourceMetrics, ScopeMetrics, metric::Data, number_data_point,
    };

    /// The OTLP request the points made before Output wrote Arrow (the former `into_request`):
    /// consecutive points of one resource and scope share a ResourceMetrics / ScopeMetrics, in
    /// which the points of one name share a Metric whose unit is its first point's.
    fn reference_request(points: Vec<Point>) -> ExportMetricsServiceRequest {
        let mut out: Vec<ResourceMetrics> = Vec::new();
        for p in points {
            let dp = NumberDataPoint {
                attributes: p.attributes,
                time_unix_nano: p.time_ns,
                value: Some(number_data_point::Value::AsDouble(p.value)),
                ..Default::default()
            };
            if out.last().is_none_or(|rm| rm.resource.as_ref() != Some(&p.resource)) {
                out.push(ResourceMetrics { resource: Some(p.resource.clone()), ..Default::default() });
            }
            let rm = out.last_mut().unwrap();
            if rm.scope_metrics.last().is_none_or(|sm| sm.scope.as_ref() != Some(&p.scope)) {
                rm.scope_metrics.push(ScopeMetrics { scope: Some(p.scope.clone()), ..Default::default() });
            }
            let sm = rm.scope_metrics.last_mut().unwrap();
            let idx = match sm.metrics.iter().position(|m| m.name == p.name) {
                Some(i) => i,
                None => {
                    sm.metrics.push(Metric {
                        name: p.name.into(),
                        unit: p.unit.into(),
                        data: Some(Data::Gauge(Gauge { data_points: Vec::new() })),
                        ..Default::default()
                    });
                    sm.metrics.len() - 1
                }
            };
            let Some(Data::Gauge(g)) = &mut sm.metrics[idx].data else { unreachable!() };
            g.data_points.push(dp);
        }
        ExportMetricsServiceRequest { resource_metrics: out }
    }

    fn resource(instance: &str) -> Resource {
        Resource {
            attributes: vec![kv_str("service.name", "vllm"), kv_str("service.instance.id", instance)],
            ..Default::default()
        }
    }

    fn scope(name: &str) -> InstrumentationScope {
        InstrumentationScope { name: name.into(), version: "0.1".into(), ..Default::default() }
    }

    fn point(r: &str, s: &str, name: &'static str, unit: &'static str, t: u64, v: f64) -> Point {
        Point {
            resource: resource(r),
            scope: scope(s),
            name,
            unit,
            time_ns: t,
            value: v,
            attributes: vec![kv_str("detector", "trend_forecast"), kv_str("metric", "llm.kv.usage")],
        }
    }

    #[test]
    fn the_batch_is_byte_for_byte_to_batch_of_the_same_points() {
        // Scores and levels alternate; a point of another name (and unit) sits between them; the
        // scope and then the resource change and come back; a name repeats with another unit.
        let mut points = Vec::new();
        let mut o = Output::new();
        for (i, (r, s)) in [("a", "s1"), ("a", "s1"), ("a", "s2"), ("b", "s1"), ("a", "s1")].into_iter().enumerate() {
            let t = 1_000 + i as u64;
            let score = point(r, s, SCORE, SCORE_UNIT, t, i as f64 * 1.5);
            let level = point(r, s, LEVEL, SCORE_UNIT, t, 0.25);
            o.score(
                &score.resource,
                &score.scope,
                &[kv_str("gen_ai.request.model", "m"), kv_str("detector", "ignored")],
                t,
                "trend_forecast",
                "llm.kv.usage",
                score.value,
                level.value,
                &[kv_i64("window", 50)],
            );
            let attrs = vec![
                kv_str("detector", "trend_forecast"),
                kv_str("metric", "llm.kv.usage"),
                kv_str("gen_ai.request.model", "m"),
                kv_i64("window", 50),
            ];
            points.push(Point { attributes: attrs.clone(), ..score });
            points.push(Point { attributes: attrs, ..level });
            if i == 1 {
                for p in [point(r, s, BREACH_ETA, "s", t, 86_400.0), point(r, s, BREACH_ETA, "min", t, f64::NAN)] {
                    o.push(p.clone());
                    points.push(p);
                }
            }
        }
        assert_eq!(o.len(), points.len());
        let mut out = Vec::new();
        o.emit(&mut out).unwrap();
        assert_eq!(out.len(), 1);
        let want = to_batch(&reference_request(points.clone())).unwrap();
        assert_eq!(out[0].num_rows(), points.len());
        assert!(same_bytes(&out[0], &want), "{:?}\n{want:?}", out[0]);

        // A different order of the same points is a different batch (the check can fail).
        points.swap(0, 1);
        assert!(!same_bytes(&out[0], &to_batch(&reference_request(points)).unwrap()));
    }

    #[test]
    fn nothing_collected_emits_nothing() {
        let mut out = Vec::new();
        Output::new().emit(&mut out).unwrap();
        assert!(out.is_empty());
        assert_eq!(Output::new().into_batch().unwrap().num_rows(), 0);
    }

    #[test]
    fn score_and_level_become_two_gauges_with_the_input_attributes() {
        let mut o = Output::new();
        let r = Resource { attributes: vec![kv_str("service.name", "vllm")], ..Default::default() };
        let s = InstrumentationScope::default();
        o.score(
            &r,
            &s,
            &[kv_str("model_name", "m")],
            10,
            "zscore_skew",
            "llm.ttft.p95",
            4.2,
            0.7,
            &[kv_i64("window", 50)],
        );
        o.score(&r, &s, &[kv_str("model_name", "m")], 20, "zscore_skew", "llm.ttft.p95", 1.0, 0.0, &[]);
        let req = o.into_request().unwrap();
        assert_eq!(req.resource_metrics.len(), 1);
        let ms = &req.resource_metrics[0].scope_metrics[0].metrics;
        let names: Vec<&str> = ms.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(names, vec![SCORE, LEVEL]);
        let Some(Data::Gauge(g)) = &ms[0].data else { panic!("gauge") };
        assert_eq!(g.data_points.len(), 2);
        let keys: Vec<&str> = g.data_points[0].attributes.iter().map(|k| k.key.as_str()).collect();
        assert_eq!(keys, vec!["detector", "metric", "model_name", "window"]);
        assert_eq!(g.data_points[0].time_unix_nano, 10);
    }
}

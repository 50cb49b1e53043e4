//! The whole processor around a detector that scores each point of a series from that series'
//! own state ([`PointDetector`]): the batch loop over the configured metrics, the series map
//! with its limits and counters, the `llm.anomaly.score` / `.level` output with the input's
//! identity, idle expiry on the watermark and the checkpoint. A detector of this kind is its
//! configuration, its mathematics and an `impl PointDetector` (see `ewma_chart`).

use super::Output;
use super::adapter::Adapter;
use super::config::metrics_only;
use super::limits::Limits;
use super::rows::{self, Rows};
use super::series::{MetaRepr, RestoreError, SeriesMap, SeriesMeta};
use arrow_array::{RecordBatch, UInt64Array};
use inferwatch_core::arrow::{ArrowProcessor, ConvError, Needs, schema};
use inferwatch_core::component::{ComponentError, CreateContext, FieldError, Parsed, parse_config, typed};
use inferwatch_core::pdata::Signal;
use inferwatch_core::state::StateError;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use std::sync::Arc;

/// A score of one point: the raw score, its level in [0, 1], and the detector's evidence.
#[derive(Debug, Clone, PartialEq)]
pub struct Scored {
    /// `llm.anomaly.score`.
    pub score: f64,
    /// `llm.anomaly.level`.
    pub level: f64,
    /// Evidence attributes after `detector`, `metric` and the input's attributes.
    pub evidence: Vec<KeyValue>,
}

/// A detector scoring each point from its series' state.
pub trait PointDetector: Send + 'static {
    /// The `detector` attribute and component type name.
    const NAME: &'static str;
    /// Version of the checkpoint format (bump it when `Repr` changes).
    const STATE_VERSION: u32;
    /// One series' state.
    type Series: Send;
    /// Its checkpoint form.
    type Repr: Serialize + DeserializeOwned;

    /// The metric names it reads.
    fn metrics(&self) -> &HashSet<String>;
    /// The state of a new series.
    fn new_series(&self) -> Self::Series;
    /// Takes the finite value `x` at event time `time_ns`; its score, if this point is scored.
    fn score(&self, series: &mut Self::Series, time_ns: u64, x: f64) -> Option<Scored>;
    /// The checkpoint form of a series' state.
    fn series_repr(&self, series: &Self::Series) -> Self::Repr;
    /// A series' state from its checkpoint form; refuses an invalid one.
    fn restore_series(&self, repr: Self::Repr) -> Result<Self::Series, RestoreError>;
}

/// A configuration that checks into a [`PointDetector`] and its series limits.
pub trait PointConfig: DeserializeOwned + Default {
    /// The detector it configures.
    type Detector: PointDetector;
    /// The checked detector and its limits, or the first field in error.
    fn check(&self) -> Result<(Self::Detector, Limits), FieldError>;
}

/// `parse_arrow` of a point detector's factory: the settings parsed and checked once, into the
/// detector and its limits.
pub fn parse<C: PointConfig>(cfg: &serde_json::Value) -> Result<Parsed, FieldError>
where
    C::Detector: Clone + Sync,
{
    Ok(Arc::new(parse_config::<C>(cfg)?.check()?))
}

/// `build_arrow` of a point detector's factory: one processor from what [`parse`] made.
pub fn build<C: PointConfig>(
    ctx: &CreateContext,
    parsed: &Parsed,
    signal: Signal,
) -> Result<Box<dyn ArrowProcessor>, ComponentError>
where
    C::Detector: Clone + Sync,
{
    metrics_only(C::Detector::NAME, signal)?;
    let (detector, limits) = typed::<(C::Detector, Limits)>(parsed)?.clone();
    Ok(Box::new(PointProcessor {
        series: SeriesMap::new(limits.max_series, limits.idle_ns),
        kit: Adapter::new(ctx, C::Detector::NAME),
        detector,
    }))
}

/// The factory of a point detector: `point_factory!(EwmaChartFactory, EwmaChartConfig, DETECTOR)`
/// declares the unit struct, registers it under the name for metrics and parses / builds through
/// [`parse`] and [`build`].
macro_rules! point_factory {
    ($factory:ident, $config:ty, $name:expr) => {
        #[doc = concat!("Factory of `", stringify!($factory), "`'s processor (a point detector).")]
        pub struct $factory;

        inferwatch_core::arrow_processor_factory!($factory, $name, &[inferwatch_core::pdata::Signal::Metrics]);

        impl inferwatch_core::arrow::ArrowProcessorFactory for $factory {
            fn parse_arrow(
                &self,
                cfg: &serde_json::Value,
            ) -> Result<inferwatch_core::component::Parsed, inferwatch_core::component::FieldError> {
                $crate::detect::point::parse::<$config>(cfg)
            }
            fn build_arrow(
                &self,
                ctx: inferwatch_core::component::CreateContext,
                parsed: &inferwatch_core::component::Parsed,
                signal: inferwatch_core::pdata::Signal,
            ) -> Result<Box<dyn inferwatch_core::arrow::ArrowProcessor>, inferwatch_core::component::ComponentError>
            {
                $crate::detect::point::build::<$config>(&ctx, parsed, signal)
            }
        }
    };
}
pub(crate) use point_factory;

/// One series held: its identity and the detector's state.
struct Held<S> {
    meta: SeriesMeta,
    state: S,
}

#[derive(Serialize, Deserialize)]
struct HeldRepr<R> {
    meta: MetaRepr,
    state: R,
}

/// The running processor of a [`PointDetector`].
pub struct PointProcessor<D: PointDetector> {
    detector: D,
    series: SeriesMap<u64, Held<D::Series>>,
    kit: Adapter,
}

impl<D: PointDetector> PointProcessor<D> {
    /// The detector (for its own accessors).
    pub fn detector(&self) -> &D {
        &self.detector
    }
}

impl<D: PointDetector> ArrowProcessor for PointProcessor<D> {
    fn needs(&self) -> Needs {
        let mut columns = rows::COLUMNS.to_vec();
        columns.push(schema::SERIES_ID);
        Needs { signal: Signal::Metrics, columns }
    }

    fn allowed_lateness_ns(&self) -> u64 {
        0
    }

    fn process(&mut self, batch: &RecordBatch, out: &mut Vec<RecordBatch>) -> Result<(), ConvError> {
        let ids = rows::column::<UInt64Array>(batch, schema::SERIES_ID)?;
        let mut rows = Rows::new(batch)?;
        let mut output = Output::new();
        for row in 0..rows.len() {
            let Some(p) = rows.number(row) else { continue };
            if !self.detector.metrics().contains(p.name) {
                continue;
            }
            let detector = &self.detector;
            let make = || -> Result<_, ConvError> {
                let meta = SeriesMeta {
                    metric: p.name.to_string(),
                    resource: rows.resource(row)?.clone(),
                    scope: rows.scope(row)?.clone(),
                    attributes: rows.attributes(row)?,
                    ..SeriesMeta::default()
                };
                Ok(Some(Held { meta, state: detector.new_series() }))
            };
            let Some(t) = self.series.try_touch(&ids.value(row), p.time, make, |_, _| {})? else { continue };
            self.kit.evicted_max(t.evicted);
            let held = t.state;
            let Some(s) = self.detector.score(&mut held.state, p.time, p.value) else { continue };
            let m = &held.meta;
            output.score(
                &m.resource,
                &m.scope,
                &m.attributes,
                p.time,
                D::NAME,
                &m.metric,
                s.score,
                s.level,
                &s.evidence,
            );
        }
        output.emit(out)
    }

    fn advance(&mut self, watermark_ns: u64, _out: &mut Vec<RecordBatch>) -> Result<(), ConvError> {
        // The end of input (u64::MAX) closes nothing: the series are kept, not counted as idle.
        if watermark_ns != u64::MAX {
            self.kit.evicted_idle(self.series.expire_idle(watermark_ns, |_| None, |_, _| {}));
        }
        Ok(())
    }

    fn state_version(&self) -> u32 {
        D::STATE_VERSION
    }

    fn snapshot(&self) -> Result<Vec<u8>, StateError> {
        let detector = &self.detector;
        let repr = |_: &u64, h: &Held<D::Series>| HeldRepr {
            meta: MetaRepr::from(&h.meta),
            state: detector.series_repr(&h.state),
        };
        self.kit.snapshot(self.series.snapshot(D::STATE_VERSION, &(), repr))
    }

    fn restore(&mut self, bytes: &[u8]) -> Result<(), StateError> {
        let (map, detector) = (&self.series, &self.detector);
        let held = |_: &u64, r: HeldRepr<D::Repr>| -> Result<Held<D::Series>, RestoreError> {
            Ok(Held { meta: r.meta.try_into()?, state: detector.restore_series(r.state)? })
        };
        let restored = self.kit.restore(None, bytes, |slot, bytes| {
            let ((), series) = map.restore(D::STATE_VERSION, bytes, held)?;
            *slot = Some(series);
            Ok(())
        })?;
        if let Some(series) = restored {
            self.series = series;
        }
        Ok(())
    }

    fn series_count(&self) -> usize {
        self.series.len()
    }
}

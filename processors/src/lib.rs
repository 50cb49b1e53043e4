//! inferwatch processors and connectors. Processors: `batch`, `memory_limiter`, `window_stats`,
//! the detectors `trend_forecast`, `zscore_skew`, `ewma_chart`, `cusum`, `anomaly_ensemble`, `delta_ab`, `kv_pressure`,
//! `coupled_model` and `peer_outlier`,
//! `gpu_enrich`, `slo`, `filter`, `resource`, `attributes`, `resourcedetection` and
//! `k8sattributes`; connectors: `alerts`, `forward` and `llm_signals` (see [`register`]).

pub mod alerts;
pub mod anomaly_ensemble;
// issue 14 pod identity: attribute actions and the resource / attributes / resourcedetection processors
pub mod attraction;
pub mod attributes;
pub mod batch;
pub mod coupled_model;
pub mod cusum;
pub mod delta_ab;
pub mod detect;
pub mod ewma_chart;
pub mod filter;
pub mod forward;
pub mod gpu_enrich;
pub mod k8sattributes;
pub mod kv_pressure;
pub mod llm_signals;
pub mod memory_limiter;
pub mod peer_outlier;
pub mod resource;
pub mod resourcedetection;
pub mod slo;
pub mod trend_forecast;
pub mod window_stats;
pub mod zscore_skew;

use inferwatch_core::registry::Registry;
use std::sync::Arc;

/// Registers every processor and connector of this crate.
pub fn register(reg: &mut Registry) {
    reg.add_processor(Arc::new(batch::BatchFactory));
    reg.add_processor(Arc::new(memory_limiter::MemoryLimiterFactory));
    reg.add_processor(Arc::new(window_stats::WindowStatsFactory));
    reg.add_processor(Arc::new(trend_forecast::TrendForecastFactory));
    reg.add_processor(Arc::new(zscore_skew::ZscoreSkewFactory));
    reg.add_processor(Arc::new(ewma_chart::EwmaChartFactory));
    reg.add_processor(Arc::new(anomaly_ensemble::AnomalyEnsembleFactory));
    reg.add_processor(Arc::new(cusum::CusumFactory));
    reg.add_processor(Arc::new(delta_ab::DeltaAbFactory));
    reg.add_processor(Arc::new(peer_outlier::PeerOutlierFactory));
    reg.add_processor(Arc::new(kv_pressure::KvPressureFactory));
    reg.add_processor(Arc::new(coupled_model::CoupledModelFactory));
    reg.add_processor(Arc::new(gpu_enrich::GpuEnrichFactory));
    reg.add_processor(Arc::new(slo::SloFactory));
    reg.add_processor(Arc::new(filter::FilterFactory));
    reg.add_processor(Arc::new(resource::ResourceFactory));
    reg.add_processor(Arc::new(attributes::AttributesFactory));
    reg.add_processor(Arc::new(resourcedetection::ResourceDetectionFactory));
    reg.add_processor(Arc::new(k8sattributes::K8sAttributesFactory));
    reg.add_connector(Arc::new(alerts::AlertsFactory));
    reg.add_connector(Arc::new(forward::ForwardFactory));
    reg.add_connector(Arc::new(llm_signals::LlmSignalsFactory));
}

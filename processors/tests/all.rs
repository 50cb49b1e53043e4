//! Every integration test of this crate in one test binary (one link instead of one per file).
mod ab_scenario;
mod alerts;
mod coupled_model;
mod delta_ab;
mod ewma_chart;
mod filter;
mod gpu_enrich;
mod kv_pressure;
mod llm_signals;
mod llm_signals_servers;
mod peer_outlier;
mod pod_identity;
mod slo;
mod slo_openslo;
mod trend_forecast;
mod window_stats;
mod zscore_skew;

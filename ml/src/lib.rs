//! Learned detectors: `lstm_ae` (an LSTM autoencoder run through ONNX Runtime) and `pca`, the
//! reconstruction-error baseline over the same feature windows.

pub mod card;
pub mod detector;
pub mod features;
pub mod lstm_ae;
pub mod pca;
pub mod runtime;
pub mod score;
pub mod windows;

use inferwatch_core::registry::Registry;
use std::sync::Arc;

/// Registers the processors of this crate.
pub fn register(reg: &mut Registry) {
    reg.add_processor(Arc::new(lstm_ae::LstmAeFactory));
    reg.add_processor(Arc::new(pca::PcaFactory));
}

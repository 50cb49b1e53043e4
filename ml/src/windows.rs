//! The public API for running the learned detectors outside a pipeline (the eval crate, the
//! benchmark): build feature windows, open a model, score windows with their levels.

pub use crate::card::{Card, Levels};
pub use crate::features::{Features, GroupKey, Limits, Window, windows_from_batches};
pub use crate::runtime::{ExecutionProvider, Runtime, RuntimeError, Search};
pub use crate::score::{Reconstructor, Scored, score_windows};

use crate::lstm_ae::model::OrtModel;
use crate::pca::Pca;
use std::path::Path;

/// The windows of one univariate series (signal 0 of `card`), `points` as (time ns, value).
pub fn univariate(card: &Card, group: &GroupKey, points: &[(u64, f64)]) -> Vec<Window> {
    let mut f = Features::new(card, Limits::default());
    for &(t, v) in points {
        f.push(group, 0, t, v);
    }
    f.finish()
}

/// A model with its card and level mapping.
pub struct Scorer {
    /// The card.
    pub card: Card,
    /// The level mapping (the card's calibration).
    pub levels: Levels,
    model: Box<dyn Reconstructor>,
    max_batch: usize,
    provider: Option<ExecutionProvider>,
}

impl Scorer {
    /// An `lstm_ae` model (`NAME.onnx`, card `NAME.json`) on the runtime `search` finds.
    pub fn lstm_ae(model: &Path, search: &Search, provider: ExecutionProvider) -> Result<Scorer, RuntimeError> {
        let card_path = Card::path_for_model(model);
        let card = Card::load(&card_path)
            .map_err(|e| RuntimeError::Model { path: card_path.clone(), message: e.to_string() })?;
        let rt = Runtime::load(search)?;
        let m = OrtModel::open(&rt, model, &card, provider, 1)?;
        let used = m.provider();
        let mut s = Scorer::new(card, Box::new(m));
        s.provider = Some(used);
        Ok(s)
    }

    /// A `pca` card with its fitted components.
    pub fn pca(card: &Path) -> Result<Scorer, RuntimeError> {
        let (card, pca) = Pca::load(card).map_err(|message| RuntimeError::Model { path: card.into(), message })?;
        Ok(Scorer::new(card, Box::new(pca)))
    }

    /// A scorer from a card and any model (levels from the card's calibration).
    pub fn new(card: Card, model: Box<dyn Reconstructor>) -> Scorer {
        let c = &card.calibration;
        let levels = Levels::new(c.quantile(0.99), c.warning_error, c.critical_error);
        Scorer { card, levels, model, max_batch: 256, provider: None }
    }

    /// The execution provider an ONNX model runs on (`None` for other models).
    pub fn provider(&self) -> Option<ExecutionProvider> {
        self.provider
    }

    /// Sets the most windows per model run (default 256).
    pub fn with_max_batch(mut self, n: usize) -> Scorer {
        self.max_batch = n.max(1);
        self
    }

    /// Scores windows; each with its level.
    pub fn score(&mut self, windows: &[Window]) -> Result<Vec<(Scored, f64)>, RuntimeError> {
        let s = score_windows(self.model.as_mut(), windows, self.card.t, self.card.k(), self.max_batch)?;
        Ok(s.into_iter().map(|s| (s, self.levels.level(s.error))).collect())
    }

    /// The raw reconstruction of `n` windows laid out in `x`.
    pub fn reconstruct(&mut self, x: &[f32], n: usize) -> Result<Vec<f32>, RuntimeError> {
        self.model.reconstruct(x, n)
    }
}

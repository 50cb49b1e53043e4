//! The ONNX model of `lstm_ae` on ONNX Runtime: input `input` and output `output`, both float32
//! [batch, T, k].

use crate::card::Card;
use crate::runtime::{ExecutionProvider, Runtime, RuntimeError};
use crate::score::Reconstructor;
use ort::session::Session;
use ort::value::Tensor;
use std::path::{Path, PathBuf};

/// Name of the graph's input.
pub const INPUT: &str = "input";
/// Name of the graph's output.
pub const OUTPUT: &str = "output";

/// An opened model.
pub struct OrtModel {
    session: Session,
    t: usize,
    k: usize,
    path: PathBuf,
    provider: ExecutionProvider,
}

impl OrtModel {
    /// Opens `path` for windows of `card`'s shape and checks it with one run on zeros.
    pub fn open(
        rt: &Runtime,
        path: &Path,
        card: &Card,
        provider: ExecutionProvider,
        threads: usize,
    ) -> Result<OrtModel, RuntimeError> {
        let (session, used) = rt.session(path, provider, threads)?;
        let mut m = OrtModel { session, t: card.t, k: card.k(), path: path.to_path_buf(), provider: used };
        let zeros = vec![0f32; m.t * m.k];
        m.reconstruct(&zeros, 1).map_err(|e| RuntimeError::Model {
            path: path.to_path_buf(),
            message: format!("does not take windows of [batch, {}, {}] as its card says: {e}", m.t, m.k),
        })?;
        Ok(m)
    }

    /// The execution provider the session runs on.
    pub fn provider(&self) -> ExecutionProvider {
        self.provider
    }
}

impl Reconstructor for OrtModel {
    fn reconstruct(&mut self, x: &[f32], n: usize) -> Result<Vec<f32>, RuntimeError> {
        let input = Tensor::from_array(([n, self.t, self.k], x.to_vec()))?;
        let out = self.session.run(ort::inputs![INPUT => input])?;
        let value = out.get(OUTPUT).ok_or_else(|| RuntimeError::Model {
            path: self.path.clone(),
            message: format!("has no output {OUTPUT:?}"),
        })?;
        let (shape, data) = value.try_extract_tensor::<f32>()?;
        let want = [n as i64, self.t as i64, self.k as i64];
        if shape.as_ref() != want {
            return Err(RuntimeError::Model {
                path: self.path.clone(),
                message: format!("output shape {:?}, expected {want:?}", shape.as_ref()),
            });
        }
        Ok(data.to_vec())
    }
}

"""PCA reconstruction-error baseline over the same windows as `lstm_ae` (issue 8 item 4).

Windows are flattened to T*k (missing cells 0, as in the window tensor); the components explaining
`variance` of the training windows' variance are kept (at most `max_components`). The score of a
window is the same masked MSE as lstm_ae's, with x̂ = mean_vec + (x - mean_vec) Cᵀ C.
"""

from __future__ import annotations

import numpy as np


def fit(x: np.ndarray, variance: float = 0.95, max_components: int = 32) -> tuple[np.ndarray, np.ndarray, float]:
    """mean_vec [T*k], components [c, T*k] (orthonormal rows) and the variance fraction they explain."""
    flat = x.reshape(len(x), -1).astype(np.float64)
    mean_vec = flat.mean(axis=0)
    _, s, vt = np.linalg.svd(flat - mean_vec, full_matrices=False)
    var = s * s
    total = float(var.sum())
    if total <= 0.0:
        return mean_vec, vt[:1], 1.0
    cum = np.cumsum(var) / total
    c = int(np.searchsorted(cum, variance - 1e-12) + 1)
    c = max(1, min(c, max_components, len(s)))
    return mean_vec, vt[:c], float(cum[c - 1])


def reconstruct(x: np.ndarray, mean_vec: np.ndarray, components: np.ndarray) -> np.ndarray:
    """x̂ of windows x [n, T, k]."""
    flat = x.reshape(len(x), -1).astype(np.float64) - mean_vec
    rec = (flat @ components.T) @ components + mean_vec
    return rec.reshape(x.shape)

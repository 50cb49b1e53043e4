"""The LSTM autoencoder of `lstm_ae` in numpy: forward pass, backward pass (BPTT), Adam, pruning.

Architecture: encoder LSTM (hidden H) over the window [T, k] -> its last hidden state, repeated T
times -> decoder LSTM (hidden H) -> per-step linear layer to k outputs.

Gate order inside this module: i, f, g (cell candidate), o, each a block of H rows of W / R / b.
ONNX's LSTM wants i, o, f, c; onnx_export.py reorders (GATES_TO_ONNX).
"""

from __future__ import annotations

import math

import numpy as np

# Parameter names: encoder / decoder input weights [4H, in], recurrent weights [4H, H], bias [4H];
# output layer [k, H] and [k].
PARAMS = ("enc_W", "enc_R", "enc_b", "dec_W", "dec_R", "dec_b", "out_W", "out_b")


def init_params(k: int, hidden: int, seed: int) -> dict[str, np.ndarray]:
    """Uniform(±1/sqrt(H)) weights (as PyTorch does), forget-gate bias 1, fixed seed."""
    rng = np.random.default_rng(seed)
    s = 1.0 / math.sqrt(hidden)
    H = hidden

    def u(*shape):
        return rng.uniform(-s, s, size=shape)

    p = {
        "enc_W": u(4 * H, k),
        "enc_R": u(4 * H, H),
        "enc_b": u(4 * H),
        "dec_W": u(4 * H, H),
        "dec_R": u(4 * H, H),
        "dec_b": u(4 * H),
        "out_W": u(k, H),
        "out_b": np.zeros(k),
    }
    p["enc_b"][H : 2 * H] += 1.0
    p["dec_b"][H : 2 * H] += 1.0
    return p


def _sigmoid(x):
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def lstm_forward(xs: np.ndarray, W: np.ndarray, R: np.ndarray, b: np.ndarray):
    """One LSTM over xs [T, B, in]; returns hidden states [T, B, H] and the cache for the backward pass."""
    T, B, _ = xs.shape
    H = R.shape[1]
    h = np.zeros((B, H), xs.dtype)
    c = np.zeros((B, H), xs.dtype)
    # The input projection of every step at once.
    ax = xs @ W.T + b
    hs = np.empty((T, B, H), xs.dtype)
    cache = []
    for t in range(T):
        a = ax[t] + h @ R.T
        i = _sigmoid(a[:, :H])
        f = _sigmoid(a[:, H : 2 * H])
        g = np.tanh(a[:, 2 * H : 3 * H])
        o = _sigmoid(a[:, 3 * H :])
        c_prev, h_prev = c, h
        c = f * c_prev + i * g
        tc = np.tanh(c)
        h = o * tc
        hs[t] = h
        cache.append((i, f, g, o, c_prev, h_prev, tc))
    return hs, cache


def lstm_backward(dhs: np.ndarray, xs: np.ndarray, W: np.ndarray, R: np.ndarray, cache):
    """BPTT of lstm_forward: dhs [T, B, H] = dL/dh_t from outside; returns dxs, dW, dR, db."""
    T, B, _ = xs.shape
    H = R.shape[1]
    da_all = np.empty((T, B, 4 * H), xs.dtype)
    dR = np.zeros_like(R)
    dh_next = np.zeros((B, H), xs.dtype)
    dc_next = np.zeros((B, H), xs.dtype)
    for t in range(T - 1, -1, -1):
        i, f, g, o, c_prev, h_prev, tc = cache[t]
        dh = dhs[t] + dh_next
        do = dh * tc
        dc = dc_next + dh * o * (1.0 - tc * tc)
        di = dc * g
        dg = dc * i
        df = dc * c_prev
        dc_next = dc * f
        da = da_all[t]
        da[:, :H] = di * i * (1.0 - i)
        da[:, H : 2 * H] = df * f * (1.0 - f)
        da[:, 2 * H : 3 * H] = dg * (1.0 - g * g)
        da[:, 3 * H :] = do * o * (1.0 - o)
        dR += da.T @ h_prev
        dh_next = da @ R
    flat_da = da_all.reshape(T * B, 4 * H)
    dW = flat_da.T @ xs.reshape(T * B, -1)
    db = flat_da.sum(axis=0)
    dxs = da_all @ W
    return dxs, dW, dR, db


def forward(p: dict[str, np.ndarray], x: np.ndarray, keep_cache: bool = False):
    """Reconstruction of x [B, T, k] -> [B, T, k]; with keep_cache also the cache for `backward`."""
    T = x.shape[1]
    xs = np.transpose(x, (1, 0, 2))
    enc_h, enc_cache = lstm_forward(xs, p["enc_W"], p["enc_R"], p["enc_b"])
    z = enc_h[-1]
    zs = np.broadcast_to(z, (T,) + z.shape).copy()
    dec_h, dec_cache = lstm_forward(zs, p["dec_W"], p["dec_R"], p["dec_b"])
    ys = dec_h @ p["out_W"].T + p["out_b"]
    y = np.transpose(ys, (1, 0, 2))
    if keep_cache:
        return y, (xs, enc_h, enc_cache, zs, dec_h, dec_cache)
    return y


def loss_and_grads(p: dict[str, np.ndarray], x: np.ndarray, mask: np.ndarray):
    """Masked MSE sum(mask (y - x)^2) / max(1, sum(mask)) over the batch, and its gradient per parameter."""
    y, (xs, enc_h, enc_cache, zs, dec_h, dec_cache) = forward(p, x, keep_cache=True)
    denom = max(1.0, float(mask.sum()))
    diff = (y - x) * mask
    loss = float((diff * (y - x)).sum() / denom)
    dy = 2.0 * diff / denom  # [B, T, k]
    dys = np.transpose(dy, (1, 0, 2))  # [T, B, k]
    g = {}
    g["out_W"] = np.einsum("tbk,tbh->kh", dys, dec_h)
    g["out_b"] = dys.sum(axis=(0, 1))
    d_dec_h = dys @ p["out_W"]
    dzs, g["dec_W"], g["dec_R"], g["dec_b"] = lstm_backward(d_dec_h, zs, p["dec_W"], p["dec_R"], dec_cache)
    d_enc_h = np.zeros_like(enc_h)
    d_enc_h[-1] = dzs.sum(axis=0)
    _, g["enc_W"], g["enc_R"], g["enc_b"] = lstm_backward(d_enc_h, xs, p["enc_W"], p["enc_R"], enc_cache)
    return loss, g


class Adam:
    """Adam with global-norm gradient clipping."""

    def __init__(self, params: dict[str, np.ndarray], lr: float = 3e-3, clip_norm: float = 5.0):
        self.lr, self.clip_norm = lr, clip_norm
        self.b1, self.b2, self.eps, self.t = 0.9, 0.999, 1e-8, 0
        self.m = {n: np.zeros_like(v) for n, v in params.items()}
        self.v = {n: np.zeros_like(v) for n, v in params.items()}

    def step(self, params: dict[str, np.ndarray], grads: dict[str, np.ndarray]) -> None:
        """One update of `params` in place."""
        norm = math.sqrt(sum(float((g * g).sum()) for g in grads.values()))
        scale = min(1.0, self.clip_norm / (norm + 1e-12))
        self.t += 1
        for n, g in grads.items():
            g = g * scale
            self.m[n] = self.b1 * self.m[n] + (1 - self.b1) * g
            self.v[n] = self.b2 * self.v[n] + (1 - self.b2) * g * g
            mh = self.m[n] / (1 - self.b1**self.t)
            vh = self.v[n] / (1 - self.b2**self.t)
            params[n] -= self.lr * mh / (np.sqrt(vh) + self.eps)


def hidden_of(p: dict[str, np.ndarray]) -> int:
    """Hidden size of a parameter set."""
    return int(p["enc_R"].shape[1])


def _unit_rows(H: int, units: np.ndarray) -> np.ndarray:
    """Rows of the four gate blocks that belong to `units`."""
    return np.concatenate([units + q * H for q in range(4)])


def unit_l1(p: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """L1 norm of every hidden unit's weights (incoming W, R rows of its 4 gates; outgoing R column and
    next-layer input column), for the encoder and the decoder."""
    H = hidden_of(p)

    def rows(M):
        return np.abs(M).reshape(4, H, -1).sum(axis=(0, 2))

    enc = rows(p["enc_W"]) + rows(p["enc_R"]) + np.abs(p["enc_R"]).sum(axis=0) + np.abs(p["dec_W"]).sum(axis=0)
    dec = rows(p["dec_W"]) + rows(p["dec_R"]) + np.abs(p["dec_R"]).sum(axis=0) + np.abs(p["out_W"]).sum(axis=0)
    return enc, dec


def prune(p: dict[str, np.ndarray], keep_fraction: float) -> tuple[dict[str, np.ndarray], int]:
    """Structured pruning: keep the ceil(keep_fraction * H) units of largest L1 norm in each LSTM."""
    H = hidden_of(p)
    kept = max(1, min(H, math.ceil(keep_fraction * H - 1e-9)))
    enc_l1, dec_l1 = unit_l1(p)
    ke = np.sort(np.argsort(-enc_l1, kind="stable")[:kept])
    kd = np.sort(np.argsort(-dec_l1, kind="stable")[:kept])
    re, rd = _unit_rows(H, ke), _unit_rows(H, kd)
    q = {
        "enc_W": p["enc_W"][re],
        "enc_R": p["enc_R"][re][:, ke],
        "enc_b": p["enc_b"][re],
        "dec_W": p["dec_W"][rd][:, ke],
        "dec_R": p["dec_R"][rd][:, kd],
        "dec_b": p["dec_b"][rd],
        "out_W": p["out_W"][:, kd],
        "out_b": p["out_b"].copy(),
    }
    return {n: np.ascontiguousarray(v) for n, v in q.items()}, kept

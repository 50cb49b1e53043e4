"""Export the numpy LSTM autoencoder (lstm.py) as ONNX with the `onnx` helper API.

Graph (opset 17, ir_version 8): input `input` float32 [batch, T, k] -> Transpose [T, batch, k] ->
LSTM (encoder) -> Y_h [1, batch, H] -> Expand to [T, batch, H] (the last hidden state repeated T
times; the batch axis stays dynamic) -> LSTM (decoder) -> Y [T, 1, batch, H] -> Squeeze ->
Transpose [batch, T, H] -> MatMul + Add -> output `output` float32 [batch, T, k].
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8  # ONNX Runtime 1.31 reads IR <= 13; onnx 1.23 writes 14 by default.
# Our gate blocks are (i, f, g, o); ONNX's LSTM wants (i, o, f, c): take our blocks 0, 3, 1, 2.
GATES_TO_ONNX = (0, 3, 1, 2)


def to_onnx_gates(M: np.ndarray, H: int) -> np.ndarray:
    """Reorder the four H-row gate blocks of M from (i, f, g, o) to ONNX's (i, o, f, c)."""
    blocks = [M[q * H : (q + 1) * H] for q in range(4)]
    return np.concatenate([blocks[q] for q in GATES_TO_ONNX], axis=0)


def lstm_tensors(prefix: str, W, R, b) -> list[onnx.TensorProto]:
    """The W [1, 4H, in], R [1, 4H, H], B [1, 8H] initializers of one ONNX LSTM."""
    H = R.shape[1]
    w = to_onnx_gates(W, H)[None].astype(np.float32)
    r = to_onnx_gates(R, H)[None].astype(np.float32)
    bias = np.concatenate([to_onnx_gates(b, H), np.zeros(4 * H)])[None].astype(np.float32)
    return [
        numpy_helper.from_array(w, f"{prefix}_W"),
        numpy_helper.from_array(r, f"{prefix}_R"),
        numpy_helper.from_array(bias, f"{prefix}_B"),
    ]


def build_model(p: dict[str, np.ndarray], T: int, name: str = "lstm_ae") -> onnx.ModelProto:
    """The ONNX model of parameter set `p` for windows of T steps."""
    k = p["enc_W"].shape[1]
    H = p["enc_R"].shape[1]
    inits = lstm_tensors("enc", p["enc_W"], p["enc_R"], p["enc_b"])
    inits += lstm_tensors("dec", p["dec_W"], p["dec_R"], p["dec_b"])
    inits += [
        numpy_helper.from_array(np.ascontiguousarray(p["out_W"].T).astype(np.float32), "out_W"),
        numpy_helper.from_array(p["out_b"].astype(np.float32), "out_b"),
        numpy_helper.from_array(np.array([T, 1, 1], dtype=np.int64), "repeat_shape"),
        numpy_helper.from_array(np.array([1], dtype=np.int64), "axis1"),
    ]
    nodes = [
        helper.make_node("Transpose", ["input"], ["x_tbk"], perm=[1, 0, 2]),
        helper.make_node("LSTM", ["x_tbk", "enc_W", "enc_R", "enc_B"], ["", "enc_h"], hidden_size=H),
        helper.make_node("Expand", ["enc_h", "repeat_shape"], ["z_tbh"]),
        helper.make_node("LSTM", ["z_tbh", "dec_W", "dec_R", "dec_B"], ["dec_y"], hidden_size=H),
        helper.make_node("Squeeze", ["dec_y", "axis1"], ["dec_tbh"]),
        helper.make_node("Transpose", ["dec_tbh"], ["dec_bth"], perm=[1, 0, 2]),
        helper.make_node("MatMul", ["dec_bth", "out_W"], ["proj"]),
        helper.make_node("Add", ["proj", "out_b"], ["output"]),
    ]
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", T, k])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", T, k])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="inferwatch")
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    return model


def export(p: dict[str, np.ndarray], T: int, path: str | Path, name: str = "lstm_ae") -> int:
    """Write the model to `path`; returns its size in bytes."""
    model = build_model(p, T, name)
    data = model.SerializeToString()
    Path(path).write_bytes(data)
    return len(data)


def from_onnx_gates(M: np.ndarray, H: int) -> np.ndarray:
    """Inverse of to_onnx_gates: ONNX (i, o, f, c) blocks back to (i, f, g, o)."""
    blocks = [M[q * H : (q + 1) * H] for q in range(4)]
    back = [None] * 4
    for pos, q in enumerate(GATES_TO_ONNX):
        back[q] = blocks[pos]
    return np.concatenate(back, axis=0)


def params_from_model(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """The numpy parameters (lstm.py layout, float64) of a model written by build_model."""
    t = {i.name: numpy_helper.to_array(i).astype(np.float64) for i in model.graph.initializer}
    p = {}
    for pre in ("enc", "dec"):
        H = t[f"{pre}_R"].shape[2]
        p[f"{pre}_W"] = from_onnx_gates(t[f"{pre}_W"][0], H)
        p[f"{pre}_R"] = from_onnx_gates(t[f"{pre}_R"][0], H)
        p[f"{pre}_b"] = from_onnx_gates(t[f"{pre}_B"][0, : 4 * H] + t[f"{pre}_B"][0, 4 * H :], H)
    p["out_W"] = np.ascontiguousarray(t["out_W"].T)
    p["out_b"] = t["out_b"]
    return p

"""ONNX Scan graphs shared by the no-GPU decomposition tests and the GPU tests."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper

from .gpucheck import make_model, node

F = TensorProto.FLOAT


def _vi(name: str, shape: Sequence[int], t: int = F) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, t, list(shape))


def cumsum_scan(
    feeds: dict[str, np.ndarray],
    in_axes: Sequence[int] = (0,),
    in_dirs: Sequence[int] = (0,),
    out_axes: Sequence[int] = (0,),
    out_dirs: Sequence[int] = (0,),
    body_extra: Sequence[onnx.NodeProto] = (),
    inits: dict[str, np.ndarray] | None = None,
    y_from: str = "xt",
) -> onnx.ModelProto:
    """``state`` plus each slice of ``x`` (times the outer ``w`` when it is fed): the running state and
    each step's ``tanh(state) * slice``, ONNX's ``test_scan9_sum`` made to exercise every attribute.
    ``body_extra`` nodes come before the last Mul, which reads ``y_from`` instead of the slice."""
    x = feeds["x"]
    row = [n for i, n in enumerate(x.shape) if i != in_axes[0]]
    outer = "w" in feeds or "w" in (inits or {})
    nodes = [
        node("Mul", ["xt", "w"], ["xw"]) if outer else node("Identity", ["xt"], ["xw"]),
        node("Add", ["s_in", "xw"], ["s_out"]),
        node("Tanh", ["s_out"], ["th"]),
        *body_extra,
        node("Mul", ["th", y_from], ["y_t"]),
    ]
    body = helper.make_graph(
        nodes, "body", [_vi("s_in", row), _vi("xt", row)], [_vi("s_out", row), _vi("y_t", row)]
    )
    scan = node(
        "Scan",
        ["s0", "x"],
        ["s", "y"],
        body=body,
        num_scan_inputs=1,
        scan_input_axes=list(in_axes),
        scan_input_directions=list(in_dirs),
        scan_output_axes=list(out_axes),
        scan_output_directions=list(out_dirs),
    )
    return make_model([scan], feeds, ("s", "y"), inits, opset=16)


def gemm_scan(feeds: dict[str, np.ndarray]) -> onnx.ModelProto:
    """An RNN written as a Scan: ``h = relu(h @ W + x_t)`` over two scan inputs (the second reversed),
    with an Einsum in the body (decomposed after the unroll), ``W`` an initializer read from outside."""
    b, hid = feeds["h0"].shape
    body = helper.make_graph(
        [
            node("MatMul", ["h_in", "W"], ["hw"]),
            node("Einsum", ["u_t", "u_t"], ["uu"], equation="bh,bh->bh"),
            node("Add", ["hw", "x_t"], ["pre"]),
            node("Add", ["pre", "uu"], ["pre2"]),
            node("Relu", ["pre2"], ["h_out"]),
            node("Constant", [], ["ax"], value=helper.make_tensor("ax", TensorProto.INT64, [1], [1])),
            node("ReduceSum", ["h_out", "ax"], ["tot"], keepdims=0),
        ],
        "rnn",
        [_vi("h_in", (b, hid)), _vi("x_t", (b, hid)), _vi("u_t", (b, hid))],
        [_vi("h_out", (b, hid)), _vi("tot", (b,))],
    )
    scan = node(
        "Scan",
        ["h0", "x", "u"],
        ["h", "tots"],
        body=body,
        num_scan_inputs=2,
        scan_input_axes=[1, 0],
        scan_input_directions=[0, 1],
        scan_output_axes=[1],
    )
    inits = {"W": (np.random.default_rng(3).standard_normal((hid, hid)) / hid).astype(np.float32)}
    return make_model([scan], feeds, ("h", "tots"), inits, opset=18)

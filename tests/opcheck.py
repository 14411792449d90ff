"""Per-op checks: one ONNX node through our frontend + ref target vs ORT's CPU EP (or numpy)."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper

from migraphx_ep.frontend import model_to_dict, parse_graph
from migraphx_ep.ir.dtypes import from_numpy
from migraphx_ep.ir.shape import Shape


def make_model(
    node: onnx.NodeProto,
    inputs: dict[str, np.ndarray],
    n_outputs: int | None = None,
    opset: int = 21,
    initializers: dict[str, np.ndarray] | None = None,
    domain_opsets: dict[str, int] | None = None,
) -> onnx.ModelProto:
    initializers = initializers or {}
    vis = [
        helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
        for k, v in inputs.items()
    ]
    outs = [
        helper.make_value_info(o, onnx.TypeProto()) for o in node.output[: n_outputs or len(node.output)] if o
    ]
    inits = [onnx.numpy_helper.from_array(v, k) for k, v in initializers.items()]
    g = helper.make_graph([node], "t", vis, outs, inits)
    opsets = [helper.make_opsetid("", opset)] + [
        helper.make_opsetid(d, v) for d, v in (domain_opsets or {}).items()
    ]
    m = helper.make_model(g, opset_imports=opsets)
    m.ir_version = 10
    return onnx.shape_inference.infer_shapes(m)


def run_ort(model: onnx.ModelProto, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, inputs)


def run_ours(model: onnx.ModelProto, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    d = model_to_dict(model)
    shapes = {k: Shape(from_numpy(v.dtype), v.shape) for k, v in inputs.items()}
    prog = parse_graph(d, shapes).program
    return [np.asarray(x) for x in prog.run_numpy(inputs)]


def assert_close(got: np.ndarray, want: np.ndarray, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype, f"dtype {got.dtype} != {want.dtype}"
    assert got.shape == want.shape, f"shape {got.shape} != {want.shape}"
    if want.dtype.kind == "f" or want.dtype.name == "bfloat16":
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=atol)
    else:
        np.testing.assert_array_equal(got, want)


def check_node(
    node: onnx.NodeProto,
    inputs: dict[str, np.ndarray],
    rtol: float = 1e-5,
    atol: float = 1e-6,
    opset: int = 21,
    initializers: dict[str, np.ndarray] | None = None,
    **kw: Any,
) -> list[np.ndarray]:
    """Build a one-node model, run it on ORT CPU and on our ref target, and compare every output."""
    model = make_model(node, inputs, opset=opset, initializers=initializers, **kw)
    want = run_ort(model, inputs)
    got = run_ours(model, inputs)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert_close(g, w, rtol, atol)
    return got

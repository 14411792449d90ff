"""gpu-vs-ref checks: one ONNX graph parsed twice, compiled once for the ref target and once for gpu.

The ref target is the oracle (every op's numpy ``compute``). The gpu program runs on two different
inputs (the second a reshuffle of the first, so value domains stay valid) and both results are compared
only after both runs, so an output buffer that the next run overwrites, or anything baked in from the
first inputs, fails the check as surely as a wrong number does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np
import onnx
from onnx import helper, numpy_helper

from migraphx_ep.frontend import model_to_dict, parse_graph
from migraphx_ep.ir.dtypes import from_numpy
from migraphx_ep.ir.shape import Shape
from migraphx_ep.targets import get_target

F16 = np.dtype(np.float16)
F32 = np.dtype(np.float32)
F64 = np.dtype(np.float64)
BF16 = np.dtype(ml_dtypes.bfloat16)
FP8_TYPES = [
    np.dtype(ml_dtypes.float8_e4m3fn),
    np.dtype(ml_dtypes.float8_e4m3fnuz),
    np.dtype(ml_dtypes.float8_e5m2),
    np.dtype(ml_dtypes.float8_e5m2fnuz),
]


@dataclass(frozen=True)
class Tol:
    """|got - want| <= atol' + rtol * |want| elementwise, where atol' is atol, or with ``scaled``
    atol * max(1, max |want|): a sum's rounding error scales with its terms, not with each result."""

    rtol: float
    atol: float
    scaled: bool = False


EXACT = Tol(0.0, 0.0)  # data movement, max/min, comparisons, rounding ops: nothing to round
FP32 = Tol(1e-5, 1e-6)  # one float op: libm and CUDA's math library differ by a few ulps
FP32_SUM = Tol(1e-5, 1e-5, scaled=True)  # reductions, softmax, norms, dot, conv: summation order
FP64 = Tol(1e-12, 1e-13, scaled=True)
TF32 = Tol(1e-2, 1e-2, scaled=True)  # 10-bit mantissa products
FP16_OP = Tol(2e-3, 1e-3)  # one op computed in float, rounded once to half: at most one ulp (2**-10)
BF16_OP = Tol(1e-2, 1e-2)  # the same in bfloat16 (one ulp is 2**-7)
FP16 = Tol(2e-2, 2e-2)  # half / bfloat16 GEMMs and convolutions in vendor libraries


def op_tol(dtype: np.dtype, fp32: Tol = FP32) -> Tol:
    """The tolerance of one elementwise op in ``dtype`` (fp32 case given: FP32 or EXACT)."""
    if fp32 == EXACT or np.dtype(dtype).kind in "iub":
        return EXACT
    return {F16: FP16_OP, BF16: BF16_OP, F64: FP64}.get(np.dtype(dtype), fp32)


def times(tol: Tol, k: float) -> Tol:
    """``tol`` widened k times: a chain of k rounded ops may drift by k of one op's error."""
    return Tol(tol.rtol * k, tol.atol * k, tol.scaled)


def sum_tol(dtype: np.dtype) -> Tol:
    """Reductions and norms: narrow floats accumulate in float and round once (two ulps of slack)."""
    dt = np.dtype(dtype)
    return times(op_tol(dt), 2) if dt in (F16, BF16) else {F64: FP64}.get(dt, FP32_SUM)


# -- data -------------------------------------------------------------------------------------------
def uniform(rng: np.random.Generator, shape: Sequence[int], lo: float = -3.0, hi: float = 3.0, dtype=F32):
    return np.asarray(rng.uniform(lo, hi, size=tuple(shape))).astype(dtype)


def normal(rng: np.random.Generator, shape: Sequence[int], dtype=F32, scale: float = 1.0, mean: float = 0.0):
    return np.asarray(mean + scale * rng.standard_normal(tuple(shape))).astype(dtype)


def ints(rng: np.random.Generator, shape: Sequence[int], lo: int, hi: int, dtype=np.int32) -> np.ndarray:
    """Integers in [lo, hi)."""
    return rng.integers(lo, hi, size=tuple(shape)).astype(dtype)


def reshuffled(feeds: dict[str, np.ndarray], seed: int = 1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {k: rng.permutation(v.reshape(-1)).reshape(v.shape) for k, v in feeds.items()}


# -- models -----------------------------------------------------------------------------------------
def make_model(
    nodes: Sequence[onnx.NodeProto],
    feeds: dict[str, np.ndarray],
    outputs: Sequence[str] = ("y",),
    inits: dict[str, np.ndarray] | None = None,
    opset: int = 21,
) -> onnx.ModelProto:
    vis = [
        helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
        for k, v in feeds.items()
    ]
    outs = [helper.make_value_info(o, onnx.TypeProto()) for o in outputs]
    weights = [numpy_helper.from_array(np.asarray(v), k) for k, v in (inits or {}).items()]
    g = helper.make_graph(list(nodes), "g", vis, outs, weights)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10
    return onnx.shape_inference.infer_shapes(m)


def node(op_type: str, inputs: Sequence[str], outputs: Sequence[str] = ("y",), **attrs: Any):
    return helper.make_node(op_type, list(inputs), list(outputs), **attrs)


# -- comparing ---------------------------------------------------------------------------------------
def assert_matches(got: np.ndarray, want: np.ndarray, tol: Tol, what: str = "") -> None:
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    if want.dtype in FP8_TYPES:  # exact, by code: numpy's equality never matches a float8 NaN
        np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8), err_msg=what)
    elif want.dtype.kind == "f" or want.dtype == BF16:
        w = want.astype(np.float64)
        atol = tol.atol
        if tol.scaled and np.isfinite(w).any():
            atol *= max(1.0, float(np.abs(w[np.isfinite(w)]).max()))
        np.testing.assert_allclose(
            got.astype(np.float64), w, rtol=tol.rtol, atol=atol, equal_nan=True, err_msg=what
        )
    else:
        np.testing.assert_array_equal(got, want, err_msg=what)


def check_model(
    model: onnx.ModelProto, feeds: dict[str, np.ndarray], target: Any, tol: Tol
) -> list[np.ndarray]:
    """Compile ``model`` for ref and for ``target``; compare on ``feeds`` and on a reshuffle of them.
    Returns the ref outputs on ``feeds``."""
    graph = model_to_dict(model)
    shapes = {k: Shape(from_numpy(v.dtype), v.shape) for k, v in feeds.items()}
    ref = parse_graph(graph, shapes).program
    ref.compile(get_target("ref"))
    dev = parse_graph(graph, shapes).program
    dev.compile(target)
    assert dev.target_name == target.name
    runs = [feeds, reshuffled(feeds)]
    got = [[np.asarray(o) for o in dev.run_numpy(f)] for f in runs]
    wants = [ref.run_numpy(f) for f in runs]
    for i, (outs, want) in enumerate(zip(got, wants, strict=True)):
        assert len(outs) == len(want), f"{len(outs)} outputs, ref has {len(want)}"
        for k, (g, w) in enumerate(zip(outs, want, strict=True)):
            assert_matches(g, w, tol, f"run {i}, output {k}")
    return wants[0]


def check_nodes(
    nodes: Sequence[onnx.NodeProto],
    feeds: dict[str, np.ndarray],
    target: Any,
    tol: Tol,
    inits: dict[str, np.ndarray] | None = None,
    outputs: Sequence[str] = ("y",),
    opset: int = 21,
) -> list[np.ndarray]:
    return check_model(make_model(nodes, feeds, outputs, inits, opset), feeds, target, tol)


def compiled_steps(
    nodes: Sequence[onnx.NodeProto],
    feeds: dict[str, np.ndarray],
    target: Any,
    inits: dict[str, np.ndarray] | None = None,
    opset: int = 21,
) -> list:
    """The lowered steps (launches) of ``nodes`` compiled for the gpu ``target``."""
    graph = model_to_dict(make_model(nodes, feeds, ("y",), inits, opset))
    prog = parse_graph(graph, {k: Shape(from_numpy(v.dtype), v.shape) for k, v in feeds.items()}).program
    prog.compile(target)
    return prog._exe.lowered.steps  # type: ignore[union-attr]


def check_op(
    op_type: str,
    feeds: dict[str, np.ndarray],
    target: Any,
    tol: Tol,
    inits: dict[str, np.ndarray] | None = None,
    inputs: Sequence[str] | None = None,
    opset: int = 21,
    **attrs: Any,
) -> list[np.ndarray]:
    """One node ``y = op_type(*inputs)``; inputs default to the feeds, then the initializers, in order."""
    names = list(inputs) if inputs is not None else [*feeds, *(inits or {})]
    return check_nodes([node(op_type, names, **attrs)], feeds, target, tol, inits, opset=opset)

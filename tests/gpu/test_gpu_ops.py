"""Elementwise ops on the gpu target vs the ref target: every unary/binary op, logic, casts, where and
clip, in float32/16, bfloat16, double, integer and bool types, on broadcast, transposed and sliced views.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from .gpucheck import (
    BF16,
    EXACT,
    F16,
    F32,
    F64,
    FP32,
    check_nodes,
    check_op,
    ints,
    node,
    op_tol,
    times,
    uniform,
)

pytestmark = pytest.mark.gpu

SHAPE = (3, 5, 7)

# ONNX op -> (low, high) of its inputs' domain, attributes, exact (nothing to round: results must be equal)
UNARY: dict[str, tuple[float, float, dict, bool]] = {
    "Abs": (-3, 3, {}, True),
    "Neg": (-3, 3, {}, True),
    "Sign": (-3, 3, {}, True),
    "Relu": (-3, 3, {}, True),
    "Ceil": (-3, 3, {}, True),
    "Floor": (-3, 3, {}, True),
    "Round": (-3, 3, {}, True),
    "Exp": (-5, 5, {}, False),
    "Log": (0.01, 10, {}, False),
    "Sqrt": (0, 10, {}, False),
    "Reciprocal": (0.1, 5, {}, False),
    "Erf": (-3, 3, {}, False),
    "Sin": (-6, 6, {}, False),
    "Cos": (-6, 6, {}, False),
    "Tan": (-1.4, 1.4, {}, False),
    "Asin": (-0.99, 0.99, {}, False),
    "Acos": (-0.99, 0.99, {}, False),
    "Atan": (-5, 5, {}, False),
    "Sinh": (-4, 4, {}, False),
    "Cosh": (-4, 4, {}, False),
    "Tanh": (-4, 4, {}, False),
    "Asinh": (-5, 5, {}, False),
    "Acosh": (1.01, 5, {}, False),
    "Atanh": (-0.95, 0.95, {}, False),
    "Sigmoid": (-8, 8, {}, False),
    "Softplus": (-8, 8, {}, False),
    "Softsign": (-8, 8, {}, False),
    "Gelu": (-5, 5, {}, False),
    "Elu": (-4, 4, {"alpha": 0.7}, False),
    "Selu": (-4, 4, {}, False),
    "Celu": (-4, 4, {"alpha": 1.3}, False),
    "LeakyRelu": (-4, 4, {"alpha": 0.1}, False),
    "HardSigmoid": (-4, 4, {"alpha": 0.3, "beta": 0.4}, False),
    "HardSwish": (-4, 4, {}, False),
    "Mish": (-5, 5, {}, False),
    "ThresholdedRelu": (-2, 2, {"alpha": 0.5}, False),
    "Shrink": (-2, 2, {"bias": 0.2, "lambd": 0.6}, False),
}


def unary_input(rng, op: str, dtype) -> np.ndarray:
    lo, hi, _, _ = UNARY[op]
    if op in ("Round", "Ceil", "Floor", "Sign", "Relu"):
        # Halves and integers too: ties (round half to even) and exact zeros are where these differ.
        return (ints(rng, SHAPE, int(2 * lo), int(2 * hi) + 1) / 2).astype(dtype)
    return uniform(rng, SHAPE, lo, hi, dtype)


@pytest.mark.parametrize("op", sorted(UNARY))
def test_unary_float32(gpu, rng, op):
    x = unary_input(rng, op, F32)
    check_op(op, {"x": x}, gpu, EXACT if UNARY[op][3] else FP32, **UNARY[op][2])


NARROW_UNARY = ["Abs", "Neg", "Relu", "Floor", "Exp", "Log", "Sqrt", "Erf", "Tanh", "Sigmoid"]


@pytest.mark.parametrize("dtype", [F16, BF16], ids=["f16", "bf16"])
@pytest.mark.parametrize("op", NARROW_UNARY)
def test_unary_narrow_float(gpu, rng, op, dtype):
    x = unary_input(rng, op, dtype)
    check_op(op, {"x": x}, gpu, op_tol(dtype, EXACT if UNARY[op][3] else FP32), **UNARY[op][2])


@pytest.mark.parametrize("op", ["Exp", "Tanh", "Sqrt", "Neg"])
def test_unary_double(gpu, rng, op):
    x = unary_input(rng, op, F64)
    check_op(op, {"x": x}, gpu, op_tol(F64, EXACT if UNARY[op][3] else FP32), **UNARY[op][2])


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("dtype", [F32, F16], ids=["f32", "f16"])
def test_gelu_modes(gpu, rng, approximate, dtype):
    x = uniform(rng, SHAPE, -5, 5, dtype)
    check_op("Gelu", {"x": x}, gpu, op_tol(dtype), approximate=approximate)


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64])
@pytest.mark.parametrize("op", ["Abs", "Neg", "Sign", "Relu", "BitwiseNot"])
def test_unary_int(gpu, rng, op, dtype):
    check_op(op, {"x": ints(rng, SHAPE, -100, 100, dtype)}, gpu, EXACT)


def test_isnan_isinf_and_nan_propagation(gpu, rng):
    x = uniform(rng, SHAPE)
    x.reshape(-1)[[0, 7, 20, 33, 50]] = [np.nan, np.inf, -np.inf, np.nan, 0.0]
    feeds = {"x": x}
    nodes = [
        node("IsNaN", ["x"], ["a"]),
        node("IsInf", ["x"], ["b"]),
        node("IsInf", ["x"], ["c"], detect_negative=0),
        node("Relu", ["x"], ["d"]),
        node("Exp", ["x"], ["e"]),
    ]
    check_nodes(nodes, feeds, gpu, FP32, outputs=["a", "b", "c", "d", "e"])


FLOATS = [F32, F16, BF16]
FLOAT_IDS = ["f32", "f16", "bf16"]


def binary_inputs(rng, op: str, dtype) -> dict[str, np.ndarray]:
    dt = np.dtype(dtype)
    if dt.kind in "iu":
        lo, hi = (0, 12) if dt.kind == "u" else (-12, 12)
        a, b = ints(rng, SHAPE, lo, hi, dt), ints(rng, SHAPE, lo, hi, dt)
        if op in ("Div", "Mod"):
            b[b == 0] = 3  # no division by zero; negative divisors stay (truncation, sign rules)
        if op == "Pow":
            a, b = ints(rng, SHAPE, -4, 5, dt), ints(rng, SHAPE, 0, 5, dt)
        return {"a": a, "b": b}
    a, b = uniform(rng, SHAPE, dtype=dt), uniform(rng, SHAPE, dtype=dt)
    if op == "Div":
        b = (np.sign(b.astype(F32)) * (0.5 + np.abs(b.astype(F32)))).astype(dt)
    if op == "Pow":
        a = uniform(rng, SHAPE, 0.1, 3, dt)
    if op in ("Max", "Min") and dt == F32:
        a.reshape(-1)[[3, 40]] = np.nan  # NaN wins, as numpy's maximum/minimum say
    return {"a": a, "b": b}


ARITH = ["Add", "Sub", "Mul", "Div", "Pow", "Max", "Min"]
EXACT_ARITH = {"Max", "Min"}


@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
@pytest.mark.parametrize("op", ARITH)
def test_binary_float(gpu, rng, op, dtype):
    check_op(op, binary_inputs(rng, op, dtype), gpu, op_tol(dtype, EXACT if op in EXACT_ARITH else FP32))


@pytest.mark.parametrize(
    "op,dtype",
    [(op, np.int32) for op in ["Add", "Sub", "Mul", "Div", "Pow", "Max", "Min"]]
    + [(op, dt) for op in ["Add", "Mul", "Div"] for dt in (np.int64, np.int8, np.uint8)]
    + [("Pow", np.int64), ("Sub", np.uint8)],
)
def test_binary_int(gpu, rng, op, dtype):
    check_op(op, binary_inputs(rng, op, dtype), gpu, EXACT)


@pytest.mark.parametrize(
    "dtype,fmod",
    [(F32, 1), (F16, 1), (np.int32, 0), (np.int32, 1), (np.int64, 0)],
    ids=["f32-fmod", "f16-fmod", "i32-mod", "i32-fmod", "i64-mod"],
)
def test_mod(gpu, rng, dtype, fmod):
    check_op("Mod", binary_inputs(rng, "Div", dtype), gpu, op_tol(dtype), fmod=fmod)


@pytest.mark.parametrize("dtype", [F32, F16], ids=["f32", "f16"])
def test_prelu_broadcast_slope(gpu, rng, dtype):
    feeds = {"x": uniform(rng, SHAPE, dtype=dtype), "s": uniform(rng, (SHAPE[1], 1), 0, 0.5, dtype)}
    check_op("PRelu", feeds, gpu, op_tol(dtype))


def test_variadic_max_min_sum_mean(gpu, rng):
    feeds = {k: uniform(rng, s) for k, s in (("a", SHAPE), ("b", SHAPE[1:]), ("c", (1, 1, SHAPE[2])))}
    nodes = [node(op, ["a", "b", "c"], [op]) for op in ("Max", "Min", "Sum", "Mean")]
    check_nodes(nodes, feeds, gpu, FP32, outputs=["Max", "Min", "Sum", "Mean"])


@pytest.mark.parametrize("dtype", [F32, F16, np.int64], ids=["f32", "f16", "i64"])
@pytest.mark.parametrize("op", ["Equal", "Greater", "Less", "GreaterOrEqual", "LessOrEqual"])
def test_comparison(gpu, rng, op, dtype):
    # Small integer values in any type, so equal pairs (the edge of every comparison) are common.
    feeds = {"a": ints(rng, SHAPE, -3, 4).astype(dtype), "b": ints(rng, SHAPE[1:], -3, 4).astype(dtype)}
    check_op(op, feeds, gpu, EXACT)


def test_logic_ops(gpu, rng):
    feeds = {"a": ints(rng, SHAPE, 0, 2).astype(bool), "b": ints(rng, SHAPE, 0, 2).astype(bool)}
    nodes = [node(op, ["a", "b"], [op]) for op in ("And", "Or", "Xor", "Equal")]
    nodes.append(node("Not", ["a"], ["Not"]))
    check_nodes(nodes, feeds, gpu, EXACT, outputs=["And", "Or", "Xor", "Equal", "Not"])


@pytest.mark.parametrize("dtype", [np.uint8, np.int32, np.int64])
@pytest.mark.parametrize("op", ["BitwiseAnd", "BitwiseOr", "BitwiseXor"])
def test_bitwise(gpu, rng, op, dtype):
    info = np.iinfo(dtype)
    feeds = {k: ints(rng, SHAPE, max(info.min, -(2**30)), min(info.max, 2**30), dtype) for k in "ab"}
    check_op(op, feeds, gpu, EXACT)


@pytest.mark.parametrize("dtype", [np.uint8, np.uint32, np.uint64])
@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
def test_bitshift(gpu, rng, direction, dtype):
    bits = np.dtype(dtype).itemsize * 8
    feeds = {"a": ints(rng, SHAPE, 0, 256, dtype), "b": ints(rng, SHAPE, 0, bits, dtype)}
    check_op("BitShift", feeds, gpu, EXACT, direction=direction)


# Casts: every pair here has a defined result (float -> int values stay in range and truncate).
CASTS = [
    (F32, F16),
    (F32, BF16),
    (F16, F32),
    (BF16, F32),
    (F16, BF16),
    (F32, F64),
    (F64, F32),
    (F32, np.int32),
    (F32, np.int8),
    (F32, np.uint8),
    (F16, np.int64),
    (np.int64, F32),
    (np.int32, F16),
    (np.int64, np.int32),
    (np.uint8, np.int64),
    (np.int32, np.bool_),
    (F32, np.bool_),
    (np.bool_, F32),
    (np.bool_, np.int64),
]


@pytest.mark.parametrize("src,dst", CASTS, ids=lambda t: np.dtype(t).name)
def test_cast(gpu, rng, src, dst):
    src, dst = np.dtype(src), np.dtype(dst)
    if src.kind == "b":
        x = ints(rng, SHAPE, 0, 2).astype(bool)
    else:
        lo = 0 if "u" in (src.kind, dst.kind) else -100
        x = uniform(rng, SHAPE, lo, 100, F64)
        x = (np.trunc(x) if src.kind in "iu" else x).astype(src)
        x.reshape(-1)[:3] = np.array([0, 1, 2]).astype(src)  # zeros and ones: the edge of a bool cast
    check_op("Cast", {"x": x}, gpu, EXACT, to=helper.np_dtype_to_tensor_dtype(dst))


@pytest.mark.parametrize("dtype", [F32, F16, np.int64, np.bool_], ids=["f32", "f16", "i64", "bool"])
def test_where_broadcast(gpu, rng, dtype):
    feeds = {
        "c": ints(rng, (SHAPE[0], 1, SHAPE[2]), 0, 2).astype(bool),
        "x": ints(rng, SHAPE, -50, 50).astype(dtype),
        "y": ints(rng, (SHAPE[2],), -50, 50).astype(dtype),
    }
    check_op("Where", feeds, gpu, EXACT)


@pytest.mark.parametrize(
    "dtype,lo,hi",
    [(F32, -1.0, 2.0), (F16, -1.0, 2.0), (np.int32, -20, 30), (F32, None, 0.5), (F32, 1, -1)],
    ids=["f32", "f16", "i32", "max-only", "min-above-max"],
)
def test_clip(gpu, rng, dtype, lo, hi):
    x = (uniform(rng, SHAPE, -3, 3) * (20 if np.dtype(dtype).kind == "i" else 1)).astype(dtype)
    if np.dtype(dtype) == F32:
        x.reshape(-1)[5] = np.nan  # NaN stays NaN
    inits = {"lo": np.array(lo, dtype)} if lo is not None else {}
    if hi is not None:
        inits["hi"] = np.array(hi, dtype)
    inputs = ["x", "lo" if lo is not None else "", "hi" if hi is not None else ""]
    check_op("Clip", {"x": x}, gpu, EXACT, inits=inits, inputs=inputs)


# -- views: broadcast (stride 0), transposed, sliced inputs feeding fused pointwise kernels --------------
def test_broadcast_both_sides(gpu, rng):
    feeds = {"a": uniform(rng, (4, 1, 6)), "b": uniform(rng, (5, 1))}
    check_nodes([node("Add", ["a", "b"], ["s"]), node("Mul", ["s", "a"], ["y"])], feeds, gpu, FP32)


@pytest.mark.parametrize("dtype", [F32, F16, BF16], ids=FLOAT_IDS)
def test_transposed_inputs_fused_chain(gpu, rng, dtype):
    # y = tanh(x^T * 2 + w) - z^T with two different permutations: strided reads in one kernel.
    feeds = {
        "x": uniform(rng, (2, 7, 5), dtype=dtype),
        "w": uniform(rng, (2, 5, 7), dtype=dtype),
        "z": uniform(rng, (5, 7, 2), dtype=dtype),
    }
    nodes = [
        node("Transpose", ["x"], ["xt"], perm=[0, 2, 1]),
        node("Add", ["xt", "xt"], ["x2"]),
        node("Add", ["x2", "w"], ["s"]),
        node("Tanh", ["s"], ["t"]),
        node("Transpose", ["z"], ["zt"], perm=[2, 0, 1]),
        node("Sub", ["t", "zt"], ["y"]),
    ]
    check_nodes(nodes, feeds, gpu, times(op_tol(dtype), 4))  # four rounded ops in a row


def test_sliced_and_expanded_inputs(gpu, rng):
    feeds = {"x": uniform(rng, (8, 12)), "v": uniform(rng, (1, 6))}
    inits = {
        "st": np.array([1, 11], np.int64),
        "en": np.array([8, 0], np.int64),
        "ax": np.array([0, 1], np.int64),
        "sp": np.array([2, -2], np.int64),
        "shape": np.array([4, 5, 1], np.int64),
    }
    nodes = [
        node("Slice", ["x", "st", "en", "ax", "sp"], ["xs"]),  # x[1:8:2, 11:0:-2]: [4, 6], offset, reversed
        node("Unsqueeze", ["xs", "one"], ["xu"]),  # [4, 1, 6]
        node("Expand", ["v", "shape"], ["ve"]),  # [4, 5, 6] from [1, 6]: stride-0 dims
        node("Mul", ["xu", "ve"], ["y"]),
    ]
    inits["one"] = np.array([1], np.int64)
    check_nodes(nodes, feeds, gpu, FP32, inits=inits)


def test_scalar_constant_and_int_float_mix(gpu, rng):
    # Cast int -> float, compare, where, clip, cast back: a chain of mixed types in one graph.
    feeds = {"i": ints(rng, (6, 9), -20, 20, np.int64), "x": uniform(rng, (6, 9))}
    inits = {"half": np.array(0.5, F32), "lo": np.array(-2.0, F32), "hi": np.array(3.0, F32)}
    nodes = [
        node("Cast", ["i"], ["f"], to=1),
        node("Mul", ["f", "half"], ["fh"]),
        node("Greater", ["fh", "x"], ["g"]),
        node("Where", ["g", "fh", "x"], ["w"]),
        node("Clip", ["w", "lo", "hi"], ["c"]),
        node("Cast", ["c"], ["y"], to=7),
    ]
    check_nodes(nodes, feeds, gpu, EXACT, inits=inits)


@pytest.mark.parametrize("dtype", [F32, F16], ids=["f32", "f16"])
@pytest.mark.parametrize("n", [3 * 2**20 + 5, 257 * 1031])
def test_large_and_odd_sizes(gpu, rng, dtype, n):
    # Past one grid of blocks (grid-stride loops) and sizes that are no multiple of a vector width.
    feeds = {"a": uniform(rng, (n,), dtype=dtype), "b": uniform(rng, (n,), dtype=dtype)}
    nodes = [node("Mul", ["a", "b"], ["m"]), node("Add", ["m", "a"], ["y"])]
    check_nodes(nodes, feeds, gpu, times(op_tol(dtype), 2))

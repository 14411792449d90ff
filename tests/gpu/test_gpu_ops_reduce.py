"""Reductions, argmax/argmin, softmax/logsoftmax and layer norms on the gpu target vs the ref target."""

from __future__ import annotations

import numpy as np
import pytest

from .gpucheck import (
    BF16,
    EXACT,
    F16,
    F32,
    FP16,
    FP32_SUM,
    Tol,
    check_nodes,
    check_op,
    ints,
    node,
    normal,
    sum_tol,
    uniform,
)

pytestmark = pytest.mark.gpu

X = (6, 10, 33)  # inner dim no power of two
AXES = [[2], [1], [0], [0, 2], [1, 2], None]
AXES_IDS = ["inner", "middle", "outer", "outer+inner", "middle+inner", "all"]

# ONNX reduce -> input domain (low, high): products near 1 stay finite, logs see positive sums.
REDUCE = {
    "ReduceSum": (-3, 3),
    "ReduceMean": (-3, 3),
    "ReduceMax": (-3, 3),
    "ReduceMin": (-3, 3),
    "ReduceProd": (0.8, 1.25),
    "ReduceL1": (-3, 3),
    "ReduceL2": (-3, 3),
    "ReduceSumSquare": (-3, 3),
    "ReduceLogSum": (0.1, 2),
    "ReduceLogSumExp": (-3, 3),
}
SELECTING = {"ReduceMax", "ReduceMin"}  # pick an element: nothing to round


def reduce(gpu, rng, op, shape, axes, keepdims=1, dtype=F32):
    lo, hi = REDUCE[op]
    x = uniform(rng, shape, lo, hi, dtype)
    inits = {"axes": np.array(axes, np.int64)} if axes is not None else {}
    tol = EXACT if op in SELECTING else sum_tol(dtype)
    return check_op(op, {"x": x}, gpu, tol, inits=inits, keepdims=keepdims)


@pytest.mark.parametrize("axes", AXES, ids=AXES_IDS)
@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMax"])
def test_reduce_axes(gpu, rng, op, axes):
    reduce(gpu, rng, op, X, axes)


@pytest.mark.parametrize("axes", [[2], [0, 2]], ids=["inner", "outer+inner"])
@pytest.mark.parametrize("op", sorted(set(REDUCE) - {"ReduceSum", "ReduceMax"}))
def test_reduce_ops(gpu, rng, op, axes):
    reduce(gpu, rng, op, X, axes)


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean", "ReduceL2"])
def test_reduce_keepdims_0_negative_axis(gpu, rng, op):
    reduce(gpu, rng, op, X, [-2], keepdims=0)


@pytest.mark.parametrize("shape,axes", [((8, 3000), [1]), ((3000, 8), [0]), ((2, 70000), [1])])
@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean", "ReduceMax"])
def test_reduce_long(gpu, rng, op, shape, axes):
    # Rows longer than a block, and columns (reducing the strided outer dim).
    reduce(gpu, rng, op, shape, axes)


@pytest.mark.parametrize("dtype", [F16, BF16], ids=["f16", "bf16"])
@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean", "ReduceMax"])
def test_reduce_narrow(gpu, rng, op, dtype):
    reduce(gpu, rng, op, (4, 1000), [1], dtype=dtype)  # narrow sums accumulate in float


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd"])
def test_reduce_int(gpu, rng, op, dtype):
    x = ints(rng, X, -3, 4, dtype) if op != "ReduceProd" else ints(rng, X, -2, 3, dtype)
    inits = {"axes": np.array([2] if op != "ReduceProd" else [0], np.int64)}
    check_op(op, {"x": x}, gpu, EXACT, inits=inits)


@pytest.mark.parametrize(
    "op,axis,keepdims,last",
    [
        ("ArgMax", 2, 1, 0),
        ("ArgMax", 1, 0, 0),
        ("ArgMax", 0, 1, 1),
        ("ArgMin", -1, 0, 0),
        ("ArgMin", 1, 1, 1),
    ],
)
@pytest.mark.parametrize("kind", ["float", "ties"])
def test_argmax_argmin(gpu, rng, op, axis, keepdims, last, kind):
    # "ties": three distinct values, so the first/last index rule decides nearly every result.
    x = uniform(rng, X) if kind == "float" else ints(rng, X, 0, 3, np.int32)
    check_op(op, {"x": x}, gpu, EXACT, axis=axis, keepdims=keepdims, select_last_index=last)


@pytest.mark.parametrize("dtype", [F16, F32], ids=["f16", "f32"])
def test_argmax_long_row(gpu, rng, dtype):
    check_op("ArgMax", {"x": uniform(rng, (3, 5000), dtype=dtype)}, gpu, EXACT, axis=1)


# Softmax: every element relative (small probabilities matter), a tiny absolute floor.
SOFTMAX_TOL = {"Softmax": Tol(1e-5, 1e-8), "LogSoftmax": Tol(1e-5, 1e-6)}
SOFTMAX_CASES = [
    ((6, 10), -1),
    ((4, 1000), -1),
    ((2, 4096), -1),
    ((3, 7, 5), 1),
    ((8, 6, 5), 0),
    ((2, 3, 4, 5), 2),
    ((5, 33), 0),
]


@pytest.mark.parametrize("shape,axis", SOFTMAX_CASES, ids=str)
@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_softmax(gpu, rng, op, shape, axis):
    check_op(op, {"x": uniform(rng, shape, -10, 10)}, gpu, SOFTMAX_TOL[op], axis=axis)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_softmax_large_values_and_masks(gpu, rng, op):
    # exp(100) overflows float: only a max-subtracted softmax gets these right. -1e9 are mask values,
    # and row 0 has a single unmasked element.
    x = uniform(rng, (4, 100), -100, 100)
    x[1:, ::3] = -1e9
    x[0, 1:] = -1e9
    check_nodes([node(op, ["x"], ["y"], axis=-1)], {"x": x}, gpu, SOFTMAX_TOL[op])


# Narrow floats: the ref steps in the narrow type (ONNX's definition), which is up to 0.4% (half) off
# the exact result; a kernel computing in float is one ulp off it. In bfloat16 the ref is 4% off on short
# rows and tens of percent on long ones (its sum stops growing), so bfloat16 is checked on short rows.
@pytest.mark.parametrize(
    "op,shape,axis,dtype,tol",
    [
        ("Softmax", (4, 1000), -1, F16, Tol(1e-2, 1e-6)),
        ("Softmax", (2, 4096), -1, F16, Tol(1e-2, 1e-6)),
        ("Softmax", (3, 7, 5), 1, F16, Tol(1e-2, 1e-6)),
        ("LogSoftmax", (4, 1000), -1, F16, Tol(5e-3, 1e-4)),
        ("Softmax", (6, 12), -1, BF16, Tol(5e-2, 1e-3)),
        ("Softmax", (3, 7, 5), 1, BF16, Tol(5e-2, 1e-3)),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_softmax_narrow(gpu, rng, op, shape, axis, dtype, tol):
    check_op(op, {"x": uniform(rng, shape, -5, 5, dtype)}, gpu, tol, axis=axis)


# -- layer norms -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "shape,axis,bias,eps,mean",
    [
        ((4, 7, 32), -1, True, 1e-5, 0.0),
        ((2, 768), -1, True, 1e-5, 5.0),
        ((3, 4096), -1, True, 1e-5, 0.0),
        ((2, 6, 5, 8), -2, True, 1e-5, 0.0),
        ((5, 100), -1, False, 1e-3, 1.0),
    ],
    ids=["rows32", "rows768-offset", "rows4096", "last2dims", "nobias"],
)
@pytest.mark.parametrize("dtype", [F32, F16, BF16], ids=["f32", "f16", "bf16"])
def test_layer_normalization(gpu, rng, shape, axis, bias, eps, mean, dtype):
    norm = shape[axis:]
    feeds = {"x": normal(rng, shape, dtype, scale=2.0, mean=mean)}
    inits = {"scale": normal(rng, norm, dtype)}
    if bias:
        inits["bias"] = normal(rng, norm, dtype)
    check_op("LayerNormalization", feeds, gpu, sum_tol(dtype), inits=inits, axis=axis, epsilon=eps)


@pytest.mark.parametrize("dtype", [F32, F16], ids=["f32", "f16"])
def test_layer_norm_spelled_out(gpu, rng, dtype):
    # How opset < 17 exporters write LayerNorm (bert_opset14): the gpu pipeline may fuse it back.
    feeds = {"x": normal(rng, (2, 9, 64), dtype, mean=1.0)}
    inits = {
        "ax": np.array([-1], np.int64),
        "two": np.array(2.0, dtype),
        "eps": np.array(1e-5, dtype),
        "g": normal(rng, (64,), dtype),
        "b": normal(rng, (64,), dtype),
    }
    nodes = [
        node("ReduceMean", ["x", "ax"], ["m"]),
        node("Sub", ["x", "m"], ["d"]),
        node("Pow", ["d", "two"], ["d2"]),
        node("ReduceMean", ["d2", "ax"], ["v"]),
        node("Add", ["v", "eps"], ["ve"]),
        node("Sqrt", ["ve"], ["s"]),
        node("Div", ["d", "s"], ["n"]),
        node("Mul", ["n", "g"], ["ng"]),
        node("Add", ["ng", "b"], ["y"]),
    ]
    # In half the ref rounds every step (d, d^2, v, s, n...); a fused kernel in float does not.
    check_nodes(nodes, feeds, gpu, FP32_SUM if dtype == F32 else FP16, inits=inits)


def test_rms_normalization(gpu, rng):
    feeds = {"x": normal(rng, (3, 5, 96), F32)}
    inits = {"scale": normal(rng, (96,), F32)}
    check_op("RMSNormalization", feeds, gpu, FP32_SUM, inits=inits, opset=23, axis=-1)


# -- NaN: reduce_max/min and argmax/argmin skip it (all NaN: NaN, index 0), on every schedule ----------------
def with_nans(rng, shape, dtype=F32):
    x = uniform(rng, shape, dtype=dtype)
    x.reshape(-1)[rng.choice(x.size, max(1, x.size // 20), replace=False)] = np.nan
    x.reshape(-1, shape[-1])[0] = np.nan  # one whole row of NaN
    return x


NAN_CASES = [
    (X, [2]),
    (X, [0, 2]),
    (X, [1]),
    ((8, 3000), [1]),
    ((3000, 8), [0]),
    ((40, 5000), [0]),
    ((6, 7), [1]),
]


@pytest.mark.parametrize("shape,axes", NAN_CASES, ids=str)
@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin"])
def test_reduce_max_min_skip_nan(gpu, rng, op, shape, axes):
    check_op(op, {"x": with_nans(rng, shape)}, gpu, EXACT, inits={"axes": np.array(axes, np.int64)})


@pytest.mark.parametrize("shape,axis", [(X, 2), (X, 0), ((3, 5000), 1), ((3000, 8), 0), ((6, 7), 1)], ids=str)
@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("last", [0, 1])
def test_argmax_argmin_skip_nan(gpu, rng, op, shape, axis, last):
    check_op(op, {"x": with_nans(rng, shape)}, gpu, EXACT, axis=axis, select_last_index=last)


@pytest.mark.parametrize("dtype", [F16, BF16], ids=["f16", "bf16"])
def test_reduce_max_and_argmax_skip_nan_narrow(gpu, rng, dtype):
    x = with_nans(rng, (4, 1000), dtype)
    check_op("ReduceMax", {"x": x}, gpu, EXACT, inits={"axes": np.array([1], np.int64)})
    check_op("ArgMin", {"x": x}, gpu, EXACT, axis=1)

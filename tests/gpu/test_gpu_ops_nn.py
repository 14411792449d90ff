"""MatMul/Gemm, Conv (with fused bias, Relu and residual Add) and pooling on the gpu target vs ref.

float32 runs with TF32 off (``gpu``) at float32 tolerance; the TF32 cases run on ``gpu_tf32``.
"""

from __future__ import annotations

import numpy as np
import pytest

from .gpucheck import (
    BF16,
    EXACT,
    F16,
    F32,
    F64,
    FP16,
    FP32_SUM,
    FP64,
    TF32,
    check_nodes,
    check_op,
    compiled_steps,
    node,
    normal,
    sum_tol,
    uniform,
)

pytestmark = pytest.mark.gpu

FLOAT_TOL = {F32: FP32_SUM, F16: FP16, BF16: FP16, F64: FP64}


def unit(rng, shape, dtype=F32, fan_in: int = 1):
    """N(0, 1/fan_in): dot products of these stay O(1) whatever K is."""
    return normal(rng, shape, dtype, scale=fan_in**-0.5)


# -- MatMul ----------------------------------------------------------------------------------------------
MATMUL = [
    ((64, 128), (128, 96)),
    ((3, 32, 64), (3, 64, 48)),  # batched
    ((2, 3, 16, 32), (32, 24)),  # broadcast weight
    ((2, 1, 16, 32), (3, 32, 8)),  # broadcast both batch dims
    ((64,), (64, 5)),  # vector @ matrix
    ((4, 64), (64,)),  # matrix @ vector
    ((1, 7, 33), (33, 17)),  # odd sizes
]


@pytest.mark.parametrize("dtype", [F32, F16, BF16], ids=["f32", "f16", "bf16"])
@pytest.mark.parametrize("a,b", MATMUL, ids=str)
def test_matmul(gpu, rng, a, b, dtype):
    feeds = {"a": unit(rng, a, dtype), "b": unit(rng, b, dtype, fan_in=a[-1])}
    check_op("MatMul", feeds, gpu, FLOAT_TOL[dtype])


def test_matmul_double(gpu, rng):
    check_op("MatMul", {"a": unit(rng, (16, 40), F64), "b": unit(rng, (40, 24), F64, 40)}, gpu, FP64)


@pytest.mark.parametrize("k", [64, 1024])
def test_matmul_tf32(gpu_tf32, rng, k):
    feeds = {"a": unit(rng, (128, k)), "b": unit(rng, (k, 96), fan_in=k)}
    check_op("MatMul", feeds, gpu_tf32, TF32)


def test_matmul_tf32_off_is_full_float32(gpu, rng):
    # A long K with values that do not fit TF32's 10-bit mantissa: TF32 would be ~1e-3 off here.
    k = 4096
    feeds = {"a": unit(rng, (64, k)) + 1.0, "b": unit(rng, (k, 64), fan_in=k) + 1.0 / k}
    check_op("MatMul", feeds, gpu, FP32_SUM)


@pytest.mark.parametrize("dtype", [F32, F16], ids=["f32", "f16"])
def test_matmul_transposed_and_weight_constant(gpu, rng, dtype):
    # A^T @ W with W an initializer (a literal, as model weights are) and A a transposed view.
    feeds = {"a": unit(rng, (2, 48, 10), dtype)}
    inits = {"w": unit(rng, (48, 20), dtype, fan_in=48)}
    nodes = [node("Transpose", ["a"], ["at"], perm=[0, 2, 1]), node("MatMul", ["at", "w"], ["y"])]
    check_nodes(nodes, feeds, gpu, FLOAT_TOL[dtype], inits=inits)


@pytest.mark.parametrize("dtype", [F32, F16], ids=["f32", "f16"])
def test_matmul_bias_relu_epilogue(gpu, rng, dtype):
    feeds = {"x": unit(rng, (2, 9, 64), dtype)}
    inits = {"w": unit(rng, (64, 48), dtype, fan_in=64), "b": unit(rng, (48,), dtype)}
    nodes = [node("MatMul", ["x", "w"], ["m"]), node("Add", ["m", "b"], ["s"]), node("Relu", ["s"], ["y"])]
    check_nodes(nodes, feeds, gpu, FLOAT_TOL[dtype], inits=inits)
    # One launch: the bias and the relu in cuBLASLt's epilogue (RELU_BIAS), the batch folded into M.
    steps = compiled_steps(nodes, feeds, gpu, inits)
    assert [s.label for s in steps] == ["gemm 1x18x48x64 +bias +relu"]


# -- Gemm ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "trans_a,trans_b,alpha,beta,c_shape",
    [
        (0, 0, 1.0, 1.0, (24,)),
        (1, 0, 0.5, 2.0, (16, 24)),
        (0, 1, 1.0, 1.0, (1, 24)),
        (1, 1, 2.0, 0.5, ()),
        (0, 1, 1.0, 0.0, None),
    ],
    ids=["bias", "transA-full-C", "transB-row-C", "both-scalar-C", "no-C"],
)
@pytest.mark.parametrize("dtype", [F32, F16], ids=["f32", "f16"])
def test_gemm(gpu, rng, trans_a, trans_b, alpha, beta, c_shape, dtype):
    m, k, n = 16, 40, 24
    feeds = {
        "a": unit(rng, (k, m) if trans_a else (m, k), dtype),
        "b": unit(rng, (n, k) if trans_b else (k, n), dtype, fan_in=k),
    }
    inits = {"c": unit(rng, c_shape, dtype)} if c_shape is not None else {}
    attrs = {"transA": trans_a, "transB": trans_b, "alpha": alpha, "beta": beta}
    check_op("Gemm", feeds, gpu, FLOAT_TOL[dtype], inits=inits, **attrs)


# -- Conv ---------------------------------------------------------------------------------------------------
CONV = {
    # name: x shape, w shape, attributes
    "3x3-pad1": ((2, 8, 16, 16), (16, 8, 3, 3), {"pads": [1, 1, 1, 1]}),
    "stride2": ((2, 8, 15, 15), (12, 8, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
    "dilation2": ((1, 4, 17, 13), (6, 4, 3, 3), {"pads": [2, 2, 2, 2], "dilations": [2, 2]}),
    "groups2": ((2, 8, 12, 12), (10, 4, 3, 3), {"pads": [1, 1, 1, 1], "group": 2}),
    "depthwise": ((2, 16, 14, 14), (16, 1, 3, 3), {"pads": [1, 1, 1, 1], "group": 16}),
    "1x1": ((2, 32, 8, 8), (24, 32, 1, 1), {}),
    "asym-pads": ((1, 3, 11, 11), (8, 3, 3, 3), {"pads": [0, 1, 2, 1], "strides": [2, 2]}),
    "same-upper": ((1, 4, 10, 9), (5, 4, 4, 4), {"auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    "7x7-stem": ((1, 3, 32, 32), (16, 3, 7, 7), {"pads": [3, 3, 3, 3], "strides": [2, 2]}),
    "conv1d": ((2, 4, 20), (6, 4, 5), {"pads": [2, 2]}),
    "conv3d": ((1, 2, 5, 6, 7), (3, 2, 3, 3, 3), {"pads": [1, 1, 1, 1, 1, 1]}),
}


def conv_feeds(rng, name: str, dtype, bias: bool):
    x, w, attrs = CONV[name]
    fan_in = int(np.prod(w[1:]))
    feeds = {"x": unit(rng, x, dtype)}
    inits = {"w": unit(rng, w, dtype, fan_in)}
    if bias:
        inits["b"] = unit(rng, w[:1], dtype)
    return feeds, inits, attrs


@pytest.mark.parametrize("name", sorted(CONV))
def test_conv_f32(gpu, rng, name):
    feeds, inits, attrs = conv_feeds(rng, name, F32, bias=True)
    check_op("Conv", feeds, gpu, FP32_SUM, inits=inits, **attrs)


@pytest.mark.parametrize("name", ["3x3-pad1", "stride2", "depthwise", "1x1", "asym-pads"])
def test_conv_f16(gpu, rng, name):
    feeds, inits, attrs = conv_feeds(rng, name, F16, bias=True)
    check_op("Conv", feeds, gpu, FP16, inits=inits, **attrs)


def test_conv_weight_as_input_no_bias(gpu, rng):
    x, w, attrs = CONV["groups2"]
    feeds = {"x": unit(rng, x), "w": unit(rng, w, fan_in=36)}
    check_op("Conv", feeds, gpu, FP32_SUM, **attrs)


def test_conv_tf32(gpu_tf32, rng):
    feeds, inits, attrs = conv_feeds(rng, "3x3-pad1", F32, bias=True)
    check_op("Conv", feeds, gpu_tf32, TF32, inits=inits, **attrs)


@pytest.mark.parametrize("epilogue", ["relu", "residual-relu", "relu6", "bn-relu"])
@pytest.mark.parametrize("dtype", [F32, F16], ids=["f32", "f16"])
def test_conv_fused(gpu, rng, epilogue, dtype):
    feeds, inits, attrs = conv_feeds(rng, "3x3-pad1", dtype, bias=True)
    nodes = [node("Conv", ["x", "w", "b"], ["c"], **attrs)]
    last = "c"
    if epilogue == "bn-relu":  # what an unfolded export (resnet_bn) looks like
        ch = CONV["3x3-pad1"][1][0]
        inits |= {
            "s": unit(rng, (ch,), dtype),
            "o": unit(rng, (ch,), dtype),
            "mu": unit(rng, (ch,), dtype),
            "var": uniform(rng, (ch,), 0.5, 2.0, dtype),
        }
        nodes.append(node("BatchNormalization", ["c", "s", "o", "mu", "var"], ["bn"]))
        last = "bn"
    if epilogue == "residual-relu":
        feeds["r"] = unit(rng, (2, 16, 16, 16), dtype)
        nodes.append(node("Add", [last, "r"], ["a"]))
        last = "a"
    if epilogue == "relu6":  # MobileNet's ReLU6 is a Clip
        inits |= {"lo": np.array(0, dtype), "hi": np.array(6, dtype)}
        nodes.append(node("Clip", [last, "lo", "hi"], ["y"]))
    else:
        nodes.append(node("Relu", [last], ["y"]))
    check_nodes(nodes, feeds, gpu, FLOAT_TOL[dtype], inits=inits)


# -- pooling ------------------------------------------------------------------------------------------------
POOL = {
    "max-k3s2p1": ("MaxPool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    "max-k2s2": ("MaxPool", {"kernel_shape": [2, 2], "strides": [2, 2]}),
    "max-ceil": ("MaxPool", {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
    "max-dilated": ("MaxPool", {"kernel_shape": [2, 3], "dilations": [2, 2], "pads": [1, 0, 1, 2]}),
    "avg-include-pad": (
        "AveragePool",
        {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 1},
    ),
    "avg-exclude-pad": ("AveragePool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    "avg-ceil": ("AveragePool", {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1}),
    "avg-ceil-pad": (
        "AveragePool",
        {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1},
    ),
    "global-avg": ("GlobalAveragePool", {}),
    "global-max": ("GlobalMaxPool", {}),
    "lp2": ("LpPool", {"kernel_shape": [2, 2], "strides": [2, 2], "p": 2}),
}


@pytest.mark.parametrize("dtype", [F32, F16], ids=["f32", "f16"])
@pytest.mark.parametrize("name", sorted(POOL))
def test_pool(gpu, rng, name, dtype):
    op, attrs = POOL[name]
    tol = EXACT if "max" in name else sum_tol(dtype)
    check_op(op, {"x": uniform(rng, (2, 3, 15, 14), dtype=dtype)}, gpu, tol, **attrs)


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
def test_pool_1d_and_3d(gpu, rng, op):
    tol = EXACT if op == "MaxPool" else FP32_SUM
    check_op(op, {"x": uniform(rng, (2, 3, 21))}, gpu, tol, kernel_shape=[4])
    x = uniform(rng, (1, 2, 6, 7, 8))
    check_op(op, {"x": x}, gpu, tol, kernel_shape=[2, 3, 2], strides=[2, 2, 2], pads=[1, 1, 0, 0, 1, 1])


@pytest.mark.parametrize("dtype", [F32, F16], ids=["f32", "f16"])
@pytest.mark.parametrize("name", ["max-k3s2p1", "max-dilated", "global-max"])
def test_max_pool_skips_nan(gpu, rng, name, dtype):
    # The ref's rule: NaN is skipped, a window of only NaN gives NaN (row 0 of channel 0 is all NaN).
    op, attrs = POOL[name]
    x = uniform(rng, (2, 3, 15, 14), dtype=dtype)
    x.reshape(-1)[rng.choice(x.size, 60, replace=False)] = np.nan
    x[0, 0, :2, :3] = np.nan
    check_op(op, {"x": x}, gpu, EXACT, **attrs)

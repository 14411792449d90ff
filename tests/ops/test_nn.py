"""convolution, convolution_backwards, pooling, lrn, dot, einsum: vs numpy and vs ORT CPU."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from migraphx_ep.frontend import ParseError
from migraphx_ep.ir.dtypes import from_numpy
from migraphx_ep.ir.operation import make_op
from migraphx_ep.ir.shape import Shape
from opcheck import check_node, make_model, run_ours

RNG = np.random.default_rng(7)


def rand(*lens: int, dtype=np.float32) -> np.ndarray:
    return np.asarray(RNG.standard_normal(lens) * 2).astype(dtype)


def run_op(name: str, args: list[np.ndarray], **attrs):
    op = make_op(name, **attrs)
    out = op.compute_shape([Shape(from_numpy(a.dtype), a.shape) for a in args])
    return op.compute(out, args), out


def naive_conv(x, w, pads, stride, dil, group):
    """Direct loop definition (no im2col), float64."""
    n, c, h, wd = x.shape
    m, cg, kh, kw = w.shape
    xp = np.pad(x.astype(np.float64), [(0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])])
    oh = (xp.shape[2] - (kh - 1) * dil[0] - 1) // stride[0] + 1
    ow = (xp.shape[3] - (kw - 1) * dil[1] - 1) // stride[1] + 1
    y = np.zeros((n, m, oh, ow))
    for mo in range(m):
        g = mo // (m // group)
        for i in range(oh):
            for j in range(ow):
                patch = xp[
                    :,
                    g * cg : (g + 1) * cg,
                    i * stride[0] : i * stride[0] + (kh - 1) * dil[0] + 1 : dil[0],
                    j * stride[1] : j * stride[1] + (kw - 1) * dil[1] + 1 : dil[1],
                ]
                y[:, mo, i, j] = (patch * w[mo]).sum(axis=(1, 2, 3))
    return y


def test_convolution_vs_naive():
    x, w = rand(2, 4, 7, 8), rand(6, 2, 3, 2)
    y, s = run_op("convolution", [x, w], padding=[1, 0, 2, 1], stride=[2, 1], dilation=[1, 2], group=2)
    assert s.lens == y.shape and y.dtype == np.float32
    np.testing.assert_allclose(y, naive_conv(x, w, [1, 0, 2, 1], [2, 1], [1, 2], 2), rtol=1e-4, atol=1e-4)


def test_convolution_int32_exact():
    x = RNG.integers(-128, 127, (1, 2, 5, 5)).astype(np.int32)
    w = RNG.integers(-128, 127, (3, 2, 3, 3)).astype(np.int32)
    y, _ = run_op("convolution", [x, w], padding=[1, 1, 1, 1])
    assert y.dtype == np.int32
    np.testing.assert_array_equal(y, naive_conv(x, w, [1, 1, 1, 1], [1, 1], [1, 1], 1).astype(np.int32))


def test_dot_batched_and_int64_exact():
    a, b = rand(2, 3, 4), rand(2, 4, 5)
    y, _ = run_op("dot", [a, b])
    np.testing.assert_allclose(y, a @ b, rtol=1e-5, atol=1e-5)
    ai = RNG.integers(-(2**40), 2**40, (3, 4)).astype(np.int64)
    bi = RNG.integers(-(2**10), 2**10, (4, 2)).astype(np.int64)
    np.testing.assert_array_equal(run_op("dot", [ai, bi])[0], ai @ bi)


def test_dot_fp16_accumulates_in_fp32():
    a, b = rand(8, 64, dtype=np.float16), rand(64, 8, dtype=np.float16)
    y, _ = run_op("dot", [a, b])
    assert y.dtype == np.float16
    np.testing.assert_array_equal(y, (a.astype(np.float32) @ b.astype(np.float32)).astype(np.float16))


def test_pooling_average_excludes_pads():
    x = rand(1, 1, 4, 4)
    y, _ = run_op("pooling", [x], mode="average", padding=[1, 1, 1, 1], stride=[2, 2], lengths=[3, 3])
    np.testing.assert_allclose(y[0, 0, 0, 0], x[0, 0, :2, :2].mean(), rtol=1e-6)


def test_pooling_max_bfloat16_pads_with_minus_infinity():
    import ml_dtypes

    x = (np.arange(16, dtype=np.float32) - 20).reshape(1, 1, 4, 4).astype(ml_dtypes.bfloat16)
    y, _ = run_op("pooling", [x], mode="max", padding=[1, 1, 1, 1], stride=[2, 2], lengths=[2, 2])
    assert y.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(y.astype(np.float32)[0, 0], [[-20, -18, -17], [-12, -10, -9], [-8, -6, -5]])


@pytest.mark.parametrize("dt", [np.float32, np.float16])
@pytest.mark.parametrize("attrs", [dict(kernel_shape=[3]), dict(kernel_shape=[3], strides=[2], pads=[1, 1])])
def test_max_pool_skips_nan_vs_ort(dt, attrs):
    # ORT's 1-d undilated float kernel skips NaN (its 2-d, dilated and double kernels each differ).
    x = rand(2, 3, 11, dtype=dt)
    x[0, 1, [2, 5, 6]] = x[1, 0, 0] = x[1, 2, 10] = np.nan
    check_node(helper.make_node("MaxPool", ["x"], ["y"], **attrs), {"x": x})


@pytest.mark.parametrize("dt", ["float32", "float64", "bfloat16", "float8_e4m3fn"])
def test_max_pool_nan_rule(dt):
    # NaN is skipped and pads never count: only a window of NaN gives NaN.
    import ml_dtypes

    nan = np.nan
    x = np.array([1, nan, 3, 2, nan, nan], np.float32).reshape(1, 1, 1, 6).astype(ml_dtypes.finfo(dt).dtype)
    y, _ = run_op("pooling", [x], mode="max", padding=[0, 1, 0, 1], lengths=[1, 2], dilations=[1, 1])
    np.testing.assert_array_equal(y.astype(np.float32).ravel(), [1, 1, 3, 3, 2, nan, nan])


CONV_CASES = [
    dict(group=2, pads=[1, 0, 2, 1], strides=[2, 1], dilations=[1, 2]),
    dict(group=1, auto_pad="SAME_UPPER", strides=[2, 3]),
    dict(group=2, auto_pad="SAME_LOWER", strides=[2, 2]),
    dict(group=1, auto_pad="VALID"),
]


@pytest.mark.parametrize("kw", CONV_CASES)
def test_conv_vs_ort(kw):
    x, b = rand(2, 4, 7, 9), rand(6)
    w = rand(6, 4 // kw["group"], 3, 2)
    check_node(
        helper.make_node("Conv", ["x", "w", "b"], ["y"], **kw), {"x": x, "w": w, "b": b}, rtol=1e-4, atol=1e-4
    )


def test_conv_1d_and_3d_vs_ort():
    check_node(
        helper.make_node("Conv", ["x", "w"], ["y"], pads=[2, 1], strides=[2]),
        {"x": rand(1, 3, 11), "w": rand(4, 3, 3)},
        rtol=1e-4,
        atol=1e-4,
    )
    check_node(
        helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 0, 1, 1, 0, 1]),
        {"x": rand(1, 2, 4, 5, 3), "w": rand(3, 2, 2, 3, 2)},
        rtol=1e-4,
        atol=1e-4,
    )


@pytest.mark.parametrize(
    "kw",
    [
        dict(),
        dict(strides=[2, 3], pads=[1, 0, 0, 1], output_padding=[1, 2], dilations=[1, 2], group=2),
        dict(strides=[2, 2], auto_pad="SAME_UPPER"),
        dict(strides=[2, 2], auto_pad="SAME_LOWER"),
        dict(strides=[2, 2], output_shape=[15, 18]),
        dict(strides=[3, 2], output_shape=[21, 17]),
        dict(strides=[2, 2], output_shape=[17, 19]),
    ],
)
def test_conv_transpose_vs_ort(kw):
    x, w, b = rand(2, 4, 7, 9), rand(4, 3, 4, 2), rand(6 if kw.get("group") == 2 else 3)
    check_node(
        helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], **kw),
        {"x": x, "w": w, "b": b},
        rtol=1e-4,
        atol=1e-4,
    )


POOL_CASES = [
    ("MaxPool", dict(kernel_shape=[3, 2])),
    ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1, pads=[1, 1, 1, 0], dilations=[1, 2])),
    ("MaxPool", dict(kernel_shape=[2, 2], auto_pad="SAME_UPPER", strides=[2, 2])),
    ("AveragePool", dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1, pads=[1, 1, 1, 0])),
    (
        "AveragePool",
        dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1, pads=[1, 1, 1, 0], count_include_pad=1),
    ),
    ("AveragePool", dict(kernel_shape=[3, 2], strides=[2, 2], auto_pad="SAME_LOWER", count_include_pad=1)),
    ("LpPool", dict(kernel_shape=[3, 2], strides=[2, 1], pads=[1, 1, 0, 0], p=3)),
    ("GlobalAveragePool", {}),
    ("GlobalMaxPool", {}),
    ("GlobalLpPool", dict(p=1)),
    ("LRN", dict(size=3, alpha=0.01, beta=0.7, bias=1.5)),
]


@pytest.mark.parametrize("op,kw", POOL_CASES)
def test_pool_vs_ort(op, kw):
    check_node(helper.make_node(op, ["x"], ["y"], **kw), {"x": rand(2, 3, 7, 9)}, rtol=1e-4, atol=1e-5)


def test_maxpool_fp16_and_int8_vs_ort():
    node = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], pads=[1, 1, 0, 0])
    check_node(node, {"x": rand(1, 2, 5, 5, dtype=np.float16)})
    check_node(node, {"x": RNG.integers(-128, 127, (1, 2, 5, 5)).astype(np.int8)})


@pytest.mark.parametrize(
    "sa,sb",
    [
        ((3, 4), (4, 5)),
        ((4,), (4, 5)),
        ((3, 4), (4,)),
        ((4,), (4,)),
        ((2, 1, 3, 4), (5, 4, 2)),
        ((2, 3, 4), (4,)),
    ],
)
@pytest.mark.parametrize("dt", [np.float32, np.float16, np.float64, np.int32, np.int64])
def test_matmul_vs_ort(sa, sb, dt):
    a, b = (RNG.standard_normal(sa) * 4).astype(dt), (RNG.standard_normal(sb) * 4).astype(dt)
    tol = 2e-3 if dt == np.float16 else 1e-5
    check_node(helper.make_node("MatMul", ["a", "b"], ["y"]), {"a": a, "b": b}, rtol=tol, atol=tol)


@pytest.mark.parametrize(
    "kw,cs",
    [
        ({}, (5,)),
        (dict(transA=1, transB=1, alpha=0.5, beta=2.0), (3, 1)),
        (dict(beta=0.0), (3, 5)),
        ({}, None),
        ({}, ()),
    ],
)
def test_gemm_vs_ort(kw, cs):
    ins = {
        "a": rand(*((4, 3) if kw.get("transA") else (3, 4))),
        "b": rand(*((5, 4) if kw.get("transB") else (4, 5))),
    }
    if cs is not None:
        ins["c"] = rand(*cs)
    check_node(helper.make_node("Gemm", list(ins), ["y"], **kw), ins, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "eq,shapes",
    [
        ("ij,jk->ik", [(3, 4), (4, 5)]),
        ("bij,bjk", [(2, 3, 4), (2, 4, 5)]),
        ("ii->i", [(3, 3)]),
        ("...ij->...ji", [(2, 3, 4)]),
        ("i,i", [(5,), (5,)]),
        ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 2)]),
    ],
)
def test_einsum_vs_ort(eq, shapes):
    ins = {f"x{i}": rand(*s) for i, s in enumerate(shapes)}
    check_node(helper.make_node("Einsum", list(ins), ["y"], equation=eq), ins, rtol=1e-4, atol=1e-4)


def test_einsum_int64_exact():
    ins = {
        "a": RNG.integers(-9, 9, (3, 4)).astype(np.int64),
        "b": RNG.integers(-9, 9, (4, 2)).astype(np.int64),
    }
    check_node(helper.make_node("Einsum", ["a", "b"], ["y"], equation="ij,jk->ik"), ins)


def refused(node: onnx.NodeProto, inputs: dict[str, np.ndarray]) -> str:
    with pytest.raises(ParseError) as e:
        run_ours(make_model(node, inputs), inputs)
    return str(e.value)


def test_unsupported_cases_refuse():
    x = rand(1, 2, 5, 5)
    xi = RNG.integers(-9, 9, (1, 2, 5, 5)).astype(np.int8)
    assert "Indices" in refused(
        helper.make_node("MaxPool", ["x"], ["y", "i"], kernel_shape=[2, 2]), {"x": xi}
    )
    assert "pads" in refused(
        helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[2, 2], pads=[2, 0, 0, 0]), {"x": x}
    )
    assert "integer Gemm" in refused(
        helper.make_node("Gemm", ["a", "b"], ["y"], alpha=2.0),
        {"a": np.ones((2, 2), np.int32), "b": np.ones((2, 2), np.int32)},
    )

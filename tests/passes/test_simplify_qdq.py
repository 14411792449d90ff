"""simplify_qdq: which dequantised dot/convolution operands become quant_dot/quant_convolution, and that
the rewritten module gives the dequantise-first numbers (up to the float rounding of the scaling)."""

from __future__ import annotations

import collections

import numpy as np
import pytest
from passcheck import Build, run_twice

from migraphx_ep.ir.evaluate import run_module
from migraphx_ep.ir.instruction import Instruction
from migraphx_ep.passes import DEAD_CODE_ELIMINATION as DCE
from migraphx_ep.passes import ELIMINATE_COMMON_SUBEXPRESSION
from migraphx_ep.passes.simplify_qdq import SIMPLIFY_QDQ

RNG = np.random.default_rng(7)
X = (2, 3, 6, 6)
W = (4, 3, 3, 3)


def scalar(b: Build, value: object, dtype: type, lens: tuple[int, ...]) -> Instruction:
    return b("multibroadcast", b.lit(value, dtype), out_lens=list(lens))


def per_axis(b: Build, values: np.ndarray, axis: int, lens: tuple[int, ...]) -> Instruction:
    return b("broadcast", b.lit(values), axis=axis, out_lens=list(lens))


def quantised_data(
    b: Build, zero: int, dtype: type = np.uint8, lens: tuple[int, ...] = X, name: str = "x"
) -> Instruction:
    """dq(q(x)) of a float parameter: ORT's QDQ pair, one scale and zero point."""
    x = b.param(name, list(lens))
    s, z = scalar(b, 0.05, np.float32, lens), scalar(b, zero, dtype, lens)
    return b("dequantizelinear", b("quantizelinear", x, s, z), s, z)


def quantised_weight(b: Build, lens: tuple[int, ...], axis: int | None, zero: int = 0) -> Instruction:
    """dq of a constant int8 weight, one scale, or one per index of ``axis``."""
    q = b.lit(RNG.integers(-127, 128, lens), np.int8)
    if axis is None:
        s = scalar(b, 0.02, np.float32, lens)
    else:
        s = per_axis(b, RNG.uniform(0.01, 0.03, lens[axis]).astype(np.float32), axis, lens)
    return b("dequantizelinear", q, s, *([scalar(b, zero, np.int8, lens)] if zero else []))


def check_rewrite(b: Build, feeds: dict[str, np.ndarray], quant: str) -> None:
    want = run_module(b.m, feeds)[0]
    run_twice([SIMPLIFY_QDQ, DCE], b.m)
    ops = collections.Counter(i.name for i in b.m.instructions)
    assert ops[quant] == 1 and ops[quant.removeprefix("quant_")] == 0
    got = run_module(b.m, feeds)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))


def x_feed(lens: tuple[int, ...] = X) -> dict[str, np.ndarray]:
    return {"x": RNG.uniform(-6, 6, lens).astype(np.float32)}  # past the uint8 range: clipped values too


@pytest.mark.parametrize("pad", [0, 1])
@pytest.mark.parametrize("axis", [None, 0], ids=["per_tensor", "per_channel"])
def test_uint8_data_convolution_with_zero_point(pad: int, axis: int | None) -> None:
    # ORT's default: uint8 activations with a zero point, int8 weights; with padding the border windows
    # read fewer weights, so the zero point's share differs per output position.
    b = Build()
    y = b(
        "convolution", quantised_data(b, 131), quantised_weight(b, W, axis), padding=[pad] * 4, stride=[2, 1]
    )
    b.ret(y)
    check_rewrite(b, x_feed(), "quant_convolution")
    q = [i for i in b.m.instructions if i.name == "quantizelinear"]
    assert [i.shape.type.name for i in q] == ["int8_type"]  # the uint8 quantise is rebuilt as int8


def test_uint8_value_read_twice_becomes_one_int8_twin() -> None:
    # A ResNet block's input: quantised once, dequantised for the convolution and for the residual add.
    # Both readers move to the int8 twin, so the uint8 quantise dies instead of being computed twice.
    b = Build()
    x = b.param("x", list(X))
    s, z = scalar(b, 0.05, np.float32, X), scalar(b, 131, np.uint8, X)
    q = b("quantizelinear", x, s, z)
    conv = b("convolution", b("dequantizelinear", q, s, z), quantised_weight(b, (3, 3, 1, 1), None))
    b.ret(b("add", conv, b("dequantizelinear", q, s, z)))
    feeds = x_feed()
    want = run_module(b.m, feeds)[0]
    run_twice([SIMPLIFY_QDQ, ELIMINATE_COMMON_SUBEXPRESSION, DCE], b.m)
    q = [i for i in b.m.instructions if i.name == "quantizelinear"]
    assert [i.shape.type.name for i in q] == ["int8_type"]
    assert sum(i.name == "quant_convolution" for i in b.m.instructions) == 1
    np.testing.assert_allclose(run_module(b.m, feeds)[0], want, rtol=1e-5, atol=1e-5)


def test_uint8_parameter_is_shifted_by_a_conversion() -> None:
    b = Build()
    q = b.param("q", [5, 6], np.uint8)
    a = b("dequantizelinear", q, scalar(b, 0.1, np.float32, (5, 6)), scalar(b, 200, np.uint8, (5, 6)))
    b.ret(b("dot", a, quantised_weight(b, (6, 3), 1)))
    feeds = {"q": RNG.integers(0, 256, (5, 6)).astype(np.uint8)}
    feeds["q"].flat[:2] = [0, 255]
    check_rewrite(b, feeds, "quant_dot")


@pytest.mark.parametrize("where", ["before", "after"])
def test_batched_dot_with_int8_zero_point_and_per_column_scales(where: str) -> None:
    # ONNX MatMul of [B, M, K] by a [K, N] weight: the parser broadcasts the weight over B, after its
    # dequantise (BERT's QDQ GEMMs) or, once other passes moved it, before.
    b = Build()
    lens, wlens = (2, 5, 6), (2, 6, 3)
    q = b.lit(RNG.integers(-127, 128, (6, 3)), np.int8)
    scales = RNG.uniform(0.01, 0.03, 3).astype(np.float32)
    if where == "before":
        q = b("multibroadcast", q, out_lens=list(wlens))
        w = b("dequantizelinear", q, per_axis(b, scales, 2, wlens))
    else:
        w = b(
            "multibroadcast", b("dequantizelinear", q, per_axis(b, scales, 1, (6, 3))), out_lens=list(wlens)
        )
    b.ret(b("dot", quantised_data(b, -9, np.int8, lens), w))
    check_rewrite(b, x_feed(lens), "quant_dot")


def test_symmetric_activations_need_no_constant_weight() -> None:
    # Attention's Q @ K^T in a QDQ model: both operands activations, zero points zero.
    b = Build()
    lens = (2, 4, 4)
    b.ret(b("dot", quantised_data(b, 0, np.int8, lens), quantised_data(b, 0, np.int8, lens, "k")))
    check_rewrite(b, {**x_feed(lens), "k": RNG.uniform(-6, 6, lens).astype(np.float32)}, "quant_dot")


def refused(b: Build) -> bool:
    before = b.m.structure()
    return not SIMPLIFY_QDQ.apply(b.m) and b.m.structure() == before


def test_weight_scales_along_the_reduced_axis_stay_float() -> None:
    b = Build()
    b.ret(b("dot", quantised_data(b, 0, np.int8, (5, 6)), quantised_weight(b, (6, 3), 0)))
    assert refused(b)


def test_weight_zero_point_stays_float() -> None:
    b = Build()
    b.ret(b("convolution", quantised_data(b, 5, np.int8), quantised_weight(b, W, None, zero=3)))
    assert refused(b)


def test_per_axis_data_scale_stays_float() -> None:
    b = Build()
    x = b.param("x", list(X))
    s = per_axis(b, np.array([0.1, 0.2, 0.3], np.float32), 1, X)
    a = b("dequantizelinear", b("quantizelinear", x, s, scalar(b, 0, np.int8, X)), s)
    b.ret(b("convolution", a, quantised_weight(b, W, None)))
    assert refused(b)


def test_data_zero_point_with_a_computed_weight_stays_float() -> None:
    # The zero point's share is a sum of the weights: a constant only when the weight is one.
    b = Build()
    lens = (2, 4, 4)
    b.ret(b("dot", quantised_data(b, 10, np.int8, lens), quantised_data(b, 0, np.int8, lens, "k")))
    assert refused(b)

"""quantizelinear / dequantizelinear / dynamicquantizelinear and the integer/QLinear parsers vs ORT CPU."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from onnx import helper

from migraphx_ep.frontend import ParseError
from migraphx_ep.ir.dtypes import from_numpy
from migraphx_ep.ir.operation import make_op
from migraphx_ep.ir.shape import Shape
from opcheck import check_node, make_model, run_ours

RNG = np.random.default_rng(11)


def run_op(name: str, args: list[np.ndarray], **attrs):
    op = make_op(name, **attrs)
    out = op.compute_shape([Shape(from_numpy(a.dtype), a.shape) for a in args])
    return op.compute(out, args)


def test_quantize_rounds_half_to_even_and_saturates():
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, 300.0, -300.0, 2.4999], np.float32)
    s = np.ones_like(x)
    zp = np.full(x.shape, 3, np.uint8)
    np.testing.assert_array_equal(run_op("quantizelinear", [x, s, zp]), [3, 5, 5, 3, 1, 255, 0, 5])
    np.testing.assert_array_equal(
        run_op("quantizelinear", [x, s], out_type=5), [0, 2, 2, 0, -2, 127, -128, 2]
    )


def test_quantize_fp8_saturate():
    x = np.array([1000.0, -1000.0, 1.0], np.float32)
    y = run_op("quantizelinear", [x, np.ones_like(x)], out_type=13, saturate=True)
    assert y.dtype == ml_dtypes.float8_e4m3fn
    np.testing.assert_array_equal(y.astype(np.float32), [448, -448, 1])


def test_dequantize_int_exact():
    x = np.array([0, 255, 128], np.uint8)
    y = run_op("dequantizelinear", [x, np.full(3, 0.5, np.float32), np.full(3, 128, np.uint8)])
    np.testing.assert_array_equal(y, [-64.0, 63.5, 0.0])


@pytest.mark.parametrize("zp_type", [np.uint8, np.int8, np.int16, np.uint16])
def test_quantizelinear_per_tensor_vs_ort(zp_type):
    x = (RNG.standard_normal((3, 4)) * 50).astype(np.float32)
    ins = {"x": x, "s": np.array(0.37, np.float32), "zp": np.array(3, zp_type)}
    check_node(helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["y"]), ins)


def test_quantizelinear_per_axis_and_blocked_vs_ort():
    x = (RNG.standard_normal((3, 5)) * 20).astype(np.float32)
    ins = {"x": x, "s": np.array([0.2, 0.5, 1.1], np.float32), "zp": np.array([1, 120, 250], np.uint8)}
    check_node(helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["y"], axis=0), ins)
    blk = {
        "x": x,
        "s": (RNG.random((3, 3)) + 0.1).astype(np.float32),
        "zp": RNG.integers(-5, 5, (3, 3)).astype(np.int8),
    }
    check_node(helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["y"], axis=1, block_size=2), blk)


def test_dequantizelinear_vs_ort():
    x = RNG.integers(-128, 127, (2, 3, 4)).astype(np.int8)
    check_node(
        helper.make_node("DequantizeLinear", ["x", "s", "zp"], ["y"], axis=1),
        {"x": x, "s": np.array([0.1, 0.2, 0.3], np.float32), "zp": np.array([1, -2, 3], np.int8)},
    )
    check_node(
        helper.make_node("DequantizeLinear", ["x", "s"], ["y"]),
        {"x": RNG.integers(-1000, 1000, (5,)).astype(np.int32), "s": np.array(0.25, np.float32)},
    )


def test_dynamicquantizelinear_vs_ort():
    x = (RNG.standard_normal((3, 4)) * 3).astype(np.float32)
    check_node(helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "s", "zp"]), {"x": x})


def test_matmulinteger_and_convinteger_vs_ort():
    a = RNG.integers(0, 255, (2, 3, 4)).astype(np.uint8)
    b = RNG.integers(-128, 127, (4, 5)).astype(np.int8)
    check_node(
        helper.make_node("MatMulInteger", ["a", "b", "az", "bz"], ["y"]),
        {"a": a, "b": b, "az": np.array(7, np.uint8), "bz": np.array(-3, np.int8)},
    )
    x = RNG.integers(0, 255, (1, 2, 5, 5)).astype(np.uint8)
    w = RNG.integers(0, 255, (3, 2, 3, 3)).astype(np.uint8)
    check_node(
        helper.make_node("ConvInteger", ["x", "w", "xz"], ["y"], pads=[1, 1, 1, 1]),
        {"x": x, "w": w, "xz": np.array(100, np.uint8)},
    )


def test_qlinearmatmul_and_qlinearconv_vs_ort():
    a = RNG.integers(0, 255, (3, 4)).astype(np.uint8)
    b = RNG.integers(0, 255, (4, 2)).astype(np.uint8)
    f = lambda v: np.array(v, np.float32)  # noqa: E731
    u = lambda v: np.array(v, np.uint8)  # noqa: E731
    check_node(
        helper.make_node("QLinearMatMul", ["a", "as", "az", "b", "bs", "bz", "ys", "yz"], ["y"]),
        {
            "a": a,
            "as": f(0.02),
            "az": u(120),
            "b": b,
            "bs": f(0.03),
            "bz": u(130),
            "ys": f(0.05),
            "yz": u(128),
        },
    )
    x = RNG.integers(0, 255, (1, 2, 5, 5)).astype(np.uint8)
    w = RNG.integers(-128, 127, (3, 2, 3, 3)).astype(np.int8)
    ins = {
        "x": x,
        "xs": f(0.02),
        "xz": u(100),
        "w": w,
        "ws": np.array([0.01, 0.02, 0.03], np.float32),
        "wz": np.zeros(3, np.int8),
        "ys": f(0.3),
        "yz": u(120),
        "b": RNG.integers(-500, 500, (3,)).astype(np.int32),
    }
    check_node(helper.make_node("QLinearConv", list(ins), ["y"], pads=[1, 1, 1, 1]), ins)


def test_refusals():
    x = np.ones((2, 2), np.float32)
    ins = {"x": x, "s": np.array(1.0, np.float32), "zp": np.array(0, ml_dtypes.float8_e4m3fn)}
    with pytest.raises(ParseError, match="float8 zero point"):
        run_ours(make_model(helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["y"]), ins), ins)
    ins2 = {"a": np.ones((2, 2), np.uint8), "b": np.ones((2, 2), np.uint8), "az": np.ones(2, np.uint8)}
    with pytest.raises(ParseError, match="per-row"):
        run_ours(make_model(helper.make_node("MatMulInteger", ["a", "b", "az"], ["y"]), ins2), ins2)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_qlinearmatmul_float16_scales_vs_ort(dtype):
    # large enough that ORT's float32 requantisation and a float16 one would round some outputs apart
    info = np.iinfo(dtype)
    ins = {
        "a": RNG.integers(info.min, info.max, (16, 24)).astype(dtype),
        "b": RNG.integers(info.min, info.max, (24, 16)).astype(dtype),
    }
    inits = {
        "as": np.array(0.031, np.float16),
        "az": np.array(3, dtype),
        "bs": np.array(0.017, np.float16),
        "bz": np.array(-2 if dtype == np.int8 else 120, dtype),
        "ys": np.array(0.9, np.float16),
        "yz": np.array(5, dtype),
    }
    node = helper.make_node("QLinearMatMul", ["a", "as", "az", "b", "bs", "bz", "ys", "yz"], ["y"])
    check_node(node, ins, opset=21, initializers=inits)

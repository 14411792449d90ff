"""Quantisation: fp16 (half arithmetic, exact boundaries), int8 (calibrated scales), fp8 autocast."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from migraphx_ep import ops  # noqa: F401 - fills the op table
from migraphx_ep.ir import DType, Program, Shape, make_op
from migraphx_ep.quantize import QuantizeError, autocast_fp8, quantize_fp16, quantize_int8
from migraphx_ep.targets import get_target

RNG = np.random.default_rng(11)
F32 = DType.float_type


def fp16_program() -> tuple[Program, np.ndarray]:
    """z = exp((x + y) * w), with an int64 side computation that fp16 must leave alone."""
    p = Program()
    m = p.get_main_module()
    x = m.add_parameter("x", Shape(F32, [3, 4]))
    y = m.add_parameter("y", Shape(F32, [3, 4]))
    k = m.add_parameter("k", Shape(DType.int64_type, [3, 4]))
    wv = RNG.uniform(-1, 1, (3, 4)).astype(np.float32)
    w = m.add_literal(wv)
    a = m.add_instruction(make_op("add"), [x, y])
    b = m.add_instruction(make_op("mul"), [a, w])
    z = m.add_instruction(make_op("exp"), [b])
    kk = m.add_instruction(make_op("add"), [k, k])
    m.add_return([z, kk, a])
    return p, wv


def names(p: Program) -> list[str]:
    return [i.name for i in p.get_main_module().instructions]


def test_fp16_computes_in_half_and_keeps_io_types():
    p, wv = fp16_program()
    quantize_fp16(p)
    m = p.get_main_module()
    m.validate()
    assert p.get_parameter_shapes()["x"].type == F32
    assert [s.type for s in p.get_output_shapes()] == [F32, DType.int64_type, F32]
    by = {i.name: i for i in m.instructions if i.name in ("mul", "exp")}
    assert by["mul"].shape.type == DType.half_type and by["exp"].shape.type == DType.half_type
    # x and y in, z and a out: four converts; none reads another convert (pairs cancelled).
    converts = [i for i in m.instructions if i.name == "convert"]
    assert len(converts) == 4
    assert not any(c.inputs[0].name == "convert" for c in converts)
    assert all(i.shape.type == DType.half_type for i in m.instructions if i.is_literal())
    x = RNG.uniform(-1, 1, (3, 4)).astype(np.float32)
    y = RNG.uniform(-1, 1, (3, 4)).astype(np.float32)
    k = RNG.integers(-5, 5, (3, 4))
    z, kk, a = p.run_numpy({"x": x, "y": y, "k": k})
    ah = x.astype(np.float16) + y.astype(np.float16)
    want = np.exp(ah * wv.astype(np.float16)).astype(np.float32)
    np.testing.assert_array_equal(z, want)
    np.testing.assert_array_equal(a, ah.astype(np.float32))
    np.testing.assert_array_equal(kk, k + k)
    assert z.dtype == np.float32 and kk.dtype == np.int64
    np.testing.assert_allclose(z, np.exp((x + y) * wv), rtol=1e-2)  # close to the float32 answer


def test_fp16_selected_ops_only():
    p, _ = fp16_program()
    quantize_fp16(p, ["mul"])
    types = {i.name: i.shape.type for i in p.get_main_module().instructions if not i.is_param()}
    assert types["mul"] == DType.half_type and types["exp"] == F32
    assert names(p).count("convert") == 2  # a into half, the product back (w became a half literal)


def test_fp16_idempotent_and_refuses_compiled():
    p, _ = fp16_program()
    quantize_fp16(p)
    before = str(p)
    quantize_fp16(p)
    assert str(p) == before  # nothing float32 left to convert
    q, _ = fp16_program()
    q.compile(get_target("ref"))
    with pytest.raises(QuantizeError, match="already compiled"):
        quantize_fp16(q)


def dot_program(wv: np.ndarray) -> Program:
    p = Program()
    m = p.get_main_module()
    x = m.add_parameter("x", Shape(F32, [4, 8]))
    w = m.add_literal(wv)
    d = m.add_instruction(make_op("dot"), [x, w])
    m.add_return([m.add_instruction(make_op("relu"), [d])])
    return p


def fake_quant(v: np.ndarray, scale: np.float32) -> np.ndarray:
    q = np.clip(np.rint(v / scale), -128, 127)
    return (q.astype(np.float32) * scale).astype(np.float32)


def test_int8_uses_calibration_data():
    wv = RNG.uniform(-2, 2, (8, 5)).astype(np.float32)
    cal = [{"x": RNG.uniform(-3, 3, (4, 8)).astype(np.float32)} for _ in range(3)]
    p = dot_program(wv)
    quantize_int8(p, get_target("ref"), cal)
    m = p.get_main_module()
    m.validate()
    assert names(p).count("quantizelinear") == 2 and names(p).count("dequantizelinear") == 2
    sx = np.float32(max(np.abs(c["x"]).max() for c in cal) / 127.0)
    sw = np.float32(np.abs(wv).max() / 127.0)
    scales = sorted(
        float(i.op.value)
        for i in m.instructions
        if i.is_literal() and i.shape.type == F32 and i.shape.elements() == 1
    )
    assert scales == sorted([float(sx), float(sw)])
    x = RNG.uniform(-3, 3, (4, 8)).astype(np.float32)
    got = p.run_numpy({"x": x})[0]
    want = np.maximum(fake_quant(x, sx) @ fake_quant(wv, sw), 0)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    exact = np.maximum(x @ wv, 0)
    assert not np.array_equal(got, exact)
    np.testing.assert_allclose(got, exact, atol=0.2)
    # Other calibration data, other scale.
    q = dot_program(wv)
    quantize_int8(q, None, [{"x": c["x"] * 0.5} for c in cal])
    q_scales = sorted(
        float(i.op.value)
        for i in q.get_main_module().instructions
        if i.is_literal() and i.shape.type == F32 and i.shape.elements() == 1
    )
    assert q_scales == sorted([float(np.float32(sx * 0.5)), float(sw)])


def test_int8_without_calibration_is_deterministic():
    wv = RNG.uniform(-2, 2, (8, 5)).astype(np.float32)
    a, b = dot_program(wv), dot_program(wv)
    quantize_int8(a, get_target("ref"))
    quantize_int8(b, get_target("ref"), [])
    assert a == b and "quantizelinear" in names(a)


def test_int8_only_named_ops_and_float_inputs():
    p = Program()
    m = p.get_main_module()
    x = m.add_parameter("x", Shape(DType.int32_type, [2, 2]))
    m.add_return([m.add_instruction(make_op("dot"), [x, x])])
    quantize_int8(p, None, [{"x": np.ones((2, 2), np.int32)}])
    assert "quantizelinear" not in names(p)
    wv = RNG.uniform(-2, 2, (8, 5)).astype(np.float32)
    q = dot_program(wv)
    quantize_int8(q, None, [{"x": np.ones((4, 8), np.float32)}], ins_names=["convolution"])
    assert "quantizelinear" not in names(q)
    with pytest.raises(RuntimeError, match="missing input"):
        quantize_int8(dot_program(wv), None, [{"y": np.ones((4, 8), np.float32)}])


def test_autocast_fp8_parameters_and_outputs():
    p = Program()
    m = p.get_main_module()
    a = m.add_parameter("a", Shape(F32, [3]))
    b = m.add_parameter("b", Shape(DType.fp8e4m3fn_type, [3]))
    c = m.add_parameter("c", Shape(DType.fp8e4m3fn_type, [3]))
    s = m.add_instruction(make_op("add"), [b, c])
    m.add_return([a, s])
    autocast_fp8(p)
    m.validate()
    assert p.get_parameter_names() == ["a", "b", "c"]  # order kept
    assert all(t.type == F32 for t in p.get_parameter_shapes().values())
    assert [t.type for t in p.get_output_shapes()] == [F32, F32]
    bv = np.array([0.3, -1.7, 100.0], np.float32)
    cv = np.array([0.1, 2.2, -3.0], np.float32)
    _, got = p.run_numpy({"a": bv, "b": bv, "c": cv})
    f8 = ml_dtypes.float8_e4m3fn
    want = (bv.astype(f8) + cv.astype(f8)).astype(np.float32)
    np.testing.assert_array_equal(got, want)
    before = str(p)
    autocast_fp8(p)
    assert str(p) == before

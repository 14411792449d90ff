"""Elementwise ops: numpy meaning per op, and one-node ONNX models vs ORT's CPU EP."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto, helper

from migraphx_ep.frontend import ParseError, model_to_dict, parse_graph
from migraphx_ep.ir import DType, Shape, make_op
from migraphx_ep.ir.dtypes import from_numpy
from opcheck import check_node, make_model

RNG = np.random.default_rng(7)
A = RNG.standard_normal((3, 4)).astype(np.float32)
B = RNG.standard_normal((3, 4)).astype(np.float32)
IA = RNG.integers(-9, 10, (3, 4)).astype(np.int64)
IB = RNG.integers(-4, 5, (3, 4)).astype(np.int64)
IB[IB == 0] = 3
BA = RNG.integers(0, 2, (3, 4)).astype(bool)
BB = RNG.integers(0, 2, (3, 4)).astype(bool)


def run_op(name: str, *args: np.ndarray, **attrs) -> np.ndarray:
    op = make_op(name, **attrs)
    out = op.compute_shape([Shape(from_numpy(a.dtype), a.shape) for a in args])
    return op.compute(out, list(args))


def refuses(node, inputs: dict, **kw) -> str:
    d = model_to_dict(make_model(node, inputs, **kw))
    with pytest.raises(ParseError) as e:
        parse_graph(d, {k: Shape(from_numpy(v.dtype), v.shape) for k, v in inputs.items()})
    return str(e.value)


# -- op level: numpy semantics ------------------------------------------------------------------------
def test_div_truncates_integers():
    a = np.array([7, -7, 7, -7, 0], np.int32)
    b = np.array([2, 2, -2, -2, 5], np.int32)
    np.testing.assert_array_equal(run_op("div", a, b), [3, -3, -3, 3, 0])
    assert run_op("div", a, b).dtype == np.int32


def test_mod_and_fmod_signs():
    a = np.array([7, -7, 7, -7], np.int64)
    b = np.array([3, 3, -3, -3], np.int64)
    np.testing.assert_array_equal(run_op("mod", a, b), [1, 2, -2, -1])  # sign of divisor
    np.testing.assert_array_equal(run_op("fmod", a, b), [1, -1, 1, -1])  # sign of dividend


@pytest.mark.parametrize("dt", [np.int32, np.uint8, np.int64])
@pytest.mark.parametrize("op,what", [("div", "division"), ("mod", "modulo"), ("fmod", "modulo")])
def test_integer_zero_divisor_raises(op, what, dt):
    a, b = np.array([5, 3, 7], dt), np.array([1, 0, 2], dt)
    with pytest.raises(ZeroDivisionError, match=f"^{op}: integer {what} by zero$"):
        run_op(op, a, b)
    run_op(op, a.astype(np.float32), b.astype(np.float32))  # floats give inf/nan, as IEEE says


@pytest.mark.parametrize("node", [helper.make_node("Div", ["a", "b"], ["y"]),
                                  helper.make_node("Mod", ["a", "b"], ["y"], fmod=1)])  # fmt: skip
def test_integer_zero_divisor_fails_the_run_through_ort(node):
    # ORT's CPU EP fails the Run ("Integer division by zero"); the EP on the ref target does too, with
    # its own message (so this cannot pass by falling back to the CPU EP), and the session survives.
    import onnxruntime as ort

    a, b = IA.astype(np.int32), IB.astype(np.int32)
    model = make_model(node, {"a": a, "b": b}).SerializeToString()
    with pytest.raises(Exception, match="by zero"):
        ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(
            None, {"a": a, "b": np.zeros_like(b)}
        )
    ep = ("MIGraphXExecutionProvider", {"migraphx_target": "ref"})
    s = ort.InferenceSession(model, providers=[ep, "CPUExecutionProvider"])
    bz = b.copy()
    bz[1, 2] = 0
    with pytest.raises(Exception, match=rf"ZeroDivisionError.*{node.op_type.lower()}: integer .* by zero"):
        s.run(None, {"a": a, "b": bz})
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"a": a, "b": b})
    np.testing.assert_array_equal(s.run(None, {"a": a, "b": b})[0], want[0])


def test_constant_zero_divisor_is_left_for_run_time():
    # Constant folding must not fail the compile (or fold a wrong 0): the Run reports it.
    from opcheck import run_ours

    node = helper.make_node("Div", ["a", "b"], ["y"])
    consts = {"a": IA[0], "b": np.array([2, 0, 1, 3], np.int64)}
    with pytest.raises(ZeroDivisionError, match="div: integer division by zero"):
        run_ours(make_model(node, {}, initializers=consts), {})


def test_round_half_to_even_and_erf():
    x = np.array([0.5, 1.5, 2.5, -0.5, -2.5, 2.4], np.float32)
    np.testing.assert_array_equal(run_op("nearbyint", x), [0, 2, 2, -0.0, -2, 2])
    np.testing.assert_allclose(run_op("erf", A), np.vectorize(math.erf)(A.astype(np.float64)), rtol=1e-6)


def test_shifts_follow_onnx28():
    a = np.array([-8, 8, 1, -1], np.int8)
    b = np.array([1, 1, 9, -1], np.int8)
    np.testing.assert_array_equal(run_op("shift_right", a, b), [-4, 4, 0, -1])
    np.testing.assert_array_equal(run_op("shift_left", a, b), [-16, 16, 0, 0])


def test_maxmin_propagate_nan_and_half_in_float32():
    x = np.array([1, np.nan, 3], np.float32)
    y = np.array([np.nan, 2, 1], np.float32)
    assert np.isnan(run_op("max", x, y)[:2]).all() and run_op("min", x, y)[2] == 1
    h = np.array([0.1, 0.2], np.float16)
    np.testing.assert_array_equal(run_op("exp", h), np.exp(h.astype(np.float32)).astype(np.float16))
    bf = np.array([1.5, -2], ml_dtypes.bfloat16)
    assert run_op("sigmoid", bf).dtype == ml_dtypes.bfloat16


def test_where_clip_and_attr_activations():
    c = A > 0
    np.testing.assert_array_equal(run_op("where", c, A, B), np.where(c, A, B))
    lo, hi = np.full_like(A, -0.5), np.full_like(A, 0.5)
    np.testing.assert_array_equal(run_op("clip", A, lo, hi), np.clip(A, -0.5, 0.5))
    np.testing.assert_allclose(run_op("leaky_relu", A, alpha=0.1), np.where(A >= 0, A, np.float32(0.1) * A))
    big = np.array([-200, 0, 200], np.float32)
    np.testing.assert_allclose(run_op("softplus", big), [0, math.log(2), 200])  # no overflow
    # The op's ``cpp`` is its device meaning; the gpu generator formats it with attributes as literals.
    from migraphx_ep.targets.gpu.kernels.pointwise import _expr

    assert (
        _expr(make_op("leaky_relu", alpha=0.5), ["x"], [DType.float_type])
        == "(x >= 0 ? x : 0x1.0000000000000p-1f * x)"
    )


# -- vs ORT -------------------------------------------------------------------------------------------
UNARY_F32 = [
    "Abs",
    "Acos",
    "Asin",
    "Atan",
    "Ceil",
    "Cos",
    "Cosh",
    "Erf",
    "Exp",
    "Floor",
    "IsNaN",
    "Neg",
    "Reciprocal",
    "Relu",
    "Round",
    "Sigmoid",
    "Sign",
    "Sin",
    "Sinh",
    "Softplus",
    "Softsign",
    "Tan",
    "Tanh",
    "Asinh",
    "Mish",
    "HardSwish",
]


@pytest.mark.parametrize("op", UNARY_F32)
def test_unary_float32_vs_ort(op):
    x = np.clip(A, -0.9, 0.9) if op in ("Acos", "Asin") else A * 2
    check_node(helper.make_node(op, ["x"], ["y"]), {"x": x}, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op", ["Log", "Sqrt", "Acosh", "Atanh"])
def test_unary_domain_restricted_vs_ort(op):
    x = np.abs(A) + 1 if op == "Acosh" else (np.abs(A) % 1 if op == "Atanh" else np.abs(A) + 0.1)
    check_node(helper.make_node(op, ["x"], ["y"]), {"x": x.astype(np.float32)})


@pytest.mark.parametrize(
    ("op", "attrs"),
    [
        ("LeakyRelu", {"alpha": 0.2}),
        ("Elu", {"alpha": 0.7}),
        ("Selu", {}),
        ("Celu", {"alpha": 1.5}),
        ("ThresholdedRelu", {"alpha": 0.3}),
        ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}),
        ("Shrink", {"lambd": 0.4, "bias": 0.1}),
    ],
)
def test_attr_activations_vs_ort(op, attrs):
    check_node(helper.make_node(op, ["x"], ["y"], **attrs), {"x": A * 2})


@pytest.mark.parametrize("approx", ["none", "tanh"])
def test_gelu_vs_ort(approx):
    check_node(helper.make_node("Gelu", ["x"], ["y"], approximate=approx), {"x": A * 3}, opset=20)


@pytest.mark.parametrize(
    "op",
    ["Add", "Sub", "Mul", "Div", "Max", "Min", "Equal", "Greater", "Less", "GreaterOrEqual", "LessOrEqual"],
)
@pytest.mark.parametrize("dt", [np.float32, np.int32, np.int64])
def test_binary_broadcast_vs_ort(op, dt):
    a = (A * 5).astype(dt) if dt != np.float32 else A
    b = (B[0] * 5).astype(dt) if dt != np.float32 else B[0]
    if op == "Div" and dt != np.float32:
        b[b == 0] = 3
    check_node(helper.make_node(op, ["a", "b"], ["y"]), {"a": a, "b": b})


def test_float16_arithmetic_vs_ort():
    h, k = A.astype(np.float16), B.astype(np.float16)
    for op in ("Add", "Mul", "Sub", "Div"):
        check_node(helper.make_node(op, ["a", "b"], ["y"]), {"a": h, "b": k}, rtol=1e-3, atol=1e-3)
    for op in ("Relu", "Abs", "Neg", "Sigmoid", "Exp"):
        check_node(helper.make_node(op, ["a"], ["y"]), {"a": h}, rtol=1e-3, atol=1e-3)


def test_integer_ops_vs_ort():
    check_node(helper.make_node("Mod", ["a", "b"], ["y"]), {"a": IA, "b": IB})
    check_node(helper.make_node("Mod", ["a", "b"], ["y"], fmod=1), {"a": IA, "b": IB})
    check_node(helper.make_node("Mod", ["a", "b"], ["y"], fmod=1), {"a": A, "b": B})
    check_node(helper.make_node("Pow", ["a", "b"], ["y"]), {"a": IA, "b": np.abs(IB)})
    check_node(helper.make_node("Pow", ["a", "b"], ["y"]), {"a": np.abs(A), "b": IB})  # mixed types
    check_node(helper.make_node("Abs", ["a"], ["y"]), {"a": IA.astype(np.int32)})
    check_node(helper.make_node("Sign", ["a"], ["y"]), {"a": IA})
    check_node(helper.make_node("Neg", ["a"], ["y"]), {"a": IA.astype(np.int32)})
    u = RNG.integers(0, 255, (3, 4)).astype(np.uint8)
    s = RNG.integers(0, 8, (3, 4)).astype(np.uint8)
    for d in ("LEFT", "RIGHT"):
        check_node(helper.make_node("BitShift", ["a", "b"], ["y"], direction=d), {"a": u, "b": s})
    for op in ("BitwiseAnd", "BitwiseOr", "BitwiseXor"):
        i32 = {"a": IA.astype(np.int32), "b": IB.astype(np.int32)}
        check_node(helper.make_node(op, ["a", "b"], ["y"]), i32)
    check_node(helper.make_node("BitwiseNot", ["a"], ["y"]), {"a": u})


def test_bool_ops_vs_ort():
    for op in ("And", "Or", "Xor", "Equal"):
        check_node(helper.make_node(op, ["a", "b"], ["y"]), {"a": BA, "b": BB})
    check_node(helper.make_node("Not", ["a"], ["y"]), {"a": BA})
    check_node(helper.make_node("Where", ["c", "a", "b"], ["y"]), {"c": BA, "a": IA, "b": IB[:1]})
    check_node(helper.make_node("Where", ["c", "a", "b"], ["y"]), {"c": BA[0], "a": A, "b": B})


def test_variadic_vs_ort():
    c = RNG.standard_normal(4).astype(np.float32)
    for op in ("Max", "Min", "Sum", "Mean"):
        check_node(helper.make_node(op, ["a", "b", "c"], ["y"]), {"a": A, "b": B, "c": c})
        check_node(helper.make_node(op, ["a"], ["y"]), {"a": A})


def test_clip_prelu_isinf_vs_ort():
    x = np.array([-np.inf, -2, np.nan, 0.5, 3, np.inf], np.float32)
    check_node(helper.make_node("Clip", ["x"], ["y"]), {"x": x})  # +-inf clamp to +-FLT_MAX
    check_node(
        helper.make_node("Clip", ["x", "lo", "hi"], ["y"]),
        {"x": x, "lo": np.array(-1, np.float32), "hi": np.array(1, np.float32)},
    )
    check_node(helper.make_node("Clip", ["x", "", "hi"], ["y"]), {"x": IA, "hi": np.array(2, np.int64)})
    check_node(helper.make_node("Clip", ["x"], ["y"], min=-0.5, max=0.5), {"x": A}, opset=6)
    check_node(helper.make_node("PRelu", ["x", "s"], ["y"]), {"x": A, "s": B[0]})
    for neg, pos in ((1, 1), (1, 0), (0, 1), (0, 0)):
        node = helper.make_node("IsInf", ["x"], ["y"], detect_negative=neg, detect_positive=pos)
        check_node(node, {"x": x})


@pytest.mark.parametrize(
    ("src", "to"),
    [
        (np.float32, TensorProto.INT32),
        (np.float32, TensorProto.BOOL),
        (np.float32, TensorProto.FLOAT16),
        (np.float32, TensorProto.DOUBLE),
        (np.int64, TensorProto.FLOAT),
        (np.bool_, TensorProto.FLOAT),
        (np.float16, TensorProto.INT64),
        (np.int32, TensorProto.UINT8),
    ],
)
def test_cast_vs_ort(src, to):
    x = (A * 7).astype(src) if src != np.bool_ else BA
    if to == TensorProto.UINT8:
        x = np.abs(x)
    check_node(helper.make_node("Cast", ["x"], ["y"], to=to), {"x": x})


def test_cast_bfloat16_rounds_to_nearest_even():
    # ORT's Python API cannot return bfloat16, so compare with ml_dtypes (round to nearest even).
    from opcheck import run_ours

    x = A * 7
    m = make_model(helper.make_node("Cast", ["x"], ["y"], to=TensorProto.BFLOAT16), {"x": x})
    got = run_ours(m, {"x": x})[0]
    assert got.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(got.view(np.uint16), x.astype(ml_dtypes.bfloat16).view(np.uint16))


@pytest.mark.parametrize("saturate", [0, 1])
@pytest.mark.parametrize("to", [TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT8E5M2, TensorProto.FLOAT8E4M3FNUZ])
def test_cast_fp8_saturate_vs_onnx_reference(to, saturate):
    # ORT's Python API returns fp8 as raw bytes, so the oracle here is ONNX's reference evaluator.
    from onnx.reference import ReferenceEvaluator

    from opcheck import run_ours

    x = np.array([0.3, -1.7, 500, -1e5, 60000, np.inf, -np.inf, np.nan], np.float32)
    for node in (
        helper.make_node("Cast", ["x"], ["y"], to=to, saturate=saturate),
        helper.make_node("CastLike", ["x", "t"], ["y"], saturate=saturate),
    ):
        inits = {"t": np.zeros(1, helper.tensor_dtype_to_np_dtype(to))} if node.op_type == "CastLike" else {}
        m = make_model(node, {"x": x}, opset=19, initializers=inits)
        got = run_ours(m, {"x": x})[0]
        want = ReferenceEvaluator(m).run(None, {"x": x})[0]
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got.astype(np.float32), want.astype(np.float32))


def test_dropout_inference_and_mask():
    got = check_node(
        helper.make_node("Dropout", ["x", "r"], ["y", "m"]),
        {"x": A},
        initializers={"r": np.array(0.3, np.float32)},
    )
    assert got[1].all() and got[1].dtype == np.bool_
    check_node(
        helper.make_node("Dropout", ["x", "r", "t"], ["y"]),
        {"x": A},
        initializers={"r": np.array(0.3, np.float32), "t": np.array(False)},
    )


def test_refusals():
    assert "fmod=0" in refuses(helper.make_node("Mod", ["a", "b"], ["y"]), {"a": A, "b": B})
    assert "training_mode" in refuses(
        helper.make_node("Dropout", ["x", "r", "t"], ["y"]),
        {"x": A, "r": np.array(0.5, np.float32), "t": np.array(True)},
    )
    node = helper.make_node("Gelu", ["x"], ["y"], approximate="erf")
    assert "approximate" in refuses(node, {"x": A}, opset=20)
    assert "attribute" in refuses(helper.make_node("Relu", ["x"], ["y"], foo=1), {"x": A})
    assert "before opset 10" in refuses(helper.make_node("Dropout", ["x"], ["y", "m"]), {"x": A}, opset=7)


def test_ops_have_cpp_templates():
    from migraphx_ep.ir import OPS
    from migraphx_ep.ops.base import BinaryOp, UnaryOp

    # Only the package's ops: other tests register throwaway ops of their own into the same table.
    ours = {n: c for n, c in OPS.items() if c.__module__.startswith("migraphx_ep.")}
    missing = [n for n, c in ours.items() if issubclass(c, UnaryOp | BinaryOp) and not c.cpp]
    assert not missing
    assert DType.bool_type == make_op("equal").compute_shape([Shape(DType.float_type, [2])] * 2).type

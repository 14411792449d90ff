"""simplify_algebra: each exact rule fires, inexact ones don't (outside fast math), numbers bit-identical."""

from __future__ import annotations

import numpy as np
import pytest
from passcheck import Build, check_pass

from migraphx_ep.ir.dtypes import DType
from migraphx_ep.passes import DEAD_CODE_ELIMINATION as DCE
from migraphx_ep.passes import SIMPLIFY_ALGEBRA, SIMPLIFY_ALGEBRA_FAST_MATH

ALG = [SIMPLIFY_ALGEBRA, DCE]
FAST = [SIMPLIFY_ALGEBRA_FAST_MATH, DCE]
LENS = [2, 4]


def _const_op(name: str, value: float, dtype: type, swap: bool = False, pattern_dtype: type | None = None):
    def build():
        b = Build()
        x = b.param("x", LENS, dtype)
        c = b("multibroadcast", b.lit(value, dtype), out_lens=LENS)
        return b.ret(b(name, c, x) if swap else b(name, x, c))

    return build


def _just_x(dtype: type):
    def build():
        b = Build()
        return b.ret(b.param("x", LENS, dtype))

    return build


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32, np.int64])
@pytest.mark.parametrize("swap", [False, True])
def test_mul_one(dtype, swap):  # x*1 -> x, both operand orders
    check_pass(ALG, _const_op("mul", 1, dtype, swap), _just_x(dtype))


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int64])
def test_add_negative_zero(dtype):  # x + -0.0 -> x
    check_pass(ALG, _const_op("add", -0.0, dtype), _just_x(dtype))


@pytest.mark.parametrize("dtype", [np.int32, np.int8, np.uint8])
def test_add_zero_integers(dtype):  # x + 0 -> x
    check_pass(ALG, _const_op("add", 0, dtype, swap=True), _just_x(dtype))


def test_add_positive_zero_float_kept_but_fast_math_removes():
    build = _const_op("add", 0.0, np.float32)
    check_pass(ALG, build, build)  # -0.0 + 0.0 is +0.0: not exact
    m = build()
    SIMPLIFY_ALGEBRA_FAST_MATH.apply(m)
    DCE.apply(m)
    assert m == _just_x(np.float32)()


@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_sub_zero(dtype):  # x - 0 -> x
    check_pass(ALG, _const_op("sub", 0, dtype), _just_x(dtype))
    kept = _const_op("sub", 0, dtype, swap=True)  # 0 - x is not x
    check_pass(ALG, kept, kept)


@pytest.mark.parametrize("value", [0.0, 2.0])
def test_mul_zero_and_others_kept(value):
    build = _const_op("mul", value, np.float32)  # x*0 is not 0 for NaN, inf, negatives
    check_pass(ALG, build, build)


@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_double_negation(dtype):  # -(-x) -> x (also INT_MIN)
    def build():
        b = Build()
        x = b.param("x", LENS, dtype)
        return b.ret(b("neg", b("neg", x)))

    check_pass(ALG, build, _just_x(dtype))


def test_add_neg_is_sub_and_sub_neg_is_add():
    def build():
        b = Build()
        x, y = b.param("x", LENS), b.param("y", LENS)
        return b.ret(b("add", b("neg", y), x), b("sub", x, b("neg", y)))

    def expected():
        b = Build()
        x, y = b.param("x", LENS), b.param("y", LENS)
        return b.ret(b("sub", x, y), b("add", x, y))

    check_pass(ALG, build, expected)


def test_relu_relu():  # relu(relu(x)) -> relu(x)
    def build():
        b = Build()
        return b.ret(b("relu", b("relu", b("relu", b.param("x", LENS)))))

    def expected():
        b = Build()
        return b.ret(b("relu", b.param("x", LENS)))

    check_pass(ALG, build, expected)


def test_convert_to_same_type():
    def build():
        b = Build()
        return b.ret(b("convert", b.param("x", LENS), target_type=DType.float_type))

    check_pass(ALG, build, _just_x(np.float32))


@pytest.mark.parametrize(
    "src,mid,dst,folds",
    [
        (np.float16, DType.float_type, DType.double_type, True),  # f16 -> f32 exact
        (np.int8, DType.int32_type, DType.float_type, True),
        (np.float32, DType.double_type, DType.half_type, True),  # one rounding either way
        (np.float32, DType.half_type, DType.double_type, False),  # f32 -> f16 loses bits
        (np.float32, DType.double_type, DType.int32_type, False),  # float -> int: NaN/inf casts not promised
        (np.int32, DType.float_type, DType.int64_type, False),  # int32 doesn't fit float's 24 bits
        (np.bool_, DType.int8_type, DType.float_type, True),
        (np.bool_, DType.half_type, DType.int32_type, True),  # 0/1 survive any route
        (np.int32, DType.double_type, DType.int8_type, False),  # 300.0 -> int8 is not 300 wrapped
        (np.uint8, DType.int16_type, DType.int8_type, True),  # integer narrowing wraps either way
        (np.int8, DType.float_type, DType.bool_type, True),
    ],
)
def test_convert_chain(src, mid, dst, folds):
    def build():
        b = Build()
        x = b.param("x", LENS, src)
        return b.ret(b("convert", b("convert", x, target_type=mid), target_type=dst))

    def expected():
        b = Build()
        return b.ret(b("convert", b.param("x", LENS, src), target_type=dst))

    check_pass(ALG, build, expected if folds else build)


def test_convert_round_trip_widening_removed():  # f16 -> f32 -> f16 is x
    def build():
        b = Build()
        x = b.param("x", LENS, np.float16)
        return b.ret(b("convert", b("convert", x, target_type=DType.float_type), target_type=DType.half_type))

    check_pass(ALG, build, _just_x(np.float16))


def _reassoc(name: str, dtype: type):
    def build():
        b = Build()
        a = b.param("a", LENS, dtype)
        c1 = b("multibroadcast", b.lit(3, dtype), out_lens=LENS)
        c2 = b("multibroadcast", b.lit([5, 7, 9, 11], dtype), out_lens=LENS)
        return b.ret(b(name, c2, b(name, a, c1)))

    def expected():
        fn = np.multiply if name == "mul" else np.add
        b = Build()
        a = b.param("a", LENS, dtype)
        c = b.lit(fn(np.asarray(3, dtype), np.asarray([5, 7, 9, 11], dtype)), dtype)
        return b.ret(b(name, a, b("multibroadcast", c, out_lens=LENS)))

    return build, expected


@pytest.mark.parametrize("name", ["mul", "add"])
@pytest.mark.parametrize("dtype", [np.int32, np.int8, np.uint16])
def test_reassociate_integer_constants(name, dtype):  # (a*c1)*c2 -> a*(c1*c2), wraps like the original
    build, expected = _reassoc(name, dtype)
    check_pass(ALG, build, expected)


@pytest.mark.parametrize("name", ["mul", "add"])
def test_reassociate_float_constants_only_fast_math(name):
    build, expected = _reassoc(name, np.float32)
    check_pass(ALG, build, build)
    m = build()
    SIMPLIFY_ALGEBRA_FAST_MATH.apply(m)
    DCE.apply(m)
    assert m == expected()


def test_rules_compose_to_fixpoint():  # -(-(x*1)) + -y -> x - y in one pass
    def build():
        b = Build()
        x, y = b.param("x", LENS), b.param("y", LENS)
        one = b("multibroadcast", b.lit(1.0), out_lens=LENS)
        return b.ret(b("add", b("neg", b("neg", b("mul", x, one))), b("neg", y)))

    def expected():
        b = Build()
        x, y = b.param("x", LENS), b.param("y", LENS)
        return b.ret(b("sub", x, y))

    check_pass(ALG, build, expected)

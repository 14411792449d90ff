"""Elementwise ops: numpy meaning + C++ expression, one line each.

Narrow floats (half, bf16, fp8) are evaluated in float32 and rounded once (``_f32``): that is what ORT's
CPU kernels and numpy's own half loops do, so results match to the last bit in the common cases.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import ClassVar

import numpy as np

from ..ir.dtypes import FLOAT_TYPES, INT_TYPES, SIGNED_INT_TYPES, DType, to_numpy
from ..ir.operation import Op, op_class, register_op
from ..ir.shape import Shape, check_shapes
from .base import NUMERIC_TYPES, binary, elementwise_shape, unary

SIGNED = FLOAT_TYPES | SIGNED_INT_TYPES
BOOL = frozenset({DType.bool_type})
ANY = NUMERIC_TYPES | BOOL
NARROW_FLOATS = frozenset(to_numpy(t) for t in FLOAT_TYPES - {DType.float_type, DType.double_type})


def f32(fn: Callable) -> Callable:
    """Run ``fn`` on float32 copies of narrow-float arguments (the caller rounds to the output type)."""

    def run(*xs: np.ndarray) -> np.ndarray:
        if xs[0].dtype in NARROW_FLOATS:
            xs = tuple(x.astype(np.float32) for x in xs)
        return fn(*xs)

    run.__name__ = getattr(fn, "__name__", "fn")
    return run


_ERF = np.frompyfunc(math.erf, 1, 1)


def erf(x: np.ndarray) -> np.ndarray:
    """libm's erf (numpy has none); evaluated in float64 so float32 results are correctly rounded."""
    return _ERF(np.asarray(x, dtype=np.float64)).astype(np.float64)


def _div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.dtype.kind in "iu":
        # C++ integer division truncates toward zero; numpy's floor_divide rounds toward -inf.
        q = np.floor_divide(a, b)
        if a.dtype.kind == "i":
            q = q + ((a - q * b != 0) & ((a < 0) != (b < 0))).astype(q.dtype)
        return q
    return np.true_divide(a, b)


def zero_divisor_message(op: str) -> str:
    """The error of ``op`` (div, mod, fmod) on an integer zero divisor; the gpu kernels' check says it too."""
    return f"{op}: integer {'division' if op == 'div' else 'modulo'} by zero"


def _checked(fn: Callable, op: str) -> Callable:
    """``fn`` raising on an integer zero divisor: ORT's CPU kernels fail the Run there (Div and Mod
    alike) where numpy would give 0 and a warning."""

    def run(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        if b.dtype.kind in "iu" and not np.all(b):
            raise ZeroDivisionError(zero_divisor_message(op))
        return fn(a, b)

    run.__name__ = op
    return run


def _pow(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    # ORT evaluates integer Pow as std::pow on doubles, truncated back (negative exponents are legal).
    if a.dtype.kind in "iu":
        return np.trunc(np.power(a.astype(np.float64), b.astype(np.float64)))
    return np.power(a, b)


def _shift_left(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    # ONNX (opset 28): shifts < 0 or >= the bit width give 0; signed values shift as their bit pattern.
    bad = (b < 0) | (b >= a.dtype.itemsize * 8)
    u = np.dtype(f"u{a.dtype.itemsize}")
    r = np.left_shift(a.view(u), np.where(bad, 0, b).astype(u)).view(a.dtype)
    return np.where(bad, 0, r)


def _shift_right(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    # Arithmetic for signed types; an out-of-range shift leaves only the sign fill (-1 or 0).
    bad = (b < 0) | (b >= a.dtype.itemsize * 8)
    r = np.right_shift(a, np.where(bad, 0, b).astype(a.dtype))
    return np.where(bad, np.where(a < 0, -1, 0).astype(a.dtype), r)


def _round(x: np.ndarray) -> np.ndarray:
    return np.rint(x)  # half to even, like std::nearbyint in the default rounding mode


# -- unary: math ----------------------------------------------------------------------------------
unary("abs", np.abs, "mx_abs({0})")
unary("neg", np.negative, "mx_neg({0})", types=SIGNED)
unary("sign", np.sign, "mx_sign({0})")
unary("relu", lambda x: np.maximum(x, np.zeros((), x.dtype)), "mx_max({0}, ({C})0)", types=SIGNED)
unary("identity", lambda x: x, "{0}", types=ANY)
unary("exp", f32(np.exp), "exp({0})", types=FLOAT_TYPES)
unary("log", f32(np.log), "log({0})", types=FLOAT_TYPES)
unary("sqrt", f32(np.sqrt), "sqrt({0})", types=FLOAT_TYPES)
# rsqrt() is not correctly rounded; numpy divides by sqrt.
unary("rsqrt", f32(lambda x: 1 / np.sqrt(x)), "(({C})1 / sqrt({0}))", types=FLOAT_TYPES)
unary("recip", f32(lambda x: 1 / x), "(({C})1 / {0})", types=FLOAT_TYPES)
# CUDA's erff is within 2 ulp of float's correctly rounded value (the ref's erf is libm's in double,
# rounded once); evaluating in double would cost 10x in GELU-heavy models for that last ulp.
unary("erf", erf, "erf({0})", types=FLOAT_TYPES)
unary("sin", f32(np.sin), "sin({0})", types=FLOAT_TYPES)
unary("cos", f32(np.cos), "cos({0})", types=FLOAT_TYPES)
unary("tan", f32(np.tan), "tan({0})", types=FLOAT_TYPES)
unary("asin", f32(np.arcsin), "asin({0})", types=FLOAT_TYPES)
unary("acos", f32(np.arccos), "acos({0})", types=FLOAT_TYPES)
unary("atan", f32(np.arctan), "atan({0})", types=FLOAT_TYPES)
unary("sinh", f32(np.sinh), "sinh({0})", types=FLOAT_TYPES)
unary("cosh", f32(np.cosh), "cosh({0})", types=FLOAT_TYPES)
unary("tanh", f32(np.tanh), "tanh({0})", types=FLOAT_TYPES)
unary("asinh", f32(np.arcsinh), "asinh({0})", types=FLOAT_TYPES)
unary("acosh", f32(np.arccosh), "acosh({0})", types=FLOAT_TYPES)
unary("atanh", f32(np.arctanh), "atanh({0})", types=FLOAT_TYPES)
unary("ceil", f32(np.ceil), "ceil({0})", types=FLOAT_TYPES)
unary("floor", f32(np.floor), "floor({0})", types=FLOAT_TYPES)
unary("nearbyint", f32(_round), "nearbyint({0})", types=FLOAT_TYPES)
unary("isnan", f32(np.isnan), "({0} != {0})", types=FLOAT_TYPES, result_type=DType.bool_type)
unary("isinf", f32(np.isinf), "(bool)isinf({0})", types=FLOAT_TYPES, result_type=DType.bool_type)
unary("not", np.logical_not, "(!{0})", types=BOOL)
unary("bitwise_not", np.invert, "(~{0})", types=INT_TYPES)

# -- binary: arithmetic ---------------------------------------------------------------------------
binary("add", np.add, "mx_add({0}, {1})")
binary("sub", np.subtract, "mx_sub({0}, {1})")
binary("mul", np.multiply, "mx_mul({0}, {1})")
binary("div", _checked(_div, "div"), "mx_div({0}, {1})")  # C++ integer division truncates, as ONNX wants
binary("pow", f32(_pow), "mx_pow({0}, {1})")
# Sign of the divisor (numpy's mod, including IEEE special cases, as ONNX Mod-28 specifies for floats).
binary("mod", f32(_checked(np.mod, "mod")), "mx_mod({0}, {1})")
binary("fmod", f32(_checked(np.fmod, "fmod")), "mx_fmod({0}, {1})")  # sign of the dividend
# NaN propagates (numpy's maximum/minimum); the expression keeps that where fmax/fmin would not.
binary("max", np.maximum, "mx_max({0}, {1})")
binary("min", np.minimum, "mx_min({0}, {1})")
binary("prelu", lambda x, s: np.where(x < 0, x * s, x), "({0} < 0 ? mx_mul({0}, {1}) : {0})", types=SIGNED)
binary("bitwise_and", np.bitwise_and, "({0} & {1})", types=INT_TYPES)
binary("bitwise_or", np.bitwise_or, "({0} | {1})", types=INT_TYPES)
binary("bitwise_xor", np.bitwise_xor, "({0} ^ {1})", types=INT_TYPES)
# A shift by a negative count or by the width or more gives 0 (or the sign for >>), as numpy does.
binary("shift_left", _shift_left, "mx_shl({0}, {1})", types=INT_TYPES)
binary("shift_right", _shift_right, "mx_shr({0}, {1})", types=INT_TYPES)

# -- binary: logic and comparison (bool results) -----------------------------------------------------
binary("logical_and", np.logical_and, "({0} && {1})", types=BOOL)
binary("logical_or", np.logical_or, "({0} || {1})", types=BOOL)
binary("logical_xor", np.logical_xor, "({0} != {1})", types=BOOL)
binary("equal", np.equal, "({0} == {1})", types=ANY, result_type=DType.bool_type)
binary("greater", np.greater, "({0} > {1})", result_type=DType.bool_type)
binary("less", np.less, "({0} < {1})", result_type=DType.bool_type)
# Own ops rather than not(less): with NaN, NaN >= x is false but !(NaN < x) is true.
binary("greater_or_equal", np.greater_equal, "({0} >= {1})", result_type=DType.bool_type)
binary("less_or_equal", np.less_equal, "({0} <= {1})", result_type=DType.bool_type)


# -- ternary ------------------------------------------------------------------------------------------
@register_op
@op_class
class Where(Op):
    """``cond ? x : y`` on equal dims (the frontend broadcasts)."""

    name: ClassVar[str] = "where"
    cpp: ClassVar[str] = "({0} ? {1} : {2})"

    def compute_shape(self, inputs: list[Shape]) -> Shape:
        c = check_shapes(self.name, inputs).has(3).same_dims()
        if inputs[0].type != DType.bool_type:
            raise c.fail("condition must be bool")
        check_shapes(self.name, inputs[1:]).same_type()
        return elementwise_shape(inputs, first=1)

    def compute(self, out: Shape, args: list[np.ndarray]) -> np.ndarray:
        return np.where(args[0], args[1], args[2]).astype(out.dtype, copy=False)


@register_op
@op_class
class Clip(Op):
    """``min(max(x, lo), hi)`` on equal dims; NaN in x stays NaN; lo > hi gives hi (as ONNX says)."""

    name: ClassVar[str] = "clip"
    cpp: ClassVar[str] = "mx_min(mx_max({0}, {1}), {2})"

    def compute_shape(self, inputs: list[Shape]) -> Shape:
        check_shapes(self.name, inputs).has(3).same_type().same_dims().types(NUMERIC_TYPES)
        return elementwise_shape(inputs)

    def compute(self, out: Shape, args: list[np.ndarray]) -> np.ndarray:
        x, lo, hi = args
        return np.minimum(np.maximum(x, lo), hi).astype(out.dtype, copy=False)

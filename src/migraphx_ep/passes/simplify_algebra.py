"""simplify_algebra: local algebra rules, exact in IEEE arithmetic (the fast-math set adds inexact ones).

Exact means bit-identical results for every input, NaN, infinities and signed zeros included (NaN
payloads aside). Deliberately absent: ``x*0 -> 0`` (NaN*0 is NaN, -1*0 is -0), ``x-x -> 0`` for floats
(inf-inf is NaN), ``x+0.0 -> x`` for floats (-0.0+0.0 is +0.0; ``x + -0.0 -> x`` is exact and kept).
Reassociating constants, ``(a*c1)*c2 -> a*(c1*c2)``, is exact for integers (wrap-around arithmetic is
associative) but not for floats (rounding, overflow): floats get it only in ``SIMPLIFY_ALGEBRA_FAST_MATH``.
"""

from __future__ import annotations

from ..ir.dtypes import INT_TYPES, DType, is_integer
from ..ir.instruction import Instruction
from ..ir.module import Module
from .manager import Pass
from .rewrite import Builder, Rule, apply_rules, const, op, rule, splat, var

x, y, a = var("x"), var("y"), var("a")
c1, c2 = const("c1"), const("c2")


def integral(ins: Instruction) -> bool:
    return is_integer(ins.shape.type)


# Element types each type converts into without loss (every value exactly representable), so a convert
# through it and on is the same as converting directly. Only types whose numpy casts round correctly.
_F16, _F32, _F64 = DType.half_type, DType.float_type, DType.double_type
_I8, _I16, _I32, _I64 = DType.int8_type, DType.int16_type, DType.int32_type, DType.int64_type
_U8, _U16, _U32 = DType.uint8_type, DType.uint16_type, DType.uint32_type
_LOSSLESS: dict[DType, frozenset[DType]] = {
    DType.bool_type: frozenset(INT_TYPES | {_F16, _F32, _F64}),
    _F16: frozenset({_F32, _F64}),
    _F32: frozenset({_F64}),
    _I8: frozenset({_I16, _I32, _I64, _F16, _F32, _F64}),
    _U8: frozenset({_I16, _I32, _I64, _U16, _U32, DType.uint64_type, _F16, _F32, _F64}),
    _I16: frozenset({_I32, _I64, _F32, _F64}),
    _U16: frozenset({_I32, _I64, _U32, DType.uint64_type, _F32, _F64}),
    _I32: frozenset({_I64, _F64}),
    _U32: frozenset({_I64, DType.uint64_type, _F64}),
}


def convert_through(r: Builder) -> bool:
    """convert(convert(x, T1), T2) == convert(x, T2) when T1 holds every value of x's type exactly, except
    float -> integer as the last step: out-of-range, NaN and inf casts wrap differently (or not at all)
    than integer narrowing does, so only an integer T1 (modular all the way) may precede an integer T2."""
    src, mid, dst = r.x.shape.type, r.mid.shape.type, r.out.shape.type
    if mid not in _LOSSLESS.get(src, frozenset()):
        return False
    return dst not in INT_TYPES or is_integer(mid) or src == DType.bool_type


EXACT_RULES: list[Rule] = [
    rule(op("mul", x, splat(1)), lambda r: r.x),  # x*1 -> x
    rule(op("add", x, splat(-0.0)), lambda r: r.x),  # x + -0.0 -> x (and x+0 for integers)
    rule(op("add", var("x", integral), splat(0)), lambda r: r.x),  # x+0 -> x, integers only
    rule(op("sub", x, splat(0)), lambda r: r.x),  # x - 0 -> x (exact: -0.0 - +0.0 is -0.0)
    rule(op("neg", op("neg", x)), lambda r: r.x),  # -(-x) -> x
    rule(op("add", x, op("neg", y)), lambda r: r.op("sub", r.x, r.y)),  # x + -y -> x - y (IEEE's definition)
    rule(op("sub", x, op("neg", y)), lambda r: r.op("add", r.x, r.y)),  # x - -y -> x + y
    rule(op("relu", op("relu", x, bind="inner")), lambda r: r.inner),  # relu(relu(x)) -> relu(x)
    rule(op("convert", x, bind="c"), lambda r: r.x, when=lambda r: r.c.shape.type == r.x.shape.type),  # T->T
    rule(
        op("convert", op("convert", x, bind="mid"), bind="out"),  # convert(convert(x)) -> convert(x)
        lambda r: r.op("convert", r.x, target_type=r.out.shape.type),
        when=convert_through,
    ),
    rule(
        op("mul", op("mul", var("a", integral), c1), c2),  # (a*c1)*c2 -> a*(c1*c2), integers
        lambda r: r.op("mul", r.a, r.fold("mul", r.c1, r.c2)),
    ),
    rule(
        op("add", op("add", var("a", integral), c1), c2),  # (a+c1)+c2 -> a+(c1+c2), integers
        lambda r: r.op("add", r.a, r.fold("add", r.c1, r.c2)),
    ),
]

FAST_MATH_RULES: list[Rule] = [
    rule(op("mul", op("mul", a, c1), c2), lambda r: r.op("mul", r.a, r.fold("mul", r.c1, r.c2))),  # (a*c1)*c2
    rule(op("add", op("add", a, c1), c2), lambda r: r.op("add", r.a, r.fold("add", r.c1, r.c2))),  # (a+c1)+c2
    rule(op("add", x, splat(0)), lambda r: r.x),  # x+0 -> x (wrong only for x = -0.0)
]


def simplify_algebra(m: Module) -> bool:
    return apply_rules(m, EXACT_RULES)


def simplify_algebra_fast_math(m: Module) -> bool:
    return apply_rules(m, EXACT_RULES + FAST_MATH_RULES)


SIMPLIFY_ALGEBRA = Pass("simplify_algebra", simplify_algebra)
SIMPLIFY_ALGEBRA_FAST_MATH = Pass("simplify_algebra_fast_math", simplify_algebra_fast_math)

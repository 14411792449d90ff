"""fuse_layernorm: the decomposed LayerNormalization the frontend emits becomes one ``fused_layernorm``
instruction that owns the chain (STYLE §6), lowered to one row kernel (``kernels/rows.py``).

Matched from the root toward the inputs (MIGraphX's ``match/layernorm.hpp``)::

    [add(beta)] [mul(gamma)] [convert] norm
    norm = mul(d, broadcast(rsqrt(v + eps) | recip(sqrt(v + eps)))) | div(d, broadcast(sqrt(v + eps)))
    d    = sub(x', broadcast(reduce_mean(x')))
    v    = reduce_mean(mul(d, d) | pow(d, 2))
    x'   = x | convert(x) from half or bfloat16 to float

over trailing axes of a float x, eps a one-element constant, gamma and beta in x's dims varying only
along the normalised axes, every value inside read only by the next op of the chain (d: by the square
and the norm; x's widening convert: by the mean and d). The largest match wins: a norm whose only reader
scales it fuses there.

The converts are what exporters write around a layernorm they compute in float32 in a half model
(GPT-2's): widen, normalise, narrow, then gamma and beta in half. The kernel loads half and computes in
float anyway, and rounds once, at the end: the chain rounds after the narrowing and after gamma and
beta too, so the fused result can differ from it by an ulp or so of the half result (it is the more
exact one), as the half layernorm without converts already does.
"""

from __future__ import annotations

from ....ir.dtypes import DType
from ....ir.instruction import Instruction
from ....ir.module import Module
from ....ops.fused import FusedLayernorm
from ....passes.manager import Pass
from ....passes.rewrite import Builder, Pattern, Predicate, Rule, any_of, apply_rules, once, op, var
from ..views import scalar_value
from .body import chain_inputs_outside, insert_fused, is_body, reader_extends

_TYPES = frozenset({DType.float_type, DType.half_type, DType.bf16_type, DType.double_type})
# The chain's bound names, inputs first (the body's instruction order).
CHAIN = ("widen", "mean", "bmean", "centred", "square", "variance", "var_eps", "rsqrt", "sqrt", "recip")
CHAIN += ("inv", "norm", "narrow", "scaled", "shifted")
_HALVES = frozenset({DType.half_type, DType.bf16_type})


def _trailing(axes: tuple[int, ...], rank: int) -> int | None:
    """The first axis when ``axes`` are exactly the last ones, else None."""
    norm = sorted(a % rank for a in axes)
    if norm and norm == list(range(norm[0], rank)):
        return norm[0]
    return None


def _axis(mean: Instruction) -> int | None:
    return _trailing(tuple(mean.op.axes), mean.inputs[0].shape.ndim())  # type: ignore[attr-defined]


def _row_mean(ins: Instruction) -> bool:
    """A mean over trailing axes of a float value, read by one instruction (the broadcast)."""
    return once(ins) and ins.inputs[0].shape.type in _TYPES and _axis(ins) is not None


def _square_and_norm(ins: Instruction) -> bool:
    """x - mean is read by exactly two instructions: the square and the norm."""
    return len({id(u) for u in ins.outputs}) == 2


def _scalar(ins: Instruction) -> bool:
    return scalar_value(ins) is not None


def _two(ins: Instruction) -> bool:
    return scalar_value(ins) == 2


def _widening(ins: Instruction) -> bool:
    """half or bfloat16 to float (exact: what the kernel does when it loads x), read only by a mean and
    a subtraction (the chain's; ``_fits`` checks they are). Read elsewhere too, x stays the float value."""
    readers = {id(u): u.name for u in ins.outputs}
    widens = ins.shape.type == DType.float_type and ins.inputs[0].shape.type in _HALVES
    return widens and sorted(readers.values()) == ["reduce_mean", "sub"]


def _narrowing(ins: Instruction) -> bool:
    """float to half or bfloat16, read once: the kernel's own final rounding."""
    return once(ins) and ins.inputs[0].shape.type == DType.float_type and ins.shape.type in _HALVES


_X = any_of(op("convert", var("x"), bind="widen", when=_widening), var("x"))
_CENTRED = op(
    "sub",
    _X,
    op("multibroadcast", op("reduce_mean", _X, bind="mean", when=_row_mean), bind="bmean", when=once),
    bind="centred",
    when=_square_and_norm,
)
_SQUARE = any_of(
    op("mul", _CENTRED, _CENTRED, bind="square", when=once),
    op("pow", _CENTRED, var("two", _two), bind="square", when=once),
)
_VARIANCE = op("reduce_mean", _SQUARE, bind="variance", when=once)
_VAR_EPS = op("add", _VARIANCE, var("eps", _scalar), bind="var_eps", when=once)
_SQRT = op("sqrt", _VAR_EPS, bind="sqrt", when=once)
_INV_SQRT = any_of(
    op("rsqrt", _VAR_EPS, bind="rsqrt", when=once),
    op("recip", _SQRT, bind="recip", when=once),
)


def _norm(when: Predicate | None) -> Pattern:
    return any_of(
        op("mul", _CENTRED, op("multibroadcast", _INV_SQRT, bind="inv", when=once), bind="norm", when=when),
        op("div", _CENTRED, op("multibroadcast", _SQRT, bind="inv", when=once), bind="norm", when=when),
    )


def _narrowed(when: Predicate | None) -> Pattern:
    return any_of(op("convert", _norm(once), bind="narrow", when=_narrowing if when else None), _norm(when))


def _scaled(when: Predicate | None) -> Pattern:
    return op("mul", _narrowed(once), var("scale"), bind="scaled", when=when)


PATTERN = any_of(
    op("add", any_of(_scaled(once), _narrowed(once)), var("shift"), bind="shifted"),
    _scaled(None),
    _narrowed(None),
)


def _bound(r: Builder, name: str) -> Instruction | None:
    return r.get(name)


def _row_vector(v: Instruction, x: Instruction, axis: int) -> bool:
    """``v`` has x's dims and varies only along the normalised axes (a broadcast gamma/beta); the
    kernel loads it in its own float type."""
    if v.shape.lens != x.shape.lens or v.shape.type not in _TYPES:
        return False
    return all(s == 0 for s in v.shape.strides[:axis])


def _fits(r: Builder) -> str | None:
    if tuple(r.variance.op.axes) != tuple(r.mean.op.axes):  # type: ignore[attr-defined]
        return "variance over other axes than the mean"
    widen = _bound(r, "widen")
    if widen is not None and {id(u) for u in widen.outputs} != {id(r.mean), id(r.centred)}:
        return "the widened x is read outside the chain"
    if _bound(r, "narrow") is not None and not _narrowing(r.narrow):
        return "the narrowing convert is read elsewhere"
    axis = _axis(r.mean)
    assert axis is not None  # _row_mean
    scale, shift = _bound(r, "scale"), _bound(r, "shift")
    if any(v is not None and not _row_vector(v, r.x, axis) for v in (scale, shift)):
        return "gamma or beta varies along the rows"
    if not chain_inputs_outside((_bound(r, n) for n in CHAIN), (r.x, scale, shift)):
        return "the chain reads its own value as gamma or beta"
    return None


def _check(r: Builder) -> str | None:
    if _bound(r, "shift") is None and reader_extends(PATTERN, CHAIN, _fits, r.root):
        return "its reader is the root"  # matched there, with gamma or beta
    return _fits(r)


def _rewrite(r: Builder) -> Instruction:
    scale, shift = _bound(r, "scale"), _bound(r, "shift")
    eps = scalar_value(r.eps)
    axis = _axis(r.mean)
    assert eps is not None and axis is not None  # the pattern's predicates
    fused = FusedLayernorm(axis=axis, epsilon=float(eps), scale=scale is not None, bias=shift is not None)
    params = [("x", r.x)] + [(n, v) for n, v in (("scale", scale), ("bias", shift)) if v is not None]
    return insert_fused(r, fused, params, (_bound(r, n) for n in CHAIN))


RULE = Rule(PATTERN, _rewrite, _check, "fuse_layernorm", prune=True)


def fuse_layernorm(m: Module) -> bool:
    if is_body(m):
        return False  # a fused op's own body: it is the chain, not a use of it
    return apply_rules(m, [RULE], backward=True)  # the largest match first (body.reader_extends)


FUSE_LAYERNORM = Pass("fuse_layernorm", fuse_layernorm)

__all__ = ["FUSE_LAYERNORM", "PATTERN", "fuse_layernorm"]

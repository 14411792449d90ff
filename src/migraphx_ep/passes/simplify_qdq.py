"""simplify_qdq: dot/convolution of dequantised int8/fp8 values -> quant_dot/quant_convolution.

MIGraphX's ``simplify_qdq``: ``dot(dq(qa, sa), dq(qb, sb))`` becomes ``dq(quant_dot(qa, qb), sa*sb)``,
so the product runs on the quantised values (int8 accumulating exactly in int32, fp8 in float32) and
is scaled once. Not bit-exact against the dequantise-first form (the float rounding of the scale
products moves), hence not in the ref pipeline: the EP's int8 and fp8 paths call it explicitly.

What qualifies is what ``onnxruntime.quantization.quantize_static`` writes, its default included:
- the data operand (a, x): one scale; int8 with any zero point, or uint8 (ORT's default activations),
  which becomes int8 with its zero point moved down by 128 (``q - 128`` is the uint8 value's int8 twin,
  exactly: a uint8 ``quantizelinear`` whose readers all dequantise is rebuilt to write the twin, and
  its readers get the moved zero point; any other uint8 value is shifted by a conversion);
- the weight operand (b, w): int8 with zero points all zero, one scale per tensor or per output channel
  (the last axis of ``b``, axis 0 of ``w``: ``per_channel=True``);
- fp8 (E4M3) operands: one scale each, zero points zero.
A data zero point ``z`` is taken out of the int32 sum exactly: ``sum((qa - z) * qb) = sum(qa * qb) -
z * sum(qb)``, the last term a constant of the (constant) weight, given to the ``dequantizelinear`` of
the sum as its int32 zero point. For a padded convolution the windows at the border hold fewer taps,
so that constant is the convolution of an all-ones input, one value per output channel and position.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..ir.dtypes import DType
from ..ir.instruction import Instruction
from ..ir.module import Module
from ..ops.quant import QUANT_GEMM_TYPES
from .manager import Pass
from .rewrite import Builder, Rule, apply_rules, compact_value, literal_source, op, var

_DQ = "dequantizelinear"
QUANT_OF = {"dot": "quant_dot", "convolution": "quant_convolution"}
_SHIFT = 128  # uint8 value - 128 = the int8 value with the zero point moved down as much


@dataclass(frozen=True)
class _QParams:
    """A dequantise's constants: ``scale`` is a scalar, or a vector along data axis ``axis``."""

    scale: np.ndarray
    axis: int | None
    zero: int


def _uniform(v: np.ndarray) -> bool:
    flat = v.reshape(-1)
    return bool(flat.size) and bool(np.all(flat == flat[0]))


def _per_axis(ins: Instruction) -> tuple[np.ndarray, int | None] | None:
    """A constant viewed at ``ins``'s dims as (its one value, None) or (a vector, the axis it runs
    along): the parser's forms, a broadcast scalar or a ``broadcast`` of a 1-D constant, possibly
    broadcast again to more leading dims."""
    rank = ins.shape.ndim()
    while ins.name == "multibroadcast":
        ins = ins.inputs[0]
    v = compact_value(ins)
    if v is not None and _uniform(v):
        return v.reshape(-1)[:1].reshape(()), None
    if ins.name == "broadcast" and ins.inputs[0].shape.ndim() == 1:
        vec = compact_value(ins.inputs[0])
        if vec is not None:
            return vec, ins.op.axis + rank - ins.shape.ndim()  # type: ignore[attr-defined]
    return None


def _qparams(dq: Instruction) -> _QParams | None:
    if dq.name != _DQ:
        return None
    scale = _per_axis(dq.inputs[1])
    if scale is None or not (np.all(np.isfinite(scale[0])) and np.all(scale[0] > 0)):
        return None
    zero = 0
    if len(dq.inputs) == 3:
        z = _per_axis(dq.inputs[2])
        if z is None or z[1] is not None:
            return None
        zero = int(z[0].astype(np.float64))
    return _QParams(scale[0].astype(np.float32), scale[1], zero)


def _data_type(t: DType) -> DType:
    return DType.int8_type if t == DType.uint8_type else t


def _check(r: Builder) -> str | None:
    a, b = _qparams(r.da), _qparams(r.db)
    if a is None or b is None:
        return "a scale or zero point is not a constant of a supported form"
    ta, tb = r.da.inputs[0].shape.type, r.db.inputs[0].shape.type
    if tb not in QUANT_GEMM_TYPES or _data_type(ta) != tb:
        return f"operand types {ta.name} x {tb.name}"
    if r.root.shape.type != DType.float_type:
        return "result is not float32"  # the scale product and the rescale are computed in float32
    if a.axis is not None:
        return "the data operand has more than one scale"
    if b.axis is not None and b.axis != _out_axis(r):
        return "the weight's scales do not run along its output channels"
    if b.zero:
        return "the weight has a nonzero zero point"
    if _zero(r, a) and (tb != DType.int8_type or literal_source(r.db.inputs[0]) is None):
        return "a data zero point with a non-constant or float8 weight"
    return None


def _out_axis(r: Builder) -> int:
    """The axis of the weight that indexes the output channels."""
    return r.db.shape.ndim() - 1 if r.root.name == "dot" else 0


def _zero(r: Builder, a: _QParams) -> int:
    """The data zero point once the data is int8."""
    return a.zero - _SHIFT if r.da.inputs[0].shape.type == DType.uint8_type else a.zero


def _as_int8(r: Builder) -> Instruction:
    """The data operand as int8: a uint8 value (not from a quantise the twin rule rebuilt) shifted by a
    conversion, ``q - 128``."""
    q = r.da.inputs[0]
    if q.shape.type != DType.uint8_type:
        return q
    wide = r.op("convert", q, target_type=DType.int16_type)
    shift = r.op("multibroadcast", r.literal(np.int16(_SHIFT)), out_lens=list(q.shape.lens))
    return r.op("convert", r.op("sub", wide, shift), target_type=DType.int8_type)


def _scalar_zero(ins: Instruction) -> int | None:
    """The one zero point of a quantise or dequantise with three inputs, else None."""
    z = _per_axis(ins.inputs[2]) if len(ins.inputs) == 3 else None
    return None if z is None or z[1] is not None else int(z[0])


def _twin_check(r: Builder) -> str | None:
    q = r.q
    if q.shape.type != DType.uint8_type or _scalar_zero(q) is None:
        return "not a uint8 quantise with one zero point"
    if any(u.name != _DQ or _scalar_zero(u) is None for u in q.outputs):
        return "a reader of the uint8 value is not a dequantise with one zero point"
    return None


def _int8(r: Builder, zero: int, like: Instruction) -> Instruction:
    return r.op("multibroadcast", r.literal(np.int8(zero - _SHIFT)), out_lens=list(like.shape.lens))


def _twin(r: Builder) -> Instruction:
    """dq(q_u8(x, s, z), s', z') -> dq(q_i8(x, s, z - 128), s', z' - 128): the same values; the rule
    rewrites every reader of ``q``, and CSE merges their rebuilt quantises into one."""
    q, dq = r.q, r.root
    q8 = r.op("quantizelinear", q.inputs[0], q.inputs[1], _int8(r, _scalar_zero(q), q))  # type: ignore[arg-type]
    return r.op(_DQ, q8, dq.inputs[1], _int8(r, _scalar_zero(dq), dq))  # type: ignore[arg-type]


def _zero_sums(r: Builder, zero: int, acc: Instruction) -> np.ndarray:
    """``zero`` times the sum of the weights each output element's window reads (int32, at compact
    dims broadcastable to ``acc``)."""
    w = np.asarray(r.db.inputs[0].eval(), np.int64)
    if r.root.name == "dot":
        return (zero * w.sum(axis=-2, keepdims=True)).astype(np.int32)
    x = r.da.inputs[0].shape
    k = x.ndim() - 2
    p, s, d = r.root.op.attrs(k)  # type: ignore[attr-defined]
    # An all-ones input: each output position sums the kernel taps its window keeps inside the input,
    # one axis at a time (tap r of output o reads o * stride - pad + r * dilation).
    sums = w.sum(axis=1)  # (K, *kernel)
    for i in range(k):
        o = np.arange(acc.shape.lens[2 + i])[:, None] * s[i] - p[i] + np.arange(w.shape[2 + i]) * d[i]
        inside = ((o >= 0) & (o < x.lens[2 + i])).astype(np.int64)  # (out, kernel)
        sums = np.tensordot(sums, inside, axes=([1], [1]))  # the kernel axis out, the output axis last
    corner = sums[(slice(None), *([slice(0, 1)] * k))]
    if np.all(sums == corner):
        sums = corner  # no window reaches the padding: one sum per output channel
    return (zero * sums[None]).astype(np.int32)


def _at(r: Builder, value: np.ndarray, axis: int | None, lens: list[int]) -> Instruction:
    """A scalar, or a vector along output axis ``axis``, or a compact array, viewed at ``lens``."""
    lit = r.literal(value)
    if value.ndim == 1:
        return r.op("broadcast", lit, axis=axis, out_lens=lens)
    return r.op("multibroadcast", lit, out_lens=lens)


def _rewrite(r: Builder) -> Instruction:
    a, b = _qparams(r.da), _qparams(r.db)
    assert a is not None and b is not None  # _check
    qb = r.db.inputs[0]
    wide = r.root.inputs[1]
    if wide is not r.db:  # the weight broadcast over the batch (ONNX MatMul): broadcast its int8 twin
        qb = r.op("multibroadcast", qb, out_lens=list(wide.shape.lens))
    acc = r.op(QUANT_OF[r.root.name], _as_int8(r), qb, **r.root.op.attributes())
    lens = list(acc.shape.lens)
    out_axis = len(lens) - 1 if r.root.name == "dot" else 1
    scale = _at(r, (np.float32(a.scale) * b.scale).astype(np.float32), out_axis, lens)
    if acc.shape.type != DType.int32_type:
        return r.op("mul", acc, scale)  # fp8 products already accumulate in float32
    zero = _zero(r, a)
    if not zero:
        return r.op(_DQ, acc, scale)  # int32 accumulator * scale, as MIGraphX
    return r.op(_DQ, acc, scale, _at(r, _zero_sums(r, zero, acc), None, lens))


_DQ_A = op(_DQ, bind="da", any_args=True)
_DQ_B = op(_DQ, bind="db", any_args=True)
_Q = op("quantizelinear", bind="q", any_args=True)
_RULES = [
    # dq(q_u8) -> dq(q_i8), first: the products below then see int8 data
    Rule(op(_DQ, _Q, var("s"), var("z")), _twin, _twin_check, "int8_twin"),
    # dot(dq(qa), dq(qb)) -> dq(quant_dot(qa, qb)); convolution likewise
    *(Rule(op(name, _DQ_A, _DQ_B), _rewrite, _check, name) for name in QUANT_OF),
    Rule(op("dot", _DQ_A, op("multibroadcast", _DQ_B)), _rewrite, _check, "dot of a broadcast weight"),
]


def simplify_qdq(m: Module) -> bool:
    return apply_rules(m, _RULES)


SIMPLIFY_QDQ = Pass("simplify_qdq", simplify_qdq)

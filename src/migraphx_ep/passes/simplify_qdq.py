"""simplify_qdq: dot/convolution of dequantised int8/fp8 values -> quant_dot/quant_convolution.

MIGraphX's ``simplify_qdq``: ``dot(dq(qa, sa), dq(qb, sb))`` becomes ``dq(quant_dot(qa, qb), sa*sb)``,
so the product runs on the quantised values (int8 accumulating exactly in int32, fp8 in float32) and
is scaled once. Only per-tensor symmetric quantisation qualifies (one constant scale per operand, zero
points all zero): that is what ``quantize_static`` emits. Not bit-exact against the dequantise-first
form (the float rounding of the scale products moves), hence not in the ref pipeline: the EP's int8
and fp8 paths call it explicitly.
"""

from __future__ import annotations

import numpy as np

from ..ir.dtypes import DType
from ..ir.instruction import Instruction
from ..ir.module import Module
from ..ops.quant import QUANT_GEMM_TYPES
from .manager import Pass
from .rewrite import Builder, Rule, apply_rules, compact_value, op

_DQ = "dequantizelinear"
QUANT_OF = {"dot": "quant_dot", "convolution": "quant_convolution"}


def _per_tensor(dq: Instruction) -> float | None:
    """The one scale of a symmetric per-tensor dequantise of int8/fp8 data, else None."""
    if dq.name != _DQ or dq.inputs[0].shape.type not in QUANT_GEMM_TYPES:
        return None
    scale = compact_value(dq.inputs[1])
    if scale is None or scale.size == 0 or not np.all(scale == scale.reshape(-1)[0]):
        return None
    if len(dq.inputs) == 3:
        zero = compact_value(dq.inputs[2])
        if zero is None or np.any(zero.astype(np.float64) != 0):
            return None
    value = float(scale.reshape(-1)[0])
    return value if np.isfinite(value) and value > 0 else None


def _check(r: Builder) -> str | None:
    a, b = r.da, r.db
    if a.inputs[0].shape.type != b.inputs[0].shape.type:
        return "operands quantised to different types"
    if r.root.shape.type != DType.float_type:
        return "result is not float32"  # the scale product and the rescale are computed in float32
    if _per_tensor(a) is None or _per_tensor(b) is None:
        return "not per-tensor symmetric quantisation"
    return None


def _rewrite(r: Builder) -> Instruction:
    qa, qb = r.da.inputs[0], r.db.inputs[0]
    acc = r.op(QUANT_OF[r.root.name], qa, qb, **r.root.op.attributes())
    scale = np.float32(_per_tensor(r.da)) * np.float32(_per_tensor(r.db))  # type: ignore[operator]
    s = r.op("multibroadcast", r.literal(np.asarray(scale, np.float32)), out_lens=list(acc.shape.lens))
    if acc.shape.type == DType.int32_type:
        return r.op(_DQ, acc, s)  # int32 accumulator * scale, as MIGraphX
    return r.op("mul", acc, s)  # fp8 products already accumulate in float32


_DQ_A = op(_DQ, bind="da", any_args=True)
_DQ_B = op(_DQ, bind="db", any_args=True)
# dot(dq(qa), dq(qb)) -> dq(quant_dot(qa, qb)); convolution likewise
_RULES = [Rule(op(name, _DQ_A, _DQ_B), _rewrite, _check, name) for name in QUANT_OF]


def simplify_qdq(m: Module) -> bool:
    return apply_rules(m, _RULES)


SIMPLIFY_QDQ = Pass("simplify_qdq", simplify_qdq)

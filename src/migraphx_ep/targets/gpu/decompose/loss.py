"""nll_loss as gathers, pointwise ops and sums (``ops/loss.py`` is the meaning).

Picks and weights are gathered in the input's type and widened to the ref's accumulation type
(float32, float64 for double) afterwards: widening is exact, so this equals widening first.
"""

from __future__ import annotations

from ....ir.dtypes import DType
from ....ir.instruction import Instruction
from .builder import Builder


def decompose_nll_loss(b: Builder, ins: Instruction) -> Instruction:
    op = ins.op
    x, t, *w = ins.inputs
    acc = DType.double_type if x.shape.type == DType.double_type else DType.float_type
    i64 = DType.int64_type
    c = x.shape.lens[1]
    t = b.convert(t, i64)
    keep = b.pw("not", b.pw("equal", t, op.ignore_index)) if op.has_ignore else None  # type: ignore[attr-defined]
    # Ignored (and, undefined by ONNX, out-of-range) targets read class 0; their weight zeroes them.
    tc = b.pw("clip", t, 0, c - 1)
    if keep is not None:
        tc = b.pw("where", keep, tc, 0)
    picked = b.add("gather_elements", x, b.add("unsqueeze", tc, axes=[1]), axis=1)
    picked = b.convert(b.add("squeeze", picked, axes=[1]), acc)
    if w:
        wt = b.convert(b.add("gather", w[0], tc, axis=0), acc)
        if keep is not None:
            wt = b.pw("where", keep, wt, 0)
        loss = b.pw("mul", b.pw("neg", picked), wt)
    else:
        wt = None  # every weight is 1: -picked * 1 is -picked
        loss = b.pw("neg", picked)
    if keep is not None:
        loss = b.pw("where", keep, loss, 0)
    if op.reduction == "none":  # type: ignore[attr-defined]
        return b.convert(loss, ins.shape.type)
    axes = list(range(loss.shape.ndim()))
    total = b.reduce("reduce_sum", loss, axes, keep=False)
    if op.reduction == "mean":  # type: ignore[attr-defined]
        if wt is None:
            wt = b.convert(keep, acc) if keep is not None else None
        count = b.reduce("reduce_sum", wt, axes, keep=False) if wt is not None else t.shape.elements()
        total = b.pw("div", total, count)
    return b.convert(total, ins.shape.type)

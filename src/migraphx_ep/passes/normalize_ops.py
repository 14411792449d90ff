"""normalize_ops: rewrite negative axes and permutation entries in op attributes as non-negative ones.

Ops built through the MIGraphX-style Python API may carry ``axis=-1``; later passes and codegen then
compare axes without knowing ranks. The table names each op's axis attributes and which rank counts:
the input's (``IN``), the output's (``OUT``: unsqueeze's new axes, onehot's new axis) or the input's
with ``rank`` itself allowed (``IN_INCLUSIVE``: flatten's axis in [-r, r]). An op is rewritten only if
every entry is in range and the rebuilt op gives exactly the same shape.
"""

from __future__ import annotations

import dataclasses
from enum import Enum

from ..ir.instruction import Instruction
from ..ir.module import Module
from .manager import Pass
from .rewrite import op_shape


class Rank(Enum):
    IN = "in"
    OUT = "out"
    IN_INCLUSIVE = "in_inclusive"


_REDUCE = ("reduce_sum", "reduce_mean", "reduce_prod", "reduce_max", "reduce_min")
_SCATTER = ("scatter_none", "scatter_add", "scatter_mul", "scatter_max", "scatter_min")
_AXIS_IN = (
    "concat",
    "gather",
    "gather_elements",
    "softmax",
    "logsoftmax",
    "argmax",
    "argmin",
    "prefix_scan_sum",
    "prefix_scan_prod",
    "topk",
    *_SCATTER,
)

AXIS_ATTRIBUTES: dict[str, tuple[tuple[str, Rank], ...]] = {
    "transpose": (("permutation", Rank.IN),),
    "squeeze": (("axes", Rank.IN),),
    "slice": (("axes", Rank.IN),),
    "step": (("axes", Rank.IN),),
    "reverse": (("axes", Rank.IN),),
    "unsqueeze": (("axes", Rank.OUT),),
    "onehot": (("axis", Rank.OUT),),
    "flatten": (("axis", Rank.IN_INCLUSIVE),),
    **{n: (("axes", Rank.IN),) for n in _REDUCE},
    **{n: (("axis", Rank.IN),) for n in _AXIS_IN},
}


def _normal(a: int, rank: int, kind: Rank) -> int | None:
    hi = rank + 1 if kind == Rank.IN_INCLUSIVE else rank
    if not -rank <= a < hi:
        return None
    return a + rank if a < 0 else a


def normalized_attributes(ins: Instruction) -> dict[str, int | tuple[int, ...]] | None:
    """The attributes to change (non-negative versions), or None when nothing needs or can change."""
    spec = AXIS_ATTRIBUTES.get(ins.name)
    if spec is None or not ins.inputs:
        return None
    changes: dict[str, int | tuple[int, ...]] = {}
    for attr, kind in spec:
        value = getattr(ins.op, attr, None)
        if value is None:
            return None  # an op of that name with other attributes: not ours to guess
        rank = ins.shape.ndim() if kind == Rank.OUT else ins.inputs[0].shape.ndim()
        entries = value if isinstance(value, tuple) else (value,)
        fixed = [_normal(int(a), rank, kind) for a in entries]
        if any(f is None for f in fixed):
            return None
        if list(fixed) != [int(a) for a in entries]:
            changes[attr] = tuple(fixed) if isinstance(value, tuple) else fixed[0]  # type: ignore[assignment]
    return changes or None


def normalize_ops(m: Module) -> bool:
    changed = False
    for ins in m:
        changes = normalized_attributes(ins)
        if changes is None:
            continue
        new_op = dataclasses.replace(ins.op, **changes)
        if op_shape(new_op, ins.inputs, ins.module_args) != ins.shape:
            continue
        m.replace_instruction(ins, new_op, ins.inputs)
        changed = True
    return changed


NORMALIZE_OPS = Pass("normalize_ops", normalize_ops)

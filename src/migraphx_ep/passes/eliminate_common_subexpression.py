"""eliminate_common_subexpression: merge instructions computing the same op on the same inputs.

One forward walk suffices: a merge redirects users to the earlier instruction before those users are
visited, so chains of duplicates collapse transitively. Literals merge when their bytes, dtype and dims
are equal (``Literal`` equality); large weights are only hashed when another literal has the same shape.
Never merged: parameters, ``@return``, nondeterministic ops, and module-owning instructions unless
their module arguments are the very same modules.
"""

from __future__ import annotations

from collections.abc import Hashable

from ..ir.instruction import Instruction
from ..ir.module import Module
from .manager import Pass
from .rewrite import replace_value


def _key(ins: Instruction) -> Hashable:
    # repr() guards op equality against values that compare equal but mean different things: an attribute
    # 0.0 vs -0.0 (pad value) or 1 vs 1.0 vs True hash and compare equal as dataclass fields.
    return (
        type(ins.op),
        ins.op,
        repr(ins.op),
        tuple(id(i) for i in ins.inputs),
        tuple(id(mod) for mod in ins.module_args),
        ins.shape,
    )


def eliminate_common_subexpression(m: Module) -> bool:
    seen: dict[Hashable, Instruction] = {}
    literals: dict[object, list[Instruction]] = {}  # shape -> distinct literals of that shape
    changed = False
    for ins in m:
        if ins.is_param() or ins.is_return() or getattr(ins.op, "nondeterministic", False):
            continue
        if ins.is_literal():
            same_shape = literals.setdefault(ins.shape, [])
            first = next((lit for lit in same_shape if lit.op == ins.op), None)
            if first is None:
                same_shape.append(ins)
            elif replace_value(m, ins, first):
                changed = True
            continue
        k = _key(ins)
        first = seen.get(k)
        if first is None:
            seen[k] = ins
        elif replace_value(m, ins, first):
            changed = True
    return changed


ELIMINATE_COMMON_SUBEXPRESSION = Pass("eliminate_common_subexpression", eliminate_common_subexpression)

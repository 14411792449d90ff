"""eliminate_common_subexpression: merge instructions computing the same op on the same inputs.

One forward walk suffices: a merge redirects users to the earlier instruction before those users are
visited, so chains of duplicates collapse transitively. Literals merge when their bytes, dtype and dims
are equal (``Literal`` equality); a weight is only hashed when another literal has the same shape and
the same sample of its elements, so distinct weights (random, trained) are told apart without reading
them, and the same literal object (the subgraph's weight cache hands one per initializer) never is.
Never merged: parameters, ``@return``, nondeterministic ops, and module-owning instructions unless
their module arguments are the very same modules.
"""

from __future__ import annotations

from collections.abc import Hashable

from ..ir.instruction import Instruction
from ..ir.module import Module
from ..ir.operation import Literal
from .manager import Pass
from .rewrite import replace_value


def _key(ins: Instruction) -> Hashable:
    return (
        type(ins.op),
        ins.op,
        tuple(id(i) for i in ins.inputs),
        tuple(id(mod) for mod in ins.module_args),
        ins.shape,
    )


def _same_op(a: Instruction, b: Instruction) -> bool:
    """Ops already equal as dataclasses may still mean different things: an attribute 0.0 vs -0.0 (pad
    value) or 1 vs 1.0 vs True compare equal as fields; their repr() tells them apart. Asked only of
    instructions whose keys match (most have none to match), not of every instruction."""
    return repr(a.op) == repr(b.op)


SAMPLES = 16  # elements compared before two same-shape literals are hashed whole


def _sample(lit: Literal) -> bytes:
    """A few elements spread over the value: equal literals have equal samples."""
    flat = lit.value.reshape(-1)
    return flat[:: max(1, flat.size // SAMPLES)][:SAMPLES].tobytes()


def eliminate_common_subexpression(m: Module) -> bool:
    seen: dict[Hashable, list[Instruction]] = {}  # key -> one instruction per distinct op repr
    literals: dict[object, list[Instruction]] = {}  # (shape, sample) -> distinct literals with them
    changed = False
    for ins in m:
        if ins.is_param() or ins.is_return() or getattr(ins.op, "nondeterministic", False):
            continue
        if ins.is_literal():
            op: Literal = ins.op  # type: ignore[assignment]
            same = literals.setdefault((ins.shape, _sample(op)), [])
            first = next((lit for lit in same if lit.op is op or lit.op == op), None)
            if first is None:
                same.append(ins)
            elif replace_value(m, ins, first):
                changed = True
            continue
        k = _key(ins)
        same_key = seen.get(k)
        if same_key is None:
            seen[k] = [ins]
            continue
        first = next((f for f in same_key if _same_op(f, ins)), None)
        if first is None:
            same_key.append(ins)
        elif replace_value(m, ins, first):
            changed = True
    return changed


ELIMINATE_COMMON_SUBEXPRESSION = Pass("eliminate_common_subexpression", eliminate_common_subexpression)

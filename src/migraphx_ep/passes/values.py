"""values: what rewrites need to replace a value safely and to read constants through views.

``replace_value`` redirects a value's users only where none of their stored shapes would go stale;
``literal_source``, ``compact_value`` and ``is_splat`` see a constant through the views and copies that
wrap it. Split off ``rewrite.py`` (the pattern engine), which re-exports them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..ir.instruction import Instruction
from ..ir.module import Module
from ..ir.operation import ModuleOp, Op
from ..ir.shape import Shape, ShapeError

# Ops that only select or copy elements, so a splat (all-equal) constant stays a splat through them.
_VALUE_PRESERVING = frozenset({"contiguous", "reshape", "flatten"})


# -- shapes and safe replacement -------------------------------------------------------------------------
def op_shape(o: Op, inputs: Sequence[Instruction], mods: Sequence[Module] = ()) -> Shape | None:
    """The shape ``o`` gives on ``inputs`` (and module args), or None if it rejects them."""
    shapes = [i.shape for i in inputs]
    try:
        if isinstance(o, ModuleOp):
            return o.compute_shape_with_modules(shapes, list(mods))
        return o.compute_shape(shapes)
    except (ShapeError, ValueError, TypeError, IndexError):
        return None


def recompute_shape(ins: Instruction, inputs: Sequence[Instruction]) -> Shape | None:
    """The shape ``ins``'s op would give on ``inputs``, or None if it rejects them."""
    return op_shape(ins.op, inputs, ins.module_args)


def replace_value(m: Module, old: Instruction, new: Instruction, partial: bool = False) -> bool:
    """Redirect every user of ``old`` to ``new`` if no user's shape changes; False (no edit) otherwise.

    ``new`` must compute the same values and come before ``old``'s users. Equal lens and type are
    required; differing strides (a view vs a packed copy) are accepted only where each user's shape is
    unaffected, ``@return`` included: a module's output shapes are its interface (and an ``if``/``loop``
    computed its own shape from them). With ``partial``, the users that can move do, and the rest keep
    reading ``old`` (True if any moved).
    """
    if new is old:
        return False
    if new.shape.lens != old.shape.lens or new.shape.type != old.shape.type:
        return False
    users = list(dict.fromkeys(old.outputs))
    if new.shape != old.shape:
        ok = [u for u in users if recompute_shape(u, [new if i is old else i for i in u.inputs]) == u.shape]
        if len(ok) != len(users) and not partial:
            return False
        users = ok
    for user in users:
        user.replace_inputs([new if i is old else i for i in user.inputs])
    return bool(users)


# -- constants seen through views ------------------------------------------------------------------------
def literal_source(ins: Instruction) -> Instruction | None:
    """The literal that ``ins`` is a view (or plain copy) of, or None."""
    while not ins.is_literal():
        if len(ins.inputs) != 1 or ins.module_args:
            return None
        if ins.op.output_alias([ins.inputs[0].shape]) != 0 and ins.name not in _VALUE_PRESERVING:
            return None
        ins = ins.inputs[0]
    return ins


def compact_value(ins: Instruction) -> np.ndarray | None:
    """A constant's value before its trailing ``multibroadcast``s (small; numpy-broadcastable to ins)."""
    while ins.name == "multibroadcast":
        ins = ins.inputs[0]
    if literal_source(ins) is None:
        return None
    return ins.eval()


def is_splat(ins: Instruction, value: float) -> bool:
    """All elements equal ``value``; for floats the sign of zero must match too (+0.0 is not -0.0)."""
    lit = literal_source(ins)
    if lit is None:
        return False
    arr = lit.op.value  # type: ignore[attr-defined]
    if arr.dtype == np.bool_:
        return False
    flat = arr.reshape(-1)
    if flat.size and not _equal(flat[:1], value):
        return False  # cheap reject before scanning a large weight
    return _equal(flat, value)


def _equal(a: np.ndarray, value: float) -> bool:
    if a.dtype.kind in "iu":
        return bool(np.all(a == value))
    f = a.astype(np.float64)
    return bool(np.all(f == value) and np.all(np.signbit(f) == np.signbit(value)))


__all__ = ["compact_value", "is_splat", "literal_source", "op_shape", "recompute_shape", "replace_value"]

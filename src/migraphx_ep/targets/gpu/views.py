"""What the lowering asks of values it reads: is an instruction a view (a step-free reinterpretation of
its input's buffer), who reads it, and is it a one-element constant (a literal in a kernel's source).
Multi-node fusions are passes (``fuse/``), matched with ``passes/rewrite.py``."""

from __future__ import annotations

import math

from ...ir.instruction import Instruction
from ...ir.shape import Shape

VIEW_OPS = frozenset(
    {
        "transpose",
        "reshape",
        "squeeze",
        "unsqueeze",
        "flatten",
        "slice",
        "step",
        "broadcast",
        "multibroadcast",
    }
)


def is_view(ins: Instruction) -> bool:
    return ins.name in VIEW_OPS and ins.op.output_alias([a.shape for a in ins.inputs]) == 0


def only_user(ins: Instruction) -> Instruction | None:
    """The single instruction reading ``ins`` (it may read it twice), or None."""
    users = {id(u): u for u in ins.outputs}
    return next(iter(users.values())) if len(users) == 1 else None


def strip_views(ins: Instruction) -> Instruction:
    while is_view(ins):
        ins = ins.inputs[0]
    return ins


def scalar_value(ins: Instruction) -> float | None:
    """The value of a one-element literal seen through views (a broadcast constant), else None."""
    base = strip_views(ins)
    if base.is_literal():
        v = base.op.value  # type: ignore[attr-defined]
        if v.size == 1:
            return v.reshape(()).item()
    return None


def reshape_strides(
    lens: tuple[int, ...], strides: tuple[int, ...], new: tuple[int, ...]
) -> tuple[int, ...] | None:
    """Strides that view a (lens, strides) buffer at dims ``new`` in row-major order without moving an
    element, or None where the reshape needs a copy (numpy's no-copy reshape rule: each group of old
    dims that merges into new ones must itself be contiguous). A head split of a strided QKV slice
    (GPT-2's [S, 3E] -> [S, H, D] per Q, K, V) is such a view; a merge across a transpose is not."""
    if 0 in lens or 0 in new or math.prod(lens) != math.prod(new):
        return None
    old = [(n, s) for n, s in zip(lens, strides, strict=True) if n != 1]
    out = [0] * len(new)
    oi = ni = 0
    while ni < len(new) and oi < len(old):
        oj, nj = oi + 1, ni + 1
        op_, np_ = old[oi][0], new[ni]
        while np_ != op_:
            if np_ < op_:
                np_ *= new[nj]
                nj += 1
            else:
                op_ *= old[oj][0]
                oj += 1
        if any(old[k][1] != old[k + 1][0] * old[k + 1][1] for k in range(oi, oj - 1)):
            return None  # the old dims of this group are not one contiguous run
        out[nj - 1] = old[oj - 1][1]
        for k in range(nj - 1, ni, -1):
            out[k - 1] = out[k] * new[k]
        ni, oi = nj, oj
    last = out[ni - 1] if ni else 1
    for k in range(ni, len(new)):
        out[k] = last  # trailing ones of the new dims
    return tuple(out)


def strided_reshape(s: Shape, lens: tuple[int, ...]) -> Shape | None:
    """``s`` reshaped to ``lens`` as a view of the same elements (``reshape_strides``), or None."""
    strides = reshape_strides(s.lens, s.strides, tuple(lens))
    return None if strides is None else Shape(s.type, lens, strides)

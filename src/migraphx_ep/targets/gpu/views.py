"""What the lowering asks of values it reads: is an instruction a view (a step-free reinterpretation of
its input's buffer), who reads it, and is it a one-element constant (a literal in a kernel's source).
Multi-node fusions are passes (``fuse/``), matched with ``passes/rewrite.py``."""

from __future__ import annotations

from ...ir.instruction import Instruction

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

"""Fusion patterns found in the IR before lowering: each one turns several instructions into one step.

* gemm epilogue: ``dot`` + bias row vector (+ a residual of the output's dims) becomes one cuBLASLt call.
* conv epilogue: ``convolution`` + per-channel bias (+ residual) (+ relu) becomes one cuDNN call.

Every matcher checks that each inner value has no user outside the group, so fusing never drops a value
something else still reads. The group's step runs at the position of its last instruction.
"""

from __future__ import annotations

from dataclasses import dataclass, field

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


def _other(ins: Instruction, one: Instruction) -> Instruction | None:
    a, b = ins.inputs
    if a is one:
        return b
    if b is one:
        return a
    return None


def _view_of(ins: Instruction, target: Instruction) -> bool:
    return strip_views(ins) is target


@dataclass
class Group:
    kind: str  # 'gemm' | 'conv'
    root: Instruction  # the last instruction: the group's value
    covered: list[Instruction] = field(default_factory=list)  # instructions folded in (root included)
    args: dict = field(default_factory=dict)


# -- gemm and conv epilogues -------------------------------------------------------------------------------
def _bias_along(v: Instruction, axis: int, out: Instruction) -> bool:
    """``v`` broadcasts a contiguous vector along ``axis`` of ``out``'s dims."""
    s = v.shape
    if s.lens != out.shape.lens or s.type != out.shape.type:
        return False
    return all((st == 0) if i != axis else (st == 1 or s.lens[i] == 1) for i, st in enumerate(s.strides))


def _residual(v: Instruction, out: Instruction) -> bool:
    return v.shape.lens == out.shape.lens and v.shape.type == out.shape.type and v.shape.standard()


def _epilogue(g: Group, axis: int, relu: bool) -> Group | None:
    """Extend ``g`` (a product) with ``+ bias`` broadcast along ``axis``, then ``+ residual``, then
    (where the library has it) relu: each only if it is the sole reader of the value before it."""
    head = g.root
    u = only_user(head)
    if u is not None and u.name == "add" and u.inputs[0] is not u.inputs[1]:
        b = _other(u, head)
        if b is not None and _bias_along(b, axis, head):
            g.args["bias"], g.root = b, u
            g.covered.append(u)
            u = only_user(u)
    if u is not None and u.name == "add" and u.inputs[0] is not u.inputs[1]:
        r = _other(u, g.root)
        if r is not None and _residual(r, head):
            g.args["residual"], g.root = r, u
            g.covered.append(u)
            u = only_user(u)
    if relu and u is not None and u.name == "relu":
        g.args["relu"], g.root = True, u
        g.covered.append(u)
    return g if len(g.covered) > 1 else None


def match_conv(conv: Instruction) -> Group | None:
    g = Group("conv", conv, [conv], {"bias": None, "residual": None, "relu": False})
    return _epilogue(g, 1, relu=True)

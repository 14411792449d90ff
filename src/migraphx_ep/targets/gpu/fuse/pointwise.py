"""fuse_pointwise: each chain of elementwise instructions becomes one ``fused_pointwise`` instruction that
owns it (STYLE §6), lowered to one generated kernel (``kernels/pointwise.py``); MIGraphX's
``fuse_pointwise``.

A pointwise instruction (an op with a device expression, ``kernels.POINTWISE_OPS``, on types the kernel
generator takes) joins its reader's kernel when that reader is its only one and is pointwise too; a
pointwise instruction nothing absorbs is a root, and its group is the tree of absorbed instructions under
it. So GELU's seven ops are one kernel, and a value read twice (a residual, a mean) is computed once.

The body reads one-element constants (seen through broadcasts) as literals, which the kernel source
carries; every other value the group reads is a parameter, in the order a depth-first walk from the root
meets them (the kernel's argument order). A root absorbing nothing stays as it is: one op is one kernel
already. The pass runs last among the fusions, on what the library epilogues, layernorm and attention
left; a fused op's body is left alone (its chain is its meaning).
"""

from __future__ import annotations

from ....ir.instruction import Instruction
from ....ir.module import Module
from ....ops.fused import FusedPointwise
from ....passes.manager import Pass
from .. import kernels as K
from ..views import only_user, scalar_value
from .body import body_name, body_names, copy_chain, is_body


def is_pointwise(ins: Instruction) -> bool:
    """An elementwise instruction one generated kernel computes (the op's ``cpp``, on these types)."""
    if ins.name not in K.POINTWISE_OPS or ins.module_args:
        return False
    return K.pointwise_supported(ins.op, [a.shape.type for a in ins.inputs]) is None


def pointwise_groups(m: Module) -> dict[int, list[Instruction]]:
    """Each root's group (keyed by ``id(root)``): the pointwise instructions its kernel computes, in
    module order, the root last. Every pointwise instruction of ``m`` is in exactly one group."""
    pointwise = {id(ins) for ins in m.instructions if is_pointwise(ins)}  # asked once per instruction
    absorbed: dict[int, Instruction] = {}  # id -> the reader whose kernel computes it
    for ins in m.instructions:
        u = only_user(ins) if id(ins) in pointwise else None
        if u is not None and id(u) in pointwise:
            absorbed[id(ins)] = u
    groups: dict[int, list[Instruction]] = {}
    for ins in m.instructions:  # module order: a group's members come before its root
        if id(ins) not in pointwise:
            continue
        root = ins
        while id(root) in absorbed:
            root = absorbed[id(root)]
        groups.setdefault(id(root), []).append(ins)
    return groups


def group_inputs(group: list[Instruction]) -> list[Instruction]:
    """The values ``group`` reads from outside that are not one-element constants, in the order a
    depth-first walk from its root (the last member) meets them."""
    inside = {id(i) for i in group}
    seen: dict[int, Instruction] = {}

    def walk(ins: Instruction) -> None:
        for a in ins.inputs:
            if id(a) in inside:
                walk(a)
            elif scalar_value(a) is None:
                seen.setdefault(id(a), a)

    walk(group[-1])
    return list(seen.values())


def fuse_pointwise(m: Module) -> bool:
    if is_body(m):
        return False
    changed = False
    used = body_names(m)  # this loop only adds bodies: the names are kept, not rescanned per group
    for group in pointwise_groups(m).values():
        root = group[-1]
        if len(group) < 2 or not root.shape.standard():
            continue
        inputs = group_inputs(group)
        params = [(f"x{i}", x) for i, x in enumerate(inputs)]
        body = copy_chain(body_name(m, FusedPointwise.name, used), params, group)
        fused = m.insert_instruction(root, FusedPointwise(), inputs, [body])
        m.replace_all_uses(root, fused)
        changed = True
    return changed


FUSE_POINTWISE = Pass("fuse_pointwise", fuse_pointwise)

__all__ = ["FUSE_POINTWISE", "fuse_pointwise", "group_inputs", "is_pointwise", "pointwise_groups"]

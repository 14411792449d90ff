"""What the gpu target's fusion passes share: the body a fused instruction owns (the matched chain copied
into a submodule, STYLE §6), its name, and the guard that lets the largest match win.

Passes sweep the module forward (``apply_rules``), so the first root a pattern meets is the innermost
one (a GEMM's bias add before the residual add reading it); a rule whose match its only reader would
extend refuses there (``reader_extends``), and the sweep fuses at that reader instead.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from ....ir.instruction import Instruction
from ....ir.module import Module
from ....ir.operation import Op
from ....passes.rewrite import Builder, Pattern, literal_source, once

Check = Callable[[Builder], "str | None"]  # a reason not to fuse, or None
MARK = ":fused_"  # in every body's name: ``{parent}:{op name}{n}``


def is_body(m: Module) -> bool:
    """``m`` is a fused instruction's body: the chain itself, not a use of it (passes leave it alone)."""
    return MARK in m.name


def body_names(m: Module) -> set[str]:
    """The names of the modules ``m``'s instructions own."""
    # Asked once per fused op, over the whole module: skip the (most) instructions that own no module
    # before starting an inner loop (a third of the time on BERT-base's ~2,000 instructions).
    return {sub.name for ins in m.instructions if ins.module_args for sub in ins.module_args}


def body_name(m: Module, kind: str, used: set[str] | None = None) -> str:
    """A name for a new body of op ``kind`` owned by an instruction of ``m``, unused among ``m``'s.
    ``used``: ``body_names(m)``, kept by a caller that only adds fused ops (the name is added to it)."""
    names = body_names(m) if used is None else used
    n = 0
    while f"{m.name}:{kind}{n}" in names:
        n += 1
    if used is not None:
        used.add(f"{m.name}:{kind}{n}")
    return f"{m.name}:{kind}{n}"


def _copy_constant(sub: Module, ins: Instruction, mapping: dict[int, Instruction]) -> Instruction:
    """``ins`` (a literal or a view of one) rebuilt in ``sub``."""
    if id(ins) not in mapping:
        if ins.is_literal():
            mapping[id(ins)] = sub.add_literal(ins.op)  # type: ignore[arg-type]
        else:
            args = [_copy_constant(sub, a, mapping) for a in ins.inputs]
            mapping[id(ins)] = sub.add_instruction(ins.op, args)
    return mapping[id(ins)]


def copy_chain(
    name: str, params: Iterable[tuple[str, Instruction]], chain: Iterable[Instruction | None]
) -> Module:
    """The matched ``chain`` (inputs first; None entries skipped), copied: a parameter per named input,
    constants it reads rebuilt inside, its last instruction returned."""
    sub = Module(name)
    mapping: dict[int, Instruction] = {}
    for pname, x in params:
        mapping[id(x)] = sub.add_parameter(pname, x.shape)
    last = None
    for ins in chain:
        if ins is None:
            continue
        args = []
        for a in ins.inputs:
            if id(a) not in mapping and literal_source(a) is None:
                raise ValueError(f"{name}: {a.name} is neither an input of the fused op nor a constant")
            args.append(mapping[id(a)] if id(a) in mapping else _copy_constant(sub, a, mapping))
        last = mapping[id(ins)] = sub.add_instruction(ins.op, args)
    assert last is not None, "an empty chain"
    sub.add_return([last])
    return sub


def insert_fused(
    r: Builder, fused_op: Op, params: Sequence[tuple[str, Instruction]], chain: Iterable[Instruction | None]
) -> Instruction:
    """``fused_op`` on the ``params`` (name, value) before the root, owning a copy of ``chain``."""
    m = r.root.module
    assert m is not None
    body = copy_chain(body_name(m, fused_op.name), params, chain)
    fused = m.insert_instruction(r.root, fused_op, [x for _, x in params], [body])
    r.created.append(fused)  # removed again if the replacement is refused
    return fused


def reader_extends(pattern: Pattern, chain: Sequence[str], fits: Check, ins: Instruction) -> bool:
    """``ins``'s only reader is the root of a match of ``pattern`` that takes ``ins`` into its chain
    (binds it to one of the ``chain`` names, not as an input) and ``fits`` (returns no reason against
    it): fusing at ``ins`` would cut that larger match short. ``fits`` is the rule's check without this
    guard (the reader may in turn leave the root to its own reader)."""
    if not once(ins):
        return False
    u = ins.outputs[0]
    m = u.module
    if m is None or u.is_return():
        return False
    b = pattern.match(u, {})
    if b is None or not any(b.get(n) is ins for n in chain):
        return False
    return not fits(Builder(m, u, b))


def chain_inputs_outside(chain: Iterable[Instruction | None], inputs: Iterable[Instruction | None]) -> bool:
    """No input of the fused op is one of the chain's own instructions (``add(x, x)`` binds x twice)."""
    inner = {id(i) for i in chain if i is not None}
    return not any(x is not None and id(x) in inner for x in inputs)


def body_op(ins: Instruction, name: str) -> Op:
    """The op of the (first) ``name`` instruction in the body of the fused instruction ``ins``."""
    return next(i.op for i in ins.module_args[0].instructions if i.name == name)


__all__ = [
    "MARK",
    "body_name",
    "body_op",
    "body_names",
    "chain_inputs_outside",
    "copy_chain",
    "insert_fused",
    "is_body",
    "reader_extends",
]

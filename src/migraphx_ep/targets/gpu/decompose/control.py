"""scan unrolled: one copy of its body per iteration, inlined into the enclosing module.

A compiled program has static shapes, so a Scan's iteration count is its scan inputs' length, known
when it compiles. Unrolled, the body's instructions are ordinary instructions the gpu target lowers (and
fuses across iterations) like any other; the ref target keeps ``ops/control.py``'s loop as the oracle.
Iteration ``t`` reads slice ``t`` of each scan input (``n - 1 - t`` for a reversed one) as a view; scan
outputs are each iteration's value given a size-1 axis and concatenated (in reverse for a reversed one).

Not unrolled (the node stays with ORT's CPU EP, with the reason): a body that owns control flow of its
own, zero iterations, and more than ``MAX_UNROLLED`` instructions in all -- each would be a launch of
its own, and a compile's Python cost grows with them.
"""

from __future__ import annotations

from ....ir.instruction import Instruction
from ....ir.module import Module
from ..kernels.spec import Unsupported
from .builder import Builder

# Body instructions times iterations: a 3-instruction body over 1,000 steps, a 40-instruction one over
# 100. Beyond it a Scan stays on the host, where its loop costs no compile.
MAX_UNROLLED = 4096
FAN_IN = 32


def _check_unrollable(ins: Instruction) -> tuple[Module, int]:
    """The body and the iteration count, or ``Unsupported`` naming why the scan is not unrolled."""
    (body,) = ins.module_args
    op = ins.op
    n = op._length([a.shape for a in ins.inputs])  # type: ignore[attr-defined]
    if n == 0:
        raise Unsupported("scan: zero iterations")
    nested = next((i for i in body.instructions if i.module_args), None)
    if nested is not None:
        raise Unsupported(f"scan: its body holds {nested.name}, control flow of its own")
    size = sum(1 for i in body.instructions if not (i.is_param() or i.is_literal() or i.is_return()))
    if n * size > MAX_UNROLLED:
        raise Unsupported(
            f"scan: {n} iterations of a {size}-instruction body exceed {MAX_UNROLLED} unrolled instructions"
        )
    return body, n


def decompose_scan(b: Builder, ins: Instruction) -> list[Instruction]:
    body, n = _check_unrollable(ins)
    op = ins.op
    n_state, k = op.num_state, op.num_scan_inputs  # type: ignore[attr-defined]
    args = ins.inputs
    states = list(args[:n_state])
    scan_in = args[n_state : n_state + k]
    outer = list(args[n_state + k :])
    literals: dict[int, Instruction] = {}  # a body literal is added to the module once, not per iteration
    per_output: list[list[Instruction]] = []
    for t in range(n):
        slices = []
        for x, axis, reverse in zip(
            scan_in,
            op.scan_input_axes,  # type: ignore[attr-defined]
            op.scan_input_directions,  # type: ignore[attr-defined]
            strict=True,
        ):
            i = n - 1 - t if reverse else t
            part = b.add("slice", x, axes=(axis,), starts=(i,), ends=(i + 1,))
            slices.append(b.add("squeeze", part, axes=(axis,)))
        outs = _inline(b, body, [*states, *slices, *outer], literals)
        states = outs[:n_state]
        per_output.append(outs[n_state:])
    results = list(states)
    for j, (axis, reverse) in enumerate(
        zip(op.scan_output_axes, op.scan_output_directions, strict=True)  # type: ignore[attr-defined]
    ):
        values = [outs[j] for outs in per_output]
        if reverse:
            values.reverse()
        results.append(_concat(b, [b.add("unsqueeze", v, axes=(axis,)) for v in values], axis))
    return results


def _concat(b: Builder, parts: list[Instruction], axis: int) -> Instruction:
    """``parts`` concatenated along ``axis``, at most ``FAN_IN`` per concat (a kernel takes a pointer
    and a branch per input: a thousand of them would strain its parameter space and its compile)."""
    while len(parts) > 1:
        parts = [
            group[0] if len(group) == 1 else b.add("concat", *group, axis=axis)
            for group in (parts[i : i + FAN_IN] for i in range(0, len(parts), FAN_IN))
        ]
    return parts[0]


def _inline(b: Builder, body: Module, feeds: list[Instruction], literals: dict[int, Instruction]) -> list:
    """Copy ``body``'s instructions before ``b.at`` with its parameters (in module order) bound to
    ``feeds``; its return's values."""
    params = body.get_parameters()
    if len(params) != len(feeds):
        raise Unsupported(f"scan: body {body.name!r} takes {len(params)} parameters, given {len(feeds)}")
    value = {id(p): f for p, f in zip(params, feeds, strict=True)}
    for i in body.instructions:
        if i.is_param():
            continue
        if i.is_literal():
            if id(i) not in literals:
                literals[id(i)] = b.m.add_literal(i.op)  # type: ignore[arg-type]
            value[id(i)] = literals[id(i)]
        elif i.is_return():
            return [value[id(a)] for a in i.inputs]
        else:
            value[id(i)] = b.m.insert_instruction(b.at, i.op, [value[id(a)] for a in i.inputs])
    raise Unsupported(f"scan: body {body.name!r} has no return")

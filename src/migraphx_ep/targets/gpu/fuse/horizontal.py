"""fuse_horizontal_dots: products of one activation with several weight matrices become one product with
their concatenation, sliced back apart (MIGraphX's horizontal dot fusion in ``simplify_algebra``).

BERT projects each layer's hidden states three times, into Q, K and V: three 768 x 768 GEMMs of 3.8 µs
each at batch 1 on an H100, where one 768 x 2304 GEMM takes 4.3 (GPT-2's exported QKV already is one).
Here ``dot(x, W_i)`` (``+ b_i``) for weights ``W_i`` of one type and inner size become
``dot(x, concat(W_i)) (+ concat(b_i))`` and a slice of the last axis per old result. The concatenations
are of weights alone: ``propagate_constant`` folds them once per subgraph (the ``WeightCache`` keys them
by their sources), so the pass runs before the shared simplifications. The slices are views: the
attention fusion reads its heads through them, as it does GPT-2's.

Each column is the same dot product as before; only the library's choice of algorithm for the wider
GEMM may order its sums differently, so the gpu target runs this and the ref, the oracle, does not.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable

import numpy as np

from ....ir.instruction import Instruction
from ....ir.module import Module
from ....ir.operation import make_op
from ....ir.weights import WeightCache
from ....passes.manager import Pass
from ....passes.rewrite import replace_value


def _weight(w: Instruction) -> Instruction | None:
    """The 2-D weight literal [K, N] a product's right operand is (or is broadcast from)."""
    base = w.inputs[0] if w.name == "multibroadcast" else w
    if base.name != "@literal" or base.shape.ndim() != 2 or not base.shape.standard():
        return None
    if w is not base and (w.shape.strides[-2:] != base.shape.strides or any(w.shape.strides[:-2])):
        return None  # not the same matrix for every batch
    return base


def _bias(product: Instruction) -> tuple[Instruction, Instruction] | None:
    """(the add, its bias literal [N]) when the product's one user adds a bias row along the last axis."""
    if len(product.outputs) != 1 or product.outputs[0].name != "add":
        return None
    add = product.outputs[0]
    other = [a for a in add.inputs if a is not product]
    if len(other) != 1 or other[0].name != "multibroadcast":
        return None
    lit = other[0].inputs[0]
    n = product.shape.lens[-1]
    if lit.name != "@literal" or lit.shape.lens not in ((n,), (1, n)) or not lit.shape.standard():
        return None
    if lit.shape.type != product.shape.type:
        return None
    return add, lit


def _members(x: Instruction) -> dict[Hashable, list[tuple[Instruction, Instruction, tuple | None]]]:
    """The products of ``x`` by weights, grouped by what one concatenation needs equal."""
    groups: dict[Hashable, list[tuple[Instruction, Instruction, tuple | None]]] = defaultdict(list)
    for user in dict.fromkeys(x.outputs):
        if user.name != "dot" or user.inputs[0] is not x or user.inputs[1] is x:
            continue
        w = _weight(user.inputs[1])
        if w is None:
            continue
        bias = _bias(user)
        key = (user.shape.type, w.shape.type, user.inputs[1].shape.lens[:-1], bias is not None)
        groups[key].append((user, w, bias))
    return groups


def _joined(
    m: Module, parts: list[Instruction], axis: int, cache: WeightCache | None, before: Instruction
) -> Instruction:
    """The literals ``parts`` (2-D, or rows [N] / [1, N] with ``axis`` 0) side by side, as one literal.

    With the subgraph's ``WeightCache`` the concatenation is one derived weight for every compile of
    the subgraph (a new input shape uploads nothing for it); without, the pass leaves a ``concat`` of
    the literals before ``before`` for ``propagate_constant`` to fold."""
    if cache is None:
        row = make_op("reshape", dims=[-1])
        flat = [p if axis or p.shape.ndim() == 1 else m.insert_instruction(before, row, [p]) for p in parts]
        return m.insert_instruction(before, make_op("concat", axis=axis), flat)
    values = [p.op.value if axis else p.op.value.reshape(-1) for p in parts]  # type: ignore[attr-defined]
    what = ("horizontal concat", axis)
    return m.add_literal(cache.derive(what, [p.op for p in parts], lambda: np.concatenate(values, axis)))  # type: ignore[misc]


def _fuse(
    m: Module,
    x: Instruction,
    members: list[tuple[Instruction, Instruction, tuple | None]],
    cache: WeightCache | None,
) -> None:
    order = {id(i): k for k, i in enumerate(m.instructions)}
    members.sort(key=lambda t: order[id(t[0])])
    first = members[0][0]
    rhs = first.inputs[1]
    total = sum(w.shape.lens[1] for _, w, _ in members)
    weights = _joined(m, [w for _, w, _ in members], 1, cache, first)
    if rhs is not members[0][1]:  # broadcast over the batch dims, as each product's weight was
        out_lens = [*rhs.shape.lens[:-1], total]
        weights = m.insert_instruction(first, make_op("multibroadcast", out_lens=out_lens), [weights])
    out = m.insert_instruction(first, make_op("dot"), [x, weights])
    if members[0][2] is not None:
        bias = _joined(m, [b[1] for _, _, b in members], 0, cache, first)  # type: ignore[index]
        wide = m.insert_instruction(first, make_op("multibroadcast", out_lens=list(out.shape.lens)), [bias])
        out = m.insert_instruction(first, make_op("add"), [out, wide])
    last, start = out.shape.ndim() - 1, 0
    for product, w, bias in members:
        n = w.shape.lens[1]
        cut = make_op("slice", axes=[last], starts=[start], ends=[start + n])
        part = m.insert_instruction(first, cut, [out])
        old = bias[0] if bias is not None else product
        replace_value(m, old, part, partial=True)
        if old.outputs:  # users whose shape a strided view would change (a return): a packed copy
            m.replace_all_uses(old, m.insert_instruction(first, make_op("contiguous"), [part]))
        start += n


def fuse_horizontal_dots(m: Module, weights: WeightCache | None = None) -> bool:
    """``weights``: the subgraph's cache of weight-only results, which then holds the concatenations."""
    changed = False
    for x in list(m.instructions):
        if len(x.outputs) < 2:
            continue
        for members in _members(x).values():
            if len(members) > 1:
                _fuse(m, x, members, weights)
                changed = True
    return changed


FUSE_HORIZONTAL_DOTS = Pass("fuse_horizontal_dots", fuse_horizontal_dots)

__all__ = ["FUSE_HORIZONTAL_DOTS", "fuse_horizontal_dots"]

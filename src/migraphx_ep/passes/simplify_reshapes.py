"""simplify_reshapes: collapse chains of views and layout ops (transposes, reshapes, broadcasts, copies).

Every rule is exact: views only reorder, drop or repeat elements, and each rewrite reads the same
elements in the same logical order. ``reshape``/``squeeze``/``unsqueeze``/``flatten`` all keep row-major
order, so any chain of them is one ``reshape`` to the final dims.
"""

from __future__ import annotations

from ..ir.instruction import Instruction
from ..ir.module import Module
from .manager import Pass
from .rewrite import Builder, Rule, apply_rules, op, rule, var

x = var("x")

RESHAPERS = ("reshape", "squeeze", "unsqueeze", "flatten")
# Views reading elements by shape strides from the input's own start, so an output shape equal to the
# input shape (lens and strides) reads exactly the input: identity transposes, broadcasts to the same
# dims, full-range slices, no-op squeezes... (a slice with equal dims starts at 0).
VIEWS = ("transpose", "multibroadcast", "broadcast", "slice", "step", *RESHAPERS)


def _same_lens(r: Builder) -> bool:
    return r.v.shape.lens == r.x.shape.lens


def _still_a_view(r: Builder) -> bool:
    """One reshape of x is a view when x is standard; otherwise only replace a chain that copies anyway."""
    return r.x.shape.standard() or r.v.op.output_alias([r.inner.shape]) < 0


def _transpose_pair(r: Builder) -> Instruction:
    """transpose(transpose(x, p1), p2) reads x dim p1[p2[i]] as output dim i."""
    p1, p2 = r.t1.op.permutation, r.v.op.permutation
    perm = tuple(p1[p] for p in p2)
    return r.x if perm == tuple(range(len(perm))) else r.op("transpose", r.x, permutation=perm)


RULES: list[Rule] = [
    rule(op(VIEWS, x, bind="v"), lambda r: r.x, when=lambda r: r.v.shape == r.x.shape),  # view(x) == x -> x
    rule(op(RESHAPERS, x, bind="v"), lambda r: r.x, when=_same_lens),  # reshape(x) to x's dims -> x
    rule(op("transpose", op("transpose", x, bind="t1"), bind="v"), _transpose_pair),  # transpose(transpose)
    rule(
        op(RESHAPERS, op(RESHAPERS, x, bind="inner"), bind="v"),  # reshape chain back to x's dims -> x
        lambda r: r.x,
        when=_same_lens,
    ),
    rule(
        op(RESHAPERS, op(RESHAPERS, x, bind="inner"), bind="v"),  # reshape∘reshape -> reshape
        lambda r: r.op("reshape", r.x, dims=r.v.shape.lens),
        when=_still_a_view,
    ),
    rule(op("contiguous", x), lambda r: r.x, when=lambda r: r.x.shape.standard()),  # contiguous(std x) -> x
    rule(
        op("multibroadcast", op("multibroadcast", x), bind="v"),  # multibroadcast∘multibroadcast -> one
        lambda r: r.op("multibroadcast", r.x, out_lens=r.v.shape.lens),
    ),
]


def simplify_reshapes(m: Module) -> bool:
    return apply_rules(m, RULES)


SIMPLIFY_RESHAPES = Pass("simplify_reshapes", simplify_reshapes)

"""einsum as transposes, reductions and batched GEMMs; lrn as pointwise ops over shifted views
(``ops/nn.py`` is the meaning).

einsum contracts its operands left to right, each pair as one ``dot`` of (batch, M, K) x (batch, K, N),
in the ref's accumulation type (float32 for half/bf16, the type itself otherwise: integers wrap, which
is the same ring whatever the grouping); a repeated label in one term reads the diagonal by a gather.
"""

from __future__ import annotations

import math

import numpy as np

from ....ir.dtypes import DType, from_numpy, to_numpy
from ....ir.instruction import Instruction
from ....ops.nn import acc_dtype
from ..kernels.spec import Unsupported
from .builder import Builder

Term = tuple[Instruction, list[str]]


def _labels(equation: str, ranks: list[int]) -> tuple[list[list[str]], list[str]]:
    """Each term's labels with '...' spelled out as digits (right-aligned), and the output's."""
    lhs, rhs = equation.replace(" ", "").split("->")
    terms = lhs.split(",")
    n_ell = max((r - len(t.replace("...", "")) for t, r in zip(terms, ranks, strict=True)), default=0)
    ell = [str(k) for k in range(n_ell)]

    def spell(term: str, rank: int) -> list[str]:
        pre, dots, post = term.partition("...")
        k = rank - len(pre) - len(post) if dots else 0
        return list(pre) + ell[n_ell - k :] + list(post)

    out = spell(rhs, len(rhs.replace("...", "")) + n_ell)
    return [spell(t, r) for t, r in zip(terms, ranks, strict=True)], out


def _diagonal(b: Builder, x: Instruction, labels: list[str]) -> Term:
    """Repeated labels read once: x[.., i, .., i, ..] -> x[.., i, ..] (a gather of the flattened pair)."""
    while len(set(labels)) < len(labels):
        lab = next(ch for ch in labels if labels.count(ch) > 1)
        p, q = _two(labels, lab)
        rest = [k for k in range(len(labels)) if k not in (p, q)]
        xt = b.transpose(x, rest + [p, q])
        n = x.shape.lens[p]
        flat = b.reshape(xt, [x.shape.lens[k] for k in rest] + [n * n])
        idx = b.literal(np.arange(n, dtype=np.int64) * (n + 1), DType.int64_type)
        x = b.add("gather", flat, idx, axis=len(rest))
        labels = [labels[k] for k in rest] + [lab]
    return x, labels


def _two(labels: list[str], lab: str) -> tuple[int, int]:
    p = labels.index(lab)
    return p, labels.index(lab, p + 1)


def _sum_out(b: Builder, term: Term, drop: set[str]) -> Term:
    x, labels = term
    axes = [k for k, ch in enumerate(labels) if ch in drop]
    if not axes:
        return term
    return b.reduce("reduce_sum", x, axes, keep=False), [ch for ch in labels if ch not in drop]


def _contract(b: Builder, a: Term, c: Term, keep: set[str]) -> Term:
    """The product of two terms, summed over shared labels not in ``keep``."""
    a = _sum_out(b, a, {ch for ch in a[1] if ch not in c[1] and ch not in keep})
    c = _sum_out(b, c, {ch for ch in c[1] if ch not in a[1] and ch not in keep})
    (x, la), (y, lc) = a, c
    size = {**dict(zip(lc, y.shape.lens, strict=True)), **dict(zip(la, x.shape.lens, strict=True))}
    for ch in set(la) & set(lc):
        if x.shape.lens[la.index(ch)] != y.shape.lens[lc.index(ch)]:
            raise Unsupported("einsum: a label broadcasts between operands")
    batch = [ch for ch in la if ch in lc and ch in keep]
    inner = [ch for ch in la if ch in lc and ch not in keep]
    left = [ch for ch in la if ch not in lc]
    right = [ch for ch in lc if ch not in la]

    def prod(chs: list[str]) -> int:
        return math.prod(size[ch] for ch in chs)

    xm = b.transpose(x, [la.index(ch) for ch in batch + left + inner])
    ym = b.transpose(y, [lc.index(ch) for ch in batch + inner + right])
    xm = b.reshape(xm, [prod(batch), prod(left), prod(inner)])
    ym = b.reshape(ym, [prod(batch), prod(inner), prod(right)])
    r = b.add("dot", xm, ym)
    labels = batch + left + right
    return b.reshape(r, [size[ch] for ch in labels]), labels


def decompose_einsum(b: Builder, ins: Instruction) -> Instruction:
    terms, out = _labels(ins.op.equation, [a.shape.ndim() for a in ins.inputs])  # type: ignore[attr-defined]
    acc = acc_dtype_of(ins.shape.type)
    ops = [_diagonal(b, b.convert(a, acc), t) for a, t in zip(ins.inputs, terms, strict=True)]
    cur = ops[0]
    for k, nxt in enumerate(ops[1:], start=1):
        later = {ch for _, lab in ops[k + 1 :] for ch in lab} | set(out)
        cur = _contract(b, cur, nxt, later)
    x, labels = _sum_out(b, cur, {ch for ch in cur[1] if ch not in out})
    x = b.transpose(x, [labels.index(ch) for ch in out])
    return b.convert(x, ins.shape.type)


def acc_dtype_of(t: DType) -> DType:
    """The ref's accumulation type for ``t`` (``ops.nn.acc_dtype``)."""
    return from_numpy(acc_dtype(to_numpy(t)))


def decompose_lrn(b: Builder, ins: Instruction) -> Instruction:
    # y = x / (bias + alpha/size * sum of x^2 over a channel window) ** beta, in float32 (or double);
    # the window sum adds `size` shifted views of the zero-padded squares (one fused kernel).
    op = ins.op
    x = ins.inputs[0]
    acc = acc_dtype_of(x.shape.type)
    xa = b.convert(x, acc)
    c, rank = x.shape.lens[1], x.shape.ndim()
    lo, hi = (op.size - 1) // 2, -(-(op.size - 1) // 2)  # type: ignore[attr-defined]
    pads = [0] * (2 * rank)
    pads[1], pads[rank + 1] = lo, hi
    sq = b.add("pad", b.pw("mul", xa, xa), pads=pads)
    win = b.add("slice", sq, axes=[1], starts=[0], ends=[c])
    for k in range(1, op.size):  # type: ignore[attr-defined]
        win = b.pw("add", win, b.add("slice", sq, axes=[1], starts=[k], ends=[k + c]))
    scale = float(np.float64(op.alpha) / op.size)  # type: ignore[attr-defined]
    den = b.pw("pow", b.pw("add", b.pw("mul", win, scale), op.bias), op.beta)  # type: ignore[attr-defined]
    return b.convert(b.pw("div", xa, den), ins.shape.type)

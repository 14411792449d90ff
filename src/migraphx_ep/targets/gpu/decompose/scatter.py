"""Scatters (ScatterElements, ScatterND, each with reduction none/add/mul/max/min, and MaxUnpool) as
dense compare-and-reduce (``ops/data.py``, ``ops/sampling.py`` are the meaning); TensorScatter as one
gather_elements (``ops/layout.py``).

Every output position compares itself with every index that could land on it (for ScatterElements only
those along the axis), so the work is outputs x candidates: small scatters only (``DENSE_LIMIT``).
* none: the last update landing on a position wins (the ref's "later updates win"): the largest
  matching update number, then one gather;
* add/mul/max/min: the matching updates reduced (non-matching ones are the reduction's identity), then
  combined with the data. Sums and products regroup the ref's sequential ``ufunc.at`` (rounding only);
  max/min keep its NaN rule: the IR's reductions skip NaN, so a matching NaN is found separately.
Indices are normalised by a gather from ``arange(dim)``: it raises IndexError out of range, as the ref.
"""

from __future__ import annotations

import math

import numpy as np

from ....ir.dtypes import DType, to_numpy
from ....ir.instruction import Instruction
from ..kernels.spec import Unsupported
from .builder import Builder

DENSE_LIMIT = 1 << 24  # elements of the largest compare-and-reduce intermediate
_REDUCE = {"add": ("reduce_sum", "add"), "mul": ("reduce_prod", "mul"), "max": ("reduce_max", "max"),
           "min": ("reduce_min", "min")}  # fmt: skip
I64 = DType.int64_type


def _reduction(ins: Instruction) -> str:
    return ins.name.split("_", 1)[1]


def _identity(red: str, t: DType) -> float | int | bool:
    dt = to_numpy(t)
    if red in ("add", "mul"):
        return 0 if red == "add" else 1
    if dt.kind == "b":
        return red == "min"
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return int(info.min if red == "max" else info.max)
    return float("-inf") if red == "max" else float("inf")


def _normalized(b: Builder, idx: Instruction, dim: int) -> Instruction:
    if dim == 0:
        raise Unsupported("scatter into an empty axis")
    return b.add("gather", b.literal(np.arange(dim), I64), idx, axis=0)


def _iota(b: Builder, n: int, axis: int, rank: int) -> Instruction:
    lens = [1] * rank
    lens[axis] = n
    return b.literal(np.arange(n).reshape(lens), I64)


def _combine(b: Builder, red: str, data: Instruction, upd: Instruction, match: Instruction, axis: int):  # noqa: ANN202
    """data combined with the matching updates reduced over ``axis`` (which ``data`` lacks)."""
    reducer, comb = _REDUCE[red]
    t = upd.shape.type
    r = b.reduce(reducer, b.pw("where", match, upd, _identity(red, t), t=t), [axis], keep=False)
    out = b.pw(comb, data, r)
    if red in ("max", "min") and to_numpy(t).kind == "f":
        nan = b.reduce("reduce_max", b.pw("logical_and", match, b.pw("isnan", upd)), [axis], keep=False)
        out = b.pw("where", nan, float("nan"), out, t=t)
    return out


def _check_size(n: int) -> None:
    if n > DENSE_LIMIT:
        raise Unsupported(f"scatter of {n} compare elements (over {DENSE_LIMIT}: too large to run densely)")


def decompose_scatter_elements(b: Builder, ins: Instruction) -> Instruction:
    data, idx, upd = ins.inputs
    rank, d, u = data.shape.ndim(), data.shape.lens, idx.shape.lens
    a = ins.op.axis % rank  # type: ignore[attr-defined]
    red = _reduction(ins)
    if math.prod(u) == 0:
        return data
    if any(u[k] > d[k] for k in range(rank) if k != a):
        raise Unsupported("scatter updates larger than the data off the axis")
    _check_size(math.prod(u) * d[a])
    # T: the update dims with the output position j inserted at a (updates along the axis at a + 1).
    t_lens = [*u[:a], d[a], *u[a:]]
    n = b.broadcast_to(b.add("unsqueeze", _normalized(b, idx, d[a]), axes=[a]), t_lens)
    match = b.pw("equal", n, _iota(b, d[a], a, rank + 1))
    region = [k for k in range(rank) if k != a and u[k] < d[k]]
    base = b.add("slice", data, axes=region, starts=[0] * len(region), ends=[u[k] for k in region])
    if red == "none":
        q = b.pw("where", match, _iota(b, u[a], a + 1, rank + 1), -1)
        last = b.reduce("reduce_max", q, [a + 1], keep=False)
        val = b.add("gather_elements", upd, b.pw("clip", last, 0, u[a] - 1), axis=a)
        res = b.pw("where", b.pw("greater_or_equal", last, 0), val, base)
    else:
        ub = b.broadcast_to(b.add("unsqueeze", upd, axes=[a]), t_lens)
        res = _combine(b, red, base, ub, match, a + 1)
    for k in region:  # put the untouched rest of the data back around the updated region
        starts = [u[j] if j == k else 0 for j in region]
        ends = [d[j] if j <= k else u[j] for j in region]
        res = b.add("concat", res, b.add("slice", data, axes=region, starts=starts, ends=ends), axis=k)
    return res


def decompose_scatternd(b: Builder, ins: Instruction) -> Instruction:
    data, idx, upd = ins.inputs
    return _scatternd(b, data, idx, upd, _reduction(ins))


def _scatternd(b: Builder, data: Instruction, idx: Instruction, upd: Instruction, red: str) -> Instruction:
    d, k = data.shape.lens, idx.shape.lens[-1]
    p, s, n = math.prod(d[:k]), math.prod(d[k:]), math.prod(idx.shape.lens[:-1])
    if n == 0:
        return data
    _check_size(p * n * (1 if red == "none" else s))
    cols = b.reshape(idx, [n, k])
    flat: Instruction | None = None
    for j in range(k):  # row-major position of each update's row in the (P, S) view of the data
        col = b.reshape(b.add("slice", cols, axes=[1], starts=[j], ends=[j + 1]), [n])
        term = b.pw("mul", _normalized(b, col, d[j]), math.prod(d[j + 1 : k]))
        flat = term if flat is None else b.pw("add", flat, term)
    assert flat is not None
    data2, upd2 = b.reshape(data, [p, s]), b.reshape(upd, [n, s])
    match = b.pw("equal", b.reshape(flat, [1, n]), _iota(b, p, 0, 2))  # (P, N)
    if red == "none":
        last = b.reduce("reduce_max", b.pw("where", match, _iota(b, n, 1, 2), -1), [1])  # (P, 1)
        val = b.add("gather", upd2, b.reshape(b.pw("clip", last, 0, n - 1), [p]), axis=0)
        res = b.pw("where", b.pw("greater_or_equal", last, 0), val, data2)
    else:
        m3 = b.broadcast_to(b.add("unsqueeze", match, axes=[2]), [p, n, s])
        u3 = b.broadcast_to(b.add("unsqueeze", upd2, axes=[0]), [p, n, s])
        res = _combine(b, red, data2, u3, m3, 1)
    return b.reshape(res, d)


def decompose_max_unpool(b: Builder, ins: Instruction) -> Instruction:
    # zeros of the output with y.flat[I] = X: a ScatterND into the flat output, the later of two equal
    # indices winning as in np.put; indices are clipped to the output first (np.put's mode="clip").
    x, idx = ins.inputs
    size, n = ins.shape.elements(), x.shape.elements()
    zeros = b.broadcast_to(b.literal(np.zeros(1), x.shape.type), [size])
    where = b.reshape(b.pw("clip", idx, 0, max(size - 1, 0)), [n, 1])
    return b.reshape(_scatternd(b, zeros, where, b.reshape(x, [n]), "none"), ins.shape.lens)


def decompose_tensor_scatter(b: Builder, ins: Instruction) -> Instruction:
    # present[b, .., p, ..] = update[b, .., p - w[b], ..] where 0 <= p - w[b] < S (mod M when circular),
    # else past: one gather_elements of the update, one where. A write index the ref refuses (negative,
    # or a linear write running past the end) turns its batch's gather index to S, out of range, so
    # the gather raises IndexError where the ref raises it.
    past, upd = ins.inputs[:2]
    ax, rank = ins.op.axis % past.shape.ndim(), past.shape.ndim()  # type: ignore[attr-defined]
    batch, m, s = past.shape.lens[0], past.shape.lens[ax], upd.shape.lens[ax]
    if s == 0:
        raise Unsupported("tensor_scatter of an empty update")
    lens = [1] * rank
    lens[0] = batch
    w = b.reshape(ins.inputs[2], lens) if len(ins.inputs) == 3 else b.literal(np.zeros(lens), I64)
    pos = b.pw("sub", _iota(b, m, ax, rank), w)
    ok = b.pw("greater_or_equal", w, 0)
    if ins.op.circular:  # type: ignore[attr-defined]
        pos = b.pw("mod", pos, m)
    else:
        ok = b.pw("logical_and", ok, b.pw("less_or_equal", w, m - s))
    inside = b.pw("logical_and", b.pw("greater_or_equal", pos, 0), b.pw("less", pos, s))
    idx = b.pw("where", ok, b.pw("where", inside, pos, 0), s)
    val = b.add("gather_elements", upd, b.broadcast_to(idx, past.shape.lens), axis=ax)
    return b.pw("where", b.broadcast_to(inside, past.shape.lens), val, past)

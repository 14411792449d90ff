"""Batch rows: one compiled program serves every batch size up to its own.

A server sees every batch size, and each never-seen size used to compile a program. Most models treat
the rows of their batch independently -- row i of every output depends on row i of the inputs only
(convolutions and pooling per sample, GEMMs per row, attention within a sample, normalisations and
softmax over the other axes). Then a program compiled for batch C answers batch B <= C exactly: its
batch inputs take B real rows and C - B rows nobody reads, and its outputs are cut to their first rows.

``prove`` checks that on the program as parsed (before any target pass; passes keep meaning), parsed
at two batch sizes. The two must be the same instruction for instruction -- ops, attributes, wiring,
constants -- except for sizes that follow the batch; and a per-op rule must carry every batch input's
rows to every output's (``Rows``): elementwise ops, broadcasts, views that keep row-major order,
transposes, GEMMs over rows, convolutions and pooling over samples, reductions, softmax, gathers,
concats and slices along other axes. Anything else that touches the rows (a reduction over the batch,
a constant folded from the batch size, an op no rule covers) keeps the batch in the compile key, as
before. Like ``runtime_dims.prove``, two sizes stand for all: a rule that held at both with the same
per-row layout is taken to hold at every size.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from ..ir.instruction import Instruction
from ..ir.module import Module
from ..ir.operation import Literal, Param
from ..ops.base import BinaryOp, UnaryOp
from ..ops.normalize import SoftmaxBase
from ..ops.reduce import ArgOp, PrefixScanOp, ReduceOp


@dataclasses.dataclass(frozen=True)
class Kind:
    """How a value holds the batch. ``axis`` set: batch row i is the ``k`` indices [i*k, (i+1)*k) of
    that axis, and depends on row i of the inputs only. ``axis`` None: the value does not depend on
    the batch's rows; ``bcast`` are its axes whose size follows the batch (it is constant along them)."""

    axis: int | None = None
    k: int = 1
    bcast: frozenset[int] = frozenset()
    follows: bool = False  # a constant whose values follow the batch size (``values`` has them)
    values: tuple[np.ndarray, np.ndarray] | None = dataclasses.field(default=None, compare=False)


FIXED = Kind()
# Constants this small are evaluated at both sizes (shape arithmetic: index ranges, folded dims).
_SMALL = 1 << 16
# Ops with one meaning per sample of axis 0 (NCHW and the like): weights and biases must be fixed.
_PER_SAMPLE = frozenset(
    {"convolution", "quant_convolution", "convolution_backwards", "pooling", "lrn", "pooling_indices"}
)
_RESHAPES = frozenset({"reshape", "flatten", "squeeze", "unsqueeze"})
_SHAPE_ATTRS = frozenset({"dims", "out_lens"})  # attributes that hold a value's own dims


class NotRowwise(ValueError):
    """The program reads its batch rows in a way ``prove`` cannot show row by row."""


def _elementwise(ins: Instruction) -> bool:
    return isinstance(ins.op, UnaryOp | BinaryOp) or bool(getattr(ins.op, "cpp", ""))


def _axes(axes: Sequence[int], rank: int) -> set[int]:
    return {a % rank for a in axes} if rank else set()


class _Prover:
    def __init__(self, sizes: tuple[int, int], batch_params: set[str]) -> None:
        self.sizes = sizes
        self.batch_params = batch_params
        self.kinds: dict[int, Kind] = {}

    def fail(self, ins: Instruction, why: str) -> NotRowwise:
        return NotRowwise(f"{ins.name}: {why}")

    # -- the two parses, side by side ----------------------------------------------------------------
    def walk(self, a: Module, b: Module) -> list[Kind]:
        if len(a.instructions) != len(b.instructions):
            raise NotRowwise("the two batch sizes parse to programs of different lengths")
        pos_a = {id(i): n for n, i in enumerate(a.instructions)}
        pos_b = {id(i): n for n, i in enumerate(b.instructions)}
        live = _live(a)
        for x, y in zip(a.instructions, b.instructions, strict=True):
            if [pos_a[id(i)] for i in x.inputs] != [pos_b[id(i)] for i in y.inputs]:
                raise self.fail(x, "wired differently at the two batch sizes")
            if x.shape.ndim() != y.shape.ndim() or x.shape.type != y.shape.type:
                raise self.fail(x, "rank or type depends on the batch size")
            pairs = enumerate(zip(x.shape.lens, y.shape.lens, strict=True))
            differ = frozenset(i for i, (m, n) in pairs if m != n)
            kinds = [self.kinds[id(i)] for i in x.inputs]
            if x.name == "@return":
                return kinds
            if id(x) not in live:  # computed for nothing: it cannot mix rows into a result
                self.kinds[id(x)] = FIXED
                continue
            if x.module_args or y.module_args:
                if any(k != FIXED for k in kinds) or differ:
                    raise self.fail(x, "a submodule reads the batch")
                if [m.structure() for m in x.module_args] != [m.structure() for m in y.module_args]:
                    raise self.fail(x, "its submodules depend on the batch size")
            kind = self.constant(x, y, kinds, differ)
            if kind is None:
                kind = self.op(x, y, kinds, differ)
                self.check(x, y, kind, differ)
            self.kinds[id(x)] = kind
        raise NotRowwise("the program has no @return")

    def constant(
        self, x: Instruction, y: Instruction, kinds: list[Kind], differ: frozenset[int]
    ) -> Kind | None:
        """A constant's kind, from its values at both sizes: literals, and small constant arithmetic
        (folded shapes, index ranges) evaluated here. None: not a constant, or too big to evaluate."""
        if isinstance(x.op, Literal):
            if not isinstance(y.op, Literal):
                raise self.fail(x, "a constant at one batch size only")
            va, vb = x.op.value, y.op.value  # type: ignore[attr-defined]
            if not differ and (x.op is y.op or _same_buffer(va, vb)):
                return Kind(values=(va, va)) if va.size <= _SMALL else FIXED
        elif (
            kinds
            and all(k.values is not None for k in kinds)
            and x.shape.elements() <= _SMALL
            and not x.module_args
            and x.shape.type == y.shape.type
            and not x.shape.sub_shapes
        ):
            try:
                va = x.op.compute(x.shape, [k.values[0] for k in kinds])  # type: ignore[index]
                vb = y.op.compute(y.shape, [k.values[1] for k in kinds])  # type: ignore[index]
            except Exception:  # noqa: BLE001 - an op that cannot fold here is judged by the rules
                return None
        else:
            return None
        va, vb = np.asarray(va), np.asarray(vb)
        values = (va, vb) if va.size <= _SMALL else None
        if not differ and np.array_equal(va, vb):
            return Kind(values=values)
        first = tuple(slice(0, 1) if i in differ else slice(None) for i in range(va.ndim))
        along = differ and np.array_equal(va, np.broadcast_to(va[first], va.shape))
        if along and np.array_equal(va[first], vb[first]):
            return Kind(bcast=differ, values=values)
        if values is None:
            raise self.fail(x, "a large constant whose values follow the batch size")
        return Kind(follows=True, bcast=differ, values=values)

    def check(self, x: Instruction, y: Instruction, kind: Kind, differ: frozenset[int]) -> None:
        """The sizes the two parses show must be the ones ``kind`` says."""
        c1, c2 = self.sizes
        if kind.axis is None:
            if differ != kind.bcast:
                raise self.fail(x, "a size follows the batch where its value does not")
            return
        a = kind.axis
        if differ != {a} or x.shape.lens[a] != c1 * kind.k or y.shape.lens[a] != c2 * kind.k:
            raise self.fail(x, f"the batch rows are not where they should be (axis {a}, {kind.k} per row)")

    # -- one op ------------------------------------------------------------------------------------
    def same_op(self, x: Instruction, y: Instruction, differ: frozenset[int]) -> bool:
        """Equal ops, or ops that differ only in attributes holding their own (batch-following) dims."""
        if x.op == y.op:
            return True
        if type(x.op) is not type(y.op) or not dataclasses.is_dataclass(x.op):
            return False
        for f in dataclasses.fields(x.op):
            u, v = getattr(x.op, f.name), getattr(y.op, f.name)
            if u == v:
                continue
            if f.name not in _SHAPE_ATTRS or len(u) != x.shape.ndim() or len(v) != len(u):
                return False
            if any(p != q and i not in differ for i, (p, q) in enumerate(zip(u, v, strict=True))):
                return False
        return True

    def op(self, x: Instruction, y: Instruction, kinds: list[Kind], differ: frozenset[int]) -> Kind:
        if isinstance(x.op, Param):
            if x.op.parameter != y.op.parameter:  # type: ignore[attr-defined]
                raise self.fail(x, "parameters in a different order")
            return Kind(0, 1) if x.op.parameter in self.batch_params else FIXED
        if not self.same_op(x, y, differ):
            raise self.fail(x, f"{x.op} at one batch size, {y.op} at the other")
        if all(k == FIXED for k in kinds) and not differ:
            return FIXED  # the same op on the same constants: the same value at every batch size
        name = x.name
        if name == "gather" and kinds[1].follows and kinds[0].axis is not None:
            return self.gather_rows(x, kinds[0], kinds[1])
        if any(k.follows for k in kinds):
            raise self.fail(x, "reads a constant whose values follow the batch size")
        if _elementwise(x) or name == "concat":
            return self.merge(x, kinds, {x.op.axis % x.shape.ndim()} if name == "concat" else set())  # type: ignore[attr-defined]
        if name in ("multibroadcast", "broadcast"):
            return self.broadcast(x, kinds[0], differ)
        if name in ("dot", "quant_dot") and len(kinds) == 2:
            return self.dot(x, kinds)
        rows = [k for k in kinds if k.axis is not None]
        if any(k.bcast for k in kinds):
            raise self.fail(x, "reads a constant whose size follows the batch")
        if len(rows) != 1 or (len(kinds) > 1 and name not in _PER_SAMPLE and name != "gather"):
            raise self.fail(x, "no rule carries the batch rows through it")
        return self.one_input(x, kinds, rows[0])

    def merge(self, x: Instruction, kinds: list[Kind], along: set[int]) -> Kind:
        """Elementwise ops (and concat ``along`` an axis): every row input holds the rows alike."""
        rows = {(k.axis, k.k) for k in kinds if k.axis is not None}
        if len(rows) > 1:
            raise self.fail(x, "combines values that hold the batch rows differently")
        lens = [i.shape.lens for i in x.inputs]
        if not along and any(n != x.shape.lens for n in lens):
            raise self.fail(x, "elementwise over unequal dims")
        if not rows:
            return Kind(bcast=frozenset().union(*(k.bcast for k in kinds)))
        ((a, k),) = rows
        if a in along or any(not kk.bcast <= {a} for kk in kinds):
            raise self.fail(x, "joins along the batch axis")
        return Kind(a, k)

    def broadcast(self, x: Instruction, kind: Kind, differ: frozenset[int]) -> Kind:
        src = x.inputs[0].shape
        off = (x.shape.ndim() - src.ndim()) if x.name == "multibroadcast" else int(x.op.axis)  # type: ignore[attr-defined]
        if kind.axis is not None:
            a = kind.axis + off
            if x.shape.lens[a] != src.lens[kind.axis]:
                raise self.fail(x, "broadcasts along the batch axis")
            return Kind(a, kind.k)
        placed = {b + off for b in kind.bcast}
        new = {i for i in differ if not (off <= i < off + src.ndim()) or src.lens[i - off] == 1}
        if not differ <= placed | new:
            raise self.fail(x, "a size follows the batch where its value does not")
        return Kind(bcast=differ)

    def dot(self, x: Instruction, kinds: list[Kind]) -> Kind:
        (ka, kb), n = kinds, x.shape.ndim()
        if ka.axis is not None and ka.axis < n - 2:  # batch dims: both operands hold the rows alike
            if kb == Kind(ka.axis, ka.k) or (kb.axis is None and kb.bcast <= {ka.axis}):
                return ka
        elif kb.axis is not None and kb.axis < n - 2:
            if ka.axis is None and ka.bcast <= {kb.axis}:
                return kb
        elif ka.axis == n - 2 and kb == FIXED:  # rows of A: rows of the product
            return ka
        elif kb.axis == n - 1 and ka == FIXED:  # columns of B: columns of the product
            return kb
        raise self.fail(x, "multiplies along the batch rows")

    def one_input(self, x: Instruction, kinds: list[Kind], row: Kind) -> Kind:
        op, name, a = x.op, x.name, row.axis
        src = x.inputs[0].shape
        rank = src.ndim()
        assert a is not None
        if name in _PER_SAMPLE:
            if kinds[0] != row or a != 0 or any(k != FIXED for k in kinds[1:]):
                raise self.fail(x, "its batch rows are not its samples (axis 0)")
            return row
        if name == "gather":
            g = op.axis % rank  # type: ignore[attr-defined]
            if kinds[0] == row and kinds[1] == FIXED and a != g:
                return Kind(a if a < g else a - 1 + x.inputs[1].shape.ndim(), row.k)
            if kinds[0] == FIXED and kinds[1] == row:
                return Kind(g + a, row.k)
            raise self.fail(x, "gathers along the batch rows")
        if name == "transpose":
            return Kind(list(op.permutation).index(a), row.k)  # type: ignore[attr-defined]
        if name in _RESHAPES:
            return self.reshape(x, row)
        if name in ("slice", "step", "reverse"):
            keep = a not in _axes(op.axes, rank)  # type: ignore[attr-defined]
        elif name == "pad":
            keep = op.pads[a] == 0 and op.pads[a + rank] == 0  # type: ignore[attr-defined]
        elif isinstance(op, ReduceOp):
            keep = a not in _axes(op.axes, rank) and x.shape.ndim() == rank
        elif isinstance(op, SoftmaxBase | ArgOp | PrefixScanOp):
            keep = a != op.axis % rank and x.shape.ndim() == rank  # type: ignore[attr-defined]
        else:
            raise self.fail(x, "no rule carries the batch rows through it")
        if not keep:
            raise self.fail(x, "works along the batch axis")
        return row

    def gather_rows(self, x: Instruction, data: Kind, idx: Kind) -> Kind:
        """Gather along the batch rows with constant indices that pick, for row i, from row i's own
        ``k`` indices, the same ones for every row (HF's masks index a flattened (batch, seq) so)."""
        g, c1 = x.op.axis % x.inputs[0].shape.ndim(), self.sizes[0]  # type: ignore[attr-defined]
        if data.axis != g or len(idx.bcast) != 1 or idx.values is None:
            raise self.fail(x, "gathers along the batch rows")
        (a,) = idx.bcast
        per = []
        for v, c in zip(idx.values, self.sizes, strict=True):
            if v.shape[a] % c:
                raise self.fail(x, "its indices do not hold whole rows")
            rows = np.moveaxis(v.astype(np.int64), a, 0).reshape(c, v.shape[a] // c, -1)
            rel = rows - (np.arange(c) * data.k)[:, None, None]
            if not (np.all(rel == rel[:1]) and rel.min() >= 0 and rel.max() < data.k):
                raise self.fail(x, "its indices reach other batch rows")
            per.append(rel[0])
        if per[0].shape != per[1].shape or not np.array_equal(*per):
            raise self.fail(x, "its per-row indices follow the batch size")
        return Kind(g + a, idx.values[0].shape[a] // c1)

    def reshape(self, x: Instruction, row: Kind) -> Kind:
        """A row-major view: row i stays whole where the dims before it multiply to the same count."""
        lens, out, c1 = x.inputs[0].shape.lens, x.shape.lens, self.sizes[0]
        assert row.axis is not None
        outer, per_row = math.prod(lens[: row.axis]), row.k * math.prod(lens[row.axis + 1 :])
        for b in range(len(out)):
            if math.prod(out[:b]) == outer and out[b] % c1 == 0 and out[b] >= c1:
                k = out[b] // c1
                if k * math.prod(out[b + 1 :]) == per_row:
                    return Kind(b, k)
        raise self.fail(x, f"reshapes {list(lens)} to {list(out)} across the batch rows")


def _live(m: Module) -> set[int]:
    """The instructions ``m``'s result reads."""
    seen: set[int] = set()
    todo = [m.instructions[-1]]
    while todo:
        ins = todo.pop()
        if id(ins) not in seen:
            seen.add(id(ins))
            todo.extend(ins.inputs)
    return seen


def _same_buffer(a: np.ndarray, b: np.ndarray) -> bool:
    """One weight shared by both parses (ir/weights.py): equal without reading 100 MB."""
    return a.shape == b.shape and a.dtype == b.dtype and a.ctypes.data == b.ctypes.data


@dataclasses.dataclass(frozen=True)
class BatchRows:
    """What ``prove`` found: the inputs that take the batch on axis 0, and per output the indices of
    axis 0 one batch row holds (None: the output does not follow the batch)."""

    inputs: tuple[str, ...]
    outputs: tuple[int | None, ...]


def prove(first: Module, second: Module, sizes: tuple[int, int], batch_params: set[str]) -> BatchRows:
    """``first`` and ``second``: one graph parsed with its batch inputs' axis 0 at ``sizes``. Raises
    NotRowwise naming the first instruction that keeps a smaller batch from being a padded larger one."""
    if sizes[0] < 2 or sizes[0] == sizes[1]:
        raise ValueError(f"batch_rows.prove needs two sizes of at least 2, got {sizes}")
    kinds = _Prover(sizes, batch_params).walk(first, second)
    outs: list[int | None] = []
    for n, k in enumerate(kinds):
        if k == FIXED:
            outs.append(None)
        elif k.axis == 0:
            outs.append(k.k)
        elif k.axis is None and k.bcast == {0}:  # constant along its batch-sized axis 0
            n1, n2 = (m.instructions[-1].inputs[n].shape.lens[0] for m in (first, second))
            if n1 % sizes[0] or n1 // sizes[0] * sizes[1] != n2:
                raise NotRowwise(f"output {n} has {n1} rows at batch {sizes[0]}: not a whole number per row")
            outs.append(n1 // sizes[0])
        else:
            raise NotRowwise(f"output {n} holds the batch rows on axis {k.axis}, not axis 0")
    return BatchRows(tuple(sorted(batch_params)), tuple(outs))


def capacity(batch: int) -> int:
    """The batch a program is compiled at to serve ``batch``: the next power of two, so the sizes up
    to N compile about log2(N) programs on the critical path."""
    return 1 << max(0, batch - 1).bit_length()


__all__ = ["BatchRows", "Kind", "NotRowwise", "capacity", "prove"]

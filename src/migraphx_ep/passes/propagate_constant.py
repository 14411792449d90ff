"""propagate_constant: replace constant subexpressions read by non-constant code with one literal.

As in MIGraphX, only the *frontier* is folded: constant instructions read by a non-constant instruction
(or by ``@return``); the constant chains behind them become garbage for DCE. Values are computed lazily,
each constant instruction at most once, in module order, with the op's own ``compute`` (the same
meaning as ``Instruction.eval``), and intermediate values are dropped once their last reader has run,
so ResNet/BERT-sized modules fold in one linear walk.

Size rule, so a tiny literal is never materialised into a huge one (an Expand of a scalar, a range):
an instruction is not folded (it stays an instruction, and its own constant inputs become the frontier)
when
  * its result is a broadcast view (fewer stored elements than logical ones), or
  * its result is larger than 64 KiB and more than 4x the bytes its inputs really store (a skipped
    instruction stores nothing itself: it weighs what its inputs weigh).

A gather of a stored table (rank >= 2) by a constant run of consecutive indices -- a transformer's
position embeddings read at ``range(sequence)`` -- becomes a slice of the table (and a reshape), which
stays a view instead of folding into a copy (so does any packed slice of a stored table that drops
rows, and a reshape of one): a view costs nothing, and the program then differs between
sequence lengths only in the slice's bounds (``ep/shape_template.py`` needs that), not in a literal
holding other rows.

Given the subgraph's ``WeightCache`` (``ir/weights.py``), a value computed from weights alone is taken
from it when an earlier compile (another input shape) folded the same expression: the same literal
object, so nothing is computed, copied or hashed again.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from ..ir.dtypes import DType
from ..ir.instruction import Instruction
from ..ir.module import Module
from ..ir.operation import Literal, ModuleOp, make_op
from ..ir.shape import Shape
from ..ir.weights import WeightCache, op_key
from .manager import Pass
from .rewrite import replace_value

log = logging.getLogger("migraphx_ep.passes.propagate_constant")

MIN_BYTES = 64 * 1024  # results up to this size always fold
GROWTH = 4  # larger results fold only if at most this many times their inputs' stored bytes

# Exceptions an op's compute may raise on a constant it cannot evaluate (no reference implementation,
# integer division by zero...): the instruction is left for run time, which reports it.
_EVAL_ERRORS = (ArithmeticError, ValueError, TypeError, IndexError, NotImplementedError)


def stored_bytes(s: Shape) -> int:
    """Bytes a value of shape ``s`` occupies once packed (a broadcast stores only its distinct elements)."""
    if s.type == DType.tuple_type:
        return sum(stored_bytes(x) for x in s.sub_shapes)
    return min(s.element_space(), s.elements()) * s.type_size()


def _is_const(ins: Instruction, const: set[int]) -> bool:
    """Mirrors ``Instruction.eval``: depends on literals only, and deterministic."""
    if ins.is_literal():
        return True
    if ins.is_param() or ins.is_return() or isinstance(ins.op, ModuleOp) or ins.module_args:
        return False
    if getattr(ins.op, "nondeterministic", False):
        return False
    return all(id(i) in const for i in ins.inputs)


_RESHAPES = frozenset({"reshape", "squeeze", "unsqueeze", "flatten"})


def table_view(ins: Instruction, views: set[int]) -> bool:
    """A packed slice of a stored table (rank >= 2) that drops rows, or a reshape of one: such a view
    stays an instruction (see the docstring); ``views`` holds the ones already found."""
    x = ins.inputs[0] if ins.inputs else None
    if ins.op.name in _RESHAPES:
        return x is not None and id(x) in views
    return (
        ins.op.name == "slice"
        and x is not None
        and x.is_literal()
        and x.shape.ndim() >= 2
        and ins.shape.elements() < x.shape.elements()
        and ins.shape.standard()
    )


def too_big(ins: Instruction, weight: dict[int, int]) -> bool:
    """The size rule; ``weight``: bytes each constant input really stores (see ``propagate_constant``)."""
    s = ins.shape
    if s.type == DType.tuple_type:
        return True  # no tuple literals; its get_tuple_elem readers fold instead
    if s.element_space() < s.elements():
        return True
    out = s.elements() * s.type_size()
    return out > MIN_BYTES and out > GROWTH * sum(weight[id(i)] for i in ins.inputs)


def index_run(idx: np.ndarray) -> int | None:
    """The first index when ``idx`` (flattened) is ``first, first + 1, ...``; None otherwise."""
    flat = idx.reshape(-1)
    if flat.size < 2 or flat.dtype.kind not in "iu" or int(flat[0]) < 0:
        return None
    first = int(flat[0])
    return first if np.array_equal(flat, np.arange(first, first + flat.size, dtype=flat.dtype)) else None


class _Values:
    """Lazy, memoised constant evaluation; a value is freed once every constant reader has used it."""

    def __init__(self) -> None:
        self.memo: dict[int, Any] = {}  # arrays (lists for tuple-typed instructions)
        self.pending: dict[int, int] = {}  # readers still to consume a memoised value

    def get(self, root: Instruction) -> np.ndarray | None:
        stack = [root]
        while stack:
            ins = stack[-1]
            if id(ins) in self.memo:
                stack.pop()
                continue
            if ins.is_literal():
                self.memo[id(ins)] = ins.op.value  # type: ignore[attr-defined]
                stack.pop()
                continue
            todo = [i for i in ins.inputs if id(i) not in self.memo]
            if todo:
                stack.extend(todo)
                continue
            try:
                value = ins.op.compute(ins.shape, [self.memo[id(i)] for i in ins.inputs])
            except _EVAL_ERRORS as e:
                log.info("not folding %s: %s", ins.op, e)
                return None
            if ins.shape.type == DType.tuple_type:
                pass  # a list, read by get_tuple_elem
            elif (value := np.asarray(value)).shape != ins.shape.lens or value.dtype != ins.shape.dtype:
                got = f"{value.dtype}{list(value.shape)}"
                raise RuntimeError(f"{ins.op}: compute gave {got}, its shape says {ins.shape}")
            self.memo[id(ins)] = value
            self.pending[id(ins)] = len(ins.outputs)
            for i in ins.inputs:
                self._consume(i)
            stack.pop()
        return self.memo[id(root)]

    def _consume(self, ins: Instruction) -> None:
        if id(ins) in self.pending:
            self.pending[id(ins)] -= 1
            if self.pending[id(ins)] <= 0:
                del self.memo[id(ins)], self.pending[id(ins)]

    def forget(self, ins: Instruction) -> None:
        self.memo.pop(id(ins), None)
        self.pending.pop(id(ins), None)


def propagate_constant(m: Module, weights: WeightCache | None = None) -> bool:
    const: set[int] = set()  # depends on literals only
    foldable: set[int] = set()  # ... and passes the size rule
    # Bytes a constant really stores: its packed size if foldable (it may become a literal), else what its
    # inputs store (a skipped broadcast of a scalar weighs 4 bytes, and so does a copy of it). Folding
    # leaves every weight unchanged, which keeps the pass idempotent.
    weight: dict[int, int] = {}
    values = _Values()
    keys: dict[int, int | None] = {}  # a constant's expression key over weights (with ``weights``)
    changed = False
    last = m.instructions[-1] if m.instructions and m.get_return() is None else None

    def value_of(f: Instruction) -> Literal | None:
        if weights is None:
            v = values.get(f)
            return None if v is None else Literal(v)
        return weights.derived(keys[id(f)], lambda: values.get(f))

    def fold(f: Instruction) -> None:
        nonlocal changed
        if f.is_literal() or id(f) not in foldable or not f.outputs:
            return
        v = value_of(f)
        if v is None:
            return
        lit = m.add_literal(v)
        if replace_value(m, f, lit):
            values.forget(f)
            # Later readers (not yet visited) now read the literal: it is constant like f was.
            const.add(id(lit))
            foldable.add(id(lit))
            weight[id(lit)] = weight[id(f)]
            keys[id(lit)] = keys.get(id(f))
            changed = True
        else:
            m.remove_instruction(lit)

    def as_view(ins: Instruction) -> bool:
        """Turn a gather of a literal table by an index run into slice + reshape (see the docstring)."""
        data, idx = ins.inputs
        a = getattr(ins.op, "axis", 0) % max(data.shape.ndim(), 1)
        if not data.is_literal() or data.shape.ndim() < 2 or any(n != 1 for n in data.shape.lens[:a]):
            return False  # rows before the axis would make the slice strided: a reshape then copies
        v = values.get(idx)
        first = None if v is None else index_run(np.asarray(v))
        if first is None or first + idx.shape.elements() > data.shape.lens[a]:
            return False
        sl = m.insert_instruction(
            ins, make_op("slice", axes=[a], starts=[first], ends=[first + idx.shape.elements()]), [data]
        )
        view = m.insert_instruction(ins, make_op("reshape", dims=list(ins.shape.lens)), [sl])
        if not replace_value(m, ins, view):
            m.remove_instruction(view)
            m.remove_instruction(sl)
            return False
        for new in (sl, view):  # constant, never a frontier literal, weighing what the table does
            const.add(id(new))
            views.add(id(new))
            weight[id(new)] = weight[id(data)]
            if weights is not None:
                keys[id(new)] = weights.expression(
                    op_key(new.op, new.shape), [keys[id(i)] for i in new.inputs]
                )
        return True

    views: set[int] = set()  # slices of stored tables, and reshapes of them: views, never folded
    for ins in m:
        if ins.op.name == "gather" and _is_const(ins, const) and as_view(ins):
            changed = True
            continue
        if _is_const(ins, const) and table_view(ins, views):
            const.add(id(ins))
            views.add(id(ins))
            weight[id(ins)] = weight[id(ins.inputs[0])]
            if weights is not None:
                keys[id(ins)] = weights.expression(op_key(ins.op, ins.shape), [keys[id(ins.inputs[0])]])
            continue
        if _is_const(ins, const):
            const.add(id(ins))
            if weights is not None:
                keys[id(ins)] = (
                    weights.key_of(ins.op)  # type: ignore[arg-type]
                    if ins.is_literal()
                    else weights.expression(op_key(ins.op, ins.shape), [keys[id(i)] for i in ins.inputs])
                )
            if ins.is_literal() or not too_big(ins, weight):
                foldable.add(id(ins))
                weight[id(ins)] = stored_bytes(ins.shape)
                if ins is last and not ins.is_literal():
                    # No @return: the last instruction is the output and has no reader to redirect.
                    v = values.get(ins)
                    if v is not None and Shape.of(v) == ins.shape:  # the output layout is the interface
                        m.replace_instruction(ins, Literal(v), [])
                        changed = True
                continue
            # A tuple's elements are computed by its op; anything else skipped is a view or copy.
            tup = ins.shape.type == DType.tuple_type
            weight[id(ins)] = stored_bytes(ins.shape) if tup else sum(weight[id(i)] for i in ins.inputs)
        for i in dict.fromkeys(ins.inputs):
            fold(i)
    return changed


PROPAGATE_CONSTANT = Pass("propagate_constant", propagate_constant)

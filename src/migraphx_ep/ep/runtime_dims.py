"""Run-time dims: input axes a compiled program serves at every size, so a new size compiles nothing.

The case that needs it: ORT GenAI's decoders feed an ``attention_mask`` of shape (batch, total) whose
length grows by one every decode step; the graph only reads it through ``ReduceSum`` (valid lengths)
and ``Shape`` (the total length). Keyed by its dims, every token compiled a program. Here:

1. ``candidates`` finds, statically, inputs whose symbolic axes reach the graph only through
   shape-preserving unary nodes ending in a ``Shape`` or a reduction (a cheap filter, not a proof).
2. The EP compiles such a subgraph with those axes as *run-time axes* (``Param.runtime_axes``): their
   ``Shape`` becomes ``dimensions_of`` (read at run), and parsers may assume what the dims cannot say
   at compile time, checked at run (``AssumptionFailed``).
3. ``prove`` compares that program with one compiled at another size of the same axes. They must be
   the same instruction for instruction (ops, attributes, wiring, constants); shapes may differ only
   where the run-time axes flow -- the parameters, elementwise ops over them -- and such values may
   only be read by reductions over those axes or ``dimensions_of``. Then every instruction computes
   the same thing at any size, and the first program is kept for all sizes. Otherwise the axes go
   back into the compile key, exactly as before.

The ref target runs such programs as they are (its kernels are numpy's, sized by their arguments).
The gpu target's arena, kernels and captured graph are planned for fixed sizes: it compiles the
program once per ``capacity`` of the run-time axes, zero-pads the inputs to it and checks instead of
step 3 that padding is exact (targets/gpu/runtime_dims.py).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from ..ir.instruction import Instruction
from ..ir.module import Module
from ..ir.operation import Param
from ..ir.program import Program
from ..ops.base import BinaryOp, UnaryOp
from ..ops.core import Convert, DimensionsOf
from ..ops.reduce import ReduceOp

RuntimeDims = dict[str, tuple[int, ...]]  # graph input -> its run-time axes

# ONNX nodes a run-time axis may pass through (shape-preserving, one data input) and end in.
_PASS = frozenset({"Cast", "Not", "Neg", "Abs", "Identity"})
_END = frozenset({"Shape", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceMean", "ReduceProd"})


def _symbolic_axes(info: dict | None) -> tuple[int, ...]:
    dims = (info or {}).get("shape")
    if not dims:
        return ()
    return tuple(i for i, d in enumerate(dims) if not (isinstance(d, int) and d >= 0))


def candidates(graph: dict) -> RuntimeDims:
    """Inputs with symbolic axes that only reach ``Shape`` nodes and reductions over those axes,
    through ``_PASS`` nodes: those axes."""
    readers: dict[str, list[dict]] = {}
    for node in graph["nodes"]:
        for name in node["inputs"]:
            readers.setdefault(name, []).append(node)
    outputs = set(graph["outputs"])
    found: RuntimeDims = {}
    for name in graph["inputs"]:
        info = graph.get("values", {}).get(name)
        axes = set(_symbolic_axes(info))
        if axes:
            axes &= _reduced_axes(name, len(info["shape"]), graph, readers, outputs)
        if axes:
            found[name] = tuple(sorted(axes))
    return found


def _reduced_axes(
    name: str, rank: int, graph: dict, readers: dict[str, list[dict]], outputs: set[str]
) -> set:
    """The axes of input ``name`` that every path from it reduces away or only reads the size of
    (empty when some path does anything else with it)."""
    todo, seen, axes = [name], set(), set(range(rank))
    while todo:
        value = todo.pop()
        if value in outputs or not readers.get(value):
            return set()  # a graph output (or an unread input) keeps its dims: nothing to gain
        for node in readers[value]:
            op = node["op_type"]
            if node.get("domain", "") not in ("", "ai.onnx") or (op not in _PASS and op not in _END):
                return set()
            if op.startswith("Reduce"):
                axes &= _reduce_node_axes(node, rank, graph)
            if op in _END or id(node) in seen:
                continue
            seen.add(id(node))
            todo.extend(o for o in node["outputs"] if o)
    return axes


def _reduce_node_axes(node: dict, rank: int, graph: dict) -> set[int]:
    """A Reduce node's axes (attribute, or a constant second input); every axis when it has none."""
    attrs = node.get("attributes", {})
    axes = attrs.get("axes")
    if axes is None and len(node["inputs"]) > 1 and node["inputs"][1]:
        axes = _constant(graph, node["inputs"][1])
        if axes is None:
            return set()  # axes known only at run: nothing to prove against
    if axes is None or len(axes) == 0:
        return set() if attrs.get("noop_with_empty_axes", 0) else set(range(rank))
    return {int(a) % rank for a in np.asarray(axes).ravel()}


def _constant(graph: dict, name: str) -> np.ndarray | None:
    value = graph.get("initializers", {}).get(name)
    if value is not None:
        return np.asarray(value)
    for node in graph["nodes"]:
        if node["op_type"] == "Constant" and name in node["outputs"]:
            v = node.get("attributes", {}).get("value")
            return None if v is None else np.asarray(v)
    return None


# The smallest capacity a padded run-time axis is compiled for: a 1024-token context, then doubling,
# so a generation compiles its decode program again only when its length passes a power of two.
MIN_CAPACITY = 1024


def capacity(n: int) -> int:
    """The size a padded program is compiled at for a run-time axis of size ``n`` (see MIN_CAPACITY)."""
    return max(MIN_CAPACITY, 1 << max(0, n - 1).bit_length())


def with_free_axes(
    dims: Iterable[tuple[int, ...]], names: list[str], runtime: RuntimeDims, padded: bool = False
) -> tuple:
    """An input-dims key with every run-time axis as -1: one key (one program) for all its sizes; with
    ``padded``, as minus its capacity: one key for all the sizes that capacity holds."""
    return tuple(
        tuple((-capacity(d) if padded else -1) if i in runtime.get(n, ()) else d for i, d in enumerate(ds))
        for n, ds in zip(names, dims, strict=True)
    )


def other_size(dims: tuple[tuple[int, ...], ...], names: list[str], runtime: RuntimeDims) -> tuple:
    """The same dims with every run-time axis one longer: the second program ``prove`` compares."""
    return tuple(
        tuple(d + 1 if i in runtime.get(n, ()) else d for i, d in enumerate(ds))
        for n, ds in zip(names, dims, strict=True)
    )


def prove(first: Program, second: Program) -> str | None:
    """None when ``first`` computes at every size of its run-time axes what a program compiled for
    that size would (``second`` is one such); else the reason it may not."""
    if set(first.modules) != set(second.modules):
        return "the two sizes compile to different modules"
    for name, mod in first.modules.items():
        other = second.modules[name]
        if name != "main" and mod.structure() != other.structure():
            return f"module {name!r} depends on the size"
    return _same_but_sizes(first.get_main_module(), second.get_main_module())


def _same_but_sizes(a: Module, b: Module) -> str | None:
    if len(a.instructions) != len(b.instructions):
        return "the two sizes compile to programs of different lengths"
    pos = {id(ins): n for n, ins in enumerate(a.instructions)}
    pos_b = {id(ins): n for n, ins in enumerate(b.instructions)}
    sized: dict[int, set[int]] = {}  # instruction id -> axes whose size follows the run-time axes
    for x, y in zip(a.instructions, b.instructions, strict=True):
        if [pos[id(i)] for i in x.inputs] != [pos_b[id(i)] for i in y.inputs]:
            return f"{x.name}: wired differently at the two sizes"
        if [m.structure() for m in x.module_args] != [m.structure() for m in y.module_args]:
            return f"{x.name}: its submodules depend on the size"
        if not _same_op(x, y):
            return f"{x.name}: {x.op} at one size, {y.op} at the other"
        differ = {i for i, (m, n) in enumerate(zip(x.shape.lens, y.shape.lens, strict=False)) if m != n}
        if x.shape.ndim() != y.shape.ndim() or x.shape.type != y.shape.type:
            return f"{x.name}: rank or type depends on the size"
        reason = _reads_ok(x, differ, sized)
        if reason:
            return reason
        if differ:
            sized[id(x)] = differ
    return None


def _same_op(x: Instruction, y: Instruction) -> bool:
    if isinstance(x.op, Param) and isinstance(y.op, Param):
        return (x.op.parameter, x.op.runtime_axes) == (y.op.parameter, y.op.runtime_axes)
    return x.op == y.op


def _reads_ok(ins: Instruction, differ: set[int], sized: dict[int, set[int]]) -> str | None:
    """Whether ``ins`` may take the size-following values it reads, and may itself follow the size."""
    op = ins.op
    if differ:  # this value's own size follows the run-time axes
        if isinstance(op, Param):
            return None if differ <= set(op.runtime_axes) else f"{ins.name}: fixed axes changed"
        if isinstance(op, UnaryOp | BinaryOp | Convert):
            return None  # elementwise over equal dims: numpy sizes the result by its arguments
        return f"{ins.name} ({op.name}) has dims that follow a run-time axis"
    for arg in ins.inputs:
        axes = sized.get(id(arg))
        if not axes:
            continue
        if isinstance(op, DimensionsOf):
            continue
        if isinstance(op, ReduceOp) and axes <= {a % max(1, arg.shape.ndim()) for a in op.axes}:
            continue
        return f"{ins.name} ({op.name}) reads {arg.name} along a run-time axis"
    return None


def runtime_params(prog: Program) -> dict[str, tuple[int, ...]]:
    """The parameters of ``prog`` that take run-time axes (a loaded .mxr keeps them)."""
    return {
        p.op.parameter: p.op.runtime_axes  # type: ignore[attr-defined]
        for p in prog.get_main_module().get_parameters()
        if getattr(p.op, "runtime_axes", ())
    }


__all__ = [
    "MIN_CAPACITY",
    "RuntimeDims",
    "candidates",
    "capacity",
    "other_size",
    "prove",
    "runtime_params",
    "with_free_axes",
]

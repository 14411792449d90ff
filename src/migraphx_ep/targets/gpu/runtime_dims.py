"""Run-time dims on the gpu target: one program for every size of an input's run-time axes.

The EP (ep/runtime_dims.py) compiles a subgraph whose input axes are *run-time axes* -- GenAI's
attention mask, one longer every decode step -- once for a capacity (``ep.runtime_dims.capacity``)
instead of once per size. The ref target sizes its numpy kernels by their arguments; the gpu target's
arena, kernels and captured graph are planned for fixed sizes, so here the input is zero-padded to the
capacity and its real dims travel as an input of their own:

- ``dims_as_inputs`` (the gpu pipeline's first pass) proves the padding exact and makes every
  ``dimensions_of`` a slice of an int64 parameter ``<input>@dims``;
- ``pad_inputs`` (called by the executable before each run) pads the input and fills ``@dims``.

Zero padding is exact where a padded element cannot reach a result: the run-time axes' values may
only flow through zero-preserving elementwise ops (a padded 0 stays 0) into sums over those axes (a
0 adds nothing) or into ``dimensions_of``. A program that does anything else with them fails to
compile with ``PaddingNotExact``, and the EP compiles per size instead, as without run-time dims.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ...ir.dtypes import DType
from ...ir.instruction import Instruction
from ...ir.module import Module
from ...ir.operation import make_op
from ...ir.shape import Shape
from ...passes.manager import Pass

DIMS_SUFFIX = "@dims"
# One-input elementwise ops that map 0 to 0 (Cast included: 0 is 0 in every type, False as bool).
_ZERO_PRESERVING = frozenset({"convert", "neg", "abs", "identity", "contiguous"})


class PaddingNotExact(ValueError):
    """A run-time axis reaches an instruction that zero padding would change the result of."""


def _check_padding(param: Instruction, axes: frozenset[int]) -> None:
    todo, seen = [param], set()
    while todo:
        value = todo.pop()
        for user in value.outputs:
            if id(user) in seen:
                continue
            seen.add(id(user))
            if user.name == "dimensions_of" and value is param:
                continue
            if user.name in _ZERO_PRESERVING and len(user.inputs) == 1:
                todo.append(user)
                continue
            if user.name == "reduce_sum" and axes <= {a % value.shape.ndim() for a in user.op.axes}:  # type: ignore[attr-defined]
                continue
            raise PaddingNotExact(
                f"run-time axes {sorted(axes)} of input {param.op.parameter!r} reach {user.name}: "  # type: ignore[attr-defined]
                "zero padding to a capacity would change its result"
            )


def dims_as_inputs(m: Module) -> bool:
    """Check that the run-time axes of ``m``'s parameters may be zero-padded, and read their dims
    from ``<param>@dims`` instead of ``dimensions_of``."""
    changed = False
    for param in list(m.get_parameters()):
        axes = frozenset(getattr(param.op, "runtime_axes", ()))
        if not axes:
            continue
        _check_padding(param, axes)
        readers = [u for u in dict.fromkeys(param.outputs) if u.name == "dimensions_of"]
        if not readers:
            continue
        name = param.op.parameter + DIMS_SUFFIX  # type: ignore[attr-defined]
        dims = m.add_parameter(name, Shape(DType.int64_type, (param.shape.ndim(),)))
        for r in readers:
            start, end = r.op.start, r.op.end  # type: ignore[attr-defined]
            part = m.insert_instruction(r, make_op("slice", axes=(0,), starts=(start,), ends=(end,)), [dims])
            m.replace_all_uses(r, part)
            m.remove_instruction(r)
        changed = True
    return changed


DIMS_AS_INPUTS = Pass("dims_as_inputs", dims_as_inputs)


def padded_inputs(main: Module) -> dict[str, tuple[Shape, frozenset[int]]]:
    """The parameters of a compiled ``main`` that ``pad_inputs`` pads: shape (the capacity) and axes."""
    return {
        p.op.parameter: (p.shape, frozenset(p.op.runtime_axes))  # type: ignore[attr-defined]
        for p in main.get_parameters()
        if getattr(p.op, "runtime_axes", ())
    }


def pad_inputs(
    params: Mapping[str, np.ndarray], padded: Mapping[str, tuple[Shape, frozenset[int]]]
) -> dict[str, np.ndarray]:
    """``params`` with each padded input zero-padded to its capacity and its dims as ``<name>@dims``."""
    out = dict(params)
    for name, (shape, axes) in padded.items():
        arr = params.get(name)
        if arr is None:
            continue  # check_params names what is missing
        lens = shape.lens
        fits = arr.ndim == len(lens) and all(
            n <= c if i in axes else n == c for i, (n, c) in enumerate(zip(arr.shape, lens, strict=True))
        )
        if not fits:
            raise ValueError(
                f"input {name!r} has dims {list(arr.shape)}; this program takes {list(lens)} with axes "
                f"{sorted(axes)} up to that size"
            )
        if arr.shape != lens:
            full = np.zeros(lens, arr.dtype)
            full[tuple(slice(0, n) for n in arr.shape)] = arr
            out[name] = full
        out[name + DIMS_SUFFIX] = np.asarray(arr.shape, np.int64)
    return out


def native_pad(arr: np.ndarray, shape: Shape, axes: frozenset[int]) -> tuple[int, int] | None:
    """How the shell pads ``arr`` for a parameter of capacity ``shape`` (csrc/native_run.h): (capacity of
    the last axis, element bytes) -- rows copied into a zeroed slot --, or None when it cannot (only the
    last axis may be a run-time one there; Python pads anything else)."""
    last = len(shape.lens) - 1
    if axes != {last} or arr.ndim != len(shape.lens) or arr.shape[:last] != shape.lens[:last]:
        return None
    if arr.shape[last] > shape.lens[last]:
        return None
    return int(shape.lens[last]), int(arr.dtype.itemsize)


__all__ = [
    "DIMS_AS_INPUTS",
    "DIMS_SUFFIX",
    "PaddingNotExact",
    "dims_as_inputs",
    "native_pad",
    "pad_inputs",
    "padded_inputs",
]

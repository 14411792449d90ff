"""One generated kernel per distinct (op, shapes) in a lowering: the other instructions get it renamed.

A transformer repeats its layer: BERT-base's 12 layers ask for the same attention, layernorm and
pointwise kernels at the same shapes, and generating a kernel's source is most of what lowering costs
(Python string building: ~70 % of BERT-base's ~10 ms lowering on a laptop core, twice that on the H100
host). For a never-seen shape that cost is on the Run's critical path (``bench/shapes.py``, stage
``lowering``), so the lowering asks ``KernelMemo`` first. A key must determine the kernel exactly: it is
built only from values whose ``repr`` is exact (numbers, strings, enums, shapes, tuples of them) and
from literal digests; anything else (an array attribute, an expression with NaN or array constants)
has no key and is generated as before.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable

from ...ir.module import Module
from ...ir.operation import op_key
from ...ir.shape import Shape
from .kernels.pointwise import exact_key
from .kernels.spec import KernelSpec, PwExpr, replace_word


def body_key(m: Module) -> Hashable | None:
    """A fused op's submodule as data: each instruction's op key, its inputs' positions and its shape
    (None where an op has no key)."""
    pos = {id(ins): i for i, ins in enumerate(m.instructions)}
    out = []
    for ins in m.instructions:
        k = op_key(ins.op)
        if k is None:
            return None
        out.append((k, tuple(pos[id(a)] for a in ins.inputs), ins.shape))
    return tuple(out)


def pointwise_key(expr: PwExpr, inputs: list[Shape], out: Shape) -> Hashable | None:
    k = exact_key(expr)
    return None if k is None else ("pointwise", k, tuple(inputs), out)


class KernelMemo:
    """The kernels one lowering generated, by key."""

    def __init__(self) -> None:
        self._specs: dict[Hashable, KernelSpec] = {}
        self.generated = 0
        self.reused = 0

    def spec(self, key: Hashable | None, name: str, make: Callable[[str], KernelSpec]) -> KernelSpec:
        """The kernel ``make(name)`` would give: made once per ``key``, then the same source under
        ``name`` (a None key: always made)."""
        hit = self._specs.get(key) if key is not None else None
        if hit is None:
            self.generated += 1
            spec = make(name)
            if key is not None:
                self._specs[key] = spec
            return spec
        self.reused += 1
        return dataclasses.replace(hit, name=name, source=replace_word(hit.source, hit.name, name))


__all__ = ["KernelMemo", "body_key", "op_key", "pointwise_key"]

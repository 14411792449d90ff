"""A decomposition's pen: adds instructions just before the one being replaced, with numpy-style
broadcasting for elementwise ops and scalar constants, so each decomposition reads like its ``compute``."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ....ir.dtypes import DType, to_numpy
from ....ir.instruction import Instruction
from ....ir.module import Module
from ....ir.operation import make_op
from ....ops.core import broadcast_lens

Value = Instruction | float | int | bool


class Builder:
    def __init__(self, module: Module, at: Instruction) -> None:
        self.m = module
        self.at = at

    def add(self, name: str, *args: Instruction, **attrs: object) -> Instruction:
        return self.m.insert_instruction(self.at, make_op(name, **attrs), list(args))

    def literal(self, value: object, t: DType) -> Instruction:
        """A literal of type ``t`` (numpy's rounding of ``value``, as the ref's scalars get)."""
        with np.errstate(all="ignore"):
            return self.m.add_literal(np.asarray(value).astype(to_numpy(t)))

    def convert(self, x: Instruction, t: DType) -> Instruction:
        if x.shape.type == t:
            return x
        if x.name in ("multibroadcast", "broadcast"):
            # Convert what is broadcast, then broadcast it: the same numbers, and a constant (a QDQ zero
            # point) folds to one value per distinct element, not to a full tensor every kernel reads.
            src = self.convert(x.inputs[0], t)
            return self.m.insert_instruction(self.at, x.op, [src])
        return self.add("convert", x, target_type=t)

    def broadcast_to(self, x: Instruction, lens: Sequence[int]) -> Instruction:
        lens = tuple(lens)
        return x if x.shape.lens == lens else self.add("multibroadcast", x, out_lens=lens)

    def reshape(self, x: Instruction, lens: Sequence[int]) -> Instruction:
        return x if x.shape.lens == tuple(lens) else self.add("reshape", x, dims=list(lens))

    def transpose(self, x: Instruction, perm: Sequence[int]) -> Instruction:
        perm = list(perm)
        return x if perm == sorted(perm) else self.add("transpose", x, permutation=perm)

    def pw(self, name: str, *xs: Value, t: DType | None = None, **attrs: object) -> Instruction:
        """Elementwise ``name`` with numpy broadcasting; a Python number becomes a scalar literal of
        ``t`` (default: the type of the last instruction argument, the value operand of ``where``)."""
        ins = [x for x in xs if isinstance(x, Instruction)]
        t = t if t is not None else ins[-1].shape.type
        args = [x if isinstance(x, Instruction) else self.literal(x, t) for x in xs]
        lens = broadcast_lens(*(a.shape.lens for a in args))
        return self.add(name, *(self.broadcast_to(a, lens) for a in args), **attrs)

    def reduce(self, name: str, x: Instruction, axes: Sequence[int], keep: bool = True) -> Instruction:
        """``name`` (reduce_sum, reduce_max, ...) over ``axes``; ``keep=False`` drops them."""
        axes = sorted(a % max(x.shape.ndim(), 1) for a in axes)
        r = self.add(name, x, axes=axes) if axes else x
        if keep or not axes:
            return r
        return self.reshape(r, [n for i, n in enumerate(r.shape.lens) if i not in axes])

"""Instructions: an op applied to input instructions, with def-use links both ways."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from .operation import Literal, ModuleOp, Op, Param, Return
from .shape import Shape

if TYPE_CHECKING:
    from .module import Module


class Instruction:
    """A node of a module. ``outputs`` lists users (with repeats when a user reads it twice)."""

    __slots__ = ("op", "inputs", "outputs", "shape", "module_args", "module", "__weakref__")

    def __init__(
        self,
        op: Op,
        inputs: Sequence[Instruction],
        shape: Shape,
        module_args: Sequence[Module] | None = None,
    ):
        self.op = op
        self.inputs: list[Instruction] = list(inputs)
        self.outputs: list[Instruction] = []
        self.shape = shape
        self.module_args: list[Module] = list(module_args or ())
        self.module: Module | None = None

    @property
    def name(self) -> str:
        return self.op.name

    def is_param(self) -> bool:
        return isinstance(self.op, Param)

    def is_literal(self) -> bool:
        return isinstance(self.op, Literal)

    def is_return(self) -> bool:
        return isinstance(self.op, Return)

    def can_eval(self) -> bool:
        """True when the value depends on literals only (MIGraphX ``instruction::can_eval``)."""
        return self.eval() is not None

    def eval(self) -> np.ndarray | None:
        """Evaluate a constant subexpression with the ref semantics, or None if it reads a parameter.

        Iterative with a memo so deep constant chains don't hit Python's recursion limit.
        """
        memo: dict[int, np.ndarray | None] = {}
        stack: list[Instruction] = [self]
        while stack:
            ins = stack[-1]
            if id(ins) in memo:
                stack.pop()
                continue
            if ins.is_literal():
                memo[id(ins)] = ins.op.value  # type: ignore[attr-defined]
                stack.pop()
                continue
            if ins.is_param() or ins.is_return() or isinstance(ins.op, ModuleOp) or ins.module_args:
                memo[id(ins)] = None
                stack.pop()
                continue
            pending = [i for i in ins.inputs if id(i) not in memo]
            if pending:
                stack.extend(pending)
                continue
            args = [memo[id(i)] for i in ins.inputs]
            if any(a is None for a in args) or getattr(ins.op, "nondeterministic", False):
                memo[id(ins)] = None
            else:
                memo[id(ins)] = ins.op.compute(ins.shape, args)  # type: ignore[arg-type]
            stack.pop()
        return memo[id(self)]

    def replace_inputs(self, inputs: list[Instruction]) -> None:
        for i in self.inputs:
            i.outputs.remove(self)
        self.inputs = list(inputs)
        for i in self.inputs:
            i.outputs.append(self)

    def __repr__(self) -> str:
        return f"<{self.op} -> {self.shape}>"

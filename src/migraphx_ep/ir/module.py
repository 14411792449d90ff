"""Modules: an ordered list of instructions with a small editing API (MIGraphX ``module``)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from .instruction import Instruction
from .operation import Literal, ModuleOp, Op, Param, Return, op_shape_memo
from .shape import Shape, ShapeError

INDEX_WINDOW = 32  # instructions either side of the last edit that ``_index`` searches first


class ModuleError(ValueError):
    """A malformed module (bad edit, dangling reference, unsorted instructions)."""


class Module:
    def __init__(self, name: str = "main") -> None:
        self.name = name
        self.instructions: list[Instruction] = []
        self._near = 0  # where ``_index`` last found an instruction

    # -- building -------------------------------------------------------------------------------
    def _shape_of(self, op: Op, args: Sequence[Instruction], mods: Sequence[Module]) -> Shape:
        in_shapes = [a.shape for a in args]
        try:
            if isinstance(op, ModuleOp):
                return op.compute_shape_with_modules(in_shapes, list(mods))
            return op_shape_memo(op, in_shapes)
        except ShapeError:
            raise
        except (ValueError, TypeError, IndexError) as e:
            raise ShapeError(f"{op.name}: {e} (inputs: {in_shapes})") from e

    def _new(self, op: Op, args: Sequence[Instruction], mods: Sequence[Module] = ()) -> Instruction:
        for a in args:
            if not isinstance(a, Instruction):
                raise ModuleError(f"{op.name}: argument {a!r} is not an instruction")
            if a.module is not self:
                raise ModuleError(f"{op.name}: argument {a.op} belongs to another module")
        ins = Instruction(op, args, self._shape_of(op, args, mods), mods)  # it copies both lists
        ins.module = self
        for a in args:
            a.outputs.append(ins)
        return ins

    def append_computed(
        self, op: Op, args: Sequence[Instruction], shape: Shape, mods: Sequence[Module] = ()
    ) -> Instruction:
        """Append an instruction whose ``shape`` the caller computed (and checked) from ``args``:
        loaders that rebuild a whole module in order (``.mxr`` files, shape templates)."""
        ins = Instruction(op, args, shape, mods)
        ins.module = self
        for a in args:
            a.outputs.append(ins)
        self.instructions.append(ins)
        return ins

    def add_instruction(
        self, op: Op, args: Sequence[Instruction] = (), mod_args: Sequence[Module] = ()
    ) -> Instruction:
        ins = self._new(op, args, mod_args)
        self.instructions.append(ins)
        return ins

    def insert_instruction(
        self, before: Instruction, op: Op, args: Sequence[Instruction] = (), mod_args: Sequence[Module] = ()
    ) -> Instruction:
        ins = self._new(op, args, mod_args)
        self.instructions.insert(self._index(before), ins)
        return ins

    def add_parameter(self, name: str, shape: Shape, runtime_axes: tuple[int, ...] = ()) -> Instruction:
        if name in self.get_parameter_names():
            raise ModuleError(f"parameter {name!r} already exists")
        ins = self._new(Param(parameter=name, shape=shape, runtime_axes=tuple(runtime_axes)), [])
        # Parameters lead the module so inserting one late can't break topological order.
        pos = 0
        while pos < len(self.instructions) and self.instructions[pos].is_param():
            pos += 1
        self.instructions.insert(pos, ins)
        return ins

    def add_literal(self, value: np.ndarray | Literal) -> Instruction:
        op = value if isinstance(value, Literal) else Literal(np.asarray(value))
        ins = self._new(op, [])
        self.instructions.insert(self._first_non_param(), ins)
        return ins

    def add_return(self, args: Sequence[Instruction]) -> Instruction:
        old = self.get_return()
        if old is not None:
            self.remove_instruction(old)
        return self.add_instruction(Return(), args)

    # -- editing --------------------------------------------------------------------------------
    def replace_instruction(
        self,
        ins: Instruction,
        op: Op | Instruction,
        args: Sequence[Instruction] | None = None,
        mod_args: Sequence[Module] | None = None,
    ) -> Instruction:
        """Give ``ins`` a new op and inputs in place, or (given an instruction) redirect its users."""
        if isinstance(op, Instruction):
            self.replace_all_uses(ins, op)
            return op
        args = ins.inputs if args is None else list(args)
        mods = ins.module_args if mod_args is None else list(mod_args)
        shape = self._shape_of(op, args, mods)
        if ins.outputs and shape != ins.shape and not ins.is_return():
            raise ModuleError(
                f"replace_instruction: {op} changes shape {ins.shape} -> {shape} of a used value"
            )
        ins.op = op
        ins.shape = shape
        ins.module_args = list(mods)
        ins.replace_inputs(list(args))
        return ins

    def replace_all_uses(self, old: Instruction, new: Instruction) -> None:
        if old is new:
            return
        if old.shape != new.shape and old.outputs:
            # Users computed their shapes from the old value; a different layout or type there would
            # silently change their meaning.
            if old.shape.lens != new.shape.lens or old.shape.type != new.shape.type:
                raise ModuleError(f"replace_all_uses: {new.shape} does not match {old.shape}")
        for user in list(dict.fromkeys(old.outputs)):
            user.replace_inputs([new if i is old else i for i in user.inputs])

    def remove_instruction(self, ins: Instruction) -> None:
        if ins.outputs:
            raise ModuleError(f"remove_instruction: {ins.op} still has users")
        ins.replace_inputs([])
        self.instructions.pop(self._index(ins))
        ins.module = None

    def recompute_shape(self, ins: Instruction) -> None:
        """Compute ``ins``'s shape again from its inputs' (MIGraphX ``instruction::recompute_shape``): a
        pass that changes the layout of values others read walks their users in order with it."""
        ins.shape = self._shape_of(ins.op, ins.inputs, ins.module_args)

    def move_instruction(self, ins: Instruction, before: Instruction) -> None:
        self.instructions.pop(self._index(ins))
        self.instructions.insert(self._index(before), ins)

    # -- queries --------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Instruction]:
        return iter(list(self.instructions))  # a copy: passes may edit while iterating

    def __len__(self) -> int:
        return len(self.instructions)

    def _index(self, ins: Instruction) -> int:
        # A pass edits where it is walking: look around the last position found first, then everywhere,
        # so inserting before (or removing) each instruction of a long module is not quadratic. list.index
        # compares by identity first (instructions define no __eq__), in C.
        lo = max(0, self._near - INDEX_WINDOW)
        try:
            i = self.instructions.index(ins, lo, lo + 2 * INDEX_WINDOW)
        except ValueError:
            try:
                i = self.instructions.index(ins)
            except ValueError:
                raise ModuleError(f"instruction {ins.op} is not in module {self.name!r}") from None
        self._near = i
        return i

    def _first_non_param(self) -> int:
        pos = 0
        while pos < len(self.instructions) and self.instructions[pos].is_param():
            pos += 1
        return pos

    def get_return(self) -> Instruction | None:
        last = self.instructions[-1] if self.instructions else None
        return last if last is not None and last.is_return() else None

    def get_parameters(self) -> list[Instruction]:
        return [i for i in self.instructions if i.is_param()]

    def get_parameter_names(self) -> list[str]:
        return [i.op.parameter for i in self.get_parameters()]  # type: ignore[attr-defined]

    def get_parameter_shapes(self) -> dict[str, Shape]:
        return {i.op.parameter: i.shape for i in self.get_parameters()}  # type: ignore[attr-defined]

    def get_parameter(self, name: str) -> Instruction | None:
        return next((i for i in self.get_parameters() if i.op.parameter == name), None)  # type: ignore[attr-defined]

    def get_output_shapes(self) -> list[Shape]:
        ret = self.get_return()
        if ret is not None:
            return [i.shape for i in ret.inputs]
        return [self.instructions[-1].shape] if self.instructions else []

    def outputs(self) -> list[Instruction]:
        ret = self.get_return()
        if ret is not None:
            return list(ret.inputs)
        return [self.instructions[-1]] if self.instructions else []

    # -- integrity ------------------------------------------------------------------------------
    def validate(self) -> None:
        """Raise ModuleError on a broken def-use link, an unsorted input or a stale shape."""
        seen: set[int] = set()
        members = {id(i) for i in self.instructions}
        for ins in self.instructions:
            if ins.module is not self:
                raise ModuleError(f"{ins.op}: wrong owning module")
            for a in ins.inputs:
                if id(a) not in members:
                    raise ModuleError(f"{ins.op}: input {a.op} is not in the module")
                if id(a) not in seen:
                    raise ModuleError(f"{ins.op}: input {a.op} comes after its user")
                if a.outputs.count(ins) != ins.inputs.count(a):
                    raise ModuleError(f"{ins.op}: def-use link to {a.op} is broken")
            for u in ins.outputs:
                if id(u) not in members:
                    raise ModuleError(f"{ins.op}: user {u.op} is not in the module")
            if ins.is_return() and ins is not self.instructions[-1]:
                raise ModuleError("@return must be the last instruction")
            if self._shape_of(ins.op, ins.inputs, ins.module_args) != ins.shape:
                raise ModuleError(f"{ins.op}: stored shape {ins.shape} is stale")
            seen.add(id(ins))

    def sort(self) -> None:
        """Reorder into a topological order that keeps the existing order where it is valid."""
        order: list[Instruction] = []
        placed: set[int] = set()
        for root in self.instructions:
            stack = [(root, False)]
            while stack:
                ins, ready = stack.pop()
                if id(ins) in placed:
                    continue
                if ready:
                    placed.add(id(ins))
                    order.append(ins)
                    continue
                stack.append((ins, True))
                stack.extend((i, False) for i in reversed(ins.inputs) if id(i) not in placed)
        ret = [i for i in order if i.is_return()]
        self.instructions = [i for i in order if not i.is_return()] + ret

    # -- printing and equality --------------------------------------------------------------------
    def numbering(self) -> dict[int, str]:
        return {id(ins): f"@{n}" for n, ins in enumerate(self.instructions)}

    def to_text(self) -> str:
        names = self.numbering()
        lines = [f'module: "{self.name}"']
        for ins in self.instructions:
            args = ",".join(names[id(a)] for a in ins.inputs)
            mods = "".join(f", {m.name}" for m in ins.module_args)
            call = f"{ins.op}({args}{mods})" if ins.inputs or mods else str(ins.op)
            lines.append(f"{names[id(ins)]} = {call} -> {ins.shape}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.to_text()

    def print(self) -> None:  # noqa: A003 - MIGraphX API name
        print(self.to_text())

    def structure(self) -> list[tuple]:
        """Position-indexed form for structural equality (names of instructions don't matter)."""
        pos = {id(ins): n for n, ins in enumerate(self.instructions)}
        return [
            (
                ins.op,
                tuple(pos[id(a)] for a in ins.inputs),
                ins.shape,
                tuple(m.structure() for m in ins.module_args),
            )
            for ins in self.instructions
        ]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Module) and self.structure() == other.structure()

    __hash__ = None  # type: ignore[assignment]

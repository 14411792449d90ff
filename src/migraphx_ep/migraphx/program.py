"""Operations, modules and programs of the MIGraphX Python API, plus its program transforms."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .. import mxr
from .. import quantize as _quantize
from ..ir.instruction import Instruction
from ..ir.module import Module
from ..ir.operation import OPS, Op, make_op
from ..ir.program import Program
from .values import _as_array, _dtype, _ir_shape, argument, shape


# -- op, module, program -------------------------------------------------------------------------------
def op(name: str, **kwargs: Any) -> Op:  # noqa: N802 - MIGraphX API name
    """``op(name, **attributes)``: shapes may be API shapes, element types may be given by name."""
    cls = OPS.get(name)
    fields = getattr(cls, "__dataclass_fields__", {})
    attrs = {}
    for k, v in kwargs.items():
        if isinstance(v, shape):
            v = v.ir
        elif isinstance(v, str) and "DType" in str(getattr(fields.get(k), "type", "")):
            v = _dtype(v)
        attrs[k] = v
    return make_op(name, **attrs)


class module:  # noqa: N801 - MIGraphX API name
    """A module of a program (get one with ``program.get_main_module()`` or ``create_module``)."""

    __slots__ = ("_m",)

    def __init__(self, m: Module) -> None:
        self._m = m

    @property
    def ir(self) -> Module:
        return self._m

    def name(self) -> str:
        return self._m.name

    def print(self) -> None:  # noqa: A003
        print(self._m.to_text())

    def add_instruction(
        self, op: Op, args: Sequence[Instruction], mod_args: Sequence[Any] = ()
    ) -> Instruction:
        return self._m.add_instruction(
            op, list(args), [m.ir if isinstance(m, module) else m for m in mod_args]
        )

    def add_literal(self, data: Any) -> Instruction:
        return self._m.add_literal(np.array(_as_array(data)))  # a copy: the caller may reuse its buffer

    def add_parameter(self, name: str, s: Any) -> Instruction:
        return self._m.add_parameter(name, _ir_shape(s))

    def add_return(self, args: Sequence[Instruction]) -> Instruction:
        return self._m.add_return(list(args))

    def get_parameter_names(self) -> list[str]:
        return self._m.get_parameter_names()

    def get_parameter_shapes(self) -> dict[str, shape]:
        return {k: shape(v) for k, v in self._m.get_parameter_shapes().items()}

    def __str__(self) -> str:
        return self._m.to_text()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, module) and self._m == other._m

    __hash__ = None  # type: ignore[assignment]


class program:  # noqa: N801 - MIGraphX API name
    __slots__ = ("_p",)

    def __init__(self, p: Program | None = None) -> None:
        self._p = Program() if p is None else p

    @property
    def ir(self) -> Program:
        return self._p

    def clone(self) -> program:
        return program(self._p.clone())

    def get_parameter_names(self) -> list[str]:
        return self._p.get_parameter_names()

    def get_parameter_shapes(self) -> dict[str, shape]:
        return {k: shape(v) for k, v in self._p.get_parameter_shapes().items()}

    def get_output_shapes(self) -> list[shape]:
        return [shape(s) for s in self._p.get_output_shapes()]

    def compile(
        self,
        t: Any,
        offload_copy: bool = True,
        fast_math: bool = True,  # noqa: A003
        exhaustive_tune: bool = False,
    ) -> None:
        self._p.compile(t, offload_copy=offload_copy, fast_math=fast_math, exhaustive_tune=exhaustive_tune)

    def is_compiled(self) -> bool:
        return self._p.is_compiled()

    def get_main_module(self) -> module:
        return module(self._p.get_main_module())

    def create_module(self, name: str) -> module:
        return module(self._p.create_module(name))

    def run(self, params: Mapping[str, Any]) -> list[argument]:
        return [argument(r) for r in self._p.run_numpy({k: _as_array(v) for k, v in params.items()})]

    def sort(self) -> None:
        self._p.sort()

    def print(self) -> None:  # noqa: A003
        print(self._p)

    def __str__(self) -> str:
        return str(self._p)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, program) and self._p == other._p

    __hash__ = None  # type: ignore[assignment]


def _ir_program(p: Any) -> Program:
    if isinstance(p, program):
        return p.ir
    if isinstance(p, Program):
        return p
    raise TypeError(f"expected a migraphx program, got {type(p).__name__}")


# -- transforms ------------------------------------------------------------------------------------------
def quantize_fp16(prog: Any, ins_names: Sequence[str] = ("all",)) -> None:
    _quantize.quantize_fp16(_ir_program(prog), list(ins_names))


def quantize_int8(
    prog: Any,
    t: Any = None,
    calibration: Sequence[Mapping[str, Any]] = (),
    ins_names: Sequence[str] = ("dot", "convolution"),
) -> None:
    data = [{k: _as_array(v) for k, v in c.items()} for c in calibration]
    _quantize.quantize_int8(_ir_program(prog), t, data, list(ins_names))


def autocast_fp8(prog: Any) -> None:
    _quantize.autocast_fp8(_ir_program(prog))


def load(filename: str | os.PathLike, format: str = "msgpack") -> program:  # noqa: A002
    return program(mxr.load(filename, format))


def save(p: Any, filename: str | os.PathLike, format: str = "msgpack") -> None:  # noqa: A002
    mxr.save(_ir_program(p), filename, format)

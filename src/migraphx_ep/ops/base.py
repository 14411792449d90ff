"""Op families: most ops are one line in a table built on these bases (STYLE.md §1).

An elementwise op's ``cpp`` is its one device meaning: a C expression over its
inputs' compute values ``{0}``, ``{1}``..., with ``{C}`` the compute type (float for half and bfloat16)
and ``{attr}`` an attribute of the op as a literal of that type. It may call the ``mx_*`` helpers of the
gpu target's kernel prelude (targets/gpu/kernels/include/mx_prelude.cuh), which give C numpy's
meaning where C's own differs: NaN through max/min/relu, wrapping integer arithmetic, integer division
and shifts, the sign of zero, correctly rounded erf/pow. The gpu kernel generator reads nothing else,
and the tests compile and run every op's expression against ``fn`` (tests/gpu/test_kernel_host.py).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import ClassVar

import numpy as np

from ..ir.dtypes import FLOAT_TYPES, INT_TYPES, DType
from ..ir.operation import Op, op_class, register_op
from ..ir.shape import Shape, check_shapes, follow_channels_last

NUMERIC_TYPES = FLOAT_TYPES | INT_TYPES
ALL_TYPES = NUMERIC_TYPES | {DType.bool_type}


def elementwise_shape(inputs: list[Shape], t: DType | None = None, first: int = 0) -> Shape:
    """An elementwise op's output: its ``first`` input's dims (of type ``t``, else that input's), laid
    out channels-last when an input is (what the gpu target's layout pass made so stays so along a
    chain of lone elementwise ops too), else standard."""
    return follow_channels_last(inputs[first].with_lens(inputs[first].lens, t), inputs)


@op_class
class UnaryOp(Op):
    """Elementwise f(x): ``fn`` is the numpy meaning, ``cpp`` the device meaning (module doc)."""

    fn: ClassVar[Callable[[np.ndarray], np.ndarray]]
    cpp: ClassVar[str] = ""
    types: ClassVar[frozenset[DType]] = frozenset(NUMERIC_TYPES)
    result_type: ClassVar[DType | None] = None  # e.g. bool for isnan

    def compute_shape(self, inputs: list[Shape]) -> Shape:
        check_shapes(self.name, inputs).has(1).types(self.types)
        return elementwise_shape(inputs, self.result_type)

    def compute(self, out: Shape, args: list[np.ndarray]) -> np.ndarray:
        with np.errstate(all="ignore"):
            return np.asarray(type(self).fn(args[0])).astype(out.dtype, copy=False)


@op_class
class BinaryOp(Op):
    """Elementwise f(a, b) on equal dims (the frontend inserts ``multibroadcast`` first)."""

    fn: ClassVar[Callable[[np.ndarray, np.ndarray], np.ndarray]]
    cpp: ClassVar[str] = ""
    types: ClassVar[frozenset[DType]] = frozenset(NUMERIC_TYPES)
    result_type: ClassVar[DType | None] = None  # bool for comparisons

    def compute_shape(self, inputs: list[Shape]) -> Shape:
        check_shapes(self.name, inputs).has(2).same_type().same_dims().types(self.types)
        return elementwise_shape(inputs, self.result_type)

    def compute(self, out: Shape, args: list[np.ndarray]) -> np.ndarray:
        with np.errstate(all="ignore"):
            return np.asarray(type(self).fn(args[0], args[1])).astype(out.dtype, copy=False)


def _define(family: type, name: str, fn: Callable, cpp: str, types, result_type: DType | None) -> type:
    """Make and register a ``family`` op class named ``name`` for the module two frames up."""
    body = {
        "__annotations__": {},
        "__module__": sys._getframe(2).f_globals["__name__"],  # the defining module, not base
        "name": name,
        "fn": staticmethod(fn),
        "cpp": cpp,
        "types": frozenset(types),
        "result_type": result_type,
    }
    cls = type(name.title().replace("_", ""), (family,), body)
    return register_op(op_class(cls))


def unary(
    name: str, fn: Callable, cpp: str = "", types=NUMERIC_TYPES, result_type: DType | None = None
) -> type:
    """Define and register an elementwise unary op in one line."""
    return _define(UnaryOp, name, fn, cpp, types, result_type)


def binary(
    name: str, fn: Callable, cpp: str = "", types=NUMERIC_TYPES, result_type: DType | None = None
) -> type:
    """Define and register an elementwise binary op in one line."""
    return _define(BinaryOp, name, fn, cpp, types, result_type)

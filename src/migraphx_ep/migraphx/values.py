"""Shapes and arguments of the MIGraphX Python API, over the IR's ``Shape`` and ``Argument``."""

from __future__ import annotations

import ctypes
import zlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from ..ir.argument import Argument
from ..ir.dtypes import DType, from_numpy, is_float, strided_view
from ..ir.shape import DynamicDimension, Shape


def _dtype(t: Any) -> DType:
    """A type from an int, a ``shape.type_t``, a name (``"float_type"``, ``"float"``) or a numpy dtype."""
    if isinstance(t, DType | int) and not isinstance(t, bool):
        return DType(t)
    if isinstance(t, str):
        key = t if t.endswith("_type") else f"{t}_type"
        if key in DType.__members__:
            return DType[key]
    try:
        return from_numpy(np.dtype(t))
    except TypeError:
        raise TypeError(f"unknown element type {t!r}; use a shape.type_t name such as 'float_type'") from None


# -- shape ---------------------------------------------------------------------------------------------
class shape:  # noqa: N801 - MIGraphX API name
    """``shape(type, lens, strides=None, dyn_dims=None)``; accessors are methods, as in MIGraphX."""

    type_t = DType
    __slots__ = ("_s",)

    def __init__(
        self,
        type: Any = DType.float_type,
        lens: Iterable[int] | None = None,  # noqa: A002
        strides: Iterable[int] | None = None,
        dyn_dims: Iterable[DynamicDimension] | None = None,
    ) -> None:
        if isinstance(type, Shape):
            self._s = type
            return
        self._s = Shape(
            _dtype(type),
            list(lens or ()),
            None if strides is None else list(strides),
            None if dyn_dims is None else list(dyn_dims),
        )

    @property
    def ir(self) -> Shape:
        return self._s

    def type(self) -> int:  # noqa: A003
        return int(self._s.type)

    def type_string(self) -> str:
        return self._s.type.name

    def lens(self) -> list[int]:
        return list(self._s.lens)

    def strides(self) -> list[int]:
        return list(self._s.strides)

    def elements(self) -> int:
        return self._s.elements()

    def dyn_dims(self) -> list[DynamicDimension]:
        return list(self._s.dyn_dims_or_fixed())

    def min_lens(self) -> list[int]:
        return [d.min for d in self._s.dyn_dims_or_fixed()]

    def max_lens(self) -> list[int]:
        return [d.max for d in self._s.dyn_dims_or_fixed()]

    def bytes(self) -> int:  # noqa: A003
        return self._s.bytes()

    def type_size(self) -> int:
        return self._s.type_size()

    def ndim(self) -> int:
        return self._s.ndim()

    def packed(self) -> bool:
        return self._s.packed()

    def transposed(self) -> bool:
        return self._s.transposed()

    def broadcasted(self) -> bool:
        return self._s.broadcasted()

    def dynamic(self) -> bool:
        return self._s.dynamic()

    def standard(self) -> bool:
        return self._s.standard()

    def scalar(self) -> bool:
        return self._s.scalar()

    def __eq__(self, other: object) -> bool:
        o = other.ir if isinstance(other, shape) else other
        return isinstance(o, Shape) and o == self._s

    def __hash__(self) -> int:
        return hash(self._s)

    def __repr__(self) -> str:
        return repr(self._s)


def _ir_shape(s: Any) -> Shape:
    if isinstance(s, shape):
        return s.ir
    if isinstance(s, Shape):
        return s
    raise TypeError(f"expected a migraphx shape, got {type(s).__name__}")


# -- argument ------------------------------------------------------------------------------------------
def _as_array(data: Any) -> np.ndarray:
    if isinstance(data, Argument):
        return data.numpy()
    if isinstance(data, bytes | bytearray):
        return np.frombuffer(data, dtype=np.uint8)
    return np.asarray(data)


class argument(Argument):  # noqa: N801 - MIGraphX API name
    """``argument(data)`` from any buffer (numpy arrays included), or ``argument(shape)`` zero-filled."""

    __slots__ = ()

    def __init__(self, data: Any = None, s: Any = None) -> None:
        if isinstance(data, shape | Shape):
            data, s = None, data
        super().__init__(None if data is None else _as_array(data), None if s is None else _ir_shape(s))

    def get_shape(self) -> shape:  # type: ignore[override]
        return shape(super().get_shape())

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Argument):
            return NotImplemented
        a, b = Argument.get_shape(self), Argument.get_shape(other)
        return a.type == b.type and a.lens == b.lens and bool(np.array_equal(self.numpy(), other.numpy()))

    __hash__ = None  # type: ignore[assignment]

    def __str__(self) -> str:
        return ", ".join(map(str, self.tolist()))


def _strided(s: Shape, flat: np.ndarray) -> np.ndarray:
    """View ``flat`` (``element_space`` elements) with the strides of ``s``."""
    if s.standard():
        return flat[: s.elements()].reshape(s.lens)
    item = flat.dtype.itemsize
    return strided_view(flat, s.lens, [st * item for st in s.strides])


def _random_values(s: Shape, seed: int) -> np.ndarray:
    if s.type == DType.tuple_type:
        raise TypeError("generate_argument: tuple shapes have no data")
    rng = np.random.default_rng(seed)
    n = s.element_space()
    if s.type == DType.bool_type:
        return rng.integers(0, 2, n).astype(np.bool_)
    if is_float(s.type):
        return rng.uniform(-1.0, 1.0, n).astype(np.float32).astype(s.dtype)
    info = np.iinfo(s.dtype)
    low = 0 if info.min == 0 else -8  # small values: safe as indices and free of overflow
    return rng.integers(low, 8 if low else 16, n).astype(s.dtype)


def generate_argument(s: Any, seed: int = 0) -> argument:
    """Deterministic pseudo-random data: floats in [-1, 1), signed ints in [-8, 8), unsigned in [0, 16)."""
    ir = _ir_shape(s)
    return argument(_strided(ir, _random_values(ir, seed)), ir)


def generate_inputs(shapes: Mapping[str, Any], seed: int = 0) -> dict[str, np.ndarray]:
    """One generated array per parameter; each name gets its own stream, independent of order."""
    return {
        name: generate_argument(_ir_shape(s), seed + zlib.crc32(name.encode())).numpy()
        for name, s in shapes.items()
    }


def fill_argument(s: Any, value: Any) -> argument:
    ir = _ir_shape(s)
    return argument(_strided(ir, np.full(ir.element_space(), value, dtype=ir.dtype)), ir)


def create_argument(s: Any, values: Sequence[Any]) -> argument:
    ir = _ir_shape(s)
    arr = np.asarray(values, dtype=ir.dtype)
    if arr.size != ir.elements():
        raise ValueError(f"create_argument: {arr.size} values for a shape of {ir.elements()} elements")
    out = _strided(ir, np.zeros(ir.element_space(), dtype=ir.dtype))
    out[...] = arr.reshape(ir.lens)
    return argument(out, ir)


def argument_from_pointer(s: Any, address: int) -> argument:
    """An argument over memory at ``address`` (no copy); the caller keeps that memory alive."""
    ir = _ir_shape(s)
    if not address:
        raise ValueError("argument_from_pointer: null address")
    nbytes = ir.bytes()
    if nbytes == 0:
        return argument(np.empty(ir.lens, dtype=ir.dtype), ir)
    raw = (ctypes.c_ubyte * nbytes).from_address(int(address))
    flat = np.frombuffer(raw, dtype=np.uint8).view(ir.dtype)
    return argument(_strided(ir, flat), ir)

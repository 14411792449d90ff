"""Tensor shapes: element type, lens and strides (views), dynamic dimensions, tuples."""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from .dtypes import DType, as_dtype, from_numpy, to_numpy, type_name


@dataclass(frozen=True)
class DynamicDimension:
    """A dimension known only within ``[min, max]``; ``optimals`` are sizes worth compiling for."""

    min: int = 0
    max: int = 0
    optimals: frozenset[int] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        if self.min < 0 or self.max < self.min:
            raise ValueError(f"dynamic_dimension: bad range [{self.min}, {self.max}]")
        object.__setattr__(self, "optimals", frozenset(self.optimals))

    def is_fixed(self) -> bool:
        return self.min == self.max

    def __str__(self) -> str:
        if self.is_fixed():
            return str(self.min)
        opt = f", {{{', '.join(map(str, sorted(self.optimals)))}}}" if self.optimals else ""
        return f"{{{self.min}, {self.max}{opt}}}"


CHANNELS_LAST = (0, 2, 3, 1)  # the permutation of an NCHW value laid out NHWC


def follow_channels_last(out: Shape, sources: Iterable[Shape]) -> Shape:
    """``out`` (standard) laid out channels-last when one of ``sources`` is: convolutions, pooling, pad
    and elementwise ops (not ``contiguous``) keep their input's layout, so a value the gpu target's
    layout pass made NHWC stays so down a chain (MIGraphX's ops keep their inputs' permutation; here
    only channels-last, the one layout a pass introduces, is kept)."""
    if out.ndim() == 4 and any(s.channels_last() for s in sources):
        return out.as_channels_last()
    return out


def standard_strides(lens: Sequence[int]) -> tuple[int, ...]:
    strides = [1] * len(lens)
    for i in range(len(lens) - 2, -1, -1):
        strides[i] = strides[i + 1] * max(lens[i + 1], 1)
    return tuple(strides)


# Every Shape built without strides, and every standard() query, needs these; a compile asks for the
# same few hundred lens thousands of times. A pure function of a tuple of ints: the memo cannot go stale.
_standard_strides = functools.lru_cache(maxsize=4096)(standard_strides)


class Shape:
    """Immutable and hashable; ``Shape(t, lens)`` is standard (packed, row-major)."""

    __slots__ = ("type", "lens", "strides", "dyn_dims", "sub_shapes", "_hash")

    def __init__(
        self,
        type: DType | int,  # noqa: A002 - MIGraphX's name
        lens: Iterable[int] = (),
        strides: Iterable[int] | None = None,
        dyn_dims: Iterable[DynamicDimension] | None = None,
        sub_shapes: Iterable[Shape] | None = None,
    ) -> None:
        self.type = as_dtype(type)
        self.sub_shapes: tuple[Shape, ...] = tuple(sub_shapes or ())
        self.dyn_dims: tuple[DynamicDimension, ...] | None = None
        if dyn_dims is not None:
            dd = tuple(dyn_dims)
            if all(d.is_fixed() for d in dd):
                lens = [d.min for d in dd]
            else:
                self.dyn_dims = dd
                lens = [d.max for d in dd]
        self.lens: tuple[int, ...] = tuple(map(int, lens))
        if self.lens and min(self.lens) < 0:
            raise ValueError(f"shape: negative length in {list(self.lens)}")
        if strides is None:
            self.strides = _standard_strides(self.lens)
        else:
            self.strides = tuple(map(int, strides))
            if len(self.strides) != len(self.lens):
                raise ValueError(f"shape: {len(self.lens)} lens but {len(self.strides)} strides")
        self._hash = hash((self.type, self.lens, self.strides, self.dyn_dims, self.sub_shapes))

    # -- construction helpers -------------------------------------------------------------------
    @classmethod
    def of(cls, array: np.ndarray) -> Shape:
        """The standard shape of an array's dtype and dims (layout is normalised, not copied)."""
        return cls(from_numpy(array.dtype), array.shape)

    @classmethod
    def tuple_of(cls, shapes: Iterable[Shape]) -> Shape:
        return cls(DType.tuple_type, sub_shapes=shapes)

    def with_lens(self, lens: Iterable[int], t: DType | None = None) -> Shape:
        return Shape(self.type if t is None else t, lens)

    def with_type(self, t: DType) -> Shape:
        return Shape(t, self.lens, self.strides)

    def as_standard(self) -> Shape:
        return Shape(self.type, self.lens)

    @classmethod
    def from_permutation(cls, t: DType, lens: Sequence[int], permutation: Sequence[int]) -> Shape:
        """Packed ``lens`` whose memory order is ``permutation`` (outermost dim first): (0, 2, 3, 1) lays
        an (N, C, H, W) value out channels-last (MIGraphX ``shape::from_permutation``)."""
        if sorted(permutation) != list(range(len(lens))):
            raise ValueError(f"shape: {list(permutation)} is not a permutation of {len(lens)} dims")
        strides = [0] * len(lens)
        step = 1
        for d in reversed(permutation):
            strides[d] = step
            step *= max(lens[d], 1)
        return cls(t, lens, strides)

    def as_channels_last(self) -> Shape:
        """This (N, C, H, W) value packed channels-last (NHWC)."""
        return Shape.from_permutation(self.type, self.lens, CHANNELS_LAST)

    def channels_last(self) -> bool:
        """Laid out exactly as ``as_channels_last`` gives (strides compared as they are, so a value of
        one channel is channels-last only when a layout made it so)."""
        if len(self.lens) != 4:
            return False
        # Asked of every 4-D input of every fused elementwise op a compile builds: no Shape made here.
        c, h, w = (max(n, 1) for n in self.lens[1:])
        return self.strides == (h * w * c, 1, w * c, c)

    # -- queries (names follow MIGraphX) --------------------------------------------------------
    @property
    def dtype(self) -> np.dtype:
        return to_numpy(self.type)

    def ndim(self) -> int:
        return len(self.lens)

    def elements(self) -> int:
        return math.prod(self.lens)

    def type_size(self) -> int:
        return 0 if self.type == DType.tuple_type else self.dtype.itemsize

    def element_space(self) -> int:
        """Elements the strided layout spans (what a buffer for it must hold)."""
        if 0 in self.lens:  # no elements (a plain loop below: asked ~1,000 times per compile)
            return 0
        space = 1
        for n, s in zip(self.lens, self.strides, strict=True):
            space += (n - 1) * s
        return space

    def bytes(self) -> int:
        if self.type == DType.tuple_type:
            return sum(s.bytes() for s in self.sub_shapes)
        return self.element_space() * self.type_size()

    def dynamic(self) -> bool:
        return self.dyn_dims is not None

    def packed(self) -> bool:
        return not self.broadcasted() and self.elements() == self.element_space()

    def transposed(self) -> bool:
        s = [st for st, n in zip(self.strides, self.lens, strict=True) if n != 1]
        return s != sorted(s, reverse=True)

    def broadcasted(self) -> bool:
        return any(s == 0 and n != 1 for s, n in zip(self.strides, self.lens, strict=True))

    def standard(self) -> bool:
        if self.type == DType.tuple_type:
            return False
        return all(
            s == e
            for s, e, n in zip(self.strides, _standard_strides(self.lens), self.lens, strict=True)
            if n != 1
        )

    def scalar(self) -> bool:
        return len(self.lens) > 0 and all(s == 0 for s in self.strides)

    def dyn_dims_or_fixed(self) -> tuple[DynamicDimension, ...]:
        return self.dyn_dims or tuple(DynamicDimension(n, n) for n in self.lens)

    # -- value semantics --------------------------------------------------------------------------
    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Shape)
            and self.type == other.type
            and self.lens == other.lens
            and self.strides == other.strides
            and self.dyn_dims == other.dyn_dims
            and self.sub_shapes == other.sub_shapes
        )

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        if self.type == DType.tuple_type:
            return "[" + ", ".join(map(repr, self.sub_shapes)) + "]"
        if self.dyn_dims is not None:
            return f"{type_name(self.type)}, {{{', '.join(map(str, self.dyn_dims))}}}"
        lens = ", ".join(map(str, self.lens))
        strides = ", ".join(map(str, self.strides))
        return f"{type_name(self.type)}, {{{lens}}}, {{{strides}}}"

    def to_dict(self) -> dict:
        d: dict = {"type": int(self.type), "lens": list(self.lens), "strides": list(self.strides)}
        if self.dyn_dims is not None:
            d["dyn_dims"] = [[x.min, x.max, sorted(x.optimals)] for x in self.dyn_dims]
        if self.sub_shapes:
            d["sub"] = [s.to_dict() for s in self.sub_shapes]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Shape:
        dyn = d.get("dyn_dims")
        return cls(
            d["type"],
            d.get("lens", ()),
            d.get("strides"),
            dyn_dims=None if dyn is None else [DynamicDimension(a, b, frozenset(o)) for a, b, o in dyn],
            sub_shapes=[cls.from_dict(s) for s in d.get("sub", ())],
        )


_TUPLE = DType.tuple_type  # a module constant: an enum member read through its class costs ~70 ns


class ShapeError(ValueError):
    """An operator was given inputs whose shapes or types it cannot accept."""


class ShapeCheck:
    """Fluent validation of an op's input shapes; every failure names the op and the rule."""

    def __init__(self, op_name: str, inputs: Sequence[Shape]) -> None:
        self.name = op_name
        self.inputs = list(inputs)

    def fail(self, why: str) -> ShapeError:
        return ShapeError(f"{self.name}: {why} (inputs: {self.inputs})")

    def has(self, *counts: int) -> ShapeCheck:
        if len(self.inputs) not in counts:
            raise self.fail(f"expected {' or '.join(map(str, counts))} inputs, got {len(self.inputs)}")
        return self

    def has_at_least(self, n: int) -> ShapeCheck:
        if len(self.inputs) < n:
            raise self.fail(f"expected at least {n} inputs, got {len(self.inputs)}")
        return self

    def same_type(self) -> ShapeCheck:
        if len({s.type for s in self.inputs}) > 1:
            raise self.fail("inputs must have the same element type")
        return self

    def same_dims(self) -> ShapeCheck:
        if len({s.lens for s in self.inputs}) > 1:
            raise self.fail("inputs must have the same dimensions")
        return self

    def same_ndims(self) -> ShapeCheck:
        if len({s.ndim() for s in self.inputs}) > 1:
            raise self.fail("inputs must have the same rank")
        return self

    def ndims(self, *ranks: int) -> ShapeCheck:
        for s in self.inputs:
            if s.ndim() not in ranks:
                raise self.fail(f"expected rank {' or '.join(map(str, ranks))}, got {s.ndim()}")
        return self

    def min_ndims(self, rank: int) -> ShapeCheck:
        for s in self.inputs:
            if s.ndim() < rank:
                raise self.fail(f"expected rank >= {rank}, got {s.ndim()}")
        return self

    def types(self, allowed: Iterable[DType]) -> ShapeCheck:
        if not isinstance(allowed, set | frozenset):  # op families pass a frozenset: no copy per check
            allowed = set(allowed)
        for s in self.inputs:
            if s.type not in allowed:
                raise self.fail(f"element type {type_name(s.type)} not supported")
        return self

    def not_tuple(self) -> ShapeCheck:
        for s in self.inputs:  # every op's check starts here: a plain loop, the member looked up once
            if s.type == _TUPLE:
                raise self.fail("tuple input not allowed")
        return self


def check_shapes(op_name: str, inputs: Sequence[Shape]) -> ShapeCheck:
    return ShapeCheck(op_name, inputs).not_tuple()

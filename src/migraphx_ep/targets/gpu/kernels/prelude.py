"""The device header every generated kernel starts with, and the Python helpers generators share.

``PRELUDE`` is the line ``#include "mx_prelude.cuh"`` (``include/``, shipped in the package; see
``headers.py``): self-contained CUDA C++ with fixed-width integer names, 16-bit storage types for half
and bfloat16, 8-bit ones for the float8 formats, numpy's element semantics as small ``mx_*`` templates
and the warp/block reductions. Half and bfloat16 values live in float ("compute type") between a load
and a store; generators round them back to 16 bits after every op (``c_type``, ``compute_type`` here),
as the ref target does. Float8 values are only converted (``elem_type``): pointwise kernels load them to
float and store them from float, and every other generator refuses them through ``c_type``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ....ir.dtypes import DType, as_dtype, to_numpy
from ....ir.shape import Shape
from .headers import include
from .params import Dim, Params, c_dim
from .spec import Unsupported

PRELUDE = include("mx_prelude.cuh")  # the first line of every generated source

_C_TYPES = {
    DType.bool_type: "bool",
    DType.half_type: "mx_f16",
    DType.bf16_type: "mx_bf16",
    DType.float_type: "float",
    DType.double_type: "double",
    DType.int8_type: "i8",
    DType.uint8_type: "u8",
    DType.int16_type: "i16",
    DType.uint16_type: "u16",
    DType.int32_type: "i32",
    DType.uint32_type: "u32",
    DType.int64_type: "i64",
    DType.uint64_type: "u64",
}
# Float8 storage types: the prelude's software codecs (so they need no fp8 hardware).
_FP8_C_TYPES = {
    DType.fp8e4m3fn_type: "mx_fp8e4m3fn",
    DType.fp8e4m3fnuz_type: "mx_fp8e4m3fnuz",
    DType.fp8e5m2_type: "mx_fp8e5m2",
    DType.fp8e5m2fnuz_type: "mx_fp8e5m2fnuz",
}
FP8 = frozenset(_FP8_C_TYPES)
NARROW = frozenset({DType.half_type, DType.bf16_type})
BLOCK = 256
MAX_BLOCKS = 132 * 32  # enough to fill the largest GPUs several times; grid-stride loops do the rest


def c_type(t: DType) -> str:
    """The storage type of an element in generated code that computes on it; fp8 and tuples have none."""
    try:
        return _C_TYPES[as_dtype(t)]
    except KeyError:
        raise Unsupported(f"no kernel element type for {DType(t).name}") from None


def elem_type(t: DType) -> str:
    """The storage type of an element a pointwise kernel loads or stores: ``c_type``'s, and the float8
    formats' (which only conversions read or write: ``pointwise_supported``)."""
    return _FP8_C_TYPES.get(as_dtype(t)) or c_type(t)


def compute_type(t: DType) -> str:
    """The type values of ``t`` are held in between a load and a store."""
    t = as_dtype(t)
    return "float" if t in NARROW or t in FP8 else c_type(t)


def c_literal(value: float | int | bool, t: DType) -> str:
    """``value`` rounded to ``t`` (numpy astype) as an exact literal of ``compute_type(t)``."""
    t = as_dtype(t)
    ct = compute_type(t)
    with np.errstate(all="ignore"):
        v = np.asarray(value).astype(to_numpy(t)).item()
    if t == DType.bool_type:
        return "true" if v else "false"
    if ct in ("float", "double"):
        v = float(v)
        suffix = "f" if ct == "float" else ""
        if math.isnan(v):
            return f"(({ct})__longlong_as_double(0x7ff8000000000000ll))"
        if math.isinf(v):
            return f"(({ct}){'-' if v < 0 else ''}__longlong_as_double(0x7ff0000000000000ll))"
        return f"{v.hex()}{suffix}"
    if v < 0:
        return f"(({ct})({v + 1}ll - 1))"  # INT64_MIN has no literal of its own
    return f"(({ct}){v}ull)"


def index_type(*sizes: int) -> str:
    """``u32`` when every element count and span fits in 31 bits (cheaper index math), else ``u64``."""
    return "u32" if max(sizes, default=0) < 2**31 else "u64"


def span(*shapes: Shape) -> int:
    """The largest element count or element space of ``shapes`` (what index math must reach)."""
    return max((max(s.elements(), s.element_space()) for s in shapes), default=0)


def batch_of_one(s: Shape) -> Shape:
    """``s`` with its first dim 1, strides kept: the shape a kernel has at batch 1. There the batch dim
    drops out of the index math, so a kernel's batch-1 source differs and is compiled beside it
    (``KernelSpec.others``)."""
    return Shape(s.type, (1, *s.lens[1:]), s.strides)


def collapse(lens: Sequence[int], strides: Sequence[Sequence[int]]) -> tuple[list[int], list[list[int]]]:
    """Drop length-1 dims and merge neighbours that are contiguous in every tensor (fewer divisions).

    ``strides`` holds one stride list per tensor over the same logical ``lens``.
    """
    keep = [i for i, n in enumerate(lens) if n != 1]
    out_lens: list[int] = []
    out_strides: list[list[int]] = [[] for _ in strides]
    for i in keep:
        if out_lens and all(st[-1] == s[i] * lens[i] for st, s in zip(out_strides, strides, strict=True)):
            out_lens[-1] *= lens[i]
            for st, s in zip(out_strides, strides, strict=True):
                st[-1] = s[i]
        else:
            out_lens.append(lens[i])
            for st, s in zip(out_strides, strides, strict=True):
                st.append(s[i])
    return out_lens, out_strides


def decompose(flat: str, lens: Sequence[Dim], prefix: str, idx: str) -> list[str]:
    """C statements splitting ``flat`` (row-major over ``lens``) into ``{prefix}0..`` digits."""
    if not lens:
        return []
    lines = [f"{idx} {prefix}_r = {flat};"]
    for d in range(len(lens) - 1, 0, -1):
        n = c_dim(lens[d])
        lines.append(f"const {idx} {prefix}{d} = {prefix}_r % {n}; {prefix}_r /= {n};")
    lines.append(f"const {idx} {prefix}0 = {prefix}_r;")
    return lines


def offset(digits: Sequence[str], strides: Sequence[Dim], idx: str = "") -> str:
    """``sum(digit * stride)`` as C, skipping zero strides; ``0`` when nothing is left."""
    terms = [d if s == 1 else f"{d} * {c_dim(s)}" for d, s in zip(digits, strides, strict=True) if s != 0]
    if not terms:
        return f"({idx})0" if idx else "0"
    return " + ".join(terms)


def check_strides(*shapes: Shape) -> None:
    for s in shapes:
        if any(st < 0 for st in s.strides):
            raise Unsupported(f"negative strides in {s}")


@dataclass
class Walk:
    """Some dims of same-lens tensors walked by one flat index: collapsed lens, each tensor's strides."""

    lens: list[int]
    strides: list[list[int]]

    def size(self) -> int:
        return math.prod(self.lens)

    def offsets(
        self, var: str, prefix: str, idx: str, p: Params | None = None
    ) -> tuple[list[str], list[str]]:
        """C lines splitting ``var`` into digits, and each tensor's offset expression; lens and strides
        other than 0 and 1 are run-time arguments when ``p`` is given."""
        strides: list[list[Dim]] = [[p.stride(x) for x in st] if p else list(st) for st in self.strides]
        if len(self.lens) <= 1:
            return [], [offset([var] * len(self.lens), st, idx) for st in strides]
        digits = [f"{prefix}{k}" for k in range(len(self.lens))]
        lens: list[Dim] = [p(n) for n in self.lens] if p else list(self.lens)
        return decompose(var, lens, prefix, idx), [offset(digits, st, idx) for st in strides]


def walk(shapes: Sequence[Shape], dims: Sequence[int], order: Sequence[int]) -> Walk:
    """``dims`` of ``shapes`` in descending ``order`` (a stride list: memory order), collapsed."""
    dims = sorted(dims, key=lambda d: -order[d])
    lens = [shapes[0].lens[d] for d in dims]
    return Walk(*collapse(lens, [[s.strides[d] for d in dims] for s in shapes]))


def grid_for(work: int, per_block: int = BLOCK) -> tuple[int, int, int]:
    """A 1-D grid covering ``work`` items at ``per_block`` per block, capped (loops stride the rest)."""
    return (max(1, min(MAX_BLOCKS, -(-work // per_block))), 1, 1)


def signature(
    name: str,
    in_types: Sequence[str],
    out_types: Sequence[str],
    threads: int = BLOCK,
    checked: bool = False,
    scalars: Sequence[str] = (),
) -> str:
    """``extern "C"`` kernel head: ``in0..`` const restrict pointers, then ``out0..``, then the error
    slot ``err`` of a ``checked`` kernel, then the run-time sizes ``scalars`` (``Params.decls``)."""
    params = [f"const {t}* __restrict__ in{i}" for i, t in enumerate(in_types)]
    params += [f"{t}* __restrict__ out{i}" for i, t in enumerate(out_types)]
    params += ["i32* __restrict__ err"] if checked else []
    params += list(scalars)
    return f'extern "C" __global__ void __launch_bounds__({threads}) {name}({", ".join(params)})'


def vector_width(*types: DType) -> int:
    """Elements per 16-byte access of the widest type (capped at 8)."""
    return max(1, min(8, 16 // max(to_numpy(t).itemsize for t in types)))

"""Neural-network ops: convolution (forward and backwards), pooling, LRN, dot, einsum.

Convolutions run as im2col + one batched matmul so BLAS does the work (a whole ResNet-50 goes through
the ref target in CI); the window extraction is a strided view, copied once by the reshape.
"""

from __future__ import annotations

import math
from typing import ClassVar

import numpy as np

from ..ir.dtypes import FLOAT_TYPES, INT_TYPES, DType, from_numpy, is_float, strided_view
from ..ir.operation import Op, op_class, register_op
from ..ir.shape import Shape, ShapeError, check_shapes, follow_channels_last
from .base import NUMERIC_TYPES

CONV_TYPES = frozenset(FLOAT_TYPES - {DType.fp8e4m3fnuz_type, DType.fp8e5m2fnuz_type})


def acc_dtype(t: np.dtype) -> np.dtype:
    """Accumulation type: float32 for <=32-bit floats (ORT CPU accumulates fp16 in fp32), else itself."""
    if t.kind == "f" and t.itemsize > 4:
        return t
    if t.kind in "iub":
        return t
    return np.dtype(np.float32)


def windows(
    x: np.ndarray,
    out: tuple[int, ...],
    lengths: tuple[int, ...],
    stride: tuple[int, ...],
    dilation: tuple[int, ...],
) -> np.ndarray:
    """Read-only view (N, C, *out, *lengths) of the sliding windows of an already padded ``x``."""
    sn, sc, *ss = x.strides
    shape = x.shape[:2] + tuple(out) + tuple(lengths)
    strides = (
        (sn, sc)
        + tuple(s * st for s, st in zip(ss, stride, strict=True))
        + tuple(s * d for s, d in zip(ss, dilation, strict=True))
    )
    return strided_view(x, shape, strides, writeable=False)


def _pad_spatial(x: np.ndarray, padding: tuple[int, ...], value: float | int = 0) -> np.ndarray:
    k = x.ndim - 2
    if not any(padding):
        return x
    widths = [(0, 0), (0, 0)] + [(padding[i], padding[i + k]) for i in range(k)]
    return np.pad(x, widths, constant_values=value)


def _spatial_attrs(op: str, k: int, padding, stride, dilation) -> tuple[tuple, tuple, tuple]:
    padding = tuple(padding) or (0,) * (2 * k)
    stride = tuple(stride) or (1,) * k
    dilation = tuple(dilation) or (1,) * k
    if len(padding) != 2 * k or len(stride) != k or len(dilation) != k:
        raise ShapeError(f"{op}: padding/stride/dilation do not match {k} spatial dims")
    if min(stride + dilation) < 1:
        raise ShapeError(f"{op}: stride and dilation must be positive")
    return padding, stride, dilation


def conv_forward(
    x: np.ndarray,
    w: np.ndarray,
    padding: tuple[int, ...],
    stride: tuple[int, ...],
    dilation: tuple[int, ...],
    group: int,
    out_lens: tuple[int, ...],
    acc: np.dtype,
) -> np.ndarray:
    """y[n, m, o] = sum_{c, k} x[n, c, o*s + k*d - p] * w[m, c, k] in ``acc`` arithmetic."""
    n, c = x.shape[:2]
    m, cg, *ks = w.shape
    xp = _pad_spatial(x.astype(acc, copy=False), padding)
    win = windows(xp, out_lens[2:], tuple(ks), stride, dilation)  # (N, C, *out, *K)
    k = len(ks)
    perm = (0, 1, *range(2 + k, 2 + 2 * k), *range(2, 2 + k))  # (N, C, *K, *out)
    cols = win.transpose(perm).reshape(n, group, cg * math.prod(ks), math.prod(out_lens[2:]))
    wg = w.astype(acc, copy=False).reshape(1, group, m // group, cg * math.prod(ks))
    y = np.matmul(wg, cols)  # (N, G, M/G, P)
    return y.reshape(out_lens)


def conv_output_lens(op: str, x: Shape, w: Shape, padding, stride, dilation, group: int) -> tuple[int, ...]:
    if x.ndim() < 3 or w.ndim() != x.ndim():
        raise ShapeError(f"{op}: input rank {x.ndim()} and weight rank {w.ndim()} must match and be >= 3")
    if group < 1 or x.lens[1] != w.lens[1] * group or w.lens[0] % group:
        raise ShapeError(f"{op}: channels {x.lens[1]}, weights {list(w.lens)} and group {group} disagree")
    out = [x.lens[0], w.lens[0]]
    k = x.ndim() - 2
    for i in range(k):
        span = (w.lens[2 + i] - 1) * dilation[i] + 1
        size = x.lens[2 + i] + padding[i] + padding[i + k] - span
        if size < 0:
            raise ShapeError(f"{op}: kernel larger than padded input on spatial axis {i}")
        out.append(size // stride[i] + 1)
    return tuple(out)


@register_op
@op_class
class Convolution(Op):
    """N-d grouped convolution; ``padding`` is [begin..., end...] per spatial axis (explicit)."""

    name: ClassVar[str] = "convolution"
    padding: tuple[int, ...] = ()
    stride: tuple[int, ...] = ()
    dilation: tuple[int, ...] = ()
    group: int = 1

    def attrs(self, k: int) -> tuple[tuple, tuple, tuple]:
        return _spatial_attrs(self.name, k, self.padding, self.stride, self.dilation)

    def compute_shape(self, inputs: list[Shape]) -> Shape:
        # int32 serves ConvInteger/QLinearConv after zero-point subtraction (wraps like ORT's int32 GEMM)
        check_shapes(self.name, inputs).has(2).same_type().types(CONV_TYPES | {DType.int32_type})
        x, w = inputs
        p, s, d = self.attrs(x.ndim() - 2)
        out = Shape(x.type, conv_output_lens(self.name, x, w, p, s, d, self.group))
        return follow_channels_last(out, [x])

    def compute(self, out: Shape, args: list[np.ndarray]) -> np.ndarray:
        x, w = args
        p, s, d = self.attrs(x.ndim - 2)
        return conv_forward(x, w, p, s, d, self.group, out.lens, acc_dtype(x.dtype)).astype(out.dtype)


@register_op
@op_class
class ConvolutionBackwards(Op):
    """Transposed convolution (ONNX ConvTranspose without bias); weights are (C, M/group, *K).

    ``padding`` crops the full result; a negative end padding extends it with zeros (output_padding).
    """

    name: ClassVar[str] = "convolution_backwards"
    padding: tuple[int, ...] = ()
    stride: tuple[int, ...] = ()
    dilation: tuple[int, ...] = ()
    group: int = 1

    def compute_shape(self, inputs: list[Shape]) -> Shape:
        check_shapes(self.name, inputs).has(2).same_type().types(CONV_TYPES)
        x, w = inputs
        k = x.ndim() - 2
        p, s, d = _spatial_attrs(self.name, k, self.padding, self.stride, self.dilation)
        if (
            x.ndim() < 3
            or w.ndim() != x.ndim()
            or self.group < 1
            or x.lens[1] != w.lens[0]
            or w.lens[0] % self.group
        ):
            raise ShapeError(f"{self.name}: input {list(x.lens)}, weights {list(w.lens)}, group {self.group}")
        out = [x.lens[0], w.lens[1] * self.group]
        for i in range(k):
            full = (x.lens[2 + i] - 1) * s[i] + (w.lens[2 + i] - 1) * d[i] + 1
            if min(p[i], p[i + k] + full) < 0 or full - p[i] - p[i + k] < 1:
                raise ShapeError(f"{self.name}: padding {list(p)} leaves no output on axis {i}")
            out.append(full - p[i] - p[i + k])
        return Shape(x.type, out)

    def compute(self, out: Shape, args: list[np.ndarray]) -> np.ndarray:
        x, w = args
        k = x.ndim - 2
        p, s, d = _spatial_attrs(self.name, k, self.padding, self.stride, self.dilation)
        acc = acc_dtype(x.dtype)
        n, c, *ins = x.shape
        _, mg, *ks = w.shape
        g = self.group
        # cols[n, g, (m, k...), i] = sum_c w[g*Cg + c, m, k] * x[n, g*Cg + c, i]
        wg = w.astype(acc, copy=False).reshape(g, c // g, mg * math.prod(ks)).transpose(0, 2, 1)
        cols = np.matmul(wg[None], x.astype(acc, copy=False).reshape(n, g, c // g, math.prod(ins)))
        cols = cols.reshape(n, g * mg, *ks, *ins)
        full = [(ins[i] - 1) * s[i] + (ks[i] - 1) * d[i] + 1 for i in range(k)]
        y = np.zeros((n, g * mg, *full), acc)
        for kpos in np.ndindex(*ks):
            dst = tuple(
                slice(kpos[i] * d[i], kpos[i] * d[i] + (ins[i] - 1) * s[i] + 1, s[i]) for i in range(k)
            )
            y[(slice(None), slice(None), *dst)] += cols[(slice(None), slice(None), *kpos)]
        # Negative end padding (output_padding) extends with zeros, then crop the begin/end pads.
        y = _pad_spatial(y, tuple([0] * k + [max(0, -p[k + i]) for i in range(k)]))
        crop = tuple(slice(p[i], p[i] + out.lens[2 + i]) for i in range(k))
        return np.ascontiguousarray(y[(slice(None), slice(None), *crop)]).astype(out.dtype)


POOL_MODES = ("average", "max", "lpnorm")


def pool_output_len(
    size: int, pad_begin: int, pad_end: int, length: int, stride: int, dilation: int, ceil_mode: bool
) -> int:
    """ONNX/ORT pooled size; with ceil_mode a last window starting inside the end padding is dropped."""
    span = (length - 1) * dilation + 1
    num = size + pad_begin + pad_end - span
    if num < 0:
        raise ShapeError("pooling: window larger than padded input")
    out = (-(-num // stride) if ceil_mode else num // stride) + 1
    if ceil_mode and (out - 1) * stride >= size + pad_begin:
        out -= 1
    return out


@register_op
@op_class
class Pooling(Op):
    """N-d pooling over explicit pads. ``average`` divides by the in-input element count unless
    ``count_include_pad`` (then explicit pads count, the ceil_mode overhang never does); ``lpnorm``
    is (sum |x|^p)^(1/p) with pads contributing 0; ``max`` ignores pads and NaN."""

    name: ClassVar[str] = "pooling"
    mode: str = "average"
    padding: tuple[int, ...] = ()
    stride: tuple[int, ...] = ()
    lengths: tuple[int, ...] = ()
    dilations: tuple[int, ...] = ()
    ceil_mode: bool = False
    lp_order: int = 2
    count_include_pad: bool = False

    def attrs(self, k: int) -> tuple[tuple, tuple, tuple]:
        if self.mode not in POOL_MODES:
            raise ShapeError(f"pooling: unknown mode {self.mode!r}")
        if len(self.lengths) != k:
            raise ShapeError(f"pooling: lengths {list(self.lengths)} do not match {k} spatial dims")
        return _spatial_attrs(self.name, k, self.padding, self.stride, self.dilations)

    def compute_shape(self, inputs: list[Shape]) -> Shape:
        types = NUMERIC_TYPES if self.mode == "max" else FLOAT_TYPES
        check_shapes(self.name, inputs).has(1).min_ndims(3).types(types)
        x = inputs[0]
        k = x.ndim() - 2
        p, s, d = self.attrs(k)
        if any(n < 1 for n in self.lengths):
            raise ShapeError("pooling: lengths must be positive")
        out = [
            pool_output_len(x.lens[2 + i], p[i], p[i + k], self.lengths[i], s[i], d[i], self.ceil_mode)
            for i in range(k)
        ]
        return follow_channels_last(Shape(x.type, (*x.lens[:2], *out)), [x])

    def compute(self, out: Shape, args: list[np.ndarray]) -> np.ndarray:
        x = args[0]
        k = x.ndim - 2
        p, s, d = self.attrs(k)
        outs = out.lens[2:]
        # Pad the end far enough for the ceil_mode overhang; the masks below tell pads from data.
        need = [(outs[i] - 1) * s[i] + (self.lengths[i] - 1) * d[i] + 1 for i in range(k)]
        extra = [max(0, need[i] - (x.shape[2 + i] + p[i] + p[i + k])) for i in range(k)]
        full_pad = tuple(p[:k]) + tuple(p[k + i] + extra[i] for i in range(k))
        red = tuple(range(2 + k, 2 + 2 * k))
        if self.mode == "max" and not is_float(from_numpy(x.dtype)):  # bfloat16/fp8 are not kind "f"
            xp = _pad_spatial(x, full_pad, np.iinfo(x.dtype).min)
            return windows(xp, outs, self.lengths, s, d).max(axis=red).astype(out.dtype)
        if self.mode == "max":
            # NaN is skipped (np.fmax; a window of only NaN gives NaN): ONNX says nothing, and ORT's CPU
            # kernels mostly skip it (which NaN wins there differs by rank and type). Pads are NaN too.
            xf = x.astype(np.float64 if x.dtype == np.float64 else np.float32)
            xp = _pad_spatial(xf, full_pad, np.nan)
            return np.fmax.reduce(windows(xp, outs, self.lengths, s, d), axis=red).astype(out.dtype)
        acc = np.float64 if x.dtype == np.float64 else np.float32
        xa = x.astype(acc)
        if self.mode == "lpnorm":
            xa = np.abs(xa) ** self.lp_order
        total = windows(_pad_spatial(xa, full_pad), outs, self.lengths, s, d).sum(axis=red)
        if self.mode == "lpnorm":
            return (total ** (1.0 / self.lp_order)).astype(out.dtype)
        return (total / self._counts(x.shape, full_pad, extra, outs, s, d, acc)).astype(out.dtype)

    def _counts(self, shape, full_pad, extra, outs, s, d, acc) -> np.ndarray:
        k = len(outs)
        ones = np.ones((1, 1, *shape[2:]), acc)
        if self.count_include_pad:
            # explicit pads count as elements; the ceil overhang does not
            mask = _pad_spatial(_pad_spatial(ones, self.padding, 1), (0,) * k + tuple(extra))
        else:
            mask = _pad_spatial(ones, full_pad)
        return windows(mask, outs, self.lengths, s, d).sum(axis=tuple(range(2 + k, 2 + 2 * k)))


@register_op
@op_class
class Lrn(Op):
    """Local response normalisation across channels (ONNX LRN)."""

    name: ClassVar[str] = "lrn"
    alpha: float = 0.0001
    beta: float = 0.75
    bias: float = 1.0
    size: int = 1

    def compute_shape(self, inputs: list[Shape]) -> Shape:
        check_shapes(self.name, inputs).has(1).min_ndims(3).types(FLOAT_TYPES)
        return inputs[0].as_standard()

    def compute(self, out: Shape, args: list[np.ndarray]) -> np.ndarray:
        x = args[0].astype(acc_dtype(args[0].dtype))
        c = x.shape[1]
        lo, hi = (self.size - 1) // 2, -(-(self.size - 1) // 2)
        sq = np.pad(x * x, [(0, 0), (lo, hi)] + [(0, 0)] * (x.ndim - 2))
        csum = np.cumsum(sq, axis=1)
        csum = np.concatenate([np.zeros_like(csum[:, :1]), csum], axis=1)
        win = csum[:, self.size : self.size + c] - csum[:, :c]
        y = x / (self.bias + (self.alpha / self.size) * win) ** self.beta
        return y.astype(out.dtype)


def matmul(a: np.ndarray, b: np.ndarray, out_dtype: np.dtype) -> np.ndarray:
    acc = acc_dtype(a.dtype)
    return np.matmul(a.astype(acc, copy=False), b.astype(acc, copy=False)).astype(out_dtype, copy=False)


@register_op
@op_class
class Dot(Op):
    """Batched matrix product of rank >= 2 operands with equal batch dims (the parser broadcasts).

    Floats narrower than 32 bits accumulate in float32 and round once; integers wrap like C.
    """

    name: ClassVar[str] = "dot"

    def compute_shape(self, inputs: list[Shape]) -> Shape:
        check_shapes(self.name, inputs).has(2).same_type().same_ndims().min_ndims(2).types(NUMERIC_TYPES)
        a, b = inputs
        if a.lens[:-2] != b.lens[:-2] or a.lens[-1] != b.lens[-2]:
            raise ShapeError(f"dot: {list(a.lens)} x {list(b.lens)} do not multiply")
        return Shape(a.type, (*a.lens[:-1], b.lens[-1]))

    def compute(self, out: Shape, args: list[np.ndarray]) -> np.ndarray:
        return matmul(args[0], args[1], out.dtype)


def einsum_lens(equation: str, all_lens: list[tuple[int, ...]]) -> tuple[int, ...]:
    """Output dims of an explicit einsum equation; ``...`` broadcasts like numpy."""
    eq = equation.replace(" ", "")
    if eq.count("->") != 1:
        raise ShapeError(f"einsum: equation {equation!r} must have one explicit '->' output")
    lhs, rhs = eq.split("->")
    terms = lhs.split(",")
    if len(terms) != len(all_lens):
        raise ShapeError(f"einsum: {len(terms)} operands in {equation!r}, {len(all_lens)} given")
    sizes: dict[str, int] = {}
    ell: tuple[int, ...] = ()
    for term, lens in zip(terms, all_lens, strict=True):
        pre, _, post = term.partition("...")
        n_ell = len(lens) - len(pre) - len(post)
        if n_ell < 0 or (n_ell and "..." not in term):
            raise ShapeError(f"einsum: term {term!r} does not match rank {len(lens)}")
        ell = tuple(np.broadcast_shapes(ell, tuple(lens[len(pre) : len(pre) + n_ell])))
        for ch, n in zip(pre + post, lens[: len(pre)] + lens[len(lens) - len(post) :], strict=True):
            if not ch.isalpha() or sizes.setdefault(ch, n) != n:
                raise ShapeError(f"einsum: label {ch!r} has sizes {sizes.get(ch)} and {n}")
    pre, _, post = rhs.partition("...")
    if any(ch not in sizes for ch in pre + post) or len(set(pre + post)) != len(pre + post):
        raise ShapeError(f"einsum: bad output {rhs!r}")
    return tuple(sizes[c] for c in pre) + (ell if "..." in rhs else ()) + tuple(sizes[c] for c in post)


@register_op
@op_class
class Einsum(Op):
    """numpy/ONNX einsum with an explicit (``->``) equation; no broadcasting between operands."""

    name: ClassVar[str] = "einsum"
    equation: str = ""

    def compute_shape(self, inputs: list[Shape]) -> Shape:
        check_shapes(self.name, inputs).has_at_least(1).same_type().types(NUMERIC_TYPES)
        return Shape(inputs[0].type, einsum_lens(self.equation, [s.lens for s in inputs]))

    def compute(self, out: Shape, args: list[np.ndarray]) -> np.ndarray:
        acc = acc_dtype(args[0].dtype)
        y = np.einsum(self.equation, *(a.astype(acc, copy=False) for a in args), optimize=len(args) > 2)
        return np.asarray(y).astype(out.dtype)


__all__ = ["CONV_TYPES", "INT_TYPES", "acc_dtype", "conv_forward", "matmul", "windows"]

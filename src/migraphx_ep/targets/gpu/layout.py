"""Layouts the lowering decides: channels-last (NHWC) activations for 2-D convolutions, and the
(row, col, batch) strides a library GEMM reads a batched matrix view with. The IR gives every value a
standard layout; the lowering gives a convolution's activations NHWC strides where tensor cores run it
(``want_channels_last``), and kernels read any strides.
"""

from __future__ import annotations

import functools

from ...ir.module import Module
from ...ir.operation import Op
from ...ir.shape import Shape
from ...switches import env_choice
from .libcalls import EPILOGUE_TYPES, GEMM_TYPES


def nhwc_shape(s: Shape) -> Shape:
    """``s`` (logical NCHW dims) laid out channels-last: the strides of an NHWC buffer."""
    n, c, h, w = s.lens
    return Shape(s.type, s.lens, (h * w * c, 1, w * c, c))


def is_nhwc(s: Shape) -> bool:
    return s.ndim() == 4 and s.lens[1] > 1 and s.strides == nhwc_shape(s).strides and not s.standard()


def want_channels_last(m: Module, use_dnn: bool) -> bool:
    """NHWC pays off where tensor cores run the convolutions (half, bf16, and fp32 through TF32), and
    makes 1x1 convolutions plain GEMMs. ``MIGRAPHX_EP_NHWC=0`` turns it off."""

    mode = env_choice("MIGRAPHX_EP_NHWC", "auto", ("auto", "0", "1"))
    if mode == "0" or not use_dnn:
        return False
    convs = [i for i in m.instructions if i.name in ("convolution", "fused_conv") and i.shape.ndim() == 4]
    # int8/fp8 convolutions run as K-major GEMMs (targets/gpu/quant.py): channels-last activations are
    # their rows as they are (1x1: no im2col at all), and the quantising kernels then read and write
    # them coalesced.
    quant = any(i.name == "quant_convolution" and i.shape.ndim() == 4 for i in m.instructions)
    if not convs:
        return quant
    # Measured on an H200 (ResNet-50): NHWC beat NCHW in fp32 (TF32) as well as fp16, at batch 1 and 32.
    return mode == "1" or all(i.shape.type in GEMM_TYPES for i in convs)


def pointwise_conv(op: Op, w: Shape, out: Shape) -> bool:
    """A 1x1, stride-1, unpadded, ungrouped 2-D convolution: in NHWC it is one GEMM."""
    return (
        out.ndim() == 4
        and out.type in EPILOGUE_TYPES
        and w.lens[2:] == (1, 1)
        and op.group == 1  # type: ignore[attr-defined]
        and not any(op.padding)  # type: ignore[attr-defined]
        and all(s == 1 for s in op.stride)  # type: ignore[attr-defined]
        and all(d == 1 for d in op.dilation)  # type: ignore[attr-defined]
    )


def _collapse(lens: tuple[int, ...], strides: tuple[int, ...]) -> int | None:
    """The single stride that walks these (batch) dims in order, 0 if broadcast, None if there is none."""
    dims = [(n, s) for n, s in zip(lens, strides, strict=True) if n != 1]
    if not dims:
        return 0
    if all(s == 0 for _, s in dims):
        return 0
    for (_, s1), (n2, s2) in zip(dims, dims[1:], strict=False):
        if s1 != s2 * n2:
            return None
    return dims[-1][1]


def matrix_layout(s: Shape) -> tuple[int, int, int] | None:
    """(row, col, batch) strides of a batched matrix view, or None when cuBLASLt cannot read it."""
    return _matrix_layout(s.lens, s.strides)


# Asked four times per GEMM, and a transformer's layers ask about the same few views: a pure function of
# two tuples of ints, so the memo cannot go stale.
@functools.lru_cache(maxsize=4096)
def _matrix_layout(lens: tuple[int, ...], strides: tuple[int, ...]) -> tuple[int, int, int] | None:
    *blens, rows, cols = lens
    *bstr, rs, cs = strides
    bs = _collapse(tuple(blens), tuple(bstr))
    if bs is None:
        return None
    if rows == 1:
        rs = cols if cs == 1 else max(rs, 1)
    if cols == 1:
        cs = rows if rs == 1 else max(cs, 1)
    if cs == 1 and rs >= cols and rs > 0:
        return (rs, 1, bs)
    if rs == 1 and cs >= rows and cs > 0:
        return (1, cs, bs)
    return None


__all__ = ["is_nhwc", "matrix_layout", "nhwc_shape", "pointwise_conv", "want_channels_last"]

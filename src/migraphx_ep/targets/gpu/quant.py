"""Lowering of ``quant_dot`` and ``quant_convolution`` on the gpu target: int8 operands accumulating
exactly into int32, fp8 E4M3 operands accumulating in float32 (``ops/quant.py`` is the meaning).

Paths, best first:

* **cuBLASLt** (``blas.py``): int8 on IMMA kernels, fp8e4m3fn on FP8 kernels (compute capability 8.9+).
  Both take only the "TN" form: both operands K-contiguous, K and their leading dimensions multiples of
  4 (int8) or 16 (fp8), N (cuBLASLt's m, rows of the column-major result) a multiple of 4 (padded like
  K here: fp8's "16-byte aligned dimensions" read conservatively). The lowering makes operands fit:
  A as it is when it fits, else one copy kernel into ``[.., M, Kp]``; B as
  ``[.., Np, Kp]`` rows, transposed and zero-padded at compile time when it is a constant (weights), else
  by a copy kernel. Zeros in the padded K add nothing, so sums are unchanged; D is ``[.., M, Np]`` and
  the value a view of its first N columns (the dequantise kernel after it reads through the stride).
* **quant_convolution, group 1, constant weights**: ``im2col`` (one copy kernel writing the windows as
  K-major rows, channels fastest, K padded) times the KRSC weights on the same GEMM; the result is a
  strided (NHWC-like) view of D, so nothing is copied back to NCHW.
* **quantizelinear into fp8e4m3fn**: a kernel of its own (``kernels/quant.py``: one pass in float32,
  the layout of what it quantises kept), so ``migraphx_fp8_enable`` programs run whole on the GPU; int8
  and other float8 outputs are decomposed into pointwise ops (``decompose/quant.py``) and never reach
  this module.
* **Generated kernels** (``kernels/gemm.py``, ``kernels/conv.py``) otherwise: without cuBLASLt, for
  fp8e4m3fnuz (no CUDA type), grouped convolutions, computed weights or an im2col matrix over 1 GiB,
  empty problems, and at bind time whenever cuBLASLt has no algorithm for a plan (the executable's
  fallback). The same exact int32 sums.

cuDNN is not used: its legacy API's int8 convolutions (INT8_CONFIG, INT8_EXT_CONFIG) write int8 or float,
never the int32 accumulator quant_convolution returns, so their result would not be exact in general.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from ...ir.dtypes import strided_view, to_numpy
from ...ir.instruction import Instruction
from ...ir.operation import make_op
from ...ir.shape import Shape
from ...ops.quant import FP8, Im2col
from . import kernels as K
from .blas import QUANT_OUT
from .kernels.conv import conv_supported
from .kernels.gemm import gemm_supported
from .kernels.quant import im2col_kernel, quantize_fp8_kernel
from .kernels.spec import Unsupported
from .layout import is_nhwc, matrix_layout
from .steps import Buf, GemmStep, KernelStep

if TYPE_CHECKING:
    from .lowering import Lowering

QUANT_OPS = frozenset({"quant_dot", "quant_convolution"})
LOWERED = QUANT_OPS | {"quantizelinear"}  # what lower_quant takes (quantizelinear: into fp8e4m3fn)
FP8_MIN_CC = (8, 9)  # Ada and newer: cuBLASLt's FP8 kernels
# An im2col matrix (output pixels x taps) past this is not worth its arena memory: the direct kernel runs.
IM2COL_LIMIT = 1 << 30


def quant_supported(ins: Instruction) -> str | None:
    """None when a generated kernel can compute ``ins`` (so every case lowers, cuBLASLt or not)."""
    if ins.name == "quantizelinear":
        try:
            quantize_fp8_kernel("k", ins.op, [a.shape for a in ins.inputs], ins.shape)
        except Unsupported:
            return f"no gpu kernel for {ins.name} to {ins.shape.type.name}"  # decomposed when int
        return None
    a, b = (x.shape for x in ins.inputs)
    if ins.name == "quant_dot":
        return gemm_supported(a, b, ins.shape)
    return conv_supported(ins.op, a, b, ins.shape)


def device_reason(ins: Instruction, cc: tuple[int, int] | None) -> str | None:
    """Why the GPU of compute capability ``cc`` should not run ``ins`` (None: it may; also when the GPU
    is unknown, as in the simulator)."""
    if cc is None or ins.name not in QUANT_OPS or ins.inputs[0].shape.type not in FP8:
        return None
    if tuple(cc) >= FP8_MIN_CC:
        return None
    return (
        f"{ins.name}: fp8 ({ins.inputs[0].shape.type.name}) needs a GPU of compute capability "
        f"{FP8_MIN_CC[0]}.{FP8_MIN_CC[1]} or newer; this one is {cc[0]}.{cc[1]}"
    )


def device_capability(device_id: int) -> tuple[int, int]:
    from .cuda import compute_capability  # no context needed (its creation runs in prewarm.py)

    return compute_capability(device_id)


def fp8_option_reason(device_id: int) -> str | None:
    """Why ``migraphx_fp8_enable=1`` cannot run on GPU ``device_id`` (None: it can)."""
    from .cuda import Device

    dev = Device.get(device_id)
    if dev.cc >= FP8_MIN_CC:
        return None
    return (
        f"migraphx_fp8_enable=1 needs a GPU with fp8 support (compute capability "
        f"{FP8_MIN_CC[0]}.{FP8_MIN_CC[1]} or newer: Ada, Hopper, Blackwell), but device {device_id} "
        f"({dev.name}) is compute capability {dev.cc[0]}.{dev.cc[1]}; use migraphx_int8_enable=1, "
        "or migraphx_target=ref"
    )


def lower_quant(lw: Lowering, ins: Instruction) -> None:
    if ins.name == "quant_dot":
        _quant_dot(lw, ins)
    elif ins.name == "quant_convolution":
        _quant_conv(lw, ins)
    else:
        _quantize_fp8(lw, ins)


def _quantize_fp8(lw: Lowering, ins: Instruction) -> None:

    args = [lw._read(a) for a in ins.inputs]
    # In the layout of what it quantises: channels-last stays so (coalesced both ways, and a 1x1 fp8
    # convolution then reads it as its GEMM's rows, as int8 ones do).
    out = lw._new(ins.shape.as_standard(), ins.name, nhwc=is_nhwc(args[0].shape))
    spec = quantize_fp8_kernel(lw._name(ins), ins.op, [a.shape for a in args], out.shape)
    lw._emit(KernelStep("quantizelinear (fp8)", args, [out], spec=spec, op=ins.op))
    lw.bufs[id(ins)] = out


# -- quant_dot -------------------------------------------------------------------------------------------
def _quant_dot(lw: Lowering, ins: Instruction) -> None:

    a, b = (lw._read(x) for x in ins.inputs)
    t = a.shape.type
    if not lw.use_blas or t not in QUANT_OUT or 0 in (*ins.shape.lens, a.shape.lens[-1]):
        out = lw._new(ins.shape.as_standard(), ins.name)
        spec = K.gemm_kernel(lw._name(ins), a.shape, b.shape, out.shape)
        lw._emit(KernelStep("quant_dot (generated)", [a, b], [out], spec=spec, op=ins.op))
        lw.bufs[id(ins)] = out
        return
    out_t, _, kq = QUANT_OUT[t]
    *blens, m, k = a.shape.lens
    n = b.shape.lens[-1]
    kp, np_ = _round(k, kq), _round(n, kq)  # N is cuBLASLt's m: padded like K (fp8: 16, to be safe)
    a = _k_major(lw, a, kp, kq, "quant_dot A")
    bt = _b_rows(lw, ins.inputs[1], b, np_, kp, kq)
    b_view = _buf(bt, _transposed(bt.shape))  # [.., Kp, Np] with K contiguous
    out = lw._new(Shape(out_t, (*blens, m, np_)), "quant gemm")
    la, lb = matrix_layout(a.shape), matrix_layout(b_view.shape)
    assert la is not None and lb is not None  # both were laid out for this
    batch = math.prod(blens)
    lc = (np_, 1, m * np_)
    if batch > 1 and lb[2] == 0 and la[2] == m * la[0]:  # shared B: one GEMM over all rows
        m, batch, la, lc = m * batch, 1, (la[0], 1, 0), (np_, 1, 0)
    label = f"quant gemm {t.name} {batch}x{m}x{np_}x{kp}"
    step = GemmStep(label, [a, b_view], [out], dtype=t, batch=batch, m=m, n=np_, k=kp, layouts=(la, lb, lc))
    lw._emit(step)
    lw.bufs[id(ins)] = out if np_ == n else _buf(out, Shape(out_t, ins.shape.lens, out.shape.strides))


def _k_major(lw: Lowering, a: Buf, kp: int, kq: int, label: str) -> Buf:
    """``a`` ([.., M, K]) as cuBLASLt's TN form wants it: K contiguous and ``kp`` long (zero-padded),
    row and batch strides multiples of ``kq``, 16-byte aligned; a copy kernel only when it is not."""

    lay = matrix_layout(a.shape)
    k = a.shape.lens[-1]
    if lay is not None and lay[1] == 1 and k == kp and lay[0] % kq == 0 and lay[2] % kq == 0:
        if a.offset % 16 == 0:
            return a
    return _pad_copy(lw, a, kp - k, 0, label)


def _b_rows(lw: Lowering, b_ins: Instruction, b: Buf, np_: int, kp: int, kq: int) -> Buf:
    """B^T as ``[.., Np, Kp]`` rows, K contiguous: B's own memory when it already is, else transposed
    and zero-padded once at compile time (a constant) or by a copy kernel (computed)."""
    bt = _buf(b, _transposed(b.shape))
    n, k = bt.shape.lens[-2:]
    if n == np_ and k == kp and b.offset % 16 == 0:
        lay = matrix_layout(bt.shape)
        if lay is not None and lay[1] == 1 and lay[0] % kq == 0 and lay[2] % kq == 0:
            return bt
    value = host_value(b)
    if value is None:
        return _pad_copy(lw, bt, kp - k, np_ - n, "quant_dot B^T")
    nb = b.shape.ndim() - 2
    shared = all(s == 0 for s, d in zip(b.shape.strides[:nb], b.shape.lens[:nb], strict=True) if d != 1)

    def make() -> np.ndarray:
        v = value[(0,) * nb] if shared else value
        return _padded(np.swapaxes(v, -1, -2), np_, kp)

    arr = _weight_array(lw, b_ins, b, ("quant_dot B^T", np_, kp), make)
    w = lw._weight(arr, "quant weight (N x K)")
    if not shared:
        return w
    return _buf(w, Shape(b.shape.type, (*b.shape.lens[:nb], np_, kp), (0,) * nb + (kp, 1)))


# -- quant_convolution ---------------------------------------------------------------------------------
def _quant_conv(lw: Lowering, ins: Instruction) -> None:

    x, w = (lw._read(a) for a in ins.inputs)
    t, op = x.shape.type, ins.op
    wv = host_value(w)
    fits = lw.use_blas and t in QUANT_OUT and op.group == 1 and wv is not None  # type: ignore[attr-defined]
    if not fits or 0 in ins.shape.lens or _im2col_bytes(ins) > IM2COL_LIMIT:
        out = lw._new(ins.shape.as_standard(), ins.name)
        spec = K.conv_kernel(lw._name(ins), op, x.shape, w.shape, out.shape)
        lw._emit(KernelStep("quant_convolution (generated)", [x, w], [out], spec=spec, op=op))
        lw.bufs[id(ins)] = out
        return
    out_t, _, kq = QUANT_OUT[t]
    k = x.shape.ndim() - 2
    pads, strides, dils = op.attrs(k)  # type: ignore[attr-defined]
    mo, c, *ks = w.shape.lens
    taps = c * math.prod(ks)
    kp, mp = _round(taps, kq), _round(mo, kq)
    im = Im2col(
        kernel=tuple(ks), padding=tuple(pads), stride=tuple(strides), dilation=tuple(dils), columns=kp
    )
    if _rows_as_they_are(x.shape, im, kp):  # channels-last 1x1: the pixels are the GEMM's rows already
        cols = _buf(x, im.compute_shape([x.shape]))
    else:
        cols = lw._new(im.compute_shape([x.shape]), "im2col")
        spec = im2col_kernel(lw._name(ins), im, x.shape, cols.shape)
        lw._emit(KernelStep(f"im2col {'x'.join(map(str, ks))}", [x], [cols], spec=spec, op=im))

    def make() -> np.ndarray:  # filters as KRSC rows, the column order of im2col
        return _padded(np.moveaxis(wv, 1, -1).reshape(mo, taps), mp, kp)

    wb = lw._weight(
        _weight_array(lw, ins.inputs[1], w, ("quant conv KRSC", mp, kp), make), "quant conv weight"
    )
    rows = cols.shape.lens[0]
    out = lw._new(Shape(out_t, (rows, mp)), "quant conv")
    layouts = ((kp, 1, 0), (1, kp, 0), (mp, 1, 0))
    b_view = _buf(wb, Shape(t, (kp, mp), (1, kp)))
    label = f"quant conv as gemm {t.name} {rows}x{mp}x{kp}"
    lw._emit(GemmStep(label, [cols, b_view], [out], dtype=t, batch=1, m=rows, n=mp, k=kp, layouts=layouts))
    # D[n * prod(O) + o, m] is y[n, m, o]: a channels-last view with Mp-element pixels
    o_lens = ins.shape.lens[2:]
    spatial = tuple(math.prod(o_lens[i + 1 :]) * mp for i in range(k))
    lw.bufs[id(ins)] = _buf(out, Shape(out_t, ins.shape.lens, (math.prod(o_lens) * mp, 1, *spatial)))


# -- helpers ---------------------------------------------------------------------------------------------
def _rows_as_they_are(x: Shape, im: Im2col, columns: int) -> bool:
    """Whether ``x`` already is ``im``'s matrix: a dense channels-last (NHWC) tensor under a 1x1, stride-1,
    unpadded window, with no padding columns (C a multiple of the GEMM's K granule)."""

    if x.ndim() != 4:
        return False
    return (
        x.channels_last()
        and x.lens[1] == columns
        and all(k == 1 for k in im.kernel)  # type: ignore[attr-defined]
        and not any(im.padding)  # type: ignore[attr-defined]
        and all(v == 1 for v in (*im.stride, *im.dilation))  # type: ignore[attr-defined]
    )


def _im2col_bytes(ins: Instruction) -> int:
    """Bytes of the im2col matrix of a quant_convolution: output pixels x taps (one byte each)."""
    y, w = ins.shape, ins.inputs[1].shape
    return y.lens[0] * math.prod(y.lens[2:]) * _round(math.prod(w.lens[1:]), 16)


def _round(n: int, q: int) -> int:
    return -(-n // q) * q


def _buf(b: Buf, shape: Shape) -> Buf:

    return Buf(b.storage, b.offset, shape)


def _transposed(s: Shape) -> Shape:
    """The view swapping the last two dims."""
    return Shape(
        s.type, (*s.lens[:-2], s.lens[-1], s.lens[-2]), (*s.strides[:-2], s.strides[-1], s.strides[-2])
    )


def _padded(m: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """``m`` ([.., r, c]) in the top-left of zeros [.., rows, cols]."""
    out = np.zeros((*m.shape[:-2], rows, cols), m.dtype)
    out[..., : m.shape[-2], : m.shape[-1]] = m
    return out


def host_value(b: Buf) -> np.ndarray | None:
    """The logical value of a buffer that is (a view of) a weight, read on the host; None otherwise."""
    if b.storage.kind != "weight" or b.storage.value is None:
        return None
    dt = to_numpy(b.shape.type)
    raw = np.asarray(b.storage.value).reshape(-1).view(np.uint8)[b.offset :]
    flat = raw[: raw.size // dt.itemsize * dt.itemsize].view(dt)
    return strided_view(flat, b.shape.lens, [s * dt.itemsize for s in b.shape.strides], writeable=False)


def _weight_array(lw: Lowering, src: Instruction, b: Buf, what: tuple, make) -> np.ndarray:
    """``make()``, shared through the subgraph's weight cache when ``src`` is a literal read whole."""
    if src.is_literal() and b.offset == 0 and b.shape == src.shape:
        return lw._derived(src, what, make)
    return make()


def _pad_copy(lw: Lowering, src: Buf, k_pad: int, n_pad: int, label: str) -> Buf:
    """``src`` copied standard with ``n_pad`` zero rows and ``k_pad`` zero columns added (the pad
    kernel moves raw bytes, so int8 and fp8 alike)."""

    r = src.shape.ndim()
    op = make_op("pad", pads=[0] * r + [0] * (r - 2) + [n_pad, k_pad])
    out = lw._new(op.compute_shape([src.shape]), label)
    spec = K.kernel_for(f"k{len(lw.steps)}_quant_pad", op, [src.shape], out.shape)
    lw._emit(KernelStep(f"pad ({label})", [src], [out], spec=spec, op=op))
    return out


__all__ = [
    "FP8_MIN_CC",
    "LOWERED",
    "QUANT_OPS",
    "device_capability",
    "device_reason",
    "fp8_option_reason",
    "host_value",
    "lower_quant",
    "quant_supported",
]

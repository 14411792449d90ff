"""Lowering of convolutions on the gpu target (out of ``lowering.py``, which calls ``lower_conv``): a
``convolution`` on cuDNN, or a ``fused_conv`` with its epilogue in the cuDNN call, or for a 1x1
convolution on channels-last activations one cuBLASLt GEMM; and the ``layout`` copies (``layout.py``'s
pass puts them before convolutions) of activations and filters.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ...ir.instruction import Instruction
from ...ir.operation import Op
from ...ir.shape import Shape
from .fuse.body import body_op
from .kernels.spec import PwInput, PwOp
from .layout import pointwise_conv
from .steps import Buf, ConvStep, GemmStep, KernelStep
from .support import IDENTITY

if TYPE_CHECKING:
    from .lowering import Lowering


def lower_conv(lw: Lowering, ins: Instruction) -> None:
    """A ``convolution`` on cuDNN, or a ``fused_conv`` (``fuse/conv_epilogue.py``): its epilogue in
    the cuDNN call, or in a cuBLASLt GEMM's for a 1x1 convolution on channels-last activations. It runs
    channels-last where the layout pass laid its activations or filters out so (the other one is laid
    out alike here should a program lack it: cuDNN reads both in one format), and writes so."""
    fused = ins.name == "fused_conv"
    conv = body_op(ins, "convolution") if fused else ins.op
    if fused and (not lw._conv_on_dnn(conv, ins.shape) or lw.conv_epilogue == "kernel"):
        return lw._lower_body(ins)  # optimised where cuDNN loads, or the epilogue switched off
    epi = {k: fused and bool(getattr(ins.op, k)) for k in ("bias", "residual", "relu")}
    x, w = (lw._read(a) for a in ins.inputs[:2])
    nhwc = x.shape.channels_last() or w.shape.channels_last()
    if nhwc and lw.use_blas and pointwise_conv(conv, ins.inputs[1].shape, ins.shape):
        return _conv_as_gemm(lw, ins, conv, x, w, epi)
    if nhwc:
        x = laid_out(lw, ins.inputs[0], x, x.shape.as_channels_last(), "conv input")
        w = laid_out(lw, ins.inputs[1], w, w.shape.as_channels_last(), "conv weight")
    reads = [x, w, *(lw._read(a) for a in ins.inputs[2:])]  # the bias, then the residual
    out = lw._new(ins.shape.as_standard(), "conv", nhwc=nhwc)
    lw._emit(
        ConvStep(
            "conv" + _epilogue_label(epi), reads, [out], op=conv, has_bias=epi["bias"],
            has_residual=epi["residual"], relu=epi["relu"],
        )
    )  # fmt: skip
    lw.bufs[id(ins)] = out


def _conv_as_gemm(lw: Lowering, ins: Instruction, conv: Op, x: Buf, w: Buf, epi: dict[str, bool]) -> None:
    """NHWC pixels x filters: D[N*H*W, K] = X[N*H*W, C] @ W[K, C]^T, bias/residual/relu in the
    cuBLASLt epilogue; D is the output's NHWC buffer, so nothing is copied."""
    x = laid_out(lw, ins.inputs[0], x, x.shape.as_channels_last(), "conv input")
    n, c, h, wd = x.shape.lens
    k = ins.shape.lens[1]
    if not w.shape.standard():  # (K, C, 1, 1): standard and channels-last are the same bytes
        w = lw._copy(w, "conv weight")
    extra = iter(ins.inputs[2:])
    reads = [x, w]
    if epi["bias"]:
        reads.append(lw._read(next(extra)))
    if epi["residual"]:
        r = next(extra)
        reads.append(laid_out(lw, r, lw._read(r), r.shape.as_channels_last(), "residual"))
    out = lw._new(ins.shape.as_standard(), "conv", nhwc=True)
    m = n * h * wd
    layouts = ((c, 1, 0), (1, c, 0), (k, 1, 0))
    label = f"conv 1x1 as gemm {m}x{k}x{c}" + _epilogue_label(epi)
    step = GemmStep(
        label, reads, [out], dtype=ins.shape.type, batch=1, m=m, n=k, k=c, layouts=layouts,
        has_bias=epi["bias"], has_residual=epi["residual"], relu=epi["relu"], conv_op=conv,
    )  # fmt: skip
    lw._emit(step)
    lw.bufs[id(ins)] = out


def lower_layout(lw: Lowering, ins: Instruction) -> None:
    """A ``layout`` instruction (``layout.py``'s pass): its input in the strides its shape says."""
    src = ins.inputs[0]
    lw.bufs[id(ins)] = laid_out(lw, src, lw._read(src), ins.shape, "layout")


def laid_out(lw: Lowering, base: Instruction, src: Buf, target: Shape, label: str) -> Buf:
    """``src`` (the value of ``base``) in ``target``'s packed layout: as it is, or a view when its bytes
    already are in that order (a single channel), or a constant's permuted once on the host (a filter
    in KRSC order), or a copy kernel's output."""
    if src.shape.strides == target.strides:
        return src
    if src.shape.packed() and all(
        a == b for a, b, n in zip(src.shape.strides, target.strides, target.lens, strict=True) if n != 1
    ):
        return Buf(src.storage, src.offset, target)
    if base.is_literal() and src.shape.standard():
        value = np.asarray(base.op.value)  # type: ignore[attr-defined]
        perm = tuple(sorted(range(target.ndim()), key=lambda d: -target.strides[d]))
        arr = lw._derived(base, ("layout", perm), lambda: np.ascontiguousarray(value.transpose(perm)))
        buf = lw._weight(arr, f"{label} ({'KRSC' if target.channels_last() else 'laid out'})")
        return Buf(buf.storage, 0, target)
    out = lw._new(target, label)
    expr = PwOp(IDENTITY, (PwInput(0),), src.shape.type)
    spec = lw._pointwise_spec(f"k{len(lw.steps)}_layout", expr, [src.shape], out.shape)
    lw._emit(
        KernelStep(
            f"to NHWC ({label})" if target.channels_last() else label, [src], [out], spec=spec, expr=expr
        )
    )
    return out


def _epilogue_label(epi: dict[str, bool]) -> str:
    return "".join(f" +{k}" for k in ("bias", "residual", "relu") if epi[k])


__all__ = ["laid_out", "lower_conv", "lower_layout"]

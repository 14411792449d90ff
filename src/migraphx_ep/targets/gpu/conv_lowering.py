"""Lowering of convolutions on the gpu target (out of ``lowering.py``, which calls ``lower_conv``): a
``convolution`` on cuDNN, or a ``fused_conv`` with its epilogue in the cuDNN call, or for a 1x1
convolution on channels-last activations one cuBLASLt GEMM; and the NHWC copies of activations and
filters (``layout.py`` decides channels-last) that they read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ...ir.instruction import Instruction
from ...ir.operation import Op
from . import kernels as K
from .kernels.spec import PwInput, PwOp
from .layout import is_nhwc, nhwc_shape, pointwise_conv
from .steps import Buf, ConvStep, GemmStep, KernelStep
from .support import IDENTITY

if TYPE_CHECKING:
    from .lowering import Lowering


def lower_conv(lw: Lowering, ins: Instruction) -> None:
    """A ``convolution`` on cuDNN, or a ``fused_conv`` (``fuse/conv_epilogue.py``): its epilogue in
    the cuDNN call, or in a cuBLASLt GEMM's for a 1x1 convolution on channels-last activations."""
    fused = ins.name == "fused_conv"
    conv = body_op(ins, "convolution") if fused else ins.op
    if fused and (not lw._conv_on_dnn(conv, ins.shape) or lw.conv_epilogue == "kernel"):
        return lw._lower_body(ins)  # optimised where cuDNN loads, or the epilogue switched off
    epi = {k: fused and bool(getattr(ins.op, k)) for k in ("bias", "residual", "relu")}
    x, w = (lw._read(a) for a in ins.inputs[:2])
    if lw.channels_last and lw.use_blas and pointwise_conv(conv, ins.inputs[1].shape, ins.shape):
        return _conv_as_gemm(lw, ins, conv, x, w, epi)
    if lw.channels_last and x.shape.ndim() == 4:
        if not is_nhwc(x.shape):
            x = relayout(lw, x, "conv input")
        w = _nhwc_weight(lw, ins.inputs[1], w)
    reads = [x, w, *(lw._read(a) for a in ins.inputs[2:])]  # the bias, then the residual
    out = lw._new(ins.shape.as_standard(), "conv", nhwc=True)
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
    if not is_nhwc(x.shape):
        x = relayout(lw, x, "conv input")
    n, c, h, wd = x.shape.lens
    k = ins.shape.lens[1]
    if not w.shape.standard():
        w = lw._copy(w, "conv weight")
    extra = iter(ins.inputs[2:])
    reads = [x, w]
    if epi["bias"]:
        reads.append(lw._read(next(extra)))
    if epi["residual"]:
        r = lw._read(next(extra))
        reads.append(r if is_nhwc(r.shape) else relayout(lw, r, "residual"))
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


def relayout(lw: Lowering, src: Buf, label: str) -> Buf:
    """A copy of ``src`` in NHWC layout."""
    out = lw._new(src.shape.as_standard(), label, nhwc=True)
    expr = PwOp(IDENTITY, (PwInput(0),), src.shape.type)
    spec = K.pointwise_kernel(f"k{len(lw.steps)}_nhwc", expr, [src.shape], out.shape)
    lw._emit(KernelStep(f"to NHWC ({label})", [src], [out], spec=spec, expr=expr))
    return out


def _nhwc_weight(lw: Lowering, ins: Instruction, w: Buf) -> Buf:
    """Filters in KRSC order: transposed once on the host when constant, else by a copy kernel."""
    if is_nhwc(w.shape):
        return w
    base = ins
    if base.is_literal() and w.shape.standard():
        value = np.asarray(base.op.value)  # type: ignore[attr-defined]
        krsc = lw._derived(base, ("krsc",), lambda: np.ascontiguousarray(value.transpose(0, 2, 3, 1)))
        buf = lw._weight(krsc, "conv weight (KRSC)")
        return Buf(buf.storage, 0, nhwc_shape(w.shape))
    return relayout(lw, w, "conv weight")


def _epilogue_label(epi: dict[str, bool]) -> str:
    return "".join(f" +{k}" for k in ("bias", "residual", "relu") if epi[k])


def body_op(ins: Instruction, name: str) -> Op:
    """The op of the (first) ``name`` instruction in the body of the fused instruction ``ins``."""
    return next(i.op for i in ins.module_args[0].instructions if i.name == name)


__all__ = ["body_op", "lower_conv", "relayout"]

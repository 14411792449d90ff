"""Layouts on the gpu target: the ``layout_convolution`` pass (MIGraphX's ``layout_convolution``) lays out
the activations and filters of 2-D convolutions channels-last (NHWC) where tensor cores run them, as
``layout`` instructions in the IR; convolutions, pooling, pad and fused elementwise chains keep their
input's channels-last layout (their ops' ``compute_shape``), so a CNN's activations stay NHWC from one
convolution to the next and the lowering writes each value in the layout its shape says. Also the
(row, col, batch) strides a library GEMM reads a batched matrix view with.
"""

from __future__ import annotations

import functools

from ...ir.instruction import Instruction
from ...ir.module import Module
from ...ir.operation import Op
from ...ir.shape import CHANNELS_LAST, Shape
from ...ops.core import Layout
from ...passes.manager import Pass
from ...switches import env_choice
from .fuse.body import body_op
from .libcalls import EPILOGUE_TYPES, GEMM_TYPES, dnn_conv


def is_nhwc(s: Shape) -> bool:
    """An NHWC buffer of more than one channel that is not also standard: a layout a library call wrote
    (int8/fp8 convolutions' rows) that a kernel after it keeps, reading and writing coalesced."""
    return s.ndim() == 4 and s.lens[1] > 1 and s.channels_last() and not s.standard()


def want_channels_last(m: Module, use_dnn: bool, mode: str | None = None) -> bool:
    """NHWC pays off where tensor cores run the convolutions (half, bf16, and fp32 through TF32), and
    makes 1x1 convolutions plain GEMMs. ``mode`` (default ``MIGRAPHX_EP_NHWC``): ``auto``, ``0`` (off)
    or ``1`` (whatever the types)."""
    if mode is None:
        mode = env_choice("MIGRAPHX_EP_NHWC", "auto", ("auto", "0", "1"))
    if mode == "0" or not use_dnn:
        return False
    convs = [i for i in m.instructions if i.name in ("convolution", "fused_conv") and i.shape.ndim() == 4]
    # int8/fp8 convolutions run as K-major GEMMs (targets/gpu/quant.py): channels-last activations are
    # their rows as they are (1x1: no im2col at all), and the quantising kernels then read and write
    # them coalesced. Their lowering lays those out itself (``is_nhwc``).
    quant = any(i.name == "quant_convolution" and i.shape.ndim() == 4 for i in m.instructions)
    if not convs:
        return quant
    # Measured on an H200 (ResNet-50): NHWC beat NCHW in fp32 (TF32) as well as fp16, at batch 1 and 32.
    return mode == "1" or all(i.shape.type in GEMM_TYPES for i in convs)


def conv_op(ins: Instruction) -> Op | None:
    """The ``convolution`` a ``convolution`` or ``fused_conv`` instruction runs, else None."""
    if ins.name == "convolution":
        return ins.op
    return body_op(ins, "convolution") if ins.name == "fused_conv" else None


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


def layout_convolution(
    m: Module, use_blas: bool = True, use_dnn: bool = True, mode: str | None = None
) -> bool:
    """Where ``want_channels_last``: each 2-D convolution cuDNN runs reads its activations and filters
    channels-last (a ``layout`` before each that is not; a constant filter's is done once on the host
    by the lowering), and so writes its output so; a 1x1 one that runs as a cuBLASLt GEMM reads its
    residual so too (the GEMM's output rows). Shapes are computed again down the module as it goes, so
    the layout flows through the ops that keep it (the next convolution finds its activations laid out)
    and every view reads the strides its input really has."""
    if not want_channels_last(m, use_dnn, mode):
        return False
    changed = False
    for ins in m:
        if changed:  # the values it reads may have changed layout above
            m.recompute_shape(ins)
        op = conv_op(ins)
        if op is None or ins.shape.ndim() != 4 or not dnn_conv(op, ins.shape):
            continue
        laid = {0, 1}
        gemm = use_blas and pointwise_conv(op, ins.inputs[1].shape, ins.shape)
        if gemm and ins.name == "fused_conv" and ins.op.residual:  # type: ignore[attr-defined]
            laid.add(len(ins.inputs) - 1)  # the residual comes last
        args = [_channels_last(m, ins, a) if i in laid else a for i, a in enumerate(ins.inputs)]
        if all(a is b for a, b in zip(args, ins.inputs, strict=True)):
            continue
        new = m.insert_instruction(ins, ins.op, args, ins.module_args)
        m.replace_all_uses(ins, new)
        m.remove_instruction(ins)
        changed = True
    return changed


def _channels_last(m: Module, before: Instruction, v: Instruction) -> Instruction:
    if v.shape.channels_last():
        return v
    return m.insert_instruction(before, Layout(permutation=CHANNELS_LAST), [v])


def layout_pass(use_blas: bool, use_dnn: bool) -> Pass:
    return Pass("layout_convolution", lambda m: layout_convolution(m, use_blas, use_dnn))


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


__all__ = [
    "conv_op",
    "is_nhwc",
    "layout_convolution",
    "layout_pass",
    "matrix_layout",
    "pointwise_conv",
    "want_channels_last",
]

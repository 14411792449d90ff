"""Softmax family and the normalisations, decomposed into reduce + pointwise ops (MIGraphX decomposes
norms and fuses them later).

Statistics are computed in float32 for narrow float inputs (ONNX's ``stash_type`` and ORT's kernels do),
with the two-pass variance mean((x - mean)^2) of ONNX's reference implementation.
"""

from __future__ import annotations

import math

import numpy as np

from ...ir.dtypes import FLOAT_TYPES, DType
from ...ir.instruction import Instruction
from ...ops.core import broadcast_lens
from ...ops.pointwise import NARROW_FLOATS
from ..context import NodeDesc, ParseContext, normalize_axis
from ..table import Unsupported, onnx_op
from .pointwise import check_attrs, fattr


def stash(x: Instruction) -> DType:
    return DType.float_type if x.shape.dtype in NARROW_FLOATS else x.shape.type


def require_float(node: NodeDesc, x: Instruction) -> None:
    if x.shape.type not in FLOAT_TYPES:
        raise Unsupported(f"{node.op_type}: input must be floating point")


# -- softmax family ---------------------------------------------------------------------------------
Flat = tuple[Instruction, int, tuple[int, ...] | None]


def flat_axis(ctx: ParseContext, node: NodeDesc, x: Instruction) -> Flat:
    """Opset < 13 works on the input flattened to 2-D at ``axis``; from 13 on one axis. Returns the
    (possibly reshaped) input, the axis to use, and the dims to reshape back to (or None)."""
    rank = x.shape.ndim()
    if rank == 0:
        raise Unsupported(f"{node.op_type}: scalar input")
    axis = normalize_axis(int(node.attr("axis", 1 if ctx.opset < 13 else -1)), rank)
    if ctx.opset >= 13 or axis == rank - 1:
        return x, axis, None
    lens = x.shape.lens
    flat = ctx.add("reshape", [x], dims=[math.prod(lens[:axis]), math.prod(lens[axis:])])
    return flat, 1, lens


@onnx_op("Softmax", "LogSoftmax")
def parse_softmax(ctx: ParseContext, node: NodeDesc, args):
    check_attrs(node, ("axis",))
    x, axis, back = flat_axis(ctx, node, args[0])
    r = ctx.add("softmax" if node.op_type == "Softmax" else "logsoftmax", [x], axis=axis)
    return r if back is None else ctx.add("reshape", [r], dims=list(back))


@onnx_op("Hardmax")
def parse_hardmax(ctx: ParseContext, node: NodeDesc, args):
    check_attrs(node, ("axis",))
    require_float(node, args[0])
    x, axis, back = flat_axis(ctx, node, args[0])
    lens = x.shape.lens
    if lens[axis] == 0:
        return args[0]
    # one-hot of the first maximum: iota along the axis == argmax (kept as a length-1 axis)
    idx = ctx.add("argmax", [x], axis=axis)
    at_axis = [-1 if i == axis else 1 for i in range(len(lens))]
    iota = ctx.literal(np.arange(lens[axis], dtype=np.int64).reshape(at_axis))
    r = ctx.convert(ctx.elementwise("equal", iota, idx), x.shape.type)
    return r if back is None else ctx.add("reshape", [r], dims=list(back))


# -- shared pieces ------------------------------------------------------------------------------------
def moments(ctx: ParseContext, x: Instruction, axes: list[int]) -> tuple[Instruction, ...]:
    """(mean, x - mean, mean((x - mean)^2)) over ``axes``, kept as length-1 axes."""
    mean = ctx.add("reduce_mean", [x], axes=axes)
    dev = ctx.elementwise("sub", x, mean)
    var = ctx.add("reduce_mean", [ctx.add("mul", [dev, dev])], axes=axes)
    return mean, dev, var


def inv_std(ctx: ParseContext, var: Instruction, eps: float) -> Instruction:
    """1 / sqrt(var + eps), rounded the way ONNX's function body does (sqrt, then reciprocal)."""
    e = ctx.literal(eps, var.shape.dtype)
    return ctx.add("recip", [ctx.add("sqrt", [ctx.elementwise("add", var, e)])])


def channel(ctx: ParseContext, v: Instruction, x: Instruction, t: DType) -> Instruction:
    """A per-channel [C] vector viewed at x's dims along axis 1."""
    if v.shape.ndim() != 1 or x.shape.ndim() < 2 or v.shape.lens[0] not in (1, x.shape.lens[1]):
        raise Unsupported(f"per-channel parameter {list(v.shape.lens)} does not match {list(x.shape.lens)}")
    return ctx.add("broadcast", [ctx.convert(v, t)], axis=1, out_lens=list(x.shape.lens))


# -- normalisations ------------------------------------------------------------------------------------
def layer_norm(
    ctx: ParseContext,
    x: Instruction,
    scale: Instruction,
    bias: Instruction | None,
    axis: int,
    eps: float,
    simplified: bool = False,
    affine_in_stash: bool = False,
):
    """LayerNorm / RMSNorm over axes [axis, rank). Returns (y, mean or None, inv_std_dev) with statistics
    in the stash type; the affine part runs in x's type (ONNX) or in the stash type (ORT contrib ops)."""
    t, w = x.shape.type, stash(x)
    xw = ctx.convert(x, w)
    axes = list(range(axis, x.shape.ndim()))
    if simplified:
        mean = None
        dev = xw
        var = ctx.add("reduce_mean", [ctx.add("mul", [xw, xw])], axes=axes)
    else:
        mean, dev, var = moments(ctx, xw, axes)
    inv = inv_std(ctx, var, eps)
    norm = ctx.elementwise("mul", dev, inv)
    at = w if affine_in_stash else t
    norm = ctx.convert(norm, at)
    for p, op in ((scale, "mul"), (bias, "add")):
        if p is not None:
            if broadcast_lens(x.shape.lens, p.shape.lens) != x.shape.lens:
                raise Unsupported(f"scale/bias {list(p.shape.lens)} do not broadcast to {list(x.shape.lens)}")
            norm = ctx.elementwise(op, norm, ctx.convert(p, at))
    return ctx.convert(norm, t), mean, inv


def wanted(node: NodeDesc, i: int) -> bool:
    return len(node.outputs) > i and bool(node.outputs[i])


@onnx_op("LayerNormalization")
def parse_layer_norm(ctx: ParseContext, node: NodeDesc, args):
    check_attrs(node, ("axis", "epsilon", "stash_type"))
    x, scale = args[0], args[1]
    bias = args[2] if len(args) > 2 else None
    require_float(node, x)
    if int(node.attr("stash_type", 1)) != 1:
        raise Unsupported("LayerNormalization: only stash_type=1 (float) is supported")
    axis = normalize_axis(int(node.attr("axis", -1)), x.shape.ndim())
    y, mean, inv = layer_norm(ctx, x, scale, bias, axis, fattr(node, "epsilon", 1e-5))
    outs = [y]
    if wanted(node, 1) or wanted(node, 2):
        outs += [ctx.convert(mean, DType.float_type), ctx.convert(inv, DType.float_type)]
    return outs


@onnx_op("RMSNormalization")
def parse_rms_norm(ctx: ParseContext, node: NodeDesc, args):
    check_attrs(node, ("axis", "epsilon", "stash_type"))
    x, scale = args[0], args[1]
    require_float(node, x)
    if int(node.attr("stash_type", 1)) != 1:
        raise Unsupported("RMSNormalization: only stash_type=1 (float) is supported")
    axis = normalize_axis(int(node.attr("axis", -1)), x.shape.ndim())
    return layer_norm(ctx, x, scale, None, axis, fattr(node, "epsilon", 1e-5), simplified=True)[0]


@onnx_op("BatchNormalization")
def parse_batch_norm(ctx: ParseContext, node: NodeDesc, args):
    check_attrs(node, ("epsilon", "momentum", "spatial", "is_test", "training_mode"))
    x, scale, bias, mean, var = args[:5]
    require_float(node, x)
    if int(node.attr("training_mode", 0)):
        raise Unsupported("BatchNormalization: training_mode=1 is not supported (inference only)")
    if ctx.opset < 7 and not int(node.attr("is_test", 0)):
        raise Unsupported("BatchNormalization: is_test=0 (training) is not supported")
    if ctx.opset < 9 and not int(node.attr("spatial", 1)):
        raise Unsupported("BatchNormalization: spatial=0 is not supported")
    if any(wanted(node, i) for i in range(1, len(node.outputs))):
        raise Unsupported("BatchNormalization: running/saved statistics outputs exist only in training mode")
    t, w = x.shape.type, stash(x)
    xw = ctx.convert(x, w)
    # y = (x - mean) * (scale / sqrt(var + eps)) + bias; the [C] factors fold when they are constant
    inv = inv_std(ctx, ctx.convert(var, w), fattr(node, "epsilon", 1e-5))
    a = ctx.add("mul", [ctx.convert(scale, w), inv])
    y = ctx.add("mul", [ctx.add("sub", [xw, channel(ctx, mean, x, w)]), channel(ctx, a, x, w)])
    return ctx.convert(ctx.add("add", [y, channel(ctx, bias, x, w)]), t)


@onnx_op("InstanceNormalization")
def parse_instance_norm(ctx: ParseContext, node: NodeDesc, args):
    check_attrs(node, ("epsilon",))
    x, scale, bias = args
    require_float(node, x)
    t, w = x.shape.type, stash(x)
    xw = ctx.convert(x, w)
    _, dev, var = moments(ctx, xw, list(range(2, x.shape.ndim())))
    norm = ctx.elementwise("mul", dev, inv_std(ctx, var, fattr(node, "epsilon", 1e-5)))
    y = ctx.add("add", [ctx.add("mul", [norm, channel(ctx, scale, x, w)]), channel(ctx, bias, x, w)])
    return ctx.convert(y, t)


@onnx_op("GroupNormalization")
def parse_group_norm(ctx: ParseContext, node: NodeDesc, args):
    check_attrs(node, ("epsilon", "num_groups", "stash_type"))
    x, scale, bias = args
    require_float(node, x)
    if int(node.attr("stash_type", 1)) != 1:
        raise Unsupported("GroupNormalization: only stash_type=1 (float) is supported")
    lens = x.shape.lens
    g = int(node.attr("num_groups"))
    if len(lens) < 2 or g <= 0 or lens[1] % g:
        raise Unsupported(f"GroupNormalization: {g} groups do not divide the channels of {list(lens)}")
    t, w = x.shape.type, stash(x)
    x3 = ctx.add("reshape", [ctx.convert(x, w)], dims=[lens[0], g, -1])
    _, dev, var = moments(ctx, x3, [2])
    norm = ctx.elementwise("mul", dev, inv_std(ctx, var, fattr(node, "epsilon", 1e-5)))
    if ctx.opset < 21:
        # opset 18: scale and bias hold one value per group, applied in the grouped view (in T).
        norm = ctx.convert(norm, t)
        y = ctx.add("mul", [norm, channel(ctx, scale, norm, t)])
        y = ctx.add("add", [y, channel(ctx, bias, norm, t)])
        return ctx.add("reshape", [y], dims=list(lens))
    # opset 21: per-channel scale and bias, applied in T after casting the normalised value back
    norm = ctx.convert(ctx.add("reshape", [norm], dims=list(lens)), t)
    return ctx.add("add", [ctx.add("mul", [norm, channel(ctx, scale, x, t)]), channel(ctx, bias, x, t)])


@onnx_op("LpNormalization")
def parse_lp_norm(ctx: ParseContext, node: NodeDesc, args):
    check_attrs(node, ("axis", "p"))
    x = args[0]
    require_float(node, x)
    p = int(node.attr("p", 2))
    if p not in (1, 2):
        raise Unsupported(f"LpNormalization: p={p} (only 1 and 2 exist)")
    axis = [normalize_axis(int(node.attr("axis", -1)), x.shape.ndim())]
    t, w = x.shape.type, stash(x)
    xw = ctx.convert(x, w)
    if p == 1:
        norm = ctx.add("reduce_sum", [ctx.add("abs", [xw])], axes=axis)
    else:
        norm = ctx.add("sqrt", [ctx.add("reduce_sum", [ctx.add("mul", [xw, xw])], axes=axis)])
    # a zero norm gives 0, not 0/0 (ONNX's reference and ORT agree)
    zero = ctx.literal(0, norm.shape.dtype)
    is_zero = ctx.elementwise("equal", norm, zero)
    y = ctx.elementwise("where", is_zero, zero, ctx.elementwise("div", xw, norm))
    return ctx.convert(y, t)


@onnx_op("MeanVarianceNormalization")
def parse_mvn(ctx: ParseContext, node: NodeDesc, args):
    check_attrs(node, ("axes",))
    x = args[0]
    require_float(node, x)
    axes = sorted({normalize_axis(int(a), x.shape.ndim()) for a in node.attr("axes", [0, 2, 3])})
    t, w = x.shape.type, stash(x)
    xw = ctx.convert(x, w)
    # ONNX's function body: (x - E[x]) / (sqrt(E[x^2] - E[x]^2) + 1e-9)
    mean = ctx.add("reduce_mean", [xw], axes=axes)
    ex2 = ctx.add("reduce_mean", [ctx.add("mul", [xw, xw])], axes=axes)
    std = ctx.add("sqrt", [ctx.add("sub", [ex2, ctx.add("mul", [mean, mean])])])
    std = ctx.elementwise("add", std, ctx.literal(1e-9, std.shape.dtype))
    return ctx.convert(ctx.elementwise("div", ctx.elementwise("sub", xw, mean), std), t)

"""Quantisation parsers: QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear, MatMulInteger,
ConvInteger, QLinearMatMul, QLinearConv.

Integer products run as int32 ``dot``/``convolution`` on zero-point-centred operands (exact; int32
wraps like ORT's accumulators). QLinear* requantise the way ORT does: float32(acc) * (sa * sb / sy),
rounded half to even, plus the output zero point, saturated.
"""

from __future__ import annotations

import math

from ...ir.dtypes import DType
from ...ir.instruction import Instruction
from ...ops.quant import FP8, QUANT_INT
from ..context import NodeDesc, ParseContext, normalize_axis, onnx_type
from ..table import Unsupported, onnx_op
from .nn import as_channel_vector, check_type, convolution, matmul

INT8 = {DType.int8_type, DType.uint8_type}


def expand_param(
    ctx: ParseContext, p: Instruction, x: Instruction, axis: int, block: int, what: str
) -> Instruction:
    """A per-tensor, per-axis or blocked scale/zero point viewed at ``x``'s dims."""
    lens, rank = x.shape.lens, x.shape.ndim()
    plens = p.shape.lens
    if block:
        if len(plens) != rank:
            raise Unsupported(f"blocked {what} must have the data's rank")
        a = normalize_axis(axis, rank)
        nb = math.ceil(lens[a] / block)
        if plens[a] != nb or any(plens[i] != lens[i] for i in range(rank) if i != a):
            raise Unsupported(
                f"blocked {what} dims {list(plens)} do not match data {list(lens)}, block {block}"
            )
        u = ctx.add("unsqueeze", [p], axes=[a + 1])
        u = ctx.broadcast_to(u, plens[: a + 1] + (block,) + plens[a + 1 :])
        r = ctx.add("reshape", [u], dims=list(plens[:a]) + [nb * block] + list(plens[a + 1 :]))
        if nb * block != lens[a]:
            r = ctx.add("slice", [r], axes=[a], starts=[0], ends=[lens[a]])
        return r
    if math.prod(plens) == 1 and len(plens) <= 1:
        return ctx.broadcast_to(ctx.add("reshape", [p], dims=[]) if plens else p, lens)
    if len(plens) != 1:
        raise Unsupported(f"{what} of dims {list(plens)} (per-tensor or 1-D per-axis only)")
    a = normalize_axis(axis, rank)
    if plens[0] != lens[a]:
        raise Unsupported(f"per-axis {what} of length {plens[0]} for axis {a} of dims {list(lens)}")
    return ctx.add("broadcast", [p], axis=a, out_lens=list(lens))


def qparams(ctx: ParseContext, node: NodeDesc, args) -> tuple[Instruction, Instruction, Instruction | None]:
    x, s = args[0], args[1]
    zp = args[2] if len(args) > 2 else None
    if node.attr("precision", 0):
        raise Unsupported("QuantizeLinear precision attribute")
    axis = int(node.attr("axis", 1)) if ctx.opset >= 13 else 1
    block = int(node.attr("block_size", 0))
    if block < 0:
        raise Unsupported(f"block_size {block}")
    if ctx.opset < 13 and s.shape.elements() != 1:
        raise Unsupported("per-axis scale before opset 13")
    se = expand_param(ctx, s, x, axis, block, "scale")
    ze = None if zp is None else expand_param(ctx, zp, x, axis, block, "zero point")
    return x, se, ze


@onnx_op("QuantizeLinear")
def parse_quantizelinear(ctx: ParseContext, node: NodeDesc, args):
    x, s, zp = qparams(ctx, node, args)
    out = onnx_type(node.attr("output_dtype", 0)) if node.attr("output_dtype", 0) else None
    if zp is not None:
        if out is not None and out != zp.shape.type:
            raise Unsupported("output_dtype differs from the zero point type")
        out = zp.shape.type
        if out in FP8 and (ctx.const(zp) is None or ctx.const(zp).astype(float).any()):
            raise Unsupported("float8 zero point must be a constant zero")
    out = out or DType.uint8_type
    if out not in QUANT_INT | FP8:
        raise Unsupported(f"quantised type {out.name}")
    if s.shape.type != x.shape.type and not (x.shape.type == DType.int32_type):
        raise Unsupported(f"scale type {s.shape.type.name} differs from input type {x.shape.type.name}")
    ins = [x, s] + ([zp] if zp is not None else [])
    return ctx.add("quantizelinear", ins, out_type=out, saturate=bool(node.attr("saturate", 1)))


@onnx_op("DequantizeLinear")
def parse_dequantizelinear(ctx: ParseContext, node: NodeDesc, args):
    x, s, zp = qparams(ctx, node, args)
    od = node.attr("output_dtype", 0)
    if od and onnx_type(od) != s.shape.type:
        raise Unsupported("DequantizeLinear output_dtype different from the scale type")
    if zp is not None and x.shape.type in FP8 | {DType.int32_type}:
        v = ctx.const(zp)
        if v is None or v.astype(float).any():
            raise Unsupported(f"{x.shape.type.name} zero point must be a constant zero")
        zp = None
    return ctx.add("dequantizelinear", [x, s] + ([zp] if zp is not None else []))


@onnx_op("DynamicQuantizeLinear")
def parse_dynamicquantizelinear(ctx: ParseContext, node: NodeDesc, args):
    t = ctx.add("dynamicquantizelinear", [args[0]])
    return [ctx.add("get_tuple_elem", [t], index=i) for i in range(3)]


def centred(
    ctx: ParseContext, x: Instruction, zp: Instruction | None, axis: int | None = None
) -> Instruction:
    """int32(x) - int32(zp); zp is a scalar, or a vector along ``axis`` of x."""
    xi = ctx.convert(x, DType.int32_type)
    if zp is None:
        return xi
    if zp.shape.type != x.shape.type:
        raise Unsupported("zero point type differs from the data type")
    zi = ctx.convert(zp, DType.int32_type)
    if zp.shape.elements() == 1:
        zi = ctx.broadcast_to(ctx.add("reshape", [zi], dims=[]) if zp.shape.ndim() else zi, xi.shape.lens)
    elif axis is not None and zp.shape.lens == (xi.shape.lens[axis],):
        zi = ctx.add("broadcast", [zi], axis=axis, out_lens=list(xi.shape.lens))
    else:
        raise Unsupported(f"zero point of dims {list(zp.shape.lens)}")
    return ctx.add("sub", [xi, zi])


@onnx_op("MatMulInteger")
def parse_matmulinteger(ctx: ParseContext, node: NodeDesc, args):
    a, b = args[0], args[1]
    check_type(a, INT8, "MatMulInteger")
    check_type(b, INT8, "MatMulInteger")
    az = args[2] if len(args) > 2 else None
    bz = args[3] if len(args) > 3 else None
    if az is not None and az.shape.elements() != 1:
        raise Unsupported("MatMulInteger per-row a_zero_point")
    bn = b.shape.ndim()
    return matmul(ctx, centred(ctx, a, az), centred(ctx, b, bz, bn - 1 if bn >= 2 else None))


@onnx_op("ConvInteger")
def parse_convinteger(ctx: ParseContext, node: NodeDesc, args):
    x, w = args[0], args[1]
    check_type(x, INT8, "ConvInteger")
    check_type(w, INT8, "ConvInteger")
    xz = args[2] if len(args) > 2 else None
    wz = args[3] if len(args) > 3 else None
    if xz is not None and xz.shape.elements() != 1:
        raise Unsupported("ConvInteger per-channel x_zero_point")
    # x's padding holds x_zero_point (ORT), i.e. zero after centring, which the convolution pads with.
    return convolution(ctx, node, centred(ctx, x, xz), centred(ctx, w, wz, 0))


def requantize(
    ctx: ParseContext, acc: Instruction, multiplier: Instruction, zp: Instruction | None, out: DType
) -> Instruction:
    f = ctx.add("mul", [ctx.convert(acc, DType.float_type), multiplier])
    one = ctx.broadcast_to(ctx.literal(1.0, "float32"), f.shape.lens)
    if zp is None:
        return ctx.add("quantizelinear", [f, one], out_type=out)
    if zp.shape.elements() != 1:
        raise Unsupported("per-channel output zero point")
    zpb = ctx.broadcast_to(ctx.add("reshape", [zp], dims=[]) if zp.shape.ndim() else zp, f.shape.lens)
    return ctx.add("quantizelinear", [f, one, zpb], out_type=out)


def scalar_f32(ctx: ParseContext, s: Instruction, what: str, allow_half: bool = False) -> Instruction:
    if s.shape.type != DType.float_type and not (allow_half and s.shape.type == DType.half_type):
        raise Unsupported(f"{what} of type {s.shape.type.name} (float32 only)")
    # ORT widens float16 scales to float32 and requantises in float32 (ONNX's reference multiplies
    # the scales in float16 and can round differently; ORT's answer is the one users get)
    s = ctx.convert(s, DType.float_type)
    if s.shape.elements() != 1:
        raise Unsupported(f"per-channel {what}")
    return ctx.add("reshape", [s], dims=[]) if s.shape.ndim() else s


@onnx_op("QLinearMatMul")
def parse_qlinearmatmul(ctx: ParseContext, node: NodeDesc, args):
    a, as_, az, b, bs, bz, ys, yz = args
    check_type(a, INT8, "QLinearMatMul")
    check_type(b, INT8, "QLinearMatMul")
    acc = matmul(ctx, centred(ctx, a, az), centred(ctx, b, bz))
    # ORT's real multiplier: (a_scale * b_scale) / y_scale in float32
    m = ctx.add(
        "div",
        [
            ctx.add("mul", [scalar_f32(ctx, as_, "a_scale", True), scalar_f32(ctx, bs, "b_scale", True)]),
            scalar_f32(ctx, ys, "y_scale", True),
        ],
    )
    return requantize(ctx, acc, ctx.broadcast_to(m, acc.shape.lens), yz, yz.shape.type)


@onnx_op("QLinearConv")
def parse_qlinearconv(ctx: ParseContext, node: NodeDesc, args):
    x, xs, xz, w, ws, wz, ys, yz = args[:8]
    bias = args[8] if len(args) > 8 else None
    check_type(x, INT8, "QLinearConv")
    check_type(w, INT8, "QLinearConv")
    if xz is not None and xz.shape.elements() != 1:
        raise Unsupported("QLinearConv per-channel x_zero_point")
    acc = convolution(ctx, node, centred(ctx, x, xz), centred(ctx, w, wz, 0))
    if bias is not None:
        if bias.shape.type != DType.int32_type:
            raise Unsupported("QLinearConv bias must be int32")
        acc = ctx.add("add", [acc, as_channel_vector(ctx, bias, acc)])
    if ws.shape.type != DType.float_type:
        raise Unsupported("QLinearConv w_scale must be float32")
    if ws.shape.elements() == 1:
        m = ctx.add(
            "div",
            [
                ctx.add("mul", [scalar_f32(ctx, xs, "x_scale"), scalar_f32(ctx, ws, "w_scale")]),
                scalar_f32(ctx, ys, "y_scale"),
            ],
        )
        m = ctx.broadcast_to(m, acc.shape.lens)
    else:
        n = ws.shape.elements()
        xsb = ctx.broadcast_to(scalar_f32(ctx, xs, "x_scale"), (n,))
        ysb = ctx.broadcast_to(scalar_f32(ctx, ys, "y_scale"), (n,))
        wv = ctx.add("reshape", [ws], dims=[n])
        m = as_channel_vector(ctx, ctx.add("div", [ctx.add("mul", [xsb, wv]), ysb]), acc)
    return requantize(ctx, acc, m, yz, yz.shape.type)

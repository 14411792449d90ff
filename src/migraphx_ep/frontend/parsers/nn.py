"""Convolution, pooling, LRN, MatMul, Gemm and Einsum parsers (ai.onnx)."""

from __future__ import annotations

from collections.abc import Sequence

from ...ir.dtypes import DType, is_float
from ...ir.instruction import Instruction
from ...ops.core import broadcast_lens
from ..context import NodeDesc, ParseContext
from ..table import Unsupported, onnx_op

CONV_DTYPES = {DType.half_type, DType.float_type, DType.double_type, DType.bf16_type}


def spatial_ints(node: NodeDesc, name: str, k: int, default: int) -> list[int]:
    v = [int(x) for x in node.attr(name, [default] * k)]
    if len(v) != k:
        raise Unsupported(f"{name} {v} does not match {k} spatial dims")
    return v


def explicit_pads(
    node: NodeDesc,
    sizes: Sequence[int],
    kernel: Sequence[int],
    strides: Sequence[int],
    dilations: Sequence[int],
) -> list[int]:
    """[begin..., end...] pads from ``pads`` or ``auto_pad`` (SAME_* from the static input size)."""
    k = len(sizes)
    auto = node.attr("auto_pad", "NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else auto
    if auto == "NOTSET":
        pads = [int(p) for p in node.attr("pads", [0] * 2 * k)]
        if len(pads) != 2 * k:
            raise Unsupported(f"pads {pads} do not match {k} spatial dims")
        if min(pads) < 0:
            raise Unsupported(f"negative pads {pads}")
        return pads
    if auto == "VALID":
        return [0] * 2 * k
    if auto not in ("SAME_UPPER", "SAME_LOWER"):
        raise Unsupported(f"auto_pad {auto!r}")
    begin, end = [], []
    for n, kk, s, d in zip(sizes, kernel, strides, dilations, strict=True):
        out = -(-n // s)
        total = max(0, (out - 1) * s + (kk - 1) * d + 1 - n)
        small, big = total // 2, total - total // 2
        begin.append(small if auto == "SAME_UPPER" else big)
        end.append(big if auto == "SAME_UPPER" else small)
    return begin + end


def as_channel_vector(ctx: ParseContext, b: Instruction, like: Instruction) -> Instruction:
    """A (C,) vector viewed as (N, C, 1...) broadcast to ``like``'s dims (channel axis 1)."""
    lens = like.shape.lens
    if b.shape.lens != (lens[1],):
        raise Unsupported(f"bias dims {list(b.shape.lens)} must be [{lens[1]}]")
    return ctx.add("broadcast", [b], axis=1, out_lens=list(lens))


def check_type(x: Instruction, allowed: set[DType], what: str) -> None:
    if x.shape.type not in allowed:
        raise Unsupported(f"{what}: element type {x.shape.type.name} not supported")


def convolution(ctx: ParseContext, node: NodeDesc, x: Instruction, w: Instruction) -> Instruction:
    """The ``convolution`` of an ONNX Conv-like node's attributes (shared with ConvInteger/QLinearConv)."""
    k = x.shape.ndim() - 2
    if k < 1 or w.shape.ndim() != k + 2:
        raise Unsupported(f"{node.op_type} of input rank {x.shape.ndim()} and weight rank {w.shape.ndim()}")
    kernel = list(w.shape.lens[2:])
    if spatial_ints(node, "kernel_shape", k, 0) not in ([0] * k, kernel):
        raise Unsupported("kernel_shape attribute disagrees with the weights")
    strides = spatial_ints(node, "strides", k, 1)
    dil = spatial_ints(node, "dilations", k, 1)
    pads = explicit_pads(node, x.shape.lens[2:], kernel, strides, dil)
    return ctx.add(
        "convolution", [x, w], padding=pads, stride=strides, dilation=dil, group=int(node.attr("group", 1))
    )


@onnx_op("Conv")
def parse_conv(ctx: ParseContext, node: NodeDesc, args):
    x, w = args[0], args[1]
    b = args[2] if len(args) > 2 else None
    check_type(x, CONV_DTYPES, "Conv")
    y = convolution(ctx, node, x, w)
    if b is not None:
        y = ctx.add("add", [y, as_channel_vector(ctx, b, y)])
    return y


@onnx_op("ConvTranspose")
def parse_conv_transpose(ctx: ParseContext, node: NodeDesc, args):
    x, w = args[0], args[1]
    b = args[2] if len(args) > 2 else None
    check_type(x, CONV_DTYPES, "ConvTranspose")
    k = x.shape.ndim() - 2
    if k < 1 or w.shape.ndim() != k + 2:
        raise Unsupported(f"ConvTranspose of input rank {x.shape.ndim()} and weight rank {w.shape.ndim()}")
    kernel = list(w.shape.lens[2:])
    if spatial_ints(node, "kernel_shape", k, 0) not in ([0] * k, kernel):
        raise Unsupported("kernel_shape attribute disagrees with the weights")
    s = spatial_ints(node, "strides", k, 1)
    d = spatial_ints(node, "dilations", k, 1)
    out_pad = spatial_ints(node, "output_padding", k, 0)
    ins = x.shape.lens[2:]
    full = [(ins[i] - 1) * s[i] + (kernel[i] - 1) * d[i] + 1 + out_pad[i] for i in range(k)]
    auto = node.attr("auto_pad", "NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else auto
    out_shape = node.attr("output_shape")
    if out_shape is not None:
        out_shape = [int(v) for v in out_shape][-k:]
        total = [full[i] - out_shape[i] for i in range(k)]
    elif auto in ("SAME_UPPER", "SAME_LOWER"):
        total = [full[i] - ins[i] * s[i] for i in range(k)]
    else:
        total = None
    if total is not None:
        if node.attr("pads") is not None and any(node.attr("pads")):
            raise Unsupported("ConvTranspose with both pads and output_shape/auto_pad")
        if out_shape is None and any(out_pad):
            raise Unsupported("ConvTranspose SAME_* with output_padding (ORT and ONNX disagree on the size)")
        # ONNX (and ORT 1.31): SAME_UPPER puts the odd pad at the end, otherwise at the beginning.
        head = [t // 2 if auto == "SAME_UPPER" else t - t // 2 for t in total]
        if min(head) < 0:
            raise Unsupported("ConvTranspose output_shape needing padding before the result")
        pads = head + [t - h for t, h in zip(total, head, strict=True)]
    else:
        pads = explicit_pads(node, [0] * k, kernel, s, d) if auto != "VALID" else [0] * 2 * k
    # output_padding extends the end: a negative end padding in convolution_backwards
    padding = pads[:k] + [pads[k + i] - out_pad[i] for i in range(k)]
    y = ctx.add(
        "convolution_backwards",
        [x, w],
        padding=padding,
        stride=s,
        dilation=d,
        group=int(node.attr("group", 1)),
    )
    if b is not None:
        y = ctx.add("add", [y, as_channel_vector(ctx, b, y)])
    return y


def pool_attrs(ctx: ParseContext, node: NodeDesc, x: Instruction, kernel: list[int]) -> dict:
    k = len(kernel)
    s = spatial_ints(node, "strides", k, 1)
    d = spatial_ints(node, "dilations", k, 1)
    ceil = bool(node.attr("ceil_mode", 0))
    auto = node.attr("auto_pad", "NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else auto
    if ceil and auto != "NOTSET":
        raise Unsupported(f"ceil_mode with auto_pad {auto}")
    pads = explicit_pads(node, x.shape.lens[2:], kernel, s, d)
    if any(pads[i] >= kernel[i] or pads[i + k] >= kernel[i] for i in range(k)):
        # a window made only of padding has no defined value in ORT (it errors or yields -inf/NaN)
        raise Unsupported(f"pads {pads} not smaller than the pooling window")
    return dict(padding=pads, stride=s, lengths=kernel, dilations=d, ceil_mode=ceil)


def pool_kernel(node: NodeDesc, x: Instruction) -> list[int]:
    k = x.shape.ndim() - 2
    if k < 1:
        raise Unsupported("pooling needs a spatial dimension")
    kernel = node.attr("kernel_shape")
    if kernel is None or len(kernel) != k:
        raise Unsupported(f"kernel_shape {kernel} does not match {k} spatial dims")
    return [int(v) for v in kernel]


@onnx_op("MaxPool")
def parse_max_pool(ctx: ParseContext, node: NodeDesc, args):
    x = args[0]
    check_type(x, CONV_DTYPES | {DType.int8_type, DType.uint8_type}, "MaxPool")
    attrs = pool_attrs(ctx, node, x, pool_kernel(node, x))
    y = ctx.add("pooling", [x], mode="max", **attrs)
    if len(node.outputs) < 2 or not node.outputs[1]:
        return y
    order = int(node.attr("storage_order", 0))
    if order not in (0, 1) or x.shape.type not in (DType.float_type, DType.double_type, DType.half_type):
        raise Unsupported(f"MaxPool Indices with storage_order {order} of {x.shape.type.name}")
    return [y, ctx.add("pooling_indices", [x], storage_order=order, **attrs)]


@onnx_op("AveragePool")
def parse_average_pool(ctx: ParseContext, node: NodeDesc, args):
    x = args[0]
    check_type(x, CONV_DTYPES, "AveragePool")
    attrs = pool_attrs(ctx, node, x, pool_kernel(node, x))
    cip = bool(node.attr("count_include_pad", 0))
    return ctx.add("pooling", [x], mode="average", count_include_pad=cip, **attrs)


def lp_order(node: NodeDesc) -> int:
    p = node.attr("p", 2)
    if float(p) != int(p) or int(p) < 1:
        raise Unsupported(f"LpPool p={p}: only positive integer orders")
    return int(p)


@onnx_op("LpPool")
def parse_lp_pool(ctx: ParseContext, node: NodeDesc, args):
    x = args[0]
    check_type(x, CONV_DTYPES, "LpPool")
    attrs = pool_attrs(ctx, node, x, pool_kernel(node, x))
    return ctx.add("pooling", [x], mode="lpnorm", lp_order=lp_order(node), **attrs)


@onnx_op("GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool")
def parse_global_pool(ctx: ParseContext, node: NodeDesc, args):
    x = args[0]
    check_type(x, CONV_DTYPES, node.op_type)
    k = x.shape.ndim() - 2
    if k < 1:
        raise Unsupported(f"{node.op_type} needs a spatial dimension")
    mode = {"GlobalAveragePool": "average", "GlobalMaxPool": "max", "GlobalLpPool": "lpnorm"}[node.op_type]
    extra = {"lp_order": lp_order(node)} if mode == "lpnorm" else {}
    return ctx.add("pooling", [x], mode=mode, lengths=list(x.shape.lens[2:]), **extra)


@onnx_op("LRN")
def parse_lrn(ctx: ParseContext, node: NodeDesc, args):
    x = args[0]
    check_type(x, CONV_DTYPES, "LRN")
    size = node.attr("size")
    if size is None or int(size) < 1:
        raise Unsupported("LRN needs a positive size")
    return ctx.add(
        "lrn",
        [x],
        alpha=float(node.attr("alpha", 0.0001)),
        beta=float(node.attr("beta", 0.75)),
        bias=float(node.attr("bias", 1.0)),
        size=int(size),
    )


MATMUL_DTYPES = CONV_DTYPES | {DType.int32_type, DType.int64_type, DType.uint32_type, DType.uint64_type}


def matmul(ctx: ParseContext, a: Instruction, b: Instruction, op: str = "dot", **attrs) -> Instruction:
    """numpy.matmul: 1-D operands gain (then lose) a unit dim; batch dims broadcast."""
    ra, rb = a.shape.ndim(), b.shape.ndim()
    if ra == 0 or rb == 0:
        raise Unsupported("MatMul of a scalar")
    if ra == 1:
        a = ctx.add("reshape", [a], dims=[1, a.shape.lens[0]])
    if rb == 1:
        b = ctx.add("reshape", [b], dims=[b.shape.lens[0], 1])
    batch = broadcast_lens(a.shape.lens[:-2], b.shape.lens[:-2])
    a = ctx.broadcast_to(a, batch + a.shape.lens[-2:])
    b = ctx.broadcast_to(b, batch + b.shape.lens[-2:])
    y = ctx.add(op, [a, b], **attrs)
    if ra == 1 or rb == 1:
        lens = list(batch) + ([] if ra == 1 else [y.shape.lens[-2]]) + ([] if rb == 1 else [y.shape.lens[-1]])
        y = ctx.add("reshape", [y], dims=lens)
    return y


@onnx_op("MatMul")
def parse_matmul(ctx: ParseContext, node: NodeDesc, args):
    a, b = args
    check_type(a, MATMUL_DTYPES, "MatMul")
    return matmul(ctx, a, b)


def transpose2(ctx: ParseContext, x: Instruction) -> Instruction:
    return ctx.add("transpose", [x], permutation=[1, 0])


@onnx_op("Gemm")
def parse_gemm(ctx: ParseContext, node: NodeDesc, args):
    a, b = args[0], args[1]
    c = args[2] if len(args) > 2 else None
    check_type(a, MATMUL_DTYPES, "Gemm")
    if a.shape.ndim() != 2 or b.shape.ndim() != 2:
        raise Unsupported("Gemm operands must be 2-D")
    alpha, beta = float(node.attr("alpha", 1.0)), float(node.attr("beta", 1.0))
    if not is_float(a.shape.type) and (alpha != 1.0 or (c is not None and beta not in (0.0, 1.0))):
        raise Unsupported("integer Gemm with alpha/beta other than 1 (ONNX scales in float)")
    if node.attr("transA", 0):
        a = transpose2(ctx, a)
    if node.attr("transB", 0):
        b = transpose2(ctx, b)
    y = ctx.add("dot", [a, b])
    if alpha != 1.0:
        y = ctx.add("mul", [y, ctx.broadcast_to(ctx.literal(alpha, y.shape.dtype), y.shape.lens)])
    if c is not None and beta != 0.0:
        if broadcast_lens(c.shape.lens, y.shape.lens) != y.shape.lens:
            raise Unsupported(f"Gemm C dims {list(c.shape.lens)} do not broadcast to {list(y.shape.lens)}")
        c = ctx.broadcast_to(c, y.shape.lens)
        if beta != 1.0:
            c = ctx.add("mul", [c, ctx.broadcast_to(ctx.literal(beta, c.shape.dtype), c.shape.lens)])
        y = ctx.add("add", [y, c])
    return y


def explicit_equation(eq: str) -> str:
    """ONNX implicit-mode einsum: output is '...' then the labels used once, in alphabetical order."""
    eq = eq.replace(" ", "")
    if "->" in eq:
        return eq
    letters = [ch for ch in eq if ch.isalpha()]
    once = sorted(ch for ch in set(letters) if letters.count(ch) == 1)
    return eq + "->" + ("..." if "..." in eq else "") + "".join(once)


@onnx_op("Einsum")
def parse_einsum(ctx: ParseContext, node: NodeDesc, args):
    eq = node.attr("equation", "")
    eq = eq.decode() if isinstance(eq, bytes) else str(eq)
    check_type(args[0], MATMUL_DTYPES | {DType.int8_type, DType.uint8_type}, "Einsum")
    try:
        return ctx.add("einsum", list(args), equation=explicit_equation(eq))
    except ValueError as e:
        raise Unsupported(f"Einsum {eq!r}: {e}") from None


__all__ = ["as_channel_vector", "convolution", "explicit_pads", "matmul"]

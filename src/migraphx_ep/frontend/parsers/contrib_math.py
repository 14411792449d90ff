"""ORT contrib (com.microsoft) activations and layer norms, with the semantics of ORT's CPU kernels
(ContribOperators.md): the norms compute in float32 and round once, including the affine part.
"""

from __future__ import annotations

from ...ir.dtypes import DType
from ...ir.instruction import Instruction
from ..context import NodeDesc, ParseContext, normalize_axis
from ..table import Unsupported, onnx_op
from .normalize import layer_norm, require_float, stash, wanted
from .pointwise import check_attrs, fattr

MS = "com.microsoft"


def _plus_bias(ctx: ParseContext, x: Instruction, bias: Instruction | None) -> Instruction:
    if bias is None:
        return x
    if bias.shape.ndim() != 1 or bias.shape.lens[0] != x.shape.lens[-1]:
        raise Unsupported(f"bias of dims {list(bias.shape.lens)} must be [{x.shape.lens[-1]}]")
    return ctx.elementwise("add", x, bias)


@onnx_op("Gelu", domain=MS)
def parse_ms_gelu(ctx: ParseContext, node: NodeDesc, args):
    check_attrs(node, ())
    return ctx.add("gelu", [args[0]])


@onnx_op("BiasGelu", domain=MS)
def parse_bias_gelu(ctx: ParseContext, node: NodeDesc, args):
    check_attrs(node, ())
    return ctx.add("gelu", [_plus_bias(ctx, args[0], args[1])])


@onnx_op("FastGelu", domain=MS)
def parse_fast_gelu(ctx: ParseContext, node: NodeDesc, args):
    check_attrs(node, ())
    bias = args[1] if len(args) > 1 else None
    return ctx.add("gelu_tanh", [_plus_bias(ctx, args[0], bias)])


@onnx_op("QuickGelu", domain=MS)
def parse_quick_gelu(ctx: ParseContext, node: NodeDesc, args):
    check_attrs(node, ("alpha",))
    return ctx.add("quick_gelu", [args[0]], alpha=fattr(node, "alpha", 1.702))


def _skip_sum(ctx: ParseContext, node: NodeDesc, args: list, bias_at: int) -> Instruction:
    x, skip = args[0], args[1]
    require_float(node, x)
    if x.shape.ndim() not in (2, 3):
        raise Unsupported(f"{node.op_type}: input must be 2-D or 3-D")
    if skip.shape.lens != x.shape.lens:
        raise Unsupported(f"{node.op_type}: skip dims {list(skip.shape.lens)} differ from input")
    bias = args[bias_at] if len(args) > bias_at else None
    return _plus_bias(ctx, ctx.add("add", [x, skip]), bias)


@onnx_op("SkipLayerNormalization", domain=MS)
def parse_skip_layer_norm(ctx: ParseContext, node: NodeDesc, args):
    check_attrs(node, ("epsilon",))
    s = _skip_sum(ctx, node, args, 4)
    beta = args[3] if len(args) > 3 else None
    y, mean, inv = layer_norm(
        ctx, s, args[2], beta, s.shape.ndim() - 1, fattr(node, "epsilon", 1e-12), affine_in_stash=True
    )
    return [y, ctx.convert(mean, DType.float_type), ctx.convert(inv, DType.float_type), s]


@onnx_op("SkipSimplifiedLayerNormalization", domain=MS)
def parse_skip_simplified_layer_norm(ctx: ParseContext, node: NodeDesc, args):
    check_attrs(node, ("epsilon",))
    if wanted(node, 1):
        raise Unsupported("SkipSimplifiedLayerNormalization: the mean output is not defined")
    s = _skip_sum(ctx, node, args, 3)
    y, _, inv = layer_norm(
        ctx,
        s,
        args[2],
        None,
        s.shape.ndim() - 1,
        fattr(node, "epsilon", 1e-12),
        simplified=True,
        affine_in_stash=True,
    )
    return [y, y, ctx.convert(inv, DType.float_type), s]


@onnx_op("SimplifiedLayerNormalization")
@onnx_op("SimplifiedLayerNormalization", domain=MS)
def parse_simplified_layer_norm(ctx: ParseContext, node: NodeDesc, args):
    check_attrs(node, ("axis", "epsilon", "stash_type"))
    x, scale = args[0], args[1]
    require_float(node, x)
    if int(node.attr("stash_type", 1)) != 1:
        raise Unsupported(f"{node.op_type}: only stash_type=1 (float) is supported")
    axis = normalize_axis(int(node.attr("axis", -1)), x.shape.ndim())
    y, _, inv = layer_norm(
        ctx, x, scale, None, axis, fattr(node, "epsilon", 1e-5), simplified=True, affine_in_stash=True
    )
    return [y, ctx.convert(inv, stash(x))]

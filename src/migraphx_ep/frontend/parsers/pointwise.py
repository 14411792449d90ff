"""Elementwise ONNX ops: generic by-name mapping with multidirectional broadcasting, plus the
irregular ones (variadic Max/Min/Sum/Mean, Pow with mixed types, Mod, Clip, Cast, IsInf, Dropout)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import ml_dtypes
import numpy as np

from ...ir.dtypes import FLOAT_TYPES, DType, is_float, to_numpy
from ...ir.instruction import Instruction
from ...ops.core import broadcast_lens
from ..context import NodeDesc, ParseContext, onnx_type
from ..table import Unsupported, onnx_op

# Opset-1 attributes that only hinted at in-place reuse; they never change the result.
LEGACY_HINTS = ("consumed_inputs",)


def check_attrs(node: NodeDesc, allowed: Iterable[str]) -> None:
    """Refuse a node carrying an attribute this parser does not interpret (it may change the meaning)."""
    unknown = sorted(set(node.attributes) - set(allowed) - set(LEGACY_HINTS))
    if unknown:
        raise Unsupported(f"{node.op_type}: attribute(s) {unknown} not supported")


def fattr(node: NodeDesc, name: str, default: float) -> float:
    """A float attribute as ORT sees it: a float32 value (defaults too)."""
    return float(np.float32(node.attr(name, default)))


UNARY = {
    "Abs": "abs",
    "Acos": "acos",
    "Acosh": "acosh",
    "Asin": "asin",
    "Asinh": "asinh",
    "Atan": "atan",
    "Atanh": "atanh",
    "Ceil": "ceil",
    "Cos": "cos",
    "Cosh": "cosh",
    "Erf": "erf",
    "Exp": "exp",
    "Floor": "floor",
    "IsNaN": "isnan",
    "Log": "log",
    "Neg": "neg",
    "Not": "not",
    "Reciprocal": "recip",
    "Relu": "relu",
    "Round": "nearbyint",
    "Sigmoid": "sigmoid",
    "Sign": "sign",
    "Sin": "sin",
    "Sinh": "sinh",
    "Softplus": "softplus",
    "Softsign": "softsign",
    "Sqrt": "sqrt",
    "Tan": "tan",
    "Tanh": "tanh",
    "Mish": "mish",
    "HardSwish": "hard_swish",
    "BitwiseNot": "bitwise_not",
}
BINARY = {
    "Add": "add",
    "Sub": "sub",
    "Mul": "mul",
    "Div": "div",
    "And": "logical_and",
    "Or": "logical_or",
    "Xor": "logical_xor",
    "Equal": "equal",
    "Greater": "greater",
    "GreaterOrEqual": "greater_or_equal",
    "Less": "less",
    "LessOrEqual": "less_or_equal",
    "BitwiseAnd": "bitwise_and",
    "BitwiseOr": "bitwise_or",
    "BitwiseXor": "bitwise_xor",
}


def legacy_broadcast(ctx: ParseContext, node: NodeDesc, a: Instruction, b: Instruction) -> None:
    """Opset < 7 broadcasting: B aligned to A at ``axis``; only the numpy-equivalent (suffix) case."""
    if ctx.opset >= 7 or "axis" not in node.attributes or not node.attr("broadcast", 0):
        return
    axis = int(node.attr("axis"))
    if axis < 0:
        axis += a.shape.ndim()
    if axis != a.shape.ndim() - b.shape.ndim():
        raise Unsupported(f"{node.op_type}: legacy broadcast at axis {axis} is not trailing alignment")


@onnx_op(*BINARY)
def parse_binary(ctx: ParseContext, node: NodeDesc, args):
    check_attrs(node, ("broadcast", "axis"))
    a, b = args
    legacy_broadcast(ctx, node, a, b)
    return ctx.elementwise(BINARY[node.op_type], a, b)


@onnx_op(*UNARY)
def parse_unary(ctx: ParseContext, node: NodeDesc, args):
    check_attrs(node, ())
    return ctx.add(UNARY[node.op_type], [args[0]])


@onnx_op("Identity")
def parse_identity(ctx: ParseContext, node: NodeDesc, args):
    return args[0]


@onnx_op("Pow")
def parse_pow(ctx: ParseContext, node: NodeDesc, args):
    check_attrs(node, ("broadcast", "axis"))
    a, b = args
    legacy_broadcast(ctx, node, a, b)
    t = a.shape.type
    if b.shape.type == t:
        return ctx.elementwise("pow", a, b)
    # Mixed types: ORT's std::pow(T, E) promotes to double and casts the result back to T.
    d = DType.double_type
    return ctx.convert(ctx.elementwise("pow", ctx.convert(a, d), ctx.convert(b, d)), t)


@onnx_op("Mod")
def parse_mod(ctx: ParseContext, node: NodeDesc, args):
    check_attrs(node, ("fmod",))
    a, b = args
    if int(node.attr("fmod", 0)) == 1:
        return ctx.elementwise("fmod", a, b)
    if is_float(a.shape.type) and ctx.opset < 28:
        raise Unsupported("Mod: fmod=0 on floating-point inputs is only defined from opset 28")
    return ctx.elementwise("mod", a, b)


@onnx_op("BitShift")
def parse_bitshift(ctx: ParseContext, node: NodeDesc, args):
    check_attrs(node, ("direction",))
    direction = node.attr("direction")
    if direction not in ("LEFT", "RIGHT"):
        raise Unsupported(f"BitShift: direction {direction!r}")
    return ctx.elementwise("shift_left" if direction == "LEFT" else "shift_right", *args)


@onnx_op("PRelu")
def parse_prelu(ctx: ParseContext, node: NodeDesc, args):
    check_attrs(node, ())
    x, slope = args
    if broadcast_lens(x.shape.lens, slope.shape.lens) != x.shape.lens:
        raise Unsupported("PRelu: slope must broadcast to the shape of X")
    return ctx.add("prelu", [x, ctx.broadcast_to(slope, x.shape.lens)])


def fold_variadic(ctx: ParseContext, op: str, args: list[Instruction | None]) -> Instruction:
    xs = [x for x in args if x is not None]
    if not xs:
        raise Unsupported("variadic op without inputs")
    out = xs[0]
    for x in xs[1:]:  # left to right, as ONNX's reference and ORT accumulate
        out = ctx.elementwise(op, out, x)
    return out


@onnx_op("Max", "Min", "Sum")
def parse_variadic(ctx: ParseContext, node: NodeDesc, args):
    check_attrs(node, ())
    return fold_variadic(ctx, {"Max": "max", "Min": "min", "Sum": "add"}[node.op_type], args)


@onnx_op("Mean")
def parse_mean(ctx: ParseContext, node: NodeDesc, args):
    check_attrs(node, ())
    total = fold_variadic(ctx, "add", args)
    n = sum(x is not None for x in args)
    if n == 1:
        return total
    return ctx.elementwise("div", total, ctx.literal(n, total.shape.dtype))


@onnx_op("Where")
def parse_where(ctx: ParseContext, node: NodeDesc, args):
    check_attrs(node, ())
    return ctx.elementwise("where", *args)


def _limit(x: Instruction, high: bool, opset: int) -> Any:
    """Clip's default bounds: numeric_limits lowest()/max() of the type (so +-inf clamp to finite);
    before opset 11 they were float attributes defaulting to +-FLT_MAX."""
    dt = x.shape.dtype
    if dt.kind in "iu":
        info = np.iinfo(dt)
    else:
        info = ml_dtypes.finfo(np.float32 if opset < 11 else dt)
    return info.max if high else info.min


@onnx_op("Clip")
def parse_clip(ctx: ParseContext, node: NodeDesc, args):
    x = args[0]
    dt = x.shape.dtype
    if ctx.opset < 11:
        check_attrs(node, ("min", "max"))
        lo = ctx.literal(node.attr("min", _limit(x, False, ctx.opset)), dt)
        hi = ctx.literal(node.attr("max", _limit(x, True, ctx.opset)), dt)
    else:
        check_attrs(node, ())
        given = list(args[1:3]) + [None] * (3 - len(args))
        lo, hi = (
            v if v is not None else ctx.literal(_limit(x, high, ctx.opset), dt)
            for v, high in zip(given, (False, True), strict=True)
        )
        for v in (lo, hi):
            if v.shape.elements() != 1:
                raise Unsupported("Clip: min and max must be scalars")
    return ctx.add("clip", [x, ctx.broadcast_to(lo, x.shape.lens), ctx.broadcast_to(hi, x.shape.lens)])


FP8 = (DType.fp8e4m3fn_type, DType.fp8e4m3fnuz_type, DType.fp8e5m2_type, DType.fp8e5m2fnuz_type)


def cast(ctx: ParseContext, node: NodeDesc, x: Instruction, t: DType) -> Instruction:
    if node.attr("round_mode", "up") != "up":
        raise Unsupported("Cast: round_mode applies to float8e8m0 only")
    if t in FP8 and int(node.attr("saturate", 1)) and x.shape.type != t:
        # Saturating cast: clamp to the finite range first (inf -> max), NaN stays NaN.
        src = x if is_float(x.shape.type) and x.shape.type not in FP8 else ctx.convert(x, DType.float_type)
        info = ml_dtypes.finfo(to_numpy(t))
        lo, hi = (
            ctx.broadcast_to(ctx.literal(float(v), src.shape.dtype), src.shape.lens)
            for v in (info.min, info.max)
        )
        x = ctx.add("clip", [src, lo, hi])
    return ctx.convert(x, t)


@onnx_op("Cast")
def parse_cast(ctx: ParseContext, node: NodeDesc, args):
    check_attrs(node, ("to", "saturate", "round_mode"))
    to = node.attr("to")
    if isinstance(to, str):
        raise Unsupported("Cast: 'to' given as a string (opset 1)")
    return cast(ctx, node, args[0], onnx_type(int(to)))


@onnx_op("CastLike")
def parse_cast_like(ctx: ParseContext, node: NodeDesc, args):
    check_attrs(node, ("saturate", "round_mode"))
    return cast(ctx, node, args[0], args[1].shape.type)


@onnx_op("IsInf")
def parse_isinf(ctx: ParseContext, node: NodeDesc, args):
    check_attrs(node, ("detect_negative", "detect_positive"))
    x = args[0]
    neg, pos = int(node.attr("detect_negative", 1)), int(node.attr("detect_positive", 1))
    if neg and pos:
        return ctx.add("isinf", [x])
    if x.shape.type not in FLOAT_TYPES:
        raise Unsupported("IsInf: input must be floating point")
    # One sign: compare with that infinity; neither: compare with NaN, which is never equal.
    target = np.inf if pos else (-np.inf if neg else np.nan)
    return ctx.elementwise("equal", x, ctx.literal(target, x.shape.dtype))


@onnx_op("Dropout")
def parse_dropout(ctx: ParseContext, node: NodeDesc, args):
    check_attrs(node, ("ratio", "is_test", "seed"))
    x = args[0]
    if ctx.opset < 7 and not int(node.attr("is_test", 0)):
        raise Unsupported("Dropout: is_test=0 (training) is not supported")
    if len(args) > 2 and args[2] is not None:
        mode = ctx.const(args[2])
        ratio = ctx.const(args[1]) if len(args) > 1 and args[1] is not None else np.float32(0.5)
        # Training with a constant ratio of 0 drops nothing: still the identity.
        drops = ratio is None or float(np.asarray(ratio)) != 0
        if mode is None or (bool(np.asarray(mode).ravel()[0]) and drops):
            raise Unsupported("Dropout: training_mode must be a constant false (or ratio a constant 0)")
    wants_mask = len(node.outputs) > 1 and bool(node.outputs[1])
    if not wants_mask:
        return [x]
    if ctx.opset < 10:
        raise Unsupported("Dropout: the mask output before opset 10 has the data type; not supported")
    mask = ctx.broadcast_to(ctx.literal(True, np.bool_), x.shape.lens)
    return [x, ctx.add("contiguous", [mask]) if mask.shape.lens else mask]


# -- activations ---------------------------------------------------------------------------------
ACTIVATIONS: dict[str, tuple[str, dict[str, float]]] = {
    "LeakyRelu": ("leaky_relu", {"alpha": 0.01}),
    "Elu": ("elu", {"alpha": 1.0}),
    "Selu": ("selu", {"alpha": 1.67326319217681884765625, "gamma": 1.05070102214813232421875}),
    "Celu": ("celu", {"alpha": 1.0}),
    "ThresholdedRelu": ("thresholded_relu", {"alpha": 1.0}),
    "HardSigmoid": ("hard_sigmoid", {"alpha": 0.2, "beta": 0.5}),
    "Shrink": ("shrink", {"lambd": 0.5, "bias": 0.0}),
}


@onnx_op(*ACTIVATIONS)
def parse_activation(ctx: ParseContext, node: NodeDesc, args):
    op, defaults = ACTIVATIONS[node.op_type]
    check_attrs(node, defaults)
    return ctx.add(op, [args[0]], **{k: fattr(node, k, v) for k, v in defaults.items()})


@onnx_op("Swish")
def parse_swish(ctx: ParseContext, node: NodeDesc, args):
    check_attrs(node, ("alpha",))
    return ctx.add("quick_gelu", [args[0]], alpha=fattr(node, "alpha", 1.0))  # x * sigmoid(alpha * x)


@onnx_op("Gelu")
def parse_gelu(ctx: ParseContext, node: NodeDesc, args):
    check_attrs(node, ("approximate",))
    approx = node.attr("approximate", "none")
    if approx not in ("none", "tanh"):
        raise Unsupported(f"Gelu: approximate={approx!r}")
    return ctx.add("gelu" if approx == "none" else "gelu_tanh", [args[0]])

"""ONNX reductions: Reduce* (axes as attribute or constant input), ArgMax/ArgMin, CumSum/CumProd.

Composite reductions (L1, L2, LogSum, LogSumExp, SumSquare) decompose into pointwise ops around a
``reduce_sum``/``reduce_max``. With ``noop_with_empty_axes`` the reduction itself is skipped but the
pointwise parts still apply (ReduceSumSquare of a no-op is x*x), as in ONNX's reference and ORT.
"""

from __future__ import annotations

from ...ir.dtypes import FLOAT_TYPES, DType
from ...ir.instruction import Instruction
from ...ops.pointwise import NARROW_FLOATS
from ..context import NodeDesc, ParseContext, normalize_axis
from ..table import Unsupported, onnx_op
from .pointwise import check_attrs

SIMPLE = {
    "ReduceSum": "reduce_sum",
    "ReduceMean": "reduce_mean",
    "ReduceMax": "reduce_max",
    "ReduceMin": "reduce_min",
    "ReduceProd": "reduce_prod",
}
COMPOSITE = ("ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare")


def reduce_axes(ctx: ParseContext, node: NodeDesc, args: list) -> tuple[int, ...]:
    """The normalised axes to reduce; () for a no-op (noop_with_empty_axes with no axes)."""
    rank = args[0].shape.ndim()
    if len(args) > 1 and args[1] is not None:
        axes = ctx.const_ints(args[1], f"{node.op_type} axes")
    else:
        axes = node.attr("axes", None)
    if not axes:
        return () if int(node.attr("noop_with_empty_axes", 0)) else tuple(range(rank))
    out = tuple(sorted({normalize_axis(int(a), rank) for a in axes}))
    if len(out) != len(axes):
        raise Unsupported(f"{node.op_type}: repeated axes {list(axes)}")
    return out


def finish_keepdims(ctx: ParseContext, node: NodeDesc, r: Instruction, axes: tuple[int, ...]) -> Instruction:
    if int(node.attr("keepdims", 1)) or not axes:
        return r
    return ctx.add("squeeze", [r], axes=list(axes))


@onnx_op(*SIMPLE)
def parse_reduce(ctx: ParseContext, node: NodeDesc, args):
    check_attrs(node, ("axes", "keepdims", "noop_with_empty_axes"))
    axes = reduce_axes(ctx, node, args)
    return finish_keepdims(ctx, node, ctx.add(SIMPLE[node.op_type], [args[0]], axes=list(axes)), axes)


@onnx_op(*COMPOSITE)
def parse_reduce_composite(ctx: ParseContext, node: NodeDesc, args):
    check_attrs(node, ("axes", "keepdims", "noop_with_empty_axes"))
    axes = list(reduce_axes(ctx, node, args))
    x = args[0]
    t = x.shape.type
    op = node.op_type
    if t not in FLOAT_TYPES and op in ("ReduceLogSum", "ReduceLogSumExp", "ReduceL2"):
        # Integer inputs: evaluate in double and truncate back, as ORT's aggregators do.
        work = DType.double_type
    elif x.shape.dtype in NARROW_FLOATS:
        work = DType.float_type  # accumulate narrow floats in float32, round once
    else:
        work = t
    if op == "ReduceL2" and work != t:
        sq = ctx.add("mul", [x, x])
        r = ctx.add("sqrt", [ctx.convert(ctx.add("reduce_sum", [sq], axes=axes), work)])
        return finish_keepdims(ctx, node, ctx.convert(r, t), tuple(axes))
    xw = ctx.convert(x, work)
    if op == "ReduceL1":
        r = ctx.add("reduce_sum", [ctx.add("abs", [xw])], axes=axes)
    elif op == "ReduceL2":
        r = ctx.add("sqrt", [ctx.add("reduce_sum", [ctx.add("mul", [xw, xw])], axes=axes)])
    elif op == "ReduceSumSquare":
        r = ctx.add("reduce_sum", [ctx.add("mul", [xw, xw])], axes=axes)
    elif op == "ReduceLogSum":
        r = ctx.add("log", [ctx.add("reduce_sum", [xw], axes=axes)])
    else:
        r = log_sum_exp(ctx, xw, axes)
    return finish_keepdims(ctx, node, ctx.convert(r, t), tuple(axes))


def log_sum_exp(ctx: ParseContext, x: Instruction, axes: list[int]) -> Instruction:
    """log(sum(exp(x - m))) + m with m the max, replaced by 0 where infinite (ORT's guard)."""
    m = ctx.add("reduce_max", [x], axes=axes)
    zero = ctx.broadcast_to(ctx.literal(0, x.shape.dtype), m.shape.lens)
    m = ctx.add("where", [ctx.add("isinf", [m]), zero, m])
    e = ctx.add("exp", [ctx.elementwise("sub", x, m)])
    return ctx.elementwise("add", ctx.add("log", [ctx.add("reduce_sum", [e], axes=axes)]), m)


@onnx_op("ArgMax", "ArgMin")
def parse_arg(ctx: ParseContext, node: NodeDesc, args):
    check_attrs(node, ("axis", "keepdims", "select_last_index"))
    x = args[0]
    axis = normalize_axis(int(node.attr("axis", 0)), x.shape.ndim())
    last = bool(node.attr("select_last_index", 0))
    r = ctx.add(node.op_type.lower(), [x], axis=axis, select_last_index=last)
    return r if int(node.attr("keepdims", 1)) else ctx.add("squeeze", [r], axes=[axis])


SCANS = {"CumSum": "prefix_scan_sum", "CumProd": "prefix_scan_prod"}


@onnx_op(*SCANS)
def parse_cumulative(ctx: ParseContext, node: NodeDesc, args):
    check_attrs(node, ("exclusive", "reverse"))
    x, axis_in = args
    axis = ctx.const_ints(axis_in, f"{node.op_type} axis")
    if len(axis) != 1:
        raise Unsupported(f"{node.op_type}: axis must hold one value")
    if x.shape.ndim() == 0:
        raise Unsupported(f"{node.op_type}: scalar input")
    flags = {k: int(node.attr(k, 0)) for k in ("exclusive", "reverse")}
    if any(v not in (0, 1) for v in flags.values()):
        raise Unsupported(f"{node.op_type}: exclusive/reverse must be 0 or 1, got {flags}")  # ORT rejects too
    ax = normalize_axis(axis[0], x.shape.ndim())
    return ctx.add(SCANS[node.op_type], [x], axis=ax, **{k: bool(v) for k, v in flags.items()})

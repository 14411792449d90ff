"""Shape and constant ONNX ops: Reshape, Flatten, Transpose, (Un)Squeeze, Shape, Size, Constant,
ConstantOfShape, Range, Expand, EyeLike.

Programs are compiled per concrete input shape, so ``Shape``/``Size`` are literals: the shape
arithmetic that exporters emit (Shape → Gather → Concat → Reshape) folds to constants, and ops that
need a shape (Reshape, Expand, ConstantOfShape...) read it with ``ctx.const_ints``.
"""

from __future__ import annotations

import math

import numpy as np

from ...ir.dtypes import DType
from ...ir.instruction import Instruction
from ...ops.core import broadcast_lens
from ..context import NodeDesc, ParseContext, normalize_axis, onnx_type
from ..table import Unsupported, onnx_op


def _static(x) -> None:
    if x.shape.dynamic():
        raise Unsupported("input has dynamic dimensions")


@onnx_op("Reshape")
def parse_reshape(ctx: ParseContext, node: NodeDesc, args):
    x = args[0]
    if ctx.opset < 5:
        dims = [int(d) for d in node.attr("shape", [])]
    else:
        dims = ctx.const_ints(args[1], "Reshape shape")
    if not node.attr("allowzero", 0):
        # 0 copies the input's dim at the same position (ONNX's default, allowzero=0).
        for i, d in enumerate(dims):
            if d == 0:
                if i >= x.shape.ndim():
                    raise Unsupported(f"Reshape: 0 at position {i} beyond input rank {x.shape.ndim()}")
                dims[i] = x.shape.lens[i]
    elif 0 in dims and -1 in dims:
        raise Unsupported("Reshape: allowzero=1 with both 0 and -1 is invalid")
    return ctx.add("reshape", [x], dims=dims)


@onnx_op("Flatten")
def parse_flatten(ctx: ParseContext, node: NodeDesc, args):
    x = args[0]
    r = x.shape.ndim()
    axis = int(node.attr("axis", 1))
    if not -r <= axis <= r:
        raise Unsupported(f"Flatten: axis {axis} out of range for rank {r}")
    return ctx.add("flatten", [x], axis=axis + r if axis < 0 else axis)


@onnx_op("Transpose")
def parse_transpose(ctx: ParseContext, node: NodeDesc, args):
    x = args[0]
    perm = node.attr("perm")
    perm = list(range(x.shape.ndim()))[::-1] if perm is None else [int(p) for p in perm]
    if sorted(perm) != list(range(x.shape.ndim())):
        raise Unsupported(f"Transpose: perm {perm} is not a permutation of rank {x.shape.ndim()}")
    return ctx.add("transpose", [x], permutation=perm)


def _axes(ctx: ParseContext, node: NodeDesc, args, what: str) -> list[int] | None:
    if ctx.opset < 13:
        a = node.attr("axes")
        return None if a is None else [int(v) for v in a]
    if len(args) < 2 or args[1] is None:
        return None
    return ctx.const_ints(args[1], f"{what} axes")


@onnx_op("Squeeze")
def parse_squeeze(ctx: ParseContext, node: NodeDesc, args):
    x = args[0]
    axes = _axes(ctx, node, args, "Squeeze") or []
    axes = [normalize_axis(a, x.shape.ndim(), "Squeeze axis") for a in axes]
    if any(x.shape.lens[a] != 1 for a in axes):
        raise Unsupported(f"Squeeze: axes {axes} of {list(x.shape.lens)} are not all size 1")
    return ctx.add("squeeze", [x], axes=sorted(set(axes)))


@onnx_op("Unsqueeze")
def parse_unsqueeze(ctx: ParseContext, node: NodeDesc, args):
    x = args[0]
    axes = _axes(ctx, node, args, "Unsqueeze")
    if axes is None:
        raise Unsupported("Unsqueeze: axes are required")
    rank = x.shape.ndim() + len(axes)
    norm = [normalize_axis(a, rank, "Unsqueeze axis") for a in axes]
    if len(set(norm)) != len(norm):
        raise Unsupported(f"Unsqueeze: repeated axes {axes}")
    return ctx.add("unsqueeze", [x], axes=sorted(norm))


# One-input elementwise ops: their result has their input's dims, at run time too.
_SAME_DIMS = frozenset({"convert", "not", "neg", "abs", "identity", "contiguous"})


def _sized_like(x: Instruction) -> Instruction:
    """The instruction whose run-time dims ``x`` has: a parameter behind a chain of ``_SAME_DIMS`` ops
    (the Shape of a Cast of a run-time input reads that input's dims), else ``x``."""
    src = x
    while not src.is_param() and src.name in _SAME_DIMS and len(src.inputs) == 1:
        src = src.inputs[0]
    return src if src.is_param() else x


@onnx_op("Shape")
def parse_shape(ctx: ParseContext, node: NodeDesc, args):
    x = args[0]
    _static(x)
    lens = list(x.shape.lens)
    r = len(lens)
    start, end = int(node.attr("start", 0)), node.attr("end")
    end = r if end is None else int(end)
    # Shape-15 clamps start/end into [0, rank] after adding rank to negatives.
    start = min(max(start + r if start < 0 else start, 0), r)
    end = min(max(end + r if end < 0 else end, 0), r)
    src = _sized_like(x)
    free = src.op.runtime_axes if src.is_param() else ()  # type: ignore[attr-defined]
    if any(start <= a < end for a in free):  # sizes known only at run: read them then
        return ctx.add("dimensions_of", [src], start=start, end=end)
    return ctx.literal(lens[start:end] if end > start else [], np.int64)


@onnx_op("Size")
def parse_size(ctx: ParseContext, node: NodeDesc, args):
    _static(args[0])
    return ctx.literal(args[0].shape.elements(), np.int64)


CONSTANT_ATTRS = {
    "value_float": np.float32,
    "value_floats": np.float32,
    "value_int": np.int64,
    "value_ints": np.int64,
}


@onnx_op("Constant")
def parse_constant(ctx: ParseContext, node: NodeDesc, args):
    given = [k for k in node.attributes if k.startswith("value") or k == "sparse_value"]
    if len(given) != 1:
        raise Unsupported(f"Constant: expected exactly one value attribute, got {given}")
    k = given[0]
    if k == "value":
        v = node.attr("value")
        if not isinstance(v, np.ndarray):
            raise Unsupported(f"Constant: value of type {type(v).__name__} is not supported")
        return ctx.weight(v)  # exporters store weights as Constant nodes too
    if k in CONSTANT_ATTRS:
        return ctx.literal(node.attr(k), CONSTANT_ATTRS[k])
    raise Unsupported(f"Constant: attribute {k!r} (strings/sparse tensors) is not supported")


@onnx_op("ConstantOfShape")
def parse_constant_of_shape(ctx: ParseContext, node: NodeDesc, args):
    dims = ctx.const_ints(args[0], "ConstantOfShape shape")
    if any(d < 0 for d in dims):
        raise Unsupported(f"ConstantOfShape: negative dims {dims}")
    value = node.attr("value")
    if value is None:
        value = np.zeros(1, np.float32)
    if not isinstance(value, np.ndarray) or value.size != 1:
        raise Unsupported("ConstantOfShape: value must be a one-element tensor")
    scalar = ctx.literal(value.reshape(()))
    if not dims:
        return scalar
    # A broadcast view of one element: the same values as a filled tensor without the memory.
    return ctx.add("multibroadcast", [scalar], out_lens=dims)


@onnx_op("Range")
def parse_range(ctx: ParseContext, node: NodeDesc, args):
    start, limit, delta = (
        ctx.require_const(a, f"Range {w}") for a, w in zip(args, ("start", "limit", "delta"), strict=True)
    )
    dt = start.dtype
    s, lim, d = start.item(), limit.item(), delta.item()
    if d == 0:
        raise Unsupported("Range: delta is 0")
    if dt.kind in "iu":
        n = max(-((s - lim) // d), 0)  # exact integer ceil((limit - start) / delta)
        return ctx.literal(s + np.arange(n, dtype=dt) * np.asarray(d, dt), dt)
    t = dt.type
    with np.errstate(all="ignore"):
        diff = t(t(lim) - t(s))
        counts = {
            math.ceil((lim - s) / d),  # exact
            math.ceil(float(t(diff / t(d)))),  # in the element type, as ONNX's function body
            math.ceil(float(diff) / float(d)),  # as ORT: difference in the type, quotient in double
        }
    if len(counts) != 1:
        raise Unsupported(f"Range: element count is ambiguous under {dt} rounding")
    n = max(counts.pop(), 0)
    # ONNX's function body (and ORT) accumulate: out[i] = out[i-1] + delta, rounded in the type.
    steps = np.full(n, t(d), dtype=dt)
    if n:
        steps[0] = t(s)
    return ctx.literal(np.add.accumulate(steps, dtype=dt), dt)


@onnx_op("Expand")
def parse_expand(ctx: ParseContext, node: NodeDesc, args):
    x = args[0]
    dims = ctx.const_ints(args[1], "Expand shape")
    try:
        lens = broadcast_lens(x.shape.lens, tuple(dims))
    except ValueError as e:
        raise Unsupported(f"Expand: {e}") from None
    return ctx.broadcast_to(x, lens)


@onnx_op("EyeLike")
def parse_eye_like(ctx: ParseContext, node: NodeDesc, args):
    x = args[0]
    if x.shape.ndim() != 2:
        raise Unsupported("EyeLike: input must be 2-D")
    dt = node.attr("dtype")
    t = x.shape.type if dt is None else onnx_type(int(dt))
    rows, cols = x.shape.lens
    eye = np.eye(rows, cols, int(node.attr("k", 0)))
    return ctx.literal(eye != 0 if t == DType.bool_type else eye.astype(x.shape.with_type(t).dtype))

"""Data movement ONNX ops: Slice, Split, Concat, gathers, scatters, Pad, Tile, TopK, OneHot, Trilu,
ReverseSequence, DepthToSpace, SpaceToDepth, CenterCropPad."""

from __future__ import annotations

import numpy as np

from ...ir.dtypes import DType, is_float, is_integer
from ...ir.instruction import Instruction
from ..context import NodeDesc, ParseContext, normalize_axis
from ..table import Unsupported, onnx_op


def slice_axis(
    ctx: ParseContext, x: Instruction, axis: int, start: int, end: int, step: int = 1
) -> Instruction:
    """ONNX/numpy slicing of one axis, any nonzero step (negative steps become reverse + step)."""
    if step == 0:
        raise Unsupported("Slice: step 0")
    r = range(*slice(start, end, step).indices(x.shape.lens[axis]))
    if len(r) == 0:
        return ctx.add("slice", [x], axes=[axis], starts=[0], ends=[0])
    lo, hi = min(r[0], r[-1]), max(r[0], r[-1])
    if (lo, hi + 1) != (0, x.shape.lens[axis]):
        x = ctx.add("slice", [x], axes=[axis], starts=[lo], ends=[hi + 1])
    if step < 0:
        x = ctx.add("reverse", [x], axes=[axis])
    if abs(step) != 1:
        x = ctx.add("step", [x], axes=[axis], steps=[abs(step)])
    return x


@onnx_op("Slice")
def parse_slice(ctx: ParseContext, node: NodeDesc, args):
    x = args[0]
    rank = x.shape.ndim()
    if ctx.opset < 10:
        starts, ends = [int(v) for v in node.attr("starts", [])], [int(v) for v in node.attr("ends", [])]
        axes = node.attr("axes")
        axes, steps = (None if axes is None else [int(a) for a in axes]), None
    else:
        starts, ends = ctx.const_ints(args[1], "Slice starts"), ctx.const_ints(args[2], "Slice ends")
        axes = ctx.const_ints(args[3], "Slice axes") if len(args) > 3 and args[3] is not None else None
        steps = ctx.const_ints(args[4], "Slice steps") if len(args) > 4 and args[4] is not None else None
    axes = list(range(len(starts))) if axes is None else axes
    steps = [1] * len(starts) if steps is None else steps
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise Unsupported("Slice: starts, ends, axes and steps differ in length")
    axes = [normalize_axis(a, rank, "Slice axis") for a in axes]
    if len(set(axes)) != len(axes):
        raise Unsupported(f"Slice: repeated axes {axes}")
    out = x
    for a, s, e, st in zip(axes, starts, ends, steps, strict=True):
        out = slice_axis(ctx, out, a, s, e, st)
    return out


@onnx_op("Split")
def parse_split(ctx: ParseContext, node: NodeDesc, args):
    x = args[0]
    axis = normalize_axis(int(node.attr("axis", 0)), x.shape.ndim(), "Split axis")
    dim = x.shape.lens[axis]
    n = len(node.outputs)
    split = None
    if len(args) > 1 and args[1] is not None and (ctx.opset >= 13 or ctx.opset == 1):
        split = ctx.const_ints(args[1], "Split split")
    elif ctx.opset < 13 and node.attr("split") is not None:
        split = [int(v) for v in node.attr("split")]
    if split is None:
        num = node.attr("num_outputs")
        if ctx.opset >= 18 and num is not None:
            if int(num) != n:
                raise Unsupported(f"Split: num_outputs {num} but {n} outputs")
            chunk = -(-dim // n)  # opset 18: ceil-sized chunks, the last one smaller
            split = [min(chunk, dim - i * chunk) for i in range(n)]
            if any(s <= 0 for s in split):
                raise Unsupported(f"Split: cannot split {dim} into {n} non-empty ceil-sized parts")
        elif ctx.opset >= 18:
            raise Unsupported("Split-18 needs either the split input or num_outputs")
        else:
            if dim % n:
                raise Unsupported(f"Split: dim {dim} does not split evenly into {n}")
            split = [dim // n] * n
    if len(split) != n or sum(split) != dim or any(s < 0 for s in split):
        raise Unsupported(f"Split: split {split} does not cover dim {dim} with {n} outputs")
    outs, off = [], 0
    for s in split:
        outs.append(ctx.add("slice", [x], axes=[axis], starts=[off], ends=[off + s]))
        off += s
    return outs


@onnx_op("Concat")
def parse_concat(ctx: ParseContext, node: NodeDesc, args):
    xs = [a for a in args if a is not None]
    axis = node.attr("axis", 1 if ctx.opset < 4 else None)
    if axis is None:
        raise Unsupported("Concat: axis is required")
    return ctx.add("concat", xs, axis=normalize_axis(int(axis), xs[0].shape.ndim(), "Concat axis"))


@onnx_op("Gather")
def parse_gather(ctx: ParseContext, node: NodeDesc, args):
    data, idx = args
    axis = normalize_axis(int(node.attr("axis", 0)), data.shape.ndim(), "Gather axis")
    return ctx.add("gather", [data, idx], axis=axis)


@onnx_op("GatherElements")
def parse_gather_elements(ctx: ParseContext, node: NodeDesc, args):
    data, idx = args
    axis = normalize_axis(int(node.attr("axis", 0)), data.shape.ndim(), "GatherElements axis")
    return ctx.add("gather_elements", [data, idx], axis=axis)


@onnx_op("GatherND")
def parse_gathernd(ctx: ParseContext, node: NodeDesc, args):
    return ctx.add("gathernd", list(args), batch_dims=int(node.attr("batch_dims", 0)))


def _reduction(ctx: ParseContext, node: NodeDesc, data: Instruction) -> str:
    red = node.attr("reduction", "none")
    allowed = (
        {"none"}
        | ({"add", "mul"} if ctx.opset >= 16 else set())
        | ({"max", "min"} if ctx.opset >= 18 else set())
    )
    if red not in allowed:
        raise Unsupported(f"{node.op_type}: reduction {red!r} not valid at opset {ctx.opset}")
    if red != "none" and data.shape.type == DType.bool_type:
        raise Unsupported(f"{node.op_type}: reduction {red!r} on bool")
    return red


@onnx_op("ScatterElements", "Scatter")
def parse_scatter_elements(ctx: ParseContext, node: NodeDesc, args):
    data, idx, upd = args
    red = _reduction(ctx, node, data) if node.op_type == "ScatterElements" else "none"
    axis = normalize_axis(int(node.attr("axis", 0)), data.shape.ndim(), f"{node.op_type} axis")
    return ctx.add(f"scatter_{red}", [data, idx, upd], axis=axis)


@onnx_op("ScatterND")
def parse_scatternd(ctx: ParseContext, node: NodeDesc, args):
    data, idx, upd = args
    if idx.shape.ndim() < 1 or idx.shape.lens[-1] < 1:
        raise Unsupported("ScatterND: indices need a non-empty last dimension")
    return ctx.add(f"scatternd_{_reduction(ctx, node, data)}", [data, idx, upd])


@onnx_op("Pad")
def parse_pad(ctx: ParseContext, node: NodeDesc, args):
    x = args[0]
    r = x.shape.ndim()
    mode = node.attr("mode", "constant")
    if mode not in ("constant", "reflect", "edge") and not (mode == "wrap" and ctx.opset >= 19):
        raise Unsupported(f"Pad: mode {mode!r} at opset {ctx.opset}")
    if ctx.opset < 11:
        pads = [int(p) for p in node.attr("paddings" if ctx.opset < 2 else "pads", [])]
        value: float | int = float(node.attr("value", 0.0))
        axes = list(range(r))
    else:
        pads = ctx.const_ints(args[1], "Pad pads")
        cv = (
            ctx.require_const(args[2], "Pad constant_value")
            if len(args) > 2 and args[2] is not None
            else np.zeros(1)
        )
        if np.asarray(cv).size != 1:
            raise Unsupported("Pad constant_value must have one element")
        value = np.asarray(cv).ravel()[0].item()
        axes = list(range(r))
        if len(args) > 3 and args[3] is not None:
            axes = [normalize_axis(a, r, "Pad axis") for a in ctx.const_ints(args[3], "Pad axes")]
    if len(pads) != 2 * len(axes) or len(set(axes)) != len(axes):
        raise Unsupported(f"Pad: {len(pads)} pads for {len(axes)} axes")
    full = [0] * (2 * r)
    for i, a in enumerate(axes):
        full[a], full[a + r] = pads[i], pads[i + len(axes)]
    t = x.shape.type
    if is_integer(t) and float(value) != int(value):
        raise Unsupported(f"Pad: value {value} is not an integer for {t.name}")
    if is_integer(t):
        value = int(value)
    elif t == DType.bool_type:
        value = bool(value)
    elif not is_float(t):
        raise Unsupported(f"Pad: element type {t.name}")
    if mode != "constant" and any(p < 0 for p in full):
        raise Unsupported("Pad: negative pads only in constant mode")
    return ctx.add("pad", [x], pads=full, mode=mode, value=value)


@onnx_op("Tile")
def parse_tile(ctx: ParseContext, node: NodeDesc, args):
    x = args[0]
    reps = ctx.const_ints(args[1], "Tile repeats")
    lens = x.shape.lens
    if len(reps) != len(lens) or any(v < 0 for v in reps):
        raise Unsupported(f"Tile: repeats {reps} do not fit rank {len(lens)}")
    if all(v == 1 for v in reps):
        return x
    # x viewed as (1, d0, 1, d1, ...) broadcast to (r0, d0, r1, d1, ...) and packed: each repeat copies
    # the whole axis, exactly numpy.tile's order.
    u = ctx.add("unsqueeze", [x], axes=[2 * i for i in range(len(lens))])
    b = ctx.add("multibroadcast", [u], out_lens=[v for pair in zip(reps, lens, strict=True) for v in pair])
    return ctx.add("reshape", [b], dims=[v * n for v, n in zip(reps, lens, strict=True)])


@onnx_op("TopK")
def parse_topk(ctx: ParseContext, node: NodeDesc, args):
    x = args[0]
    k = int(node.attr("k", 1)) if ctx.opset < 10 else ctx.const_ints(args[1], "TopK k")[0]
    axis = normalize_axis(int(node.attr("axis", -1)), x.shape.ndim(), "TopK axis")
    largest = bool(node.attr("largest", 1))
    if not node.attr("sorted", 1) and k > 1:
        # ONNX leaves the order open; ORT returns its selection order, which we don't reproduce.
        raise Unsupported("TopK: sorted=0 (implementation-defined output order)")
    if not 0 <= k <= x.shape.lens[axis]:
        raise Unsupported(f"TopK: k={k} out of range for dim {x.shape.lens[axis]}")
    t = ctx.add("topk", [x], k=k, axis=axis, largest=largest)
    return [ctx.add("get_tuple_elem", [t], index=0), ctx.add("get_tuple_elem", [t], index=1)]


@onnx_op("OneHot")
def parse_onehot(ctx: ParseContext, node: NodeDesc, args):
    idx, depth, values = args
    d = ctx.require_const(depth, "OneHot depth")
    if d.size != 1:
        raise Unsupported("OneHot: depth must have one element")
    dv = d.ravel()[0]
    if float(dv) != int(dv) or int(dv) < 1:
        # ONNX truncates a float depth; ORT rejects non-positive depth: refuse the unclear cases.
        raise Unsupported(f"OneHot: depth {dv} is not a positive integer")
    axis = int(node.attr("axis", -1))
    normalize_axis(axis, idx.shape.ndim() + 1, "OneHot axis")
    return ctx.add("onehot", [idx, values], depth=int(dv), axis=axis)


@onnx_op("Trilu")
def parse_trilu(ctx: ParseContext, node: NodeDesc, args):
    k = 0
    if len(args) > 1 and args[1] is not None:
        k = ctx.const_ints(args[1], "Trilu k")[0]
    return ctx.add("trilu", [args[0]], upper=bool(node.attr("upper", 1)), k=k)


@onnx_op("ReverseSequence")
def parse_reverse_sequence(ctx: ParseContext, node: NodeDesc, args):
    return ctx.add(
        "reverse_sequence",
        list(args),
        batch_axis=int(node.attr("batch_axis", 1)),
        time_axis=int(node.attr("time_axis", 0)),
    )


@onnx_op("DepthToSpace")
def parse_depth_to_space(ctx: ParseContext, node: NodeDesc, args):
    x = args[0]
    b = int(node.attr("blocksize"))
    mode = node.attr("mode", "DCR")
    if x.shape.ndim() != 4 or b < 1 or x.shape.lens[1] % (b * b) or mode not in ("DCR", "CRD"):
        raise Unsupported(f"DepthToSpace: needs NCHW with C divisible by {b}^2 and mode DCR/CRD")
    n, c, h, w = x.shape.lens
    if mode == "DCR":
        y = ctx.add("reshape", [x], dims=[n, b, b, c // (b * b), h, w])
        y = ctx.add("transpose", [y], permutation=[0, 3, 4, 1, 5, 2])
    else:
        y = ctx.add("reshape", [x], dims=[n, c // (b * b), b, b, h, w])
        y = ctx.add("transpose", [y], permutation=[0, 1, 4, 2, 5, 3])
    return ctx.add("reshape", [y], dims=[n, c // (b * b), h * b, w * b])


@onnx_op("SpaceToDepth")
def parse_space_to_depth(ctx: ParseContext, node: NodeDesc, args):
    x = args[0]
    b = int(node.attr("blocksize"))
    mode = node.attr("mode", "DCR")  # the mode attribute arrived in a later opset; DCR before
    if (
        x.shape.ndim() != 4
        or b < 1
        or x.shape.lens[2] % b
        or x.shape.lens[3] % b
        or mode not in ("DCR", "CRD")
    ):
        raise Unsupported(f"SpaceToDepth: needs NCHW with H, W divisible by {b} and mode DCR/CRD")
    n, c, h, w = x.shape.lens
    y = ctx.add("reshape", [x], dims=[n, c, h // b, b, w // b, b])
    y = ctx.add("transpose", [y], permutation=[0, 3, 5, 1, 2, 4] if mode == "DCR" else [0, 1, 3, 5, 2, 4])
    return ctx.add("reshape", [y], dims=[n, c * b * b, h // b, w // b])


@onnx_op("CenterCropPad")
def parse_center_crop_pad(ctx: ParseContext, node: NodeDesc, args):
    x = args[0]
    r = x.shape.ndim()
    shape = ctx.const_ints(args[1], "CenterCropPad shape")
    axes = node.attr("axes")
    axes = list(range(r)) if axes is None else [normalize_axis(int(a), r, "CenterCropPad axis") for a in axes]
    if len(axes) != len(shape) or len(set(axes)) != len(axes) or any(s < 0 for s in shape):
        raise Unsupported(f"CenterCropPad: shape {shape} does not fit axes {axes}")
    pads = [0] * (2 * r)
    for a, s in zip(axes, shape, strict=True):
        dim = x.shape.lens[a]
        if s < dim:  # crop: the odd extra element comes off the end
            start = (dim - s) // 2
            x = ctx.add("slice", [x], axes=[a], starts=[start], ends=[start + s])
        elif s > dim:  # pad with zeros: the odd extra element goes at the end
            pads[a], pads[a + r] = (s - dim) // 2, s - dim - (s - dim) // 2
    if any(pads):
        zero = False if x.shape.type == DType.bool_type else 0
        x = ctx.add("pad", [x], pads=pads, mode="constant", value=zero)
    return x

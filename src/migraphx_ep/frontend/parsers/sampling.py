"""Sampling parsers: MaxUnpool, GridSample, RoiAlign, MaxRoiPool (MaxPool's Indices live in nn.py)."""

from __future__ import annotations

from ...ir.dtypes import DType
from ..context import NodeDesc, ParseContext
from ..table import Unsupported, onnx_op
from .nn import check_type, spatial_ints

FLOATS = {DType.float_type, DType.double_type}


def text(node: NodeDesc, name: str, default: str) -> str:
    v = node.attr(name, default)
    return v.decode() if isinstance(v, bytes) else str(v)


@onnx_op("MaxUnpool", min_opset=9)
def parse_max_unpool(ctx: ParseContext, node: NodeDesc, args):
    x, ind = args[0], args[1]
    out_in = args[2] if len(args) > 2 else None
    check_type(x, FLOATS | {DType.half_type}, "MaxUnpool")
    k = x.shape.ndim() - 2
    kernel = node.attr("kernel_shape")
    if k < 1 or kernel is None or len(kernel) != k:
        raise Unsupported(f"MaxUnpool kernel_shape {kernel} for input rank {x.shape.ndim()}")
    if ind.shape.lens != x.shape.lens or ind.shape.type != DType.int64_type:
        raise Unsupported("MaxUnpool indices must be int64 of the input's dims")
    s = spatial_ints(node, "strides", k, 1)
    p = [int(v) for v in node.attr("pads", [0] * 2 * k)]
    if len(p) != 2 * k or min(p) < 0:
        raise Unsupported(f"MaxUnpool pads {p}")
    ins = x.shape.lens[2:]
    lens = list(x.shape.lens[:2]) + [(ins[i] - 1) * s[i] - p[i] - p[i + k] + int(kernel[i]) for i in range(k)]
    if out_in is not None:
        given = ctx.const_ints(out_in, "MaxUnpool output_shape")
        # ONNX's reference scatters into the inferred shape and then pads; only the plain case is
        # verified here, so any other output_shape is refused rather than guessed.
        if given != lens:
            raise Unsupported(f"MaxUnpool output_shape {given} differs from the inferred {lens}")
    return ctx.add("max_unpool", [x, ind], out_lens=lens)


@onnx_op("GridSample", min_opset=16)
def parse_grid_sample(ctx: ParseContext, node: NodeDesc, args):
    x, grid = args
    check_type(x, FLOATS, "GridSample")
    if grid.shape.type != x.shape.type:
        raise Unsupported("GridSample grid type differs from the input's")
    old = ctx.opset < 20
    mode = text(node, "mode", "bilinear" if old else "linear")
    names = (
        {"bilinear": "linear", "bicubic": "cubic", "nearest": "nearest"}
        if old
        else {m: m for m in ("linear", "cubic", "nearest")}
    )
    if mode not in names:
        raise Unsupported(f"GridSample mode {mode!r} at opset {ctx.opset}")
    pad = text(node, "padding_mode", "zeros")
    if pad not in ("zeros", "border", "reflection"):
        raise Unsupported(f"GridSample padding_mode {pad!r}")
    if names[mode] == "cubic" and pad == "border":
        # ORT clamps every coordinate once any one is out of bounds, ONNX's reference only that one:
        # cubic taps see the difference
        raise Unsupported("GridSample cubic with border padding (ORT and ONNX disagree)")
    rank = x.shape.ndim()
    if rank != 4 and not (rank == 5 and names[mode] != "cubic" and not old):
        # ORT 1.31 samples 5-D volumes only with linear/nearest (opset 20+)
        raise Unsupported(f"GridSample of rank {rank} with mode {mode}")
    if grid.shape.ndim() != rank or grid.shape.lens[0] != x.shape.lens[0] or grid.shape.lens[-1] != rank - 2:
        raise Unsupported(f"GridSample grid dims {list(grid.shape.lens)} for input {list(x.shape.lens)}")
    return ctx.add(
        "grid_sample",
        [x, grid],
        mode=names[mode],
        padding_mode=pad,
        align_corners=bool(node.attr("align_corners", 0)),
    )


@onnx_op("RoiAlign", min_opset=10)
def parse_roi_align(ctx: ParseContext, node: NodeDesc, args):
    x, rois, bi = args
    check_type(x, FLOATS, "RoiAlign")
    if rois.shape.type != x.shape.type or bi.shape.type != DType.int64_type:
        raise Unsupported("RoiAlign rois must match X's type and batch_indices be int64")
    if x.shape.ndim() != 4 or rois.shape.ndim() != 2 or rois.shape.lens[1] != 4:
        raise Unsupported(f"RoiAlign X {list(x.shape.lens)} / rois {list(rois.shape.lens)}")
    mode = text(node, "mode", "avg")
    default_ctm = "half_pixel" if ctx.opset >= 16 else "output_half_pixel"
    ctm = text(node, "coordinate_transformation_mode", default_ctm)
    if mode not in ("avg", "max") or ctm not in ("half_pixel", "output_half_pixel"):
        raise Unsupported(f"RoiAlign mode {mode!r} / coordinate_transformation_mode {ctm!r}")
    sr = int(node.attr("sampling_ratio", 0))
    oh, ow = int(node.attr("output_height", 1)), int(node.attr("output_width", 1))
    if sr < 0 or oh < 1 or ow < 1:
        raise Unsupported(f"RoiAlign sampling_ratio {sr} / output {oh}x{ow}")
    return ctx.add(
        "roi_align",
        [x, rois, bi],
        mode=mode,
        output_height=oh,
        output_width=ow,
        sampling_ratio=sr,
        spatial_scale=float(node.attr("spatial_scale", 1.0)),
        half_pixel=ctm == "half_pixel",
    )


@onnx_op("MaxRoiPool")
def parse_max_roi_pool(ctx: ParseContext, node: NodeDesc, args):
    x, rois = args
    check_type(x, FLOATS, "MaxRoiPool")
    if rois.shape.type != x.shape.type or rois.shape.ndim() != 2 or rois.shape.lens[1] != 5:
        raise Unsupported(f"MaxRoiPool rois {rois.shape}")
    if x.shape.ndim() != 4:
        raise Unsupported("MaxRoiPool input must be 4-D")
    pooled = node.attr("pooled_shape")
    if pooled is None or len(pooled) != 2 or min(pooled) < 1:
        raise Unsupported(f"MaxRoiPool pooled_shape {pooled}")
    return ctx.add(
        "max_roi_pool",
        [x, rois],
        pooled_shape=[int(v) for v in pooled],
        spatial_scale=float(node.attr("spatial_scale", 1.0)),
    )

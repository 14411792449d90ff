"""Resize (opsets 10-19) and Upsample: resolve scales/sizes/axes/aspect policy into the ``resize`` op."""

from __future__ import annotations

import numpy as np

from ...ir.dtypes import is_float
from ...ir.instruction import Instruction
from ...ops.resize import COORD_MODES, NEAREST_MODES
from ..context import NodeDesc, ParseContext, normalize_axis
from ..table import Unsupported, onnx_op


def _out_from_scales(lens: tuple[int, ...], scales: list[float]) -> list[int]:
    """floor(dim * scale). ORT multiplies in float32, the reference in float64: refuse where they differ."""
    out = []
    for n, s in zip(lens, scales, strict=True):
        if s <= 0:
            raise Unsupported(f"Resize: scale {s} must be positive")
        f64 = int(np.floor(np.float64(np.float32(s)) * n))
        f32 = int(np.floor(np.float32(s) * np.float32(n)))
        if f64 != f32:
            raise Unsupported(f"Resize: output size of {n} * {s} is ambiguous under float rounding")
        out.append(f64)
    return out


def _optional(ctx: ParseContext, args: list, i: int, what: str) -> np.ndarray | None:
    if len(args) <= i or args[i] is None:
        return None
    if args[i].shape.elements() == 0:
        return None  # an empty tensor means "not given"
    return ctx.require_const(args[i], f"Resize {what}")


def _emit(
    ctx: ParseContext, x: Instruction, out: list[int], scales: list[float], mode: str, **attrs
) -> Instruction:
    if mode != "nearest" and not is_float(x.shape.type):
        raise Unsupported(
            f"Resize: {mode} interpolation of {x.shape.type.name} (integer rounding) is not supported"
        )
    if any(n == 0 for n in x.shape.lens):
        raise Unsupported("Resize: empty input")
    return ctx.add("resize", [x], out_lens=out, scales=[float(s) for s in scales], mode=mode, **attrs)


@onnx_op("Upsample")
def parse_upsample(ctx: ParseContext, node: NodeDesc, args):
    x = args[0]
    mode = node.attr("mode", "nearest")
    if mode not in ("nearest", "linear", "bilinear"):
        raise Unsupported(f"Upsample: mode {mode!r}")
    if ctx.opset < 9:
        scales = [float(s) for s in node.attr("scales", [])]
    else:
        scales = [float(s) for s in ctx.require_const(args[1], "Upsample scales").ravel()]
    if len(scales) != x.shape.ndim() or any(s < 1 for s in scales):
        raise Unsupported(f"Upsample: scales {scales} must be >= 1, one per axis")
    return _emit(
        ctx,
        x,
        _out_from_scales(x.shape.lens, scales),
        scales,
        "nearest" if mode == "nearest" else "linear",
        coordinate_transformation_mode="asymmetric",
        nearest_mode="floor",
    )


@onnx_op("Resize")
def parse_resize(ctx: ParseContext, node: NodeDesc, args):
    x = args[0]
    r = x.shape.ndim()
    mode = node.attr("mode", "nearest")
    if mode not in ("nearest", "linear", "cubic") or (ctx.opset < 11 and mode == "cubic"):
        raise Unsupported(f"Resize: mode {mode!r} at opset {ctx.opset}")
    if ctx.opset < 11:
        scales = [float(s) for s in ctx.require_const(args[1], "Resize scales").ravel()]
        if len(scales) != r:
            raise Unsupported(f"Resize: {len(scales)} scales for rank {r}")
        if mode == "nearest" and any(s < 1 for s in scales):
            # Resize-10 never said how nearest rounds when shrinking; ORT rounds up, others down.
            raise Unsupported("Resize-10: nearest downsampling rounding is unspecified")
        return _emit(
            ctx,
            x,
            _out_from_scales(x.shape.lens, scales),
            scales,
            mode,
            coordinate_transformation_mode="asymmetric",
            nearest_mode="floor",
        )

    coord = node.attr("coordinate_transformation_mode", "half_pixel")
    nearest = node.attr("nearest_mode", "round_prefer_floor")
    if coord not in COORD_MODES or (coord == "half_pixel_symmetric" and ctx.opset < 19):
        raise Unsupported(f"Resize: coordinate_transformation_mode {coord!r} at opset {ctx.opset}")
    if nearest not in NEAREST_MODES:
        raise Unsupported(f"Resize: nearest_mode {nearest!r}")
    antialias = bool(node.attr("antialias", 0))
    if antialias and mode == "nearest":
        raise Unsupported("Resize: antialias with nearest mode")
    policy = node.attr("keep_aspect_ratio_policy", "stretch")
    if policy not in ("stretch", "not_larger", "not_smaller"):
        raise Unsupported(f"Resize: keep_aspect_ratio_policy {policy!r}")
    axes = node.attr("axes")
    axes = list(range(r)) if axes is None else [normalize_axis(int(a), r, "Resize axis") for a in axes]
    if len(set(axes)) != len(axes):
        raise Unsupported(f"Resize: repeated axes {axes}")

    roi_in = _optional(ctx, args, 1, "roi")
    scales_in = _optional(ctx, args, 2, "scales")
    sizes_in = _optional(ctx, args, 3, "sizes")
    if (scales_in is None) == (sizes_in is None):
        raise Unsupported("Resize: exactly one of scales and sizes must be given")
    lens = list(x.shape.lens)
    if scales_in is not None:
        if len(scales_in.ravel()) != len(axes):
            raise Unsupported(f"Resize: {scales_in.size} scales for {len(axes)} axes")
        if coord == "tf_crop_and_resize":
            # The spec scales the roi extent, ORT and the reference do not: refuse the disagreement.
            raise Unsupported("Resize: tf_crop_and_resize with scales (output size is ambiguous)")
        scales = [1.0] * r
        for a, s in zip(axes, scales_in.ravel().tolist(), strict=True):
            scales[a] = float(s)
        out = _out_from_scales(x.shape.lens, scales)
    else:
        sizes = [int(v) for v in sizes_in.ravel()]
        if len(sizes) != len(axes) or any(s < 0 for s in sizes):
            raise Unsupported(f"Resize: sizes {sizes} do not fit axes {axes}")
        out = list(lens)
        scales = [1.0] * r
        for a, s in zip(axes, sizes, strict=True):
            out[a] = s
            scales[a] = s / lens[a]
        if policy != "stretch":
            pick = min if policy == "not_larger" else max
            s = pick(scales[a] for a in axes)
            for a in axes:
                scales[a] = s
                out[a] = int(s * lens[a] + 0.5)  # round half up, as the spec says
    resized = [a for a in axes if out[a] != lens[a] or scales[a] != 1.0]
    if coord == "align_corners" and any(abs(scales[a] * lens[a] - out[a]) > 1e-6 for a in resized):
        # ORT divides by the integer output length, the reference by dim * scale: they disagree here.
        raise Unsupported("Resize: align_corners with a scale whose output length is not whole")
    if coord == "pytorch_half_pixel" and mode == "cubic" and any(out[a] == 1 for a in resized):
        # For a length-1 output ORT samples at 0, the reference at -0.5: cubic weights then differ.
        raise Unsupported("Resize: pytorch_half_pixel cubic with an output length of 1")
    roi: list[float] = []
    if coord == "tf_crop_and_resize":
        if roi_in is None or roi_in.size != 2 * len(axes):
            raise Unsupported("Resize: tf_crop_and_resize needs a constant roi with 2 values per axis")
        rv = [float(v) for v in roi_in.ravel()]
        roi = [0.0] * r + [1.0] * r
        for i, a in enumerate(axes):
            roi[a], roi[a + r] = rv[i], rv[i + len(axes)]
    return _emit(
        ctx,
        x,
        out,
        scales,
        mode,
        roi=roi,
        coordinate_transformation_mode=coord,
        nearest_mode=nearest,
        cubic_coeff_a=float(node.attr("cubic_coeff_a", -0.75)),
        exclude_outside=bool(node.attr("exclude_outside", 0)),
        extrapolation_value=float(node.attr("extrapolation_value", 0.0)),
        antialias=antialias,
    )

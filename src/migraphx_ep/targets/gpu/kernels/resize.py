"""Resize (nearest, linear) through per-axis coordinate tables.

The tables are the ref's own per-axis steps (``Resize.axis_taps``: neighbour indices, float64 weights,
tf_crop_and_resize's outside mask), computed on the host for each shape and handed to the kernel as a
second input (``resize_table``: a weight buffer the lowering adds), so the source holds no size: lens,
strides and each table's byte offset are run-time arguments and a new input size compiles nothing.
Reading a table costs what the ``__device__`` arrays baked into the source did (global memory either way).
"""

from __future__ import annotations

import math

import numpy as np

from ....ir.dtypes import DType, to_numpy
from ....ir.operation import Op
from ....ir.shape import Shape
from .data import index_kernel, params_for, raw_literal, raw_type
from .prelude import c_type, offset
from .spec import KernelSpec, Unsupported

Tables = list[tuple[np.ndarray, np.ndarray, np.ndarray] | None]


def resize_tables(op: Op, in_lens: tuple[int, ...]) -> Tables:
    """Per axis, None when the ref skips it, else (neighbours [n_out, taps], weights float64 [n_out,
    taps], outside [n_out]): the per-axis steps of ``Resize.compute`` (nearest keeps one tap)."""
    r = len(in_lens)
    tables: Tables = []
    for axis in range(r):
        n_in, n_out, scale = in_lens[axis], op.out_lens[axis], float(op.scales[axis])  # type: ignore[attr-defined]
        roi = (op.roi[axis], op.roi[axis + r]) if op.roi else (0.0, 1.0)  # type: ignore[attr-defined]
        trivial = roi == (0.0, 1.0) or (
            np.isclose(roi[0], 0.0, rtol=1e-9, atol=0) and np.isclose(roi[1], 1.0)
        )
        if np.isclose(scale, 1.0, rtol=1e-9, atol=0) and n_out == n_in and trivial or n_out == 0:
            tables.append(None)
            continue
        ctm = op.coordinate_transformation_mode  # type: ignore[attr-defined]
        x_ori, nbr, w = op.axis_taps(n_in, axis, r)  # type: ignore[attr-defined]
        if op.mode == "nearest":  # type: ignore[attr-defined]
            nbr = nbr[np.arange(n_out), np.argmax(w, axis=1)][:, None]
            w = np.ones_like(nbr, np.float64)
        outside = np.zeros(n_out, bool)
        if ctm == "tf_crop_and_resize":
            outside = (x_ori < 0) | (x_ori > n_in - 1)
        tables.append((nbr, w, outside))
    return tables


def resize_supported(op: Op, x: Shape) -> str | None:
    if op.mode not in ("nearest", "linear") or (op.mode == "linear" and op.antialias):  # type: ignore[attr-defined]
        return f"resize mode {op.mode} (antialias={op.antialias}) has no kernel"  # type: ignore[attr-defined]
    floats = (DType.half_type, DType.bf16_type, DType.float_type, DType.double_type)
    if op.mode == "linear" and x.type not in floats:  # type: ignore[attr-defined]
        return f"linear resize of {x.type.name}"
    return None


def _layout(op: Op, in_lens: tuple[int, ...]) -> tuple[np.ndarray, dict[int, list[int]]]:
    """The table bytes, and per resized axis the byte offsets (8-aligned) of its int32 neighbours,
    then its float64 weights (linear) and uint8 outside mask (tf_crop_and_resize). Remembered on the
    op (immutable) for its last input lens: the lowering asks for the table weight, then the kernel."""
    last = op.__dict__.get("_resize_layout")
    if last is not None and last[0] == tuple(in_lens):
        return last[1]
    layout = _make_layout(op, in_lens)
    layout[0].setflags(write=False)  # shared by both askers (and the weight's device copy)
    object.__setattr__(op, "_resize_layout", (tuple(in_lens), layout))
    return layout


def _make_layout(op: Op, in_lens: tuple[int, ...]) -> tuple[np.ndarray, dict[int, list[int]]]:
    tables = resize_tables(op, in_lens) if math.prod(op.out_lens) else [None] * len(in_lens)  # type: ignore[attr-defined]
    linear = op.mode == "linear"  # type: ignore[attr-defined]
    tf = op.coordinate_transformation_mode == "tf_crop_and_resize"  # type: ignore[attr-defined]
    parts: list[np.ndarray] = []
    offsets: dict[int, list[int]] = {}
    at = 0
    for a, tb in enumerate(tables):
        if tb is None:
            continue
        nbr, w, outside = tb
        arrays = [nbr.astype(np.int32)] + ([w.astype(np.float64)] if linear else [])
        arrays += [outside.astype(np.uint8)] if tf else []
        offsets[a] = []
        for arr in arrays:
            raw = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
            offsets[a].append(at)
            parts += [raw, np.zeros(-raw.size % 8, np.uint8)]
            at += raw.size + (-raw.size % 8)
    data = np.concatenate(parts) if parts else np.zeros(8, np.uint8)
    return data, offsets


def resize_table(op: Op, x: Shape) -> np.ndarray:
    """The bytes ``resize_kernel`` reads as its second input for ``op`` on ``x`` (uint8, 8-aligned parts)."""
    return _layout(op, x.lens)[0]


def resize_kernel(name: str, op: Op, x: Shape, out: Shape) -> KernelSpec:
    """Nearest (a copy of raw bits) or linear (float64 weights, summed axis by axis like the ref); the
    kernel's inputs are ``x`` and ``resize_table(op, x)``."""
    why = resize_supported(op, x)
    if why:
        raise Unsupported(why)
    data, offsets = _layout(op, x.lens)
    table = Shape(DType.uint8_type, (data.size,))
    axes = sorted(offsets)
    tf = op.coordinate_transformation_mode == "tf_crop_and_resize"  # type: ignore[attr-defined]
    p = params_for(out, x, table)
    body = []
    for a in axes:  # each table at its run-time byte offset in input 1
        offs = iter(offsets[a])
        body.append(f"const i32* nb{a} = reinterpret_cast<const i32*>(in1 + {p(next(offs))});")
        if op.mode == "linear":  # type: ignore[attr-defined]
            body.append(f"const double* w{a} = reinterpret_cast<const double*>(in1 + {p(next(offs))});")
        if tf:
            body.append(f"const u8* ob{a} = in1 + {p(next(offs))};")
    strides = [p.stride(s) for s in x.strides]
    o = [f"o{d}" for d in range(x.ndim())]
    if op.mode == "nearest":  # type: ignore[attr-defined]
        src = [f"(IDX)nb{d}[o{d}]" if d in axes else o[d] for d in range(x.ndim())]
        load = f"in0[{offset(src, strides, 'IDX')}]"
        if tf and axes:
            extrap = raw_literal(op.extrapolation_value, x.type)  # type: ignore[attr-defined]
            load = f"({' || '.join(f'ob{a}[o{a}]' for a in axes)}) ? {extrap} : {load}"
        body.append(f"out0[oo] = {load};")
        raw = raw_type(x.type)
        return index_kernel(name, [x, table], [raw, "u8"], out, raw, body, p=p)
    extrap = float(op.extrapolation_value).hex()  # type: ignore[attr-defined]

    def value(k: int, src: list[str]) -> str:
        """Axis ``axes[k]``'s result (the ref resizes axes in order: the last one is outermost)."""
        if k < 0:
            return f"(double)mx_ld(in0[{offset(src, strides, 'IDX')}])"
        a = axes[k]
        taps = []
        for j in range(2):
            s2 = list(src)
            s2[a] = f"(IDX)nb{a}[o{a} * 2 + {j}]"
            taps.append(f"__dmul_rn({value(k - 1, s2)}, w{a}[o{a} * 2 + {j}])")
        e = f"__dadd_rn({taps[0]}, {taps[1]})"
        return f"(ob{a}[o{a}] ? {extrap} : {e})" if tf else e

    info = np.finfo(to_numpy(out.type))
    lo, hi = float(info.min).hex(), float(info.max).hex()
    body += [
        f"const double v = {value(len(axes) - 1, o)};",
        f"out0[oo] = mx_cvt<{c_type(out.type)}>(mx_min(mx_max(v, {lo}), {hi}));",
    ]
    return index_kernel(name, [x, table], [c_type(x.type), "u8"], out, c_type(out.type), body, p=p)

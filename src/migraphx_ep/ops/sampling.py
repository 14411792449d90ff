"""Sampling ops: max-pool argmax indices, max unpooling, grid sampling, RoiAlign and MaxRoiPool.

Semantics follow ORT's CPU kernels (which ONNX's reference mirrors): coordinates are computed in the
input's float type (float32 below float64) and interpolation weights are applied separately per
corner, so results agree to rounding.
"""

from __future__ import annotations

import math
from typing import ClassVar

import numpy as np

from ..ir.dtypes import DType
from ..ir.operation import Op, op_class, register_op
from ..ir.shape import Shape, ShapeError, check_shapes
from .base import NUMERIC_TYPES
from .nn import Pooling, _pad_spatial, windows

SAMPLE_TYPES = frozenset({DType.half_type, DType.float_type, DType.double_type, DType.bf16_type})


def work_dtype(t: np.dtype) -> type:
    return np.float64 if t == np.float64 else np.float32


@register_op
@op_class
class PoolingIndices(Op):
    """The int64 Indices output of ONNX MaxPool: flat positions in the whole input (N, C included) of
    each window's first maximum; spatial dims flatten row-major, or column-major with
    ``storage_order`` 1 (ORT). Pads are never chosen. NaNs never win (ORT compares with ``>``)."""

    name: ClassVar[str] = "pooling_indices"
    padding: tuple[int, ...] = ()
    stride: tuple[int, ...] = ()
    lengths: tuple[int, ...] = ()
    dilations: tuple[int, ...] = ()
    ceil_mode: bool = False
    storage_order: int = 0

    def pooling(self) -> Pooling:
        return Pooling(
            mode="max",
            padding=self.padding,
            stride=self.stride,
            lengths=self.lengths,
            dilations=self.dilations,
            ceil_mode=self.ceil_mode,
        )

    def compute_shape(self, inputs: list[Shape]) -> Shape:
        # Standard whatever the input's layout (the pooled values keep a channels-last one; a kernel
        # of its own writes these positions).
        return self.pooling().compute_shape(inputs).as_standard().with_type(DType.int64_type)

    def compute(self, out: Shape, args: list[np.ndarray]) -> np.ndarray:
        x = args[0]
        n, c, *sp = x.shape
        k = len(sp)
        p, s, d = self.pooling().attrs(k)
        outs = out.lens[2:]
        need = [(outs[i] - 1) * s[i] + (self.lengths[i] - 1) * d[i] + 1 for i in range(k)]
        extra = [max(0, need[i] - (sp[i] + p[i] + p[i + k])) for i in range(k)]
        pads = tuple(p[:k]) + tuple(p[k + i] + extra[i] for i in range(k))
        xf = x.astype(np.float64)
        xf = np.where(np.isnan(xf), -np.inf, xf)
        pos = np.arange(math.prod(sp), dtype=np.int64).reshape(sp[::-1] if self.storage_order else sp)
        if self.storage_order:
            pos = pos.transpose(tuple(range(k))[::-1])
        base = (np.arange(n * c, dtype=np.int64) * math.prod(sp)).reshape(n, c, *([1] * k))
        idx = base + pos[None, None]
        wx = windows(_pad_spatial(xf, pads, -np.inf), outs, self.lengths, s, d)
        wi = windows(_pad_spatial(idx, pads, -1), outs, self.lengths, s, d)
        flat = (*wx.shape[: 2 + k], -1)
        am = np.argmax(wx.reshape(flat), axis=-1)[..., None]
        return np.take_along_axis(wi.reshape(flat), am, axis=-1)[..., 0]


@register_op
@op_class
class MaxUnpool(Op):
    """ONNX MaxUnpool: zeros of ``out_lens`` with y.flat[I] = X (I indexes the whole output)."""

    name: ClassVar[str] = "max_unpool"
    out_lens: tuple[int, ...] = ()

    def compute_shape(self, inputs: list[Shape]) -> Shape:
        check_shapes(self.name, inputs).has(2).same_dims()
        check_shapes(self.name, inputs[:1]).types(NUMERIC_TYPES)
        check_shapes(self.name, inputs[1:]).types({DType.int64_type})
        x = inputs[0]
        if len(self.out_lens) != x.ndim() or tuple(self.out_lens[:2]) != x.lens[:2]:
            raise ShapeError(f"max_unpool: output {list(self.out_lens)} does not fit input {list(x.lens)}")
        return Shape(x.type, self.out_lens)

    def compute(self, out: Shape, args: list[np.ndarray]) -> np.ndarray:
        y = np.zeros(out.lens, out.dtype)
        # out-of-range indices are an error in ORT; clip keeps the reference total
        np.put(y, args[1].ravel(), args[0].ravel(), mode="clip")
        return y


def _reflect(v: np.ndarray, lo: float, hi: float) -> np.ndarray:
    rng = hi - lo
    if rng <= 0:
        return np.full_like(v, lo)
    below, above = lo - v, v - hi
    dx = np.where(v < lo, below, above)
    n = np.trunc(dx / rng)
    r = dx - n * rng
    even = n % 2 == 0
    low_side = np.where(even, lo + r, hi - r)
    high_side = np.where(even, hi - r, lo + r)
    return np.where(v < lo, low_side, np.where(v > hi, high_side, v))


def _cubic_coeffs(t: np.ndarray) -> list[np.ndarray]:
    a = -0.75
    t = np.abs(t)
    return [
        ((a * (t + 1) - 5 * a) * (t + 1) + 8 * a) * (t + 1) - 4 * a,
        ((a + 2) * t - (a + 3)) * t * t + 1,
        ((a + 2) * (1 - t) - (a + 3)) * (1 - t) * (1 - t) + 1,
        ((a * (2 - t) - 5 * a) * (2 - t) + 8 * a) * (2 - t) - 4 * a,
    ]


GRID_MODES = ("linear", "nearest", "cubic")
GRID_PADDING = ("zeros", "border", "reflection")


@register_op
@op_class
class GridSample(Op):
    """ONNX GridSample (opset 20 names): X (N, C, *D) sampled at grid (N, *O, k), k = len(D), whose
    last axis lists coordinates innermost-dimension first, normalised to [-1, 1]."""

    name: ClassVar[str] = "grid_sample"
    mode: str = "linear"
    padding_mode: str = "zeros"
    align_corners: bool = False

    def compute_shape(self, inputs: list[Shape]) -> Shape:
        check_shapes(self.name, inputs).has(2).same_type().types(SAMPLE_TYPES)
        x, g = inputs
        k = x.ndim() - 2
        if self.mode not in GRID_MODES or self.padding_mode not in GRID_PADDING:
            raise ShapeError(f"grid_sample: mode {self.mode!r} / padding {self.padding_mode!r}")
        if k < 1 or g.ndim() != k + 2 or g.lens[0] != x.lens[0] or g.lens[-1] != k:
            raise ShapeError(f"grid_sample: grid {list(g.lens)} does not fit input {list(x.lens)}")
        return Shape(x.type, (*x.lens[:2], *g.lens[1:-1]))

    def compute(self, out: Shape, args: list[np.ndarray]) -> np.ndarray:
        x, grid = args
        wt = work_dtype(x.dtype)
        dims = x.shape[2:]
        k = len(dims)
        g = grid.astype(wt)
        coords, borders = [], []
        for i, size in enumerate(dims):
            v = g[..., k - 1 - i]
            if self.align_corners:
                c, lo, hi = (v + 1) / 2 * (size - 1), 0.0, size - 1.0
            else:
                c, lo, hi = ((v + 1) * size - 1) / 2, -0.5, size - 0.5
            if self.mode == "nearest":
                c = np.rint(c)
            out_of = (c < lo) | (c > hi)
            if self.padding_mode == "border":
                c = np.where(out_of, np.clip(c, 0, size - 1), c)
            elif self.padding_mode == "reflection":
                c = np.where(out_of, _reflect(c, lo, hi), c).astype(wt)
            coords.append(c.astype(wt))
            borders.append((lo, hi))
        if self.mode == "nearest":
            taps = [[(np.trunc(c).astype(np.int64), np.ones_like(c))] for c in coords]
        elif self.mode == "linear":
            taps = []
            for c in coords:
                f = np.floor(c)
                t = c - f
                taps.append([(f.astype(np.int64), 1 - t), (f.astype(np.int64) + 1, t)])
        else:
            taps = []
            for c in coords:
                f = np.floor(c)
                w = _cubic_coeffs(c - f)
                taps.append([(f.astype(np.int64) + j - 1, w[j]) for j in range(4)])
        y = np.zeros((x.shape[0], *out.lens[2:], x.shape[1]), wt)
        batch = np.arange(x.shape[0]).reshape((-1,) + (1,) * (out.ndim() - 2))
        xw = np.moveaxis(x.astype(wt), 1, -1)  # (N, *D, C)
        for combo in np.ndindex(*(len(t) for t in taps)):
            weight = np.ones((), wt)
            idx, valid = [], np.ones((), bool)
            for i, j in enumerate(combo):
                ix, w = taps[i][j]
                weight = weight * w
                ix, ok = self._pixel_index(ix, dims[i], borders[i])
                idx.append(ix)
                valid = valid & ok
            vals = xw[(batch, *idx)]  # (N, *O, C)
            y += np.where(valid[..., None], vals, 0) * weight[..., None]
        return np.moveaxis(y, -1, 1).astype(out.dtype)

    def _pixel_index(self, ix: np.ndarray, size: int, border: tuple[float, float]):
        if self.padding_mode == "zeros":
            ok = (ix >= 0) & (ix < size)
            return np.clip(ix, 0, size - 1), ok
        if self.padding_mode == "border":
            return np.clip(ix, 0, size - 1), np.ones(ix.shape, bool)
        r = np.trunc(_reflect(ix.astype(np.float64), *border)).astype(np.int64)
        return np.clip(r, 0, size - 1), np.ones(ix.shape, bool)


def _bilinear_taps(y: np.floating, x: np.floating, h: int, w: int) -> list[tuple[int, int, float]]:
    """ORT's RoiAlign pre-calc: the four (row, col, weight) taps of one sample point."""
    t = type(y)
    if y < -1.0 or y > h or x < -1.0 or x > w:
        return [(0, 0, t(0))] * 4
    y, x = max(y, t(0)), max(x, t(0))
    yl, xl = int(y), int(x)
    if yl >= h - 1:
        yh = yl = h - 1
        y = t(yl)
    else:
        yh = yl + 1
    if xl >= w - 1:
        xh = xl = w - 1
        x = t(xl)
    else:
        xh = xl + 1
    ly, lx = y - t(yl), x - t(xl)
    hy, hx = t(1) - ly, t(1) - lx
    return [(yl, xl, hy * hx), (yl, xh, hy * lx), (yh, xl, ly * hx), (yh, xh, ly * lx)]


@register_op
@op_class
class RoiAlign(Op):
    """ONNX RoiAlign on X (N, C, H, W), rois (R, 4) [x1, y1, x2, y2], batch_indices (R,).

    ``half_pixel`` shifts by -0.5 (opset 16 default); otherwise rois are at least 1x1. ``max`` takes,
    like ORT, the max over samples of the max of the *weighted* corner values. As in ORT, a batch index
    outside [0, N) and a roi that is not finite fail the Run (the roi after ``spatial_scale`` here: a
    sample count of an inf or NaN size has no value).
    """

    name: ClassVar[str] = "roi_align"
    mode: str = "avg"
    output_height: int = 1
    output_width: int = 1
    sampling_ratio: int = 0
    spatial_scale: float = 1.0
    half_pixel: bool = True

    def compute_shape(self, inputs: list[Shape]) -> Shape:
        check_shapes(self.name, inputs).has(3)
        x, rois, bi = inputs
        check_shapes(self.name, [x, rois]).same_type().types(SAMPLE_TYPES)
        check_shapes(self.name, [bi]).types({DType.int64_type, DType.int32_type})
        if self.mode not in ("avg", "max") or min(self.output_height, self.output_width) < 1:
            raise ShapeError(f"roi_align: mode {self.mode!r}, output dims bad")
        if x.ndim() != 4 or rois.ndim() != 2 or rois.lens[1] != 4 or bi.lens != (rois.lens[0],):
            raise ShapeError(f"roi_align: X {list(x.lens)}, rois {list(rois.lens)}, indices {list(bi.lens)}")
        return Shape(x.type, (rois.lens[0], x.lens[1], self.output_height, self.output_width))

    def compute(self, out: Shape, args: list[np.ndarray]) -> np.ndarray:
        x, rois, bidx = args
        wt = work_dtype(x.dtype)
        h, w = x.shape[2:]
        ph_n, pw_n = self.output_height, self.output_width
        off = 0.5 if self.half_pixel else 0.0
        y = np.zeros(out.lens, wt)
        bad = (bidx < 0) | (bidx >= x.shape[0])
        if bad.any():  # numpy would wrap a negative one
            r = int(np.flatnonzero(bad)[0])
            msg = f"roi_align: batch_indices value out of range [0, {x.shape[0]}): {int(bidx[r])} at {r}"
            raise IndexError(msg)
        for r in range(rois.shape[0]):
            # ORT's arithmetic, in the input's float type (numpy 2 keeps float32 scalars float32)
            x1, y1, x2, y2 = (wt(v) * wt(self.spatial_scale) - wt(off) for v in rois[r])
            rw, rh = x2 - x1, y2 - y1
            if not np.isfinite([x1, y1, x2, y2, rw, rh]).all():
                raise ValueError(f"roi_align: rois must be finite (after spatial_scale): roi {r}")
            if not self.half_pixel:
                rw, rh = max(rw, wt(1)), max(rh, wt(1))
            bh, bw = rh / wt(ph_n), rw / wt(pw_n)
            gh = self.sampling_ratio if self.sampling_ratio > 0 else int(np.ceil(rh / wt(ph_n)))
            gw = self.sampling_ratio if self.sampling_ratio > 0 else int(np.ceil(rw / wt(pw_n)))
            count = max(gh * gw, 1)
            img = x[int(bidx[r])].astype(wt)  # (C, H, W)
            for ph in range(ph_n):
                for pw in range(pw_n):
                    acc = None
                    for iy in range(gh):
                        yy = y1 + wt(ph) * bh + wt(iy + 0.5) * bh / wt(gh)
                        for ix in range(gw):
                            xx = x1 + wt(pw) * bw + wt(ix + 0.5) * bw / wt(gw)
                            terms = [tw * img[:, ty, tx] for ty, tx, tw in _bilinear_taps(yy, xx, h, w)]
                            if self.mode == "avg":
                                v = terms[0] + terms[1] + terms[2] + terms[3]
                                acc = v if acc is None else acc + v
                            else:
                                v = np.maximum(np.maximum(np.maximum(terms[0], terms[1]), terms[2]), terms[3])
                                acc = v if acc is None else np.maximum(acc, v)
                    if acc is not None:
                        y[r, :, ph, pw] = acc / wt(count) if self.mode == "avg" else acc
        return y.astype(out.dtype)


@register_op
@op_class
class MaxRoiPool(Op):
    """ONNX MaxRoiPool (Caffe): rois (R, 5) [batch, x1, y1, x2, y2] scaled and rounded half away from
    zero, each split into ``pooled_shape`` bins of floor/ceil bounds; an empty bin gives 0."""

    name: ClassVar[str] = "max_roi_pool"
    pooled_shape: tuple[int, ...] = (1, 1)
    spatial_scale: float = 1.0

    def compute_shape(self, inputs: list[Shape]) -> Shape:
        check_shapes(self.name, inputs).has(2).same_type().types(SAMPLE_TYPES)
        x, rois = inputs
        if x.ndim() != 4 or rois.ndim() != 2 or rois.lens[1] != 5 or len(self.pooled_shape) != 2:
            raise ShapeError(f"max_roi_pool: X {list(x.lens)}, rois {list(rois.lens)}")
        return Shape(x.type, (rois.lens[0], x.lens[1], *self.pooled_shape))

    def compute(self, out: Shape, args: list[np.ndarray]) -> np.ndarray:
        x, rois = args
        wt = work_dtype(x.dtype)
        h, w = x.shape[2:]
        ph_n, pw_n = self.pooled_shape
        y = np.zeros(out.lens, x.dtype)

        def rnd(v: float) -> int:
            return int(math.floor(v + 0.5)) if v >= 0 else int(math.ceil(v - 0.5))

        for r in range(rois.shape[0]):
            b = int(rois[r, 0])
            xs, ys, xe, ye = (rnd(float(wt(v) * wt(self.spatial_scale))) for v in rois[r, 1:])
            rh, rw = max(ye - ys + 1, 1), max(xe - xs + 1, 1)
            bh, bw = wt(rh) / wt(ph_n), wt(rw) / wt(pw_n)
            for ph in range(ph_n):
                hs = min(max(int(math.floor(wt(ph) * bh)) + ys, 0), h)
                he = min(max(int(math.ceil(wt(ph + 1) * bh)) + ys, 0), h)
                for pw in range(pw_n):
                    ws = min(max(int(math.floor(wt(pw) * bw)) + xs, 0), w)
                    we = min(max(int(math.ceil(wt(pw + 1) * bw)) + xs, 0), w)
                    if he > hs and we > ws:
                        y[r, :, ph, pw] = x[b, :, hs:he, ws:we].max(axis=(1, 2))
        return y

"""Resize: nearest / linear / cubic interpolation with ONNX's coordinate transformations.

Interpolation is separable, so each resized axis is one gather of ``n`` neighbours and a weighted sum
(the scheme of ONNX's reference implementation). The parser resolves scales/sizes/axes/aspect policy
into per-axis ``scales`` and the output dims, so this op only maps coordinates and weighs neighbours.
"""

from __future__ import annotations

import math
from typing import ClassVar

import numpy as np

from ..ir.dtypes import FLOAT_TYPES
from ..ir.operation import Op, op_class, register_op
from ..ir.shape import Shape, ShapeError, check_shapes

COORD_MODES = (
    "half_pixel",
    "half_pixel_symmetric",
    "pytorch_half_pixel",
    "align_corners",
    "asymmetric",
    "tf_crop_and_resize",
)
NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


def source_coords(
    mode: str, y: np.ndarray, scale: float, n_in: int, n_out: int, roi: tuple[float, float]
) -> np.ndarray:
    """Input coordinate of each output index ``y`` (float64, as the ONNX reference computes it)."""
    width = scale * n_in  # the real-valued output length the scale implies
    if mode == "align_corners":
        return np.zeros(n_out) if width == 1 else y * (n_in - 1) / (width - 1)
    if mode == "asymmetric":
        return y / scale
    if mode == "tf_crop_and_resize":
        if width == 1:
            x = np.full(n_out, (roi[1] - roi[0]) * (n_in - 1) / 2)
        else:
            x = y * (roi[1] - roi[0]) * (n_in - 1) / (width - 1)
        return x + roi[0] * (n_in - 1)
    if mode == "pytorch_half_pixel":
        return np.full(n_out, -0.5) if width == 1 else (y + 0.5) / scale - 0.5
    if mode == "half_pixel":
        return (y + 0.5) / scale - 0.5
    if mode == "half_pixel_symmetric":
        offset = n_in / 2 * (1 - n_out / width)
        return offset + (y + 0.5) / scale - 0.5
    raise ValueError(f"resize: unknown coordinate_transformation_mode {mode!r}")


def _cubic(x: np.ndarray, a: float) -> np.ndarray:
    x = np.abs(x)
    near = ((a + 2) * x - (a + 3)) * x * x + 1
    far = ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
    return np.where(x <= 1, near, np.where(x < 2, far, 0.0))


@register_op
@op_class
class Resize(Op):
    name: ClassVar[str] = "resize"
    out_lens: tuple[int, ...] = ()
    scales: tuple[float, ...] = ()
    roi: tuple[float, ...] = ()  # starts then ends per axis (tf_crop_and_resize only)
    mode: str = "nearest"
    coordinate_transformation_mode: str = "half_pixel"
    nearest_mode: str = "round_prefer_floor"
    cubic_coeff_a: float = -0.75
    exclude_outside: bool = False
    extrapolation_value: float = 0.0
    antialias: bool = False

    def compute_shape(self, inputs: list[Shape]) -> Shape:
        check_shapes(self.name, inputs).has(1)
        s = inputs[0]
        r = s.ndim()
        if len(self.out_lens) != r or len(self.scales) != r or self.roi and len(self.roi) != 2 * r:
            raise ShapeError(f"resize: out_lens/scales/roi do not match rank {r}")
        if (
            self.mode not in ("nearest", "linear", "cubic")
            or self.coordinate_transformation_mode not in COORD_MODES
            or self.nearest_mode not in NEAREST_MODES
        ):
            raise ShapeError(f"resize: unsupported mode {self.mode}/{self.coordinate_transformation_mode}")
        if self.mode != "nearest" and s.type not in FLOAT_TYPES:
            raise ShapeError(f"resize: {self.mode} needs a floating-point input")
        if any(n == 0 for n in s.lens) and any(o for o in self.out_lens):
            raise ShapeError("resize: cannot resize an empty tensor")
        return Shape(s.type, self.out_lens)

    def _weights(self, ratio: np.ndarray, scale: float) -> np.ndarray:
        """Per output position, the weights of its ``n`` neighbours (n fixed per axis)."""
        r = ratio[:, None]
        if self.mode == "nearest":
            pick_hi = {
                "round_prefer_floor": r > 0.5,
                "round_prefer_ceil": r >= 0.5,
                "floor": np.zeros_like(r, bool),
                "ceil": np.ones_like(r, bool),
            }[self.nearest_mode]
            pick_hi = pick_hi | (r == 1.0)  # an exact integer coordinate is its own neighbour
            return np.concatenate([~pick_hi, pick_hi], axis=1).astype(np.float64)
        a = self.cubic_coeff_a
        if not self.antialias:
            if self.mode == "linear":
                return np.concatenate([1 - r, r], axis=1)
            return _cubic(np.concatenate([r + 1, r, 1 - r, 2 - r], axis=1), a)
        s = min(scale, 1.0)  # antialiasing only widens the filter when downsampling
        if self.mode == "linear":
            start = math.floor(-1 / s) + 1
            taps = np.arange(start, 2 - start)
            w = np.clip(1 - np.abs((taps - r) * s), 0, 1)
        else:
            start = math.floor(-2 / s) + 1
            w = _cubic(s * (np.arange(start, 2 - start) - r), a)
        return w / w.sum(axis=1, keepdims=True)

    def axis_taps(self, n_in: int, axis: int, rank: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One axis's source coordinates [n_out], neighbour indices [n_out, taps] (clipped to the input:
        outside taps read the edge value) and weights [n_out, taps]. The gpu target bakes these same
        tables into its resize kernels."""
        n_out, scale = self.out_lens[axis], float(self.scales[axis])
        roi = (self.roi[axis], self.roi[axis + rank]) if self.roi else (0.0, 1.0)
        x_ori = source_coords(
            self.coordinate_transformation_mode, np.arange(n_out, dtype=np.float64), scale, n_in, n_out, roi
        )
        base = np.floor(x_ori)
        ratio = np.where(x_ori == base, 1.0, x_ori - base)  # prefer the left neighbour, as ONNX does
        w = self._weights(ratio, scale)
        n = w.shape[1]
        # The n neighbours nearest to x_ori, ties to the smaller index (ONNX's reference rule).
        pad = -(-n // 2)
        xp = x_ori + pad
        p = np.floor(xp).astype(np.int64)
        frac = xp - p
        if n % 2 == 0:
            first = p + np.where(frac == 0, -(n // 2), -(n // 2) + 1)
        else:
            first = p + np.where(frac <= 0.5, -((n - 1) // 2), -((n - 1) // 2) + 1)
        nbr = first[:, None] + np.arange(n) - pad
        if self.exclude_outside:
            w = np.where((nbr < 0) | (nbr >= n_in), 0.0, w)
            total = w.sum(axis=1, keepdims=True)
            w = w / np.where(total == 0, 1.0, total)
        return x_ori, np.clip(nbr, 0, n_in - 1), w

    def _resize_axis(self, x: np.ndarray, axis: int) -> np.ndarray:
        n_in, n_out = x.shape[axis], self.out_lens[axis]
        r = x.ndim
        x_ori, nbr, w = self.axis_taps(n_in, axis, r)
        if self.mode == "nearest":
            out = np.take(x, nbr[np.arange(n_out), np.argmax(w, axis=1)], axis=axis)
        else:
            g = np.take(x, nbr, axis=axis)  # axis becomes (n_out, n)
            out = (g * w.reshape((1,) * axis + w.shape + (1,) * (r - axis - 1))).sum(axis=axis + 1)
        if self.coordinate_transformation_mode == "tf_crop_and_resize":
            outside = ((x_ori < 0) | (x_ori > n_in - 1)).reshape(
                (1,) * axis + (n_out,) + (1,) * (r - axis - 1)
            )
            out = np.where(outside, np.asarray(self.extrapolation_value, out.dtype), out)
        return out

    def compute(self, out: Shape, args: list[np.ndarray]) -> np.ndarray:
        x = args[0]
        res = x if self.mode == "nearest" else x.astype(np.float64)
        r = x.ndim
        for axis in range(r):
            trivial_roi = not self.roi or (
                math.isclose(self.roi[axis], 0.0) and math.isclose(self.roi[axis + r], 1.0)
            )
            if math.isclose(self.scales[axis], 1.0) and self.out_lens[axis] == x.shape[axis] and trivial_roi:
                continue  # identity along this axis (the reference skips it too)
            if self.out_lens[axis] == 0:
                res = np.take(res, np.zeros(0, np.int64), axis=axis)
                continue
            res = self._resize_axis(res, axis)
        if self.mode == "nearest":
            return np.ascontiguousarray(res)
        info = np.finfo(out.dtype) if out.dtype.kind == "f" else None
        with np.errstate(all="ignore"):
            return (np.clip(res, info.min, info.max) if info is not None else res).astype(out.dtype)

"""GridSample and RoiAlign on the gpu target vs the ref target, on a GPU.

The kernels repeat the ref's roundings (no fma: ``mx_sampling.cuh``), so float and double results are
compared exactly (the parser takes float and double only). A mismatch of an ulp here means a product
NVRTC fused after all. Host runs of the same kernels: test_sampling_host.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from .gpucheck import EXACT, F32, F64, check_op, uniform

pytestmark = pytest.mark.gpu

I64 = np.int64


def grid(rng: np.random.Generator, lens: tuple[int, ...], dtype=F32) -> np.ndarray:
    """Coordinates in and out of [-1, 1], some exactly on the corners, one NaN and one inf."""
    g = uniform(rng, lens, -1.4, 1.4, dtype=F32)
    flat = g.reshape(-1)
    flat[:6] = [-1.0, 1.0, 0.0, np.nan, np.inf, 3.5]
    return g.astype(dtype)


@pytest.mark.parametrize("align", [0, 1])
@pytest.mark.parametrize("pad", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("mode", ["linear", "nearest", "cubic"])
def test_grid_sample(gpu, rng, mode, pad, align):
    if mode == "cubic" and pad == "border":
        pytest.skip("refused by the parser: ORT and ONNX disagree")
    feeds = {"x": uniform(rng, (2, 3, 7, 9)), "g": grid(rng, (2, 5, 6, 2))}
    check_op("GridSample", feeds, gpu, EXACT, mode=mode, padding_mode=pad, align_corners=align)


@pytest.mark.parametrize("pad", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("mode", ["linear", "nearest"])
def test_grid_sample_volumetric(gpu, rng, mode, pad):
    feeds = {"x": uniform(rng, (2, 2, 4, 5, 6)), "g": grid(rng, (2, 3, 4, 5, 3))}
    check_op("GridSample", feeds, gpu, EXACT, mode=mode, padding_mode=pad)


@pytest.mark.parametrize("mode", ["bilinear", "nearest", "bicubic"])
def test_grid_sample_opset16_names(gpu, rng, mode):
    feeds = {"x": uniform(rng, (1, 4, 6, 5)), "g": grid(rng, (1, 8, 7, 2))}
    check_op("GridSample", feeds, gpu, EXACT, opset=16, mode=mode, padding_mode="reflection")


def test_grid_sample_double(gpu, rng):
    feeds = {"x": uniform(rng, (2, 3, 6, 6), dtype=F64), "g": grid(rng, (2, 4, 4, 2), F64)}
    check_op("GridSample", feeds, gpu, EXACT, mode="cubic", align_corners=1)


def test_grid_sample_large(gpu, rng):
    """More outputs than one pass of the grid: the grid-stride loop, and 16 cubic taps per thread."""
    feeds = {"x": uniform(rng, (2, 8, 64, 48)), "g": grid(rng, (2, 96, 80, 2))}
    check_op("GridSample", feeds, gpu, EXACT, mode="cubic", padding_mode="reflection")


def rois(rng: np.random.Generator, r: int, h: int, w: int, dtype=F32) -> np.ndarray:
    a = rng.random((r, 2)) * [w, h] - 0.5
    b = a + rng.random((r, 2)) * [w / 1.5, h / 1.5] + 0.2
    out = np.concatenate((a, b), 1)
    out[0] = [-2.0, -1.0, w + 1.0, h + 2.0]  # over every edge
    out[1] = [3.0, 3.0, 1.0, 2.0]  # reversed
    return out.astype(dtype)


@pytest.mark.parametrize("scale", [1.0, 0.8])
@pytest.mark.parametrize("ratio", [0, 2])
@pytest.mark.parametrize("ctm", ["half_pixel", "output_half_pixel"])
@pytest.mark.parametrize("mode", ["avg", "max"])
def test_roi_align(gpu, rng, mode, ctm, ratio, scale):
    b = np.array([0, 1, 1, 0, 1, 0], I64)
    feeds = {"x": uniform(rng, (2, 3, 10, 9)), "rois": rois(rng, 6, 10, 9), "b": b}
    check_op("RoiAlign", feeds, gpu, EXACT, opset=16, mode=mode, coordinate_transformation_mode=ctm,
             output_height=3, output_width=2, sampling_ratio=ratio, spatial_scale=scale)  # fmt: skip


def test_roi_align_double_opset10(gpu, rng):
    """Opset 10: output_half_pixel by default; double works in double."""
    x, r = uniform(rng, (1, 2, 8, 8), dtype=F64), rois(rng, 3, 8, 8, F64)
    feeds = {"x": x, "rois": r, "b": np.zeros(3, I64)}
    check_op("RoiAlign", feeds, gpu, EXACT, opset=10, output_height=2, output_width=3)


def test_roi_align_large(gpu, rng):
    feeds = {"x": uniform(rng, (2, 16, 40, 50)), "rois": rois(rng, 40, 40, 50), "b": rng.integers(0, 2, 40)}
    check_op("RoiAlign", feeds, gpu, EXACT, mode="avg", output_height=7, output_width=7, spatial_scale=0.5)

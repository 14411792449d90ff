"""MaxPool Indices, MaxUnpool, GridSample, RoiAlign and MaxRoiPool vs ORT CPU."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from migraphx_ep.frontend import ParseError
from migraphx_ep.ir.shape import Shape
from migraphx_ep.ops.sampling import GridSample, PoolingIndices
from opcheck import check_node, make_model, run_ort, run_ours

RNG = np.random.default_rng(3)


def rand(*lens: int, dtype=np.float32) -> np.ndarray:
    return RNG.standard_normal(lens).astype(dtype)


POOL_CASES = [
    ("2d", (2, 3, 6, 5), dict(kernel_shape=[3, 2])),
    ("pads_strides", (1, 2, 7, 7), dict(kernel_shape=[3, 3], pads=[1, 0, 1, 2], strides=[2, 2])),
    ("col_major", (1, 2, 5, 6), dict(kernel_shape=[2, 2], strides=[2, 2], storage_order=1)),
    ("dilated_ceil", (1, 1, 8, 8), dict(kernel_shape=[2, 2], dilations=[2, 2], ceil_mode=1, strides=[2, 2])),
    ("1d", (2, 2, 9), dict(kernel_shape=[3], strides=[2])),
    ("3d_col_major", (1, 2, 4, 5, 3), dict(kernel_shape=[2, 2, 2], storage_order=1)),
]


@pytest.mark.parametrize("name,dims,attrs", POOL_CASES, ids=[c[0] for c in POOL_CASES])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_maxpool_indices_vs_ort(name, dims, attrs, dtype):
    node = helper.make_node("MaxPool", ["x"], ["y", "i"], **attrs)
    check_node(node, {"x": rand(*dims, dtype=dtype)}, opset=12)


def test_maxpool_indices_ties_pick_first():
    x = np.zeros((1, 1, 2, 2), np.float32)
    op = PoolingIndices(lengths=(2, 2))
    assert op.compute(op.compute_shape([Shape.of(x)]), [x]).tolist() == [[[[0]]]]


@pytest.mark.parametrize("with_shape", [False, True])
def test_max_unpool_vs_ort(with_shape):
    x = rand(2, 3, 6, 6)
    node = helper.make_node("MaxPool", ["x"], ["y", "i"], kernel_shape=[2, 2], strides=[2, 2])
    y, ind = run_ours(make_model(node, {"x": x}, opset=12), {"x": x})
    names, inits = ["y", "i"], {}
    if with_shape:
        names.append("shape")
        inits["shape"] = np.array([2, 3, 7, 7], np.int64)
    unpool = helper.make_node("MaxUnpool", names, ["z"], kernel_shape=[2, 2], strides=[2, 2])
    if with_shape:
        # ORT scatters straight into output_shape, ONNX's reference into the inferred shape and then
        # pads (test_maxunpool_export_with_output_shape): they disagree, so we refuse.
        with pytest.raises(ParseError, match="differs from the inferred"):
            run_ours(make_model(unpool, {"y": y, "i": ind}, opset=12, initializers=inits), {"y": y, "i": ind})
        return
    check_node(unpool, {"y": y, "i": ind}, opset=12, initializers=inits)


GRID_MODES = [("linear", 0), ("linear", 1), ("nearest", 0), ("nearest", 1), ("cubic", 0), ("cubic", 1)]


@pytest.mark.parametrize("mode,align", GRID_MODES)
@pytest.mark.parametrize("pad", ["zeros", "border", "reflection"])
def test_grid_sample_4d_vs_ort(mode, align, pad):
    if mode == "cubic" and pad == "border":
        pytest.skip("refused: ORT and ONNX disagree")
    x = rand(2, 3, 5, 4)
    grid = RNG.random((2, 4, 6, 2)).astype(np.float32) * 3.2 - 1.6  # some points outside [-1, 1]
    node = helper.make_node("GridSample", ["x", "g"], ["y"], mode=mode, padding_mode=pad, align_corners=align)
    check_node(node, {"x": x, "g": grid}, opset=20, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mode", ["bilinear", "bicubic", "nearest"])
def test_grid_sample_opset16_names_vs_ort(mode):
    x, grid = rand(1, 2, 4, 4), (RNG.random((1, 3, 3, 2)) * 2.4 - 1.2).astype(np.float32)
    node = helper.make_node("GridSample", ["x", "g"], ["y"], mode=mode, padding_mode="reflection")
    check_node(node, {"x": x, "g": grid}, opset=16, rtol=1e-4, atol=1e-5)


def test_grid_sample_double_vs_ort():
    x, grid = rand(1, 2, 4, 4, dtype=np.float64), RNG.random((1, 3, 3, 2)) * 2.4 - 1.2
    node = helper.make_node("GridSample", ["x", "g"], ["y"], mode="cubic", align_corners=1)
    check_node(node, {"x": x, "g": grid}, opset=20, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("mode", ["linear", "nearest"])
@pytest.mark.parametrize("pad", ["zeros", "reflection"])
def test_grid_sample_5d_vs_ort(mode, pad):
    x = rand(1, 2, 3, 4, 5)
    grid = RNG.random((1, 2, 3, 4, 3)).astype(np.float32) * 2.6 - 1.3
    node = helper.make_node("GridSample", ["x", "g"], ["y"], mode=mode, padding_mode=pad)
    check_node(node, {"x": x, "g": grid}, opset=20, rtol=1e-4, atol=1e-5)


def test_grid_sample_identity_vs_numpy():
    x = rand(1, 1, 3, 4)
    ys, xs = np.meshgrid(np.linspace(-1, 1, 3), np.linspace(-1, 1, 4), indexing="ij")
    grid = np.stack((xs, ys), -1)[None].astype(np.float32)
    op = GridSample(mode="linear", align_corners=True)
    y = op.compute(op.compute_shape([Shape.of(x), Shape.of(grid)]), [x, grid])
    np.testing.assert_allclose(y, x, rtol=1e-6, atol=1e-6)


def test_grid_sample_cubic_border_refused():
    ins = {"x": rand(1, 1, 3, 3), "g": rand(1, 2, 2, 2)}
    m = make_model(
        helper.make_node("GridSample", ["x", "g"], ["y"], mode="cubic", padding_mode="border"), ins, opset=20
    )
    with pytest.raises(ParseError, match="disagree"):
        run_ours(m, ins)


def test_grid_sample_cubic_5d_refused():
    ins = {"x": rand(1, 1, 2, 2, 2), "g": rand(1, 1, 1, 1, 3)}
    m = make_model(helper.make_node("GridSample", ["x", "g"], ["y"], mode="cubic"), ins, opset=20)
    with pytest.raises(ParseError, match="rank 5"):
        run_ours(m, ins)


def rois(r: int, h: int, w: int, cols: int = 4) -> np.ndarray:
    a = RNG.random((r, 2)) * [w, h] - 0.5
    b = a + RNG.random((r, 2)) * [w / 1.5, h / 1.5] + 0.2
    out = np.concatenate((a, b), 1).astype(np.float32)
    return out


@pytest.mark.parametrize("mode", ["avg", "max"])
@pytest.mark.parametrize("ctm", ["half_pixel", "output_half_pixel"])
@pytest.mark.parametrize("ratio", [0, 2])
def test_roi_align_vs_ort(mode, ctm, ratio):
    ins = {"x": rand(2, 3, 10, 9), "rois": rois(4, 10, 9), "b": np.array([0, 1, 1, 0], np.int64)}
    node = helper.make_node(
        "RoiAlign",
        list(ins),
        ["y"],
        mode=mode,
        coordinate_transformation_mode=ctm,
        output_height=3,
        output_width=2,
        sampling_ratio=ratio,
        spatial_scale=0.8,
    )
    check_node(node, ins, opset=16, rtol=1e-4, atol=1e-5)


def test_roi_align_opset10_double_vs_ort():
    ins = {
        "x": rand(1, 2, 8, 8, dtype=np.float64),
        "rois": rois(3, 8, 8).astype(np.float64),
        "b": np.zeros(3, np.int64),
    }
    node = helper.make_node("RoiAlign", list(ins), ["y"], output_height=2, output_width=3)
    check_node(node, ins, opset=10, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize(
    "index,roi,error",
    [(-1, [0, 0, 3, 3], IndexError), (2, [0, 0, 3, 3], IndexError), (1, [np.nan, 0, 3, 3], ValueError),
     (1, [0, np.inf, 3, 3], ValueError)],
)  # fmt: skip
def test_roi_align_bad_inputs_fail_like_ort(index, roi, error):
    """ORT rejects a batch index outside [0, N) and a roi that is not finite; numpy would wrap -1."""
    ins = {"x": rand(2, 1, 4, 4), "rois": np.array([roi], np.float32), "b": np.array([index], np.int64)}
    node = helper.make_node("RoiAlign", list(ins), ["y"], output_height=2, output_width=2)
    m = make_model(node, ins, opset=16)
    with pytest.raises(Exception, match="out of range" if error is IndexError else "finite"):
        run_ort(m, ins)
    with pytest.raises(error, match="roi_align: (batch_indices value out of range|rois must be finite)"):
        run_ours(m, ins)


def test_max_roi_pool_vs_ort():
    r = rois(4, 9, 10) * 2
    r = np.concatenate((np.array([[0], [1], [1], [0]], np.float32), r), 1)
    ins = {"x": rand(2, 3, 9, 10), "rois": r}
    node = helper.make_node("MaxRoiPool", list(ins), ["y"], pooled_shape=[3, 2], spatial_scale=0.5)
    check_node(node, ins, opset=12)

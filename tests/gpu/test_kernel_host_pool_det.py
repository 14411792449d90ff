"""MaxPool's Indices and Det kernels run on the host (``test_kernel_host``'s g++ shim), against the ref."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from migraphx_ep.ir.operation import make_op
from migraphx_ep.targets.gpu import kernels as K
from migraphx_ep.targets.gpu import nvrtc

from .test_kernel_host import launch, shape

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="no g++ to build kernels for the host")

POOL_INDICES = {
    # input dims, attributes
    "plain": ((2, 3, 5, 6), {"lengths": [2, 2], "stride": [2, 2]}),
    "pads_overlap": ((1, 2, 5, 5), {"lengths": [5, 5], "padding": [2, 2, 2, 2]}),
    "pads_start_window": ((1, 1, 4, 4), {"lengths": [3, 2], "padding": [2, 1, 0, 1]}),
    "strided_dilated_ceil": ((1, 2, 7, 8), {"lengths": [2, 3], "stride": [2, 3], "dilations": [2, 2],
                                            "padding": [1, 0, 1, 1], "ceil_mode": True}),
    "1d": ((2, 2, 9), {"lengths": [3], "stride": [2], "padding": [1, 1]}),
    "3d": ((1, 2, 3, 4, 5), {"lengths": [2, 2, 3], "stride": [1, 2, 2], "padding": [0, 1, 1, 1, 0, 1]}),
}  # fmt: skip


@pytest.mark.parametrize("order", [0, 1])
@pytest.mark.parametrize("name", list(POOL_INDICES))
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])  # the shim has no half
def test_pooling_indices(tmp_path, dtype, name: str, order: int) -> None:  # noqa: ANN001
    lens, attrs = POOL_INDICES[name]
    rng = np.random.default_rng(0)
    # small integers: ties, whose first occurrence must win; NaN, which never wins; -inf and all-NaN
    # windows, which keep the window's first element (a pad's -1 where that is a pad)
    x = rng.integers(-3, 4, lens).astype(dtype)
    flat = x.reshape(-1)
    flat[::7] = np.nan
    flat[1::11] = -np.inf
    x.reshape(-1)[: lens[-1] * 2] = np.nan
    op = make_op("pooling_indices", storage_order=order, **attrs)
    out_shape = op.compute_shape([shape(x)])
    out = np.full(out_shape.lens, -7, np.int64)
    assert launch(K.kernel_for("k_pool_idx", op, [shape(x)], out_shape), tmp_path, [x], out) == 0
    want = op.compute(out_shape, [x])
    np.testing.assert_array_equal(out, want)


def test_pooling_indices_reads_a_strided_input(tmp_path) -> None:  # noqa: ANN001
    from migraphx_ep.ir.shape import Shape

    nhwc = np.arange(2 * 4 * 5 * 3, dtype=np.float32)[::-1].copy().reshape(2, 4, 5, 3)
    x = nhwc.transpose(0, 3, 1, 2)  # NCHW dims over NHWC memory
    xs = Shape(shape(nhwc).type, x.shape, [s // 4 for s in x.strides])
    op = make_op("pooling_indices", lengths=[2, 2], stride=[1, 2], storage_order=1)
    out_shape = op.compute_shape([xs])
    out = np.zeros(out_shape.lens, np.int64)
    launch(K.kernel_for("k_pool_idx", op, [xs], out_shape), tmp_path, [nhwc], out)
    np.testing.assert_array_equal(out, op.compute(out_shape, [np.ascontiguousarray(x)]))


# -- Det ---------------------------------------------------------------------------------------------------
DET_EXACT = np.array(
    [
        [[0, 1, 0], [2, 3, 0], [0, 0, 1]],  # a row swap: the sign flips
        [[0, 1, 2], [0, 3, 4], [5, 6, 7]],  # a zero first pivot found further down
        [[1, 2, 3], [2, 4, 6], [1, 1, 1]],  # singular: an exact zero pivot later on gives 0
        [[0, 0, 1], [0, 0, 2], [3, 4, 5]],  # a zero column: getrf's info > 0
        [[4, -2, 1], [-2, 4, -2], [1, -2, 4]],
    ],
    np.float32,
)


def _det(tmp_path, x: np.ndarray, xs=None) -> tuple[np.ndarray, np.ndarray]:  # noqa: ANN001
    op = make_op("det")
    xs = xs or shape(x)
    out_shape = op.compute_shape([xs])
    out = np.full(out_shape.lens, 7, x.dtype)
    assert launch(K.kernel_for("k_det", op, [xs], out_shape), tmp_path, [x], out) == 0
    want = op.compute(out_shape, [np.ascontiguousarray(np.lib.stride_tricks.as_strided(x, xs.lens,
                      [s * x.itemsize for s in xs.strides]))])  # fmt: skip
    return out, want


def test_det_pivoting_and_singular_cases_are_exact(tmp_path) -> None:  # noqa: ANN001
    out, want = _det(tmp_path, DET_EXACT)
    np.testing.assert_array_equal(out, want)
    assert want.tolist() == [-2.0, -10.0, 0.0, 0.0, 36.0]
    assert not np.signbit(out[2:4]).any()  # numpy's 0 for a singular matrix, never a signed product


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_det_random(tmp_path, n: int, dtype) -> None:  # noqa: ANN001
    x = np.random.default_rng(n).standard_normal((2, 3, n, n)).astype(dtype)
    out, want = _det(tmp_path, x)
    tol = 1e-6 if dtype == np.float32 else 1e-13  # float32: factored in double, rounded once (as the ref)
    np.testing.assert_allclose(out, want, rtol=tol, atol=tol * max(1.0, float(np.abs(want).max())))


def test_det_of_one_matrix_and_a_transposed_view(tmp_path) -> None:  # noqa: ANN001
    from migraphx_ep.ir.shape import Shape

    out, want = _det(tmp_path, np.array([[0, 1], [2, 3]], np.float32))  # ONNX's test_det_2d: a scalar
    assert out.shape == () and out == want == -2
    x = np.random.default_rng(0).standard_normal((3, 4, 4)).astype(np.float32)
    xs = Shape(shape(x).type, (3, 4, 4), (16, 1, 4))  # each matrix transposed: the same determinant
    out, want = _det(tmp_path, x, xs)
    np.testing.assert_allclose(out, want, rtol=2e-5, atol=2e-5 * max(1.0, float(np.abs(want).max())))
    np.testing.assert_allclose(want, np.linalg.det(x), rtol=1e-5)


def test_det_too_large_is_refused() -> None:
    from migraphx_ep.ir.dtypes import DType
    from migraphx_ep.ir.shape import Shape

    assert "at most 32" in (K.supported(make_op("det"), [Shape(DType.float_type, (2, 33, 33))],
                                        Shape(DType.float_type, (2,))) or "")  # fmt: skip


# -- through the partitioner and the lowering (simulated), and NVRTC -----------------------------------
def _lowered_models(rng) -> list:  # noqa: ANN001
    from .decomposecheck import make_model, node

    x = rng.standard_normal((1, 2, 5, 5)).astype(np.float16)
    pool = node(
        "MaxPool", ["x"], ["y", "i"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], storage_order=1
    )
    det = {"m": rng.standard_normal((3, 2, 3, 3)).astype(np.float32)}
    return [
        (make_model([pool], {"x": x}, ["y", "i"], opset=12), {"x": x}),
        (make_model([node("Det", ["m"])], det), det),
    ]


def test_pool_indices_and_det_lower(rng) -> None:  # noqa: ANN001
    from .decomposecheck import check_decomposed

    for model, feeds in _lowered_models(rng):
        check_decomposed(model, feeds, [])


@pytest.mark.skipif(nvrtc.nvrtc_available() is not None, reason=str(nvrtc.nvrtc_available()))
def test_pool_indices_and_det_kernels_compile(rng) -> None:  # noqa: ANN001
    from .decomposecheck import check_decomposed, compile_kernels

    for model, feeds in _lowered_models(rng):
        assert compile_kernels(check_decomposed(model, feeds, [])) >= 1

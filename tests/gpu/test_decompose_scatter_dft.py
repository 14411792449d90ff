"""TensorScatter, MaxUnpool and DFT on the gpu target through their decompositions, checked against the
ref target without a GPU (``decomposecheck``)."""

from __future__ import annotations

import numpy as np
import pytest

from migraphx_ep.targets.gpu import nvrtc

from .decomposecheck import check_decomposed, compile_kernels, errors_alike, make_model, node
from .gpucheck import EXACT, F16, F64, normal


def _model(op: str, feeds: dict, outputs=("y",), opset: int = 21, **attrs):  # noqa: ANN001, ANN003, ANN202
    return make_model([node(op, list(feeds), outputs, **attrs)], feeds, outputs, opset=opset)


# -- TensorScatter -----------------------------------------------------------------------------------------
TENSOR_SCATTER = {
    # past dims, update dims, axis, mode, write indices
    "linear_4d": ((2, 3, 6, 4), (2, 3, 2, 4), -2, "linear", [1, 4]),
    "circular_wraps": ((3, 2, 5, 2), (3, 2, 3, 2), 2, "circular", [4, 0, 2]),
    "circular_index_past_end": ((2, 5, 3), (2, 2, 3), 1, "circular", [7, 5]),
    "axis_last": ((2, 3, 5), (2, 3, 2), -1, "linear", [3, 0]),
    "whole_axis": ((2, 4, 3), (2, 4, 3), 1, "linear", [0, 0]),
}


@pytest.mark.parametrize("name", list(TENSOR_SCATTER))
def test_tensor_scatter(rng, name: str) -> None:  # noqa: ANN001
    past, upd, axis, mode, w = TENSOR_SCATTER[name]
    feeds = {"past": normal(rng, past), "upd": normal(rng, upd), "w": np.array(w, np.int64)}
    model = _model("TensorScatter", feeds, opset=24, axis=axis, mode=mode)
    check_decomposed(model, feeds, ["tensor_scatter"], EXACT)


def test_tensor_scatter_without_indices_writes_at_zero(rng) -> None:  # noqa: ANN001
    feeds = {"past": normal(rng, (2, 4, 3), F16), "upd": normal(rng, (2, 3, 3), F16)}
    check_decomposed(_model("TensorScatter", feeds, opset=24, axis=1), feeds, ["tensor_scatter"], EXACT)


@pytest.mark.parametrize("mode,bad", [("linear", [0, 5]), ("linear", [-1, 0]), ("circular", [2, -3])])
def test_tensor_scatter_bad_index_raises_like_the_ref(rng, mode: str, bad: list[int]) -> None:  # noqa: ANN001
    feeds = {"past": normal(rng, (2, 6, 3)), "upd": normal(rng, (2, 2, 3)), "w": np.array([0, 0], np.int64)}
    model = _model("TensorScatter", feeds, opset=24, axis=1, mode=mode)
    errors_alike(model, {**feeds, "w": np.array(bad, np.int64)}, IndexError)


# -- MaxUnpool ---------------------------------------------------------------------------------------------
def unpool_indices() -> np.ndarray:
    """Flat indices into the whole (2, 3, 4, 6) output of (2, 3, 2, 3) values, one per 2x2 window."""
    return np.array([(k // 3) * 12 + (k % 3) * 2 + 7 * (k % 2) for k in range(36)], np.int64)


def test_max_unpool(rng) -> None:  # noqa: ANN001
    x = normal(rng, (2, 3, 2, 3))
    # plus a duplicate (the later value wins), one across planes and two outside the output (clipped
    # to its ends, as np.put does)
    idx = unpool_indices()
    idx[5], idx[20], idx[30], idx[31] = idx[4], 3, -9, 500
    feeds = {"x": x, "i": idx.reshape(x.shape)}
    model = _model("MaxUnpool", feeds, opset=11, kernel_shape=[2, 2], strides=[2, 2])
    check_decomposed(model, feeds, ["max_unpool"], EXACT)


def test_max_unpool_1d_with_pads_f64(rng) -> None:  # noqa: ANN001
    x = normal(rng, (1, 2, 4), F64)
    feeds = {"x": x, "i": np.array([[[0, 2, 4, 6], [7, 9, 11, 1]]], np.int64)}  # 2 * ((4-1)*2 - 2 + 3) = 14
    model = _model("MaxUnpool", feeds, opset=11, kernel_shape=[3], strides=[2], pads=[1, 1])
    check_decomposed(model, feeds, ["max_unpool"], EXACT)


# -- DFT ---------------------------------------------------------------------------------------------------
DFT = {
    # input dims, axis, attributes, dft_length (None: the axis size)
    "real": ((2, 8, 3, 1), 1, {}, None),
    "real_onesided_odd": ((2, 3, 9, 1), 2, {"onesided": 1}, None),
    "complex": ((2, 6, 3, 2), 1, {}, None),
    "irfft_even": ((2, 5, 3, 2), 1, {"inverse": 1, "onesided": 1}, 8),
    "irfft_odd": ((2, 3, 6, 2), 2, {"inverse": 1, "onesided": 1}, 9),
    "zero_padded": ((2, 5, 1), 1, {}, 8),
    "truncated_onesided": ((2, 3, 10, 1), 2, {"onesided": 1}, 7),
    "complex_axis0": ((7, 2, 2), 0, {}, None),
}


@pytest.mark.parametrize("name", list(DFT))
def test_dft(rng, name: str) -> None:  # noqa: ANN001
    lens, axis, attrs, length = DFT[name]
    feeds = {"x": normal(rng, lens)}
    inits = {"axis": np.array(axis, np.int64)}
    inputs = ["x", "" if length is None else "n", "axis"]
    if length is not None:
        inits["n"] = np.array(length, np.int64)
    model = make_model([node("DFT", inputs, **attrs)], feeds, inits=inits, opset=20)
    check_decomposed(model, feeds, ["dft"])


@pytest.mark.parametrize("dtype", [F16, F64], ids=["f16", "f64"])
def test_dft_types(rng, dtype) -> None:  # noqa: ANN001
    feeds = {"x": normal(rng, (2, 6, 2), dtype)}
    check_decomposed(_model("DFT", feeds, opset=19, axis=1), feeds, ["dft"])


def test_dft_complex_inverse_is_refused(rng) -> None:  # noqa: ANN001
    from migraphx_ep.ep.partition import partition
    from migraphx_ep.frontend import model_to_dict
    from migraphx_ep.targets.gpu.support import instruction_supported

    feeds = {"x": normal(rng, (3, 5, 2))}
    model = _model("DFT", feeds, opset=19, axis=1, inverse=1)
    (reason,) = partition(model_to_dict(model), instruction_supported).refused.values()
    assert "inverse complex dft" in reason


def test_dft_twiddles_are_exact_at_quarter_turns() -> None:
    from migraphx_ep.targets.gpu.decompose.signal import twiddles

    c, s = twiddles(8, 8, 8)
    m = np.outer(np.arange(8), np.arange(8)) % 8
    np.testing.assert_array_equal(c[m % 2 == 0], np.array([1, 0, -1, 0])[m[m % 2 == 0] // 2])
    np.testing.assert_array_equal(s[m % 2 == 0], np.array([0, 1, 0, -1])[m[m % 2 == 0] // 2])
    np.testing.assert_allclose(c, np.cos(2 * np.pi * m / 8), atol=1e-15)
    np.testing.assert_allclose(s, np.sin(2 * np.pi * m / 8), atol=1e-15)


def test_dft_too_large_is_refused() -> None:
    from migraphx_ep.ir.dtypes import DType
    from migraphx_ep.ir.module import Module
    from migraphx_ep.ir.operation import make_op
    from migraphx_ep.ir.shape import Shape
    from migraphx_ep.targets.gpu.support import instruction_supported

    m = Module()
    x = m.add_parameter("x", Shape(DType.float_type, (1, 2048, 2)))
    ins = m.add_instruction(make_op("dft", axis=1), [x])
    assert "matrix (over" in (instruction_supported(ins) or "")


@pytest.mark.skipif(nvrtc.nvrtc_available() is not None, reason=str(nvrtc.nvrtc_available()))
def test_decomposed_kernels_compile(rng) -> None:  # noqa: ANN001
    feeds = {"past": normal(rng, (2, 5, 3)), "upd": normal(rng, (2, 2, 3)), "w": np.array([4, 0], np.int64)}
    model = _model("TensorScatter", feeds, opset=24, axis=1, mode="circular")
    assert compile_kernels(check_decomposed(model, feeds, ["tensor_scatter"], EXACT)) >= 1
    feeds = {"x": normal(rng, (2, 3, 2, 3)), "i": unpool_indices().reshape(2, 3, 2, 3)}
    model = _model("MaxUnpool", feeds, opset=11, kernel_shape=[2, 2], strides=[2, 2])
    assert compile_kernels(check_decomposed(model, feeds, ["max_unpool"], EXACT)) >= 1
    feeds = {"x": normal(rng, (2, 5, 3, 2), F16)}
    model = _model("DFT", feeds, opset=19, axis=1, inverse=1, onesided=1)
    assert compile_kernels(check_decomposed(model, feeds, ["dft"])) >= 1

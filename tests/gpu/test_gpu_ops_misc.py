"""TensorScatter, MaxUnpool, DFT, MaxPool's Indices and Det on the device vs ref.

The same cases as ``test_decompose_scatter_dft`` and the host-compiled kernel tests (which check the
decompositions, the lowering and the kernels' code without a GPU); here the device runs them.
"""

from __future__ import annotations

import numpy as np
import pytest

from .gpucheck import EXACT, F16, F32, F64, FP32_SUM, check_nodes, check_op, node, normal, sum_tol
from .test_decompose_scatter_dft import unpool_indices

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("mode", ["linear", "circular"])
def test_tensor_scatter(gpu, rng, mode: str) -> None:  # noqa: ANN001
    # the second run reshuffles the write indices: both orders stay in range
    feeds = {"past": normal(rng, (2, 3, 6, 4)), "upd": normal(rng, (2, 3, 2, 4))}
    feeds["w"] = np.array([1, 4] if mode == "linear" else [5, 2], np.int64)
    check_op("TensorScatter", feeds, gpu, EXACT, opset=24, mode=mode)


def test_max_unpool(gpu, rng) -> None:  # noqa: ANN001
    x = normal(rng, (2, 3, 2, 3))
    idx = unpool_indices()
    check_op("MaxUnpool", {"x": x, "i": idx.reshape(x.shape)}, gpu, EXACT, opset=11, kernel_shape=[2, 2],
             strides=[2, 2])  # fmt: skip


@pytest.mark.parametrize(
    "lens,attrs",
    [((2, 8, 3, 1), {"axis": 1}), ((2, 6, 3, 2), {"axis": 1}), ((2, 3, 9, 1), {"axis": 2, "onesided": 1}),
     ((2, 5, 3, 2), {"axis": 1, "inverse": 1, "onesided": 1})],
    ids=["real", "complex", "rfft", "irfft"],
)  # fmt: skip
def test_dft(gpu, rng, lens: tuple[int, ...], attrs: dict) -> None:  # noqa: ANN001
    check_op("DFT", {"x": normal(rng, lens)}, gpu, FP32_SUM, opset=19, **attrs)


@pytest.mark.parametrize("dtype", [F16, F64], ids=["f16", "f64"])
def test_dft_types(gpu, rng, dtype) -> None:  # noqa: ANN001
    check_op("DFT", {"x": normal(rng, (2, 6, 2), dtype)}, gpu, sum_tol(dtype), opset=19, axis=1)


def test_dft_zero_padded(gpu, rng) -> None:  # noqa: ANN001
    feeds = {"x": normal(rng, (2, 5, 1))}
    nodes = [node("DFT", ["x", "n"], onesided=1, axis=1)]
    check_nodes(nodes, feeds, gpu, FP32_SUM, inits={"n": np.array(8, np.int64)}, opset=19)


@pytest.mark.parametrize("order", [0, 1])
@pytest.mark.parametrize("dtype", [F32, F16, F64], ids=["f32", "f16", "f64"])
def test_max_pool_indices(gpu, rng, dtype, order: int) -> None:  # noqa: ANN001
    # small integers: ties, where the first maximum must win; NaN never wins
    x = rng.integers(-3, 4, (2, 3, 7, 8)).astype(dtype)
    x.reshape(-1)[::7] = np.nan
    attrs = {"kernel_shape": [3, 2], "strides": [2, 2], "dilations": [2, 1], "pads": [2, 1, 1, 1]}
    nodes = [node("MaxPool", ["x"], ["y", "i"], storage_order=order, ceil_mode=1, **attrs)]
    check_nodes(nodes, {"x": x}, gpu, EXACT, outputs=["y", "i"], opset=12)


def test_max_pool_indices_3d(gpu, rng) -> None:  # noqa: ANN001
    x = rng.integers(-5, 6, (1, 2, 4, 5, 6)).astype(F32)
    nodes = [node("MaxPool", ["x"], ["y", "i"], kernel_shape=[2, 2, 3], pads=[1, 0, 1, 0, 1, 1])]
    check_nodes(nodes, {"x": x}, gpu, EXACT, outputs=["y", "i"], opset=12)


@pytest.mark.parametrize("dtype", [F32, F16, F64], ids=["f32", "f16", "f64"])
def test_det(gpu, rng, dtype) -> None:  # noqa: ANN001
    for lens in ((2, 3, 3, 3), (4, 5, 5), (2, 2), (3, 1, 1)):
        check_op("Det", {"x": normal(rng, lens, dtype)}, gpu, sum_tol(dtype))


def test_det_pivoting_and_singular(gpu) -> None:  # noqa: ANN001
    from .test_kernel_host_pool_det import DET_EXACT

    # a reshuffle of these is no longer singular or integer-valued: the tolerance covers both runs
    check_op("Det", {"x": DET_EXACT}, gpu, FP32_SUM)

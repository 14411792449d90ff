"""Window functions, MelWeightMatrix, DFT and STFT vs ORT CPU and numpy."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from migraphx_ep.frontend import ParseError
from migraphx_ep.ir.dtypes import DType
from migraphx_ep.ir.shape import Shape
from migraphx_ep.ops.signal import Dft, Stft, Window
from opcheck import check_node, make_model, run_ours

RNG = np.random.default_rng(11)


def rand(*lens: int, dtype=np.float32) -> np.ndarray:
    return RNG.standard_normal(lens).astype(dtype)


def i64(v: int) -> np.ndarray:
    return np.array(v, np.int64)


@pytest.mark.parametrize("op", ["HannWindow", "HammingWindow", "BlackmanWindow"])
@pytest.mark.parametrize("periodic", [0, 1])
@pytest.mark.parametrize("otype", [TensorProto.FLOAT, TensorProto.DOUBLE])
def test_window_vs_ort(op, periodic, otype):
    node = helper.make_node(op, ["size"], ["y"], periodic=periodic, output_datatype=otype)
    check_node(node, {}, opset=17, initializers={"size": np.array(10, np.int32)}, rtol=1e-6, atol=1e-7)


def test_window_vs_numpy():
    w = Window(kind="hann", size=8, periodic=False)
    np.testing.assert_allclose(w.compute(w.compute_shape([]), []), np.hanning(8), atol=1e-7)
    b = Window(kind="blackman", size=9, periodic=False, out_type=DType.double_type)
    np.testing.assert_allclose(b.compute(b.compute_shape([]), []), np.blackman(9), atol=1e-15)


def test_window_runtime_size_refused():
    node = helper.make_node("HannWindow", ["size"], ["y"])
    m = make_model(node, {"size": np.array(4, np.int32)}, opset=17)
    with pytest.raises(ParseError, match="compile-time constant"):
        run_ours(m, {"size": np.array(4, np.int32)})


def test_mel_weight_matrix_vs_ort():
    node = helper.make_node("MelWeightMatrix", ["n", "d", "sr", "lo", "hi"], ["y"])
    inits = {
        "n": np.array(8, np.int32),
        "d": np.array(64, np.int32),
        "sr": np.array(8000, np.int32),
        "lo": np.array(50.0, np.float32),
        "hi": np.array(3900.0, np.float32),
    }
    check_node(node, {}, opset=17, initializers=inits)


DFT_CASES = [
    # (name, input dims, attrs, dft_length, axis)
    ("real", (2, 6, 3, 1), {}, None, 1),
    ("complex", (2, 6, 3, 2), {}, None, 1),
    ("axis2", (2, 6, 3, 2), {}, None, 2),
    ("neg_axis", (2, 6, 3, 2), {}, None, -3),
    ("pad_len", (2, 5, 3, 1), {}, 8, 1),
    ("trunc_len", (2, 6, 3, 2), {}, 4, 1),
    ("rfft", (2, 7, 3, 1), dict(onesided=1), None, 1),
    ("rfft_len", (2, 7, 3, 1), dict(onesided=1), 9, 1),
    ("inverse", (2, 6, 3, 2), dict(inverse=1), None, 1),
    ("inverse_real", (2, 6, 3, 1), dict(inverse=1), None, 2),
    ("irfft", (2, 4, 3, 2), dict(inverse=1, onesided=1), None, 1),
    ("irfft_len", (2, 4, 3, 2), dict(inverse=1, onesided=1), 7, 1),
]


@pytest.mark.parametrize("name,dims,attrs,length,axis", DFT_CASES, ids=[c[0] for c in DFT_CASES])
@pytest.mark.parametrize("opset", [17, 20])
def test_dft_vs_ort(name, dims, attrs, length, axis, opset):
    x = rand(*dims)
    inits: dict[str, np.ndarray] = {}
    names = ["x", "n" if length else ""]
    if length:
        inits["n"] = i64(length)
    if opset >= 20:
        names.append("a")
        inits["a"] = i64(axis)
    else:
        attrs = {**attrs, "axis": axis}
    if name == "irfft":
        # a consistent one-sided spectrum (real DC/Nyquist), so every implementation agrees
        c = np.fft.rfft(rand(2, 6, 3), axis=1)
        x = np.stack((c.real, c.imag), -1).astype(np.float32)
    node = helper.make_node("DFT", names, ["y"], **attrs)
    check_node(node, {"x": x}, opset=opset, initializers=inits, rtol=1e-4, atol=1e-4)


def test_dft_double_and_half():
    for dt, tol in ((np.float64, 1e-12), (np.float16, 2e-2)):
        check_node(
            helper.make_node("DFT", ["x"], ["y"], axis=1),
            {"x": rand(1, 8, 2, 2, dtype=dt)},
            opset=17,
            rtol=tol,
            atol=tol,
        )


def test_dft_vs_numpy():
    x = rand(3, 5, 2)
    op = Dft(axis=1, length=8)
    y = op.compute(op.compute_shape([Shape.of(x)]), [x])
    want = np.fft.fft(x[..., 0] + 1j * x[..., 1], n=8, axis=1)
    np.testing.assert_allclose(y[..., 0] + 1j * y[..., 1], want, rtol=1e-5, atol=1e-5)


def test_irfft_missing_bins_refused():
    node = helper.make_node("DFT", ["x", "n"], ["y"], axis=1, onesided=1, inverse=1)
    m = make_model(node, {"x": rand(1, 4, 3, 2)}, opset=17, initializers={"n": i64(8)})
    with pytest.raises(ParseError, match="bins"):
        run_ours(m, {"x": rand(1, 4, 3, 2)})


def test_dft_onesided_complex_refused():
    node = helper.make_node("DFT", ["x"], ["y"], axis=1, onesided=1)
    m = make_model(node, {"x": rand(1, 4, 3, 2)}, opset=17)
    with pytest.raises(ParseError, match="one-sided"):
        run_ours(m, {"x": rand(1, 4, 3, 2)})


@pytest.mark.parametrize("window,onesided", [(False, 1), (True, 1), (True, 0)])
def test_stft_vs_ort(window, onesided):
    x = rand(2, 40, 1)
    inits = {"step": i64(6)}
    names = ["x", "step"]
    if window:
        inits["w"] = np.hanning(10).astype(np.float32)
        names.append("w")
    else:
        inits["fl"] = i64(10)
        names += ["", "fl"]
    node = helper.make_node("STFT", names, ["y"], onesided=onesided)
    check_node(node, {"x": x}, opset=17, initializers=inits, rtol=1e-4, atol=1e-4)


def test_stft_vs_numpy():
    x = rand(1, 20, 1)
    op = Stft(frame_step=5, frame_length=8, onesided=True)
    y = op.compute(op.compute_shape([Shape.of(x)]), [x])
    frames = np.stack([x[0, i * 5 : i * 5 + 8, 0] for i in range(3)])
    want = np.fft.rfft(frames, axis=-1)
    assert y.shape == (1, 3, 5, 2)
    np.testing.assert_allclose(y[0, ..., 0] + 1j * y[0, ..., 1], want, rtol=1e-5, atol=1e-5)

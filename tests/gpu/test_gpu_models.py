"""Whole models through onnxruntime on the gpu target vs ORT's CPU EP: every node on our EP, accuracy with
TF32 off / on and in fp16, concurrent runs, the model cache, device_id errors, and 'auto' picking gpu."""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto

import migraphx_ep  # noqa: F401 - registers and routes the EP
from conftest import make_model, node_providers, profiled_options, tensor
from migraphx_ep.testing import light_input, light_model
from test_models_ep import FIXTURES, MODELS, feeds_for

pytestmark = pytest.mark.gpu

EP = "MIGraphXExecutionProvider"
GPU = {"migraphx_target": "gpu"}
TF32_OFF = {**GPU, "migraphx_tf32_enable": "0"}
FP32_MODELS = [f for f in FIXTURES if not f.endswith("_fp16")]
FP16_MODELS = [f for f in FIXTURES if f.endswith("_fp16")]
LIGHT = ["resnet50", "squeezenet"]  # real-size convolutional nets (224 x 224), random weights


@pytest.fixture(autouse=True)
def no_env_overrides(monkeypatch):
    """ORT_MIGRAPHX_* variables win over provider options: keep the machine's own out of these tests."""
    for k in list(os.environ):
        if k.startswith("ORT_MIGRAPHX_"):
            monkeypatch.delenv(k)


def load(name: str) -> onnx.ModelProto:
    return onnx.load(os.path.join(MODELS, f"{name}.onnx"))


def session(blob: bytes, options: dict, profile: bool = True) -> ort.InferenceSession:
    so = profiled_options() if profile else ort.SessionOptions()
    return ort.InferenceSession(blob, so, providers=[(EP, options), "CPUExecutionProvider"])


def cpu(blob: bytes, feeds: dict) -> list[np.ndarray]:
    return ort.InferenceSession(blob, providers=["CPUExecutionProvider"]).run(None, feeds)


def assert_outputs(got: list, want: list, rtol: float, atol: float) -> None:
    """``atol`` is a fraction of each output's largest magnitude: ResNet-50's random-weight softmax
    outputs are all ~1e-3, where a plain 1e-4 would let a 5% error through."""
    assert len(got) == len(want)
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g.dtype == w.dtype and g.shape == w.shape, (k, g.dtype, w.dtype, g.shape, w.shape)
        w64 = w.astype(np.float64)
        scale = float(np.abs(w64).max()) if w64.size else 0.0
        np.testing.assert_allclose(
            g.astype(np.float64), w64, rtol=rtol, atol=atol * scale, err_msg=f"output {k}"
        )


def assert_all_on_ep(placed: dict[str, str]) -> None:
    off = sorted(k for k, v in placed.items() if v != EP)
    assert placed and not off, f"{len(off)} of {len(placed)} node events not on {EP}: {off[:20]}"


def run_on_gpu(model: onnx.ModelProto, feeds: dict, options: dict, rtol: float, atol: float) -> None:
    blob = model.SerializeToString()
    s = session(blob, options)
    got = s.run(None, feeds)
    assert_all_on_ep(node_providers(s))
    assert_outputs(got, cpu(blob, feeds), rtol, atol)


@pytest.mark.parametrize("name", FP32_MODELS)
def test_fp32_model_tf32_off(name):
    model = load(name)
    run_on_gpu(model, feeds_for(model, batch=2, seq=9), TF32_OFF, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("name", LIGHT)
def test_light_model_tf32_off(name):
    model = light_model(name)
    run_on_gpu(model, light_input(model), TF32_OFF, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("name", FP32_MODELS)
def test_fp32_model_tf32_on(name):
    model = load(name)
    options = {**GPU, "migraphx_tf32_enable": "1"}
    run_on_gpu(model, feeds_for(model, batch=2, seq=9), options, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("name", FP16_MODELS)
def test_fp16_model(name):
    model = load(name)
    run_on_gpu(model, feeds_for(model, batch=2, seq=9), GPU, rtol=2e-2, atol=2e-2)


def long_k_matmul() -> tuple[bytes, dict]:
    # K = 4096 and values off TF32's 10-bit grid: TF32 is ~1e-3 off here, float32 ~1e-6.
    rng = np.random.default_rng(3)
    k = 4096
    w = (rng.standard_normal((k, 64)) * k**-0.5 + 1.0 / k).astype(np.float32)
    nodes = [onnx.helper.make_node("MatMul", ["x", "w"], ["y"])]
    inits = [onnx.numpy_helper.from_array(w, "w")]
    blob = make_model(
        nodes, [tensor("x", TensorProto.FLOAT, [64, k])], [tensor("y", TensorProto.FLOAT, [64, 64])], inits
    )
    return blob, {"x": (rng.standard_normal((64, k)) + 1.0).astype(np.float32)}


@pytest.mark.parametrize("how", ["option", "env"])
def test_tf32_off_gives_float32_accuracy(monkeypatch, how):
    options = TF32_OFF
    if how == "env":  # the variable wins over the option, as every ORT_MIGRAPHX_* does
        monkeypatch.setenv("ORT_MIGRAPHX_TF32_ENABLE", "0")
        options = {**GPU, "migraphx_tf32_enable": "1"}
    blob, feeds = long_k_matmul()
    got = session(blob, options, profile=False).run(None, feeds)[0]
    want = cpu(blob, feeds)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_concurrent_runs_on_one_session():
    # 4 threads x 20 runs on one session, each run its own input and batch 1 or 2 (new shapes compile
    # while other threads run); every result is checked against ORT CPU on the same input.
    model = load("bert")
    blob = model.SerializeToString()
    jobs = [(t, i) for t in range(4) for i in range(20)]
    feeds = {(t, i): feeds_for(model, batch=1 + i % 2, seq=9, seed=100 * t + i) for t, i in jobs}
    reference = ort.InferenceSession(blob, providers=["CPUExecutionProvider"])
    want = {job: reference.run(None, f) for job, f in feeds.items()}
    s = session(blob, TF32_OFF, profile=False)
    start = threading.Barrier(4)

    def worker(t: int) -> list:
        start.wait()
        return [((t, i), s.run(None, feeds[(t, i)])) for i in range(20)]

    with ThreadPoolExecutor(4) as pool:
        results = [r for rs in pool.map(worker, range(4)) for r in rs]
    assert len(results) == len(jobs)
    for job, got in results:
        assert_outputs(got, want[job], rtol=1e-3, atol=1e-4)


def test_model_cache_second_session_compiles_nothing(tmp_path, recording):
    model = load("resnet")  # convolutions and a GEMM: the saved program carries their plans
    blob = model.SerializeToString()
    feeds = feeds_for(model, batch=2, seq=9)
    options = {**TF32_OFF, "migraphx_model_cache_dir": str(tmp_path)}
    first = session(blob, options, profile=False).run(None, feeds)
    compiled = sum(c.compiles for ep in recording.eps for c in ep.compiled)
    files = sorted(tmp_path.glob("*.mxr"))
    assert compiled >= 1 and len(files) == compiled
    n = len(recording.eps)
    again = session(blob, options, profile=False).run(None, feeds)
    second = recording.eps[n:]
    assert second and all(ep.target_name == "gpu" for ep in second)
    subgraphs = [c for ep in second for c in ep.compiled]
    assert sum(c.compiles for c in subgraphs) == 0, "the second session compiled instead of loading"
    assert sum(c.loads for c in subgraphs) == compiled
    assert all(p.target_name == "gpu" for c in subgraphs for p in c.programs.values())
    assert sorted(tmp_path.glob("*.mxr")) == files
    assert_outputs(again, first, rtol=1e-6, atol=1e-7)  # the same program: the same numbers
    assert_outputs(again, cpu(blob, feeds), rtol=1e-3, atol=1e-4)


def test_bad_device_id_is_a_clear_error():
    model = load("resnet")
    with pytest.raises(Exception, match="device_id") as err:
        s = session(model.SerializeToString(), {**GPU, "device_id": "99"}, profile=False)
        s.run(None, feeds_for(model, batch=1, seq=9))  # in case the error waits for the first compile
    assert "99" in str(err.value)


def test_auto_target_picks_gpu(recording):
    model = load("resnet")
    blob = model.SerializeToString()
    feeds = feeds_for(model, batch=2, seq=9)
    s = ort.InferenceSession(blob, profiled_options(), providers=[EP, "CPUExecutionProvider"])
    got = s.run(None, feeds)
    assert recording.eps and {ep.target_name for ep in recording.eps} == {"gpu"}
    assert_all_on_ep(node_providers(s))
    assert_outputs(got, cpu(blob, feeds), rtol=2e-2, atol=2e-2)  # TF32 is on by default

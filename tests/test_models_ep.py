"""Whole models through onnxruntime with the EP: every node placed on it, outputs as ORT's CPU EP's.

The PyTorch-exported fixtures (tests/models) and ONNX's bundled "light" model-zoo graphs, the latter
with random weights (their shipped weights are constant placeholders).
"""

from __future__ import annotations

import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import migraphx_ep  # noqa: F401 - registers and routes the EP
from conftest import node_providers, profiled_options
from migraphx_ep.testing import LIGHT_MODELS, light_expected_output, light_input, light_model

EP = "MIGraphXExecutionProvider"
MODELS = os.path.join(os.path.dirname(__file__), "models")


def feeds_for(model: onnx.ModelProto, batch: int, seq: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for vi in model.graph.input:
        tt = vi.type.tensor_type
        dims = [
            d.dim_value if d.HasField("dim_value") else (batch if i == 0 else seq)
            for i, d in enumerate(tt.shape.dim)
        ]
        dt = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)
        if "mask" in vi.name:
            m = np.ones(dims, dt)
            m[..., -2:] = 0
            out[vi.name] = m
        elif dt.kind in "iu":
            high = 2 if "type" in vi.name else 100  # token types are 0/1; ids stay inside the tiny vocab
            out[vi.name] = rng.integers(0, high, size=dims).astype(dt)
        else:
            out[vi.name] = rng.standard_normal(dims).astype(dt)
    return out


def run_both(blob: bytes, feeds: dict) -> tuple[list, list, dict]:
    want = ort.InferenceSession(blob, providers=["CPUExecutionProvider"]).run(None, feeds)
    s = ort.InferenceSession(
        blob, profiled_options(), providers=[(EP, {"migraphx_target": "ref"}), "CPUExecutionProvider"]
    )
    got = s.run(None, feeds)
    return got, want, node_providers(s)


FIXTURES = sorted(f[:-5] for f in os.listdir(MODELS) if f.endswith(".onnx"))


@pytest.mark.parametrize("name", FIXTURES)
def test_exported_model(name):
    model = onnx.load(os.path.join(MODELS, f"{name}.onnx"))
    fp16 = name.endswith("_fp16")
    got, want, placed = run_both(model.SerializeToString(), feeds_for(model, batch=2, seq=9))
    assert set(placed.values()) == {EP}, placed
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        # fp16: both runtimes round differently inside (ORT fuses, we round per op); fp32 is tight.
        np.testing.assert_allclose(
            g.astype(np.float64),
            w.astype(np.float64),
            rtol=2e-2 if fp16 else 1e-4,
            atol=2e-2 if fp16 else 1e-5,
        )


@pytest.mark.parametrize("name", LIGHT_MODELS)
def test_light_model_random_weights(name):
    model = light_model(name)
    got, want, placed = run_both(model.SerializeToString(), light_input(model))
    assert set(placed.values()) == {EP}, placed
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["squeezenet"])
def test_light_model_shipped_weights_and_output(name):
    # The shipped graph (ConstantOfShape weights) and its shipped expected output. Not AlexNet: its
    # constant weights drive the logits to ~3e10, where a float32 ulp is ~4096, so any change of
    # summation order (another BLAS build) turns the uniform softmax into a peaked one.
    model = light_model(name, randomize=False)
    feeds = {k: np.zeros_like(v) for k, v in light_input(model).items()}
    got, _, placed = run_both(model.SerializeToString(), feeds)
    assert set(placed.values()) == {EP}
    np.testing.assert_allclose(got[0], light_expected_output(name), rtol=1e-3, atol=1e-6)

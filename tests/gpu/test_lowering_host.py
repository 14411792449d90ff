"""Lowered programs with every generated kernel run on the host (``hostblock.py``: one block of fibers
with real barriers and shuffles) and GEMMs / convolutions by the numpy step simulator, vs the ref
target, each at two input shapes: what a new shape runs on the gpu target, without a GPU.

The second shape reuses the first one's kernel sources (``test_shape_reuse``), so this also checks that
the run-time sizes each kernel receives (``KernelSpec.args``) describe the new shape correctly.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto

from migraphx_ep.frontend.graph import model_to_dict
from migraphx_ep.frontend.parser import parse_graph
from migraphx_ep.ir.dtypes import DType, from_numpy, from_onnx
from migraphx_ep.ir.shape import Shape
from migraphx_ep.passes import run_passes
from migraphx_ep.targets import get_target
from migraphx_ep.targets.gpu import simulate
from migraphx_ep.targets.gpu.decompose import gpu_pipeline
from migraphx_ep.targets.gpu.errors import device_error
from migraphx_ep.targets.gpu.kernels.headers import expand
from migraphx_ep.targets.gpu.kernels.spec import canonical
from migraphx_ep.targets.gpu.layout import layout_convolution
from migraphx_ep.targets.gpu.lowering import lower
from migraphx_ep.targets.gpu.steps import Buf, KernelStep

from .hostblock import HAVE_GXX, launch
from .test_shape_reuse import load, pooling_net

pytestmark = pytest.mark.skipif(not HAVE_GXX, reason="no g++ to build kernels for the host")


def address(mem: simulate.Memory, b: Buf) -> int:
    base = mem.weights if b.storage.kind == "weight" else mem.arena
    return base.ctypes.data + b.storage.offset + b.offset


def runs_here(spec) -> bool:
    """What the fiber shim models: static shared memory, block barriers, full-warp shuffles (kernels
    with dynamic shared memory or ``__syncwarp``, such as fused attention, stay with the simulator)."""
    text = expand(spec.source)  # with the headers' code: a header may hold the __syncwarp
    return not spec.shared_bytes and "__syncwarp" not in text and "extern __shared__" not in text


@pytest.fixture(scope="module")
def kdir(tmp_path_factory):
    """One build folder for the module: a kernel source is compiled once, whichever test meets it."""
    return tmp_path_factory.mktemp("kernels")


@pytest.fixture
def host_kernels(monkeypatch, kdir):
    """The step simulator with kernel steps running their generated source on the host."""
    numpy_step = simulate._step

    def step(s, mem: simulate.Memory) -> None:
        if not isinstance(s, KernelStep) or not runs_here(s.spec):
            return numpy_step(s, mem)
        if all(b.shape.elements() == 0 for b in s.writes):
            return None  # the executable launches nothing either
        err = np.zeros(1, np.int32)
        ptrs = [address(mem, b) for b in (*s.reads, *s.writes)] + ([err.ctypes.data] if s.spec.checks else [])
        launch(canonical(s.spec), kdir, ptrs)
        if err[0]:
            raise device_error(s.spec, int(err[0]))
        return None

    monkeypatch.setattr(simulate, "_step", step)
    monkeypatch.setenv("MIGRAPHX_EP_RUNTIME_SIZES", "1")


def check(model: onnx.ModelProto, feeds: dict[str, np.ndarray], nhwc: bool | None, tol: float) -> None:
    g = model_to_dict(model)
    shapes = {k: Shape(from_numpy(v.dtype), v.shape) for k, v in feeds.items()}
    ref = parse_graph(g, shapes).program
    ref.compile(get_target("ref"))
    m = parse_graph(g, shapes, specialize=True).program.get_main_module()
    run_passes(m, [p for p in gpu_pipeline() if p.name != "layout_convolution"])
    layout_convolution(m, mode=None if nhwc is None else str(int(nhwc)))
    low = lower(m, True, True)
    assert any(isinstance(s, KernelStep) and runs_here(s.spec) for s in low.steps)
    for got, want in zip(simulate.run_steps(low, feeds), ref.run_numpy(feeds), strict=True):
        assert got.shape == want.shape and got.dtype == want.dtype
        w = want.astype(np.float64)
        scale = max(1.0, float(np.abs(w[np.isfinite(w)]).max())) if w.size else 1.0
        np.testing.assert_allclose(got.astype(np.float64), w, rtol=tol, atol=tol * scale)


def token_feeds(model: onnx.ModelProto, rng, batch: int, seq: int) -> dict[str, np.ndarray]:
    feeds = {}
    for i in model.graph.input:
        if i.name == "attention_mask":
            feeds[i.name] = (rng.uniform(size=(batch, seq)) < 0.8).astype(np.int64)
            feeds[i.name][:, 0] = 1
        else:
            feeds[i.name] = rng.integers(0, 2 if "type" in i.name else 100, (batch, seq), dtype=np.int64)
    return feeds


@pytest.mark.parametrize("name", ["bert", "gpt2", "bert_fp16", "bert_opset14"])
def test_transformer_at_two_shapes(host_kernels, rng, name):
    model = load(name)
    for batch, seq in [(2, 16), (3, 24)]:
        check(model, token_feeds(model, rng, batch, seq), None, 2e-2 if "fp16" in name else 1e-4)


@pytest.mark.parametrize("nhwc", [False, True], ids=["nchw", "nhwc"])
@pytest.mark.parametrize("name", ["resnet", "mobilenet_v2_fp16"])
def test_cnn_at_two_image_sizes(host_kernels, rng, name, nhwc):
    model = load(name, free_image=True)
    dt = np.float16 if "fp16" in name else np.float32
    for lens in [(2, 3, 64, 64), (3, 3, 80, 96)]:
        x = rng.standard_normal(lens).astype(dt)
        check(model, {"pixel_values": x}, nhwc, 2e-2 if dt == np.float16 else 1e-4)


@pytest.mark.parametrize("nhwc", [False, True], ids=["nchw", "nhwc"])
@pytest.mark.parametrize("dtype", [TensorProto.FLOAT, TensorProto.FLOAT16], ids=["f32", "f16"])
def test_pooling_net_at_two_image_sizes(host_kernels, rng, dtype, nhwc):
    dt = np.float16 if from_onnx(dtype) == DType.half_type else np.float32
    for lens in [(2, 3, 32, 48), (3, 3, 40, 22)]:
        x = rng.standard_normal(lens).astype(dt)
        check(pooling_net(dtype), {"x": x}, nhwc, 2e-2 if dt == np.float16 else 1e-4)

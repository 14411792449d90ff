"""With run-time kernel sizes (the default; MIGRAPHX_EP_RUNTIME_SIZES=0 turns them off) a new input
shape compiles no kernels (codegen level, no GPU): the lowered program at a second shape has the same
kernel sources (under the one symbol ``canonical`` gives them) as at the first. Row kernels (softmax,
layer norm), reductions and global pools take their sizes as arguments and keep only a size class in
the source; resize reads its coordinate tables from an input.

What still differs between two shapes is structure, not size: a dim that becomes 1 (batch 1) drops out
of the collapsed loops, and a size class changes the schedule (rows of <= 16 elements get a thread
each, softmax rows of <= 256 share a warp...). The shapes below stay within one class."""

from __future__ import annotations

import collections
import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from migraphx_ep.frontend.graph import model_to_dict
from migraphx_ep.frontend.parser import parse_graph
from migraphx_ep.ir.dtypes import from_onnx
from migraphx_ep.ir.shape import Shape
from migraphx_ep.passes import run_passes
from migraphx_ep.targets.gpu.decompose import gpu_pipeline
from migraphx_ep.targets.gpu.kernels.spec import canonical
from migraphx_ep.targets.gpu.layout import layout_convolution
from migraphx_ep.targets.gpu.lowering import lower
from migraphx_ep.targets.gpu.steps import KernelStep

MODELS = os.path.join(os.path.dirname(__file__), "..", "models")


def bodies(
    model: onnx.ModelProto, lens: dict[str, tuple[int, ...]], nhwc: bool | None = None
) -> dict[str, str]:
    """canonical kernel source -> kind, for ``model`` lowered with inputs of ``lens``."""
    g = model_to_dict(model)
    shapes = {n: Shape(from_onnx(g["values"][n]["dtype"]), lens[n]) for n in g["inputs"]}
    m = parse_graph(g, shapes, specialize=True).program.get_main_module()
    run_passes(m, [p for p in gpu_pipeline() if p.name != "layout_convolution"])
    layout_convolution(m, mode=None if nhwc is None else str(int(nhwc)))
    out = {}
    for s in lower(m, True, True).steps:
        if isinstance(s, KernelStep):
            kind = s.op.name if s.op is not None else s.label.split()[0]
            out[canonical(s.spec).source] = "pointwise" if s.expr is not None else kind
    return out


def new_kinds(model, first: dict, second: dict, nhwc: bool | None = None) -> collections.Counter:
    seen = bodies(model, first, nhwc)
    return collections.Counter(k for src, k in bodies(model, second, nhwc).items() if src not in seen)


def load(name: str, free_image: bool = False) -> onnx.ModelProto:
    """A test model; with ``free_image`` its image's height and width become symbolic (the exports fix
    them at 32), and the recorded intermediate shapes are dropped."""
    m = onnx.load(os.path.join(MODELS, f"{name}.onnx"))
    if free_image:
        m.graph.ClearField("value_info")
        for d, p in zip(m.graph.input[0].type.tensor_type.shape.dim[2:], ("height", "width"), strict=True):
            d.dim_param = p
    return m


def token_lens(name: str, batch: int, sequence: int) -> dict[str, tuple[int, ...]]:
    g = model_to_dict(load(name))
    return {n: (batch, sequence) for n in g["inputs"]}


@pytest.fixture(autouse=True)
def runtime_sizes(monkeypatch):
    monkeypatch.setenv("MIGRAPHX_EP_RUNTIME_SIZES", "1")


def test_cnn_new_batch_compiles_nothing():
    m = load("resnet")
    assert (
        new_kinds(m, {"pixel_values": (2, 3, 32, 32)}, {"pixel_values": (5, 3, 32, 32)})
        == collections.Counter()
    )


@pytest.mark.parametrize("name", ["bert", "gpt2", "bert_fp16", "gpt2_fp16", "bert_opset14"])
@pytest.mark.parametrize("shapes", [((2, 16), (3, 24)), ((2, 20), (4, 31)), ((1, 9), (1, 13))], ids=str)
def test_transformer_new_shape_compiles_nothing(name, shapes):
    # (Sequences under 16 and over 16 differ in one pointwise size class: transposes of 16+ take tiles.)
    (b1, s1), (b2, s2) = shapes
    new = new_kinds(load(name), token_lens(name, b1, s1), token_lens(name, b2, s2))
    assert new == collections.Counter(), new


@pytest.mark.parametrize("nhwc", [False, True], ids=["nchw", "nhwc"])
@pytest.mark.parametrize("name", ["resnet", "resnet_fp16", "mobilenet_v2", "mobilenet_v2_fp16"])
def test_cnn_new_image_size_compiles_nothing(name, nhwc):
    # Final maps 8x8 and 10x12: global pools of the same class (more than 16 positions).
    first, second = {"pixel_values": (2, 3, 64, 64)}, {"pixel_values": (3, 3, 80, 96)}
    assert new_kinds(load(name, free_image=True), first, second, nhwc) == collections.Counter()


def pooling_net(dtype: int) -> onnx.ModelProto:
    """A detector-like net: conv, max pool, squeeze-excite (global average pool), linear and nearest
    upsampling back to full size, then global max / lp pools and a ReduceMean over H, W."""
    rng = np.random.default_rng(0)
    np_t = helper.tensor_dtype_to_np_dtype(dtype)

    def init(name: str, *shape: int) -> onnx.TensorProto:
        return numpy_helper.from_array(rng.standard_normal(shape).astype(np_t), name)

    n = helper.make_node
    nodes = [
        n("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
        n("Relu", ["c1"], ["r1"]),
        n("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        n("GlobalAveragePool", ["p1"], ["g"]),
        n("Conv", ["g", "w2"], ["s"]),
        n("Sigmoid", ["s"], ["sg"]),
        n("Mul", ["p1", "sg"], ["se"]),
        n("Resize", ["se", "", "up_scales"], ["up"], mode="linear"),
        n("Resize", ["p1", "", "up_scales"], ["near"], mode="nearest", nearest_mode="floor"),
        n("Add", ["up", "r1"], ["a0"]),
        n("Add", ["a0", "near"], ["a"]),
        n("GlobalMaxPool", ["a"], ["gm"]),
        n("GlobalLpPool", ["a"], ["gl"], p=2),
        n("ReduceMean", ["a", "hw"], ["rm"], keepdims=1),
    ]
    inits = [init("w1", 8, 3, 3, 3), init("w2", 8, 8, 1, 1),
             numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "up_scales"),
             numpy_helper.from_array(np.array([2, 3], np.int64), "hw")]  # fmt: skip
    x = helper.make_tensor_value_info("x", dtype, ["batch", 3, "height", "width"])
    outs = [helper.make_value_info(o, onnx.TypeProto()) for o in ("gm", "gl", "rm")]
    g = helper.make_graph(nodes, "pooling_net", [x], outs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])


@pytest.mark.parametrize("nhwc", [False, True], ids=["nchw", "nhwc"])
@pytest.mark.parametrize("dtype", [TensorProto.FLOAT, TensorProto.FLOAT16], ids=["f32", "f16"])
def test_global_pools_and_resize_new_image_size_compile_nothing(dtype, nhwc):
    m = pooling_net(dtype)
    first = bodies(m, {"x": (2, 3, 32, 48)}, nhwc)
    kinds = collections.Counter(first.values())
    assert kinds["pooling"] >= 3 and kinds["resize"] == 2 and kinds["reduce_mean"] == 1, kinds
    for lens in [(3, 3, 40, 24), (2, 3, 64, 34), (4, 3, 18, 58)]:
        new = collections.Counter(k for s, k in bodies(m, {"x": lens}, nhwc).items() if s not in first)
        assert new == collections.Counter(), (lens, new)


def test_without_the_switch_sizes_are_baked(monkeypatch):
    """MIGRAPHX_EP_RUNTIME_SIZES=0 (the fully specialised baseline bench/shapes.py compares with): every
    size is a literal, so a new batch needs new kernels; this is what the tests above rule out."""
    monkeypatch.setenv("MIGRAPHX_EP_RUNTIME_SIZES", "0")
    m = load("resnet")
    assert sum(new_kinds(m, {"pixel_values": (2, 3, 32, 32)}, {"pixel_values": (5, 3, 32, 32)}).values()) > 0
    new = new_kinds(pooling_net(TensorProto.FLOAT), {"x": (2, 3, 32, 48)}, {"x": (3, 3, 40, 24)})
    assert new["pooling"] and new["resize"] and new["reduce_mean"]

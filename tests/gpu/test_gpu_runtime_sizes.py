"""Kernels that take their sizes at run time, on the gpu target vs the ref, at many shapes per source:
softmax / layer-norm rows of every size class, every reduction schedule, global pools (NCHW and NHWC,
NaN skipped by max) and resize through its coordinate tables. Then whole programs at new shapes: the
second and third shape must compile no NVRTC kernel at all, and still match the ref.

NHWC inputs are made as the lowering sees them after a channels-last convolution: an (N, H, W, C)
tensor transposed to NCHW is a view with NHWC strides, and pools keep that layout for their output.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto

from migraphx_ep.targets.gpu import nvrtc

from .gpucheck import (
    EXACT,
    F16,
    F32,
    FP16,
    FP32_SUM,
    Tol,
    check_model,
    check_nodes,
    check_op,
    node,
    sum_tol,
    uniform,
)
from .test_shape_reuse import load, pooling_net

pytestmark = pytest.mark.gpu
NCHW = [0, 3, 1, 2]


def with_nans(rng, shape, dtype):
    x = uniform(rng, shape, dtype=dtype)
    x.reshape(-1)[rng.choice(x.size, max(1, x.size // 10), replace=False)] = np.nan
    x.reshape(-1, shape[-1])[0] = np.nan  # a run of NaN (a whole window when the last dims are small)
    return x


# -- global pools and spatial reductions --------------------------------------------------------------------
GLOBAL = {"avg": "GlobalAveragePool", "max": "GlobalMaxPool", "lp": "GlobalLpPool"}
HW = [(1, 1), (3, 7), (7, 7), (12, 11), (33, 33), (64, 70), (160, 112)]


def spatial(gpu, rng, op_type: str, hw, layout: str, dtype, **attrs) -> None:
    """``op_type`` over H, W of (2, 33, h, w) and (1, 96, h, w): 33 channels cannot group in vectors,
    96 can. NHWC: the input is stored (N, H, W, C) and transposed to NCHW (a strided view)."""
    for n, c in ((2, 33), (1, 96)):
        nchw = (n, c, *hw)
        shape = (n, hw[0], hw[1], c) if layout == "nhwc" else nchw
        maxes = op_type in ("GlobalMaxPool", "ReduceMax")
        x = with_nans(rng, shape, dtype) if maxes else uniform(rng, shape, dtype=dtype)
        tol = EXACT if maxes else sum_tol(dtype)
        src, nodes = "x", []
        if layout == "nhwc":
            nodes.append(node("Transpose", ["x"], ["t"], perm=NCHW))
            src = "t"
        inputs = [src, "axes"] if op_type.startswith("Reduce") else [src]
        nodes.append(node(op_type, inputs, ["y"], **attrs))
        inits = {"axes": np.array([2, 3], np.int64)} if op_type.startswith("Reduce") else {}
        check_nodes(nodes, {"x": x}, gpu, tol, inits=inits)


@pytest.mark.parametrize("hw", HW, ids=str)
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("kind", sorted(GLOBAL))
@pytest.mark.parametrize("dtype", [F32, F16], ids=["f32", "f16"])
def test_global_pool(gpu, rng, hw, layout, kind, dtype):
    spatial(gpu, rng, GLOBAL[kind], hw, layout, dtype, **({"p": 2} if kind == "lp" else {}))


@pytest.mark.parametrize("hw", [(3, 7), (33, 33), (160, 112)], ids=str)
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("op", ["ReduceMean", "ReduceMax"])
@pytest.mark.parametrize("keepdims", [1, 0])
def test_spatial_reduce(gpu, rng, hw, layout, op, keepdims):
    spatial(gpu, rng, op, hw, layout, F16, keepdims=keepdims)


# -- every reduction schedule ------------------------------------------------------------------------------
REDUCE_CASES = {  # schedule -> (shape, axes)
    "thread": ((6, 8), [1]),
    "row warp, vectors": ((40, 304), [1]),
    "row warp, odd row": ((40, 301), [1]),
    "row block": ((3, 10003), [1]),
    "wide": ((300, 40), [0]),
    "wide, odd columns": ((300, 41), [0]),
    "wide 1024": ((9000, 12), [0]),
    "split": ((100, 40), [0]),
    "thread, many outputs": ((20, 70000), [0]),
    "middle": ((5, 200, 9), [1]),
    "outer+inner": ((40, 7, 33), [0, 2]),
}


@pytest.mark.parametrize("case", sorted(REDUCE_CASES))
@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean", "ReduceMax", "ArgMax"])
@pytest.mark.parametrize("dtype", [F32, F16], ids=["f32", "f16"])
def test_reduce_schedules(gpu, rng, case, op, dtype):
    shape, axes = REDUCE_CASES[case]
    if op == "ArgMax":
        x = np.round(with_nans(rng, shape, dtype))  # ties: the first index wins
        check_op("ArgMax", {"x": x}, gpu, EXACT, axis=axes[0], select_last_index=0)
        return
    x = with_nans(rng, shape, dtype) if op == "ReduceMax" else uniform(rng, shape, dtype=dtype)
    tol = EXACT if op == "ReduceMax" else sum_tol(dtype)
    check_op(op, {"x": x}, gpu, tol, inits={"axes": np.array(axes, np.int64)})


# -- softmax and layer norm rows -------------------------------------------------------------------------
ROW_LENS = [1, 3, 7, 33, 256, 300, 1000, 1500, 4097, 9000]


@pytest.mark.parametrize("n", ROW_LENS)
@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("dtype", [F32, F16], ids=["f32", "f16"])
def test_softmax_rows(gpu, rng, n, op, dtype):
    if dtype == F16 and n > 4097:
        pytest.skip("the ref's half sum stops growing on rows this long (see test_gpu_ops_reduce)")
    tol = {"Softmax": Tol(1e-5, 1e-8), "LogSoftmax": Tol(1e-5, 1e-6)}[op]
    if dtype == F16:
        tol = Tol(1e-2, 1e-6) if op == "Softmax" else Tol(5e-3, 1e-4)
    x = uniform(rng, (3, 5, n), -5, 5, dtype)
    check_op(op, {"x": x}, gpu, tol, axis=-1)
    # A row view one element in (unaligned, odd row stride): the scalar row body.
    inits = {"s": np.array([1], np.int64), "e": np.array([n + 1], np.int64), "a": np.array([2], np.int64)}
    xs = uniform(rng, (3, 5, n + 1), -5, 5, dtype)
    nodes = [node("Slice", ["x", "s", "e", "a"], ["v"]), node(op, ["v"], ["y"], axis=-1)]
    check_nodes(nodes, {"x": xs}, gpu, tol, inits=inits)


@pytest.mark.parametrize("shape,axis", [((3, 33, 5), 1), ((300, 7), 0), ((2, 1000, 3), 1)], ids=str)
def test_softmax_strided_axis(gpu, rng, shape, axis):
    check_op("Softmax", {"x": uniform(rng, shape, -5, 5)}, gpu, Tol(1e-5, 1e-8), axis=axis)


@pytest.mark.parametrize("n", [1, 3, 33, 768, 1000, 3000, 9000])
@pytest.mark.parametrize("dtype", [F32, F16], ids=["f32", "f16"])
@pytest.mark.parametrize("bias", [True, False])
def test_layer_normalization_rows(gpu, rng, n, dtype, bias):
    feeds = {"x": uniform(rng, (2, 5, n), dtype=dtype)}
    inits = {"scale": uniform(rng, (n,), dtype=dtype)}
    if bias:
        inits["bias"] = uniform(rng, (n,), dtype=dtype)
    check_op("LayerNormalization", feeds, gpu, sum_tol(dtype), inits=inits, axis=-1, epsilon=1e-5)


# -- resize ------------------------------------------------------------------------------------------------
RESIZE = {
    "nearest": {"mode": "nearest", "nearest_mode": "floor", "coordinate_transformation_mode": "asymmetric"},
    "nearest-half-pixel": {"mode": "nearest"},
    "linear": {"mode": "linear"},
    "linear-align-corners": {"mode": "linear", "coordinate_transformation_mode": "align_corners"},
}


@pytest.mark.parametrize(
    "hw,scales", [((5, 8), (2.0, 1.5)), ((9, 4), (2.0, 2.0)), ((32, 64), (0.5, 0.75))], ids=str
)
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("name", sorted(RESIZE))
@pytest.mark.parametrize("dtype", [F32, F16], ids=["f32", "f16"])
def test_resize_sizes(gpu, rng, hw, scales, layout, name, dtype):
    attrs = RESIZE[name]
    shape = (2, *hw, 3) if layout == "nhwc" else (2, 3, *hw)
    inits = {"scales": np.array([1, 1, *scales], np.float32)}
    nodes = [node("Transpose", ["x"], ["t"], perm=NCHW)] if layout == "nhwc" else []
    nodes.append(node("Resize", ["t" if layout == "nhwc" else "x", "", "scales"], ["y"], **attrs))
    tol = EXACT if attrs["mode"] == "nearest" else (FP32_SUM if dtype == F32 else FP16)
    check_nodes(nodes, {"x": uniform(rng, shape, dtype=dtype)}, gpu, tol, inits=inits)


# -- whole programs: a new shape compiles nothing --------------------------------------------------------
def compiles(model: onnx.ModelProto, feeds: dict, gpu, tol: Tol) -> int:
    """NVRTC compiles (not cache hits) that compiling and running ``model`` on ``feeds`` took."""
    before = nvrtc.compile_count()
    check_model(model, feeds, gpu, tol)
    return nvrtc.compile_count() - before


@pytest.fixture
def no_disk_cache(monkeypatch):
    monkeypatch.delenv("MIGRAPHX_EP_KERNEL_CACHE", raising=False)
    monkeypatch.setenv("MIGRAPHX_EP_RUNTIME_SIZES", "1")


@pytest.mark.parametrize("nhwc", ["0", "1"], ids=["nchw", "nhwc"])
@pytest.mark.parametrize("dtype", [TensorProto.FLOAT, TensorProto.FLOAT16], ids=["f32", "f16"])
def test_pooling_net_new_image_sizes_compile_nothing(gpu, rng, monkeypatch, no_disk_cache, nhwc, dtype):
    monkeypatch.setenv("MIGRAPHX_EP_NHWC", nhwc)
    model = pooling_net(dtype)
    np_t = np.float16 if dtype == TensorProto.FLOAT16 else np.float32
    tol = Tol(1e-4, 1e-4, scaled=True) if dtype == TensorProto.FLOAT else Tol(2e-2, 2e-2, scaled=True)
    counts = [compiles(model, {"x": uniform(rng, lens, dtype=np_t)}, gpu, tol)
              for lens in [(2, 3, 32, 48), (3, 3, 40, 24), (2, 3, 64, 34)]]  # fmt: skip
    assert counts[1:] == [0, 0], counts


@pytest.mark.parametrize("name", ["bert", "gpt2", "bert_fp16"])
def test_transformer_new_shapes_compile_nothing(gpu, rng, no_disk_cache, name):
    model = load(name)
    names = [i.name for i in model.graph.input]
    tol = Tol(1e-4, 1e-4, scaled=True) if not name.endswith("fp16") else Tol(2e-2, 2e-2, scaled=True)
    counts = []
    for batch, seq in [(2, 16), (3, 24), (4, 31)]:
        feeds = {"input_ids": rng.integers(0, 100, (batch, seq), dtype=np.int64)}
        feeds["attention_mask"] = (rng.uniform(size=(batch, seq)) < 0.8).astype(np.int64)
        feeds["attention_mask"][:, 0] = 1
        if "token_type_ids" in names:
            feeds["token_type_ids"] = rng.integers(0, 2, (batch, seq), dtype=np.int64)
        counts.append(compiles(model, feeds, gpu, tol))
    assert counts[1:] == [0, 0], counts

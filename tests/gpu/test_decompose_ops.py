"""Quantisation, losses, Einsum, LRN, ReverseSequence and BitCast on the gpu target through their
decompositions (or, for BitCast, a view), checked against the ref target without a GPU."""

from __future__ import annotations

import numpy as np
import pytest

from migraphx_ep.targets.gpu import nvrtc

from .decomposecheck import check_decomposed, compile_kernels, errors_alike, make_model, node
from .gpucheck import BF16, EXACT, F16, F32, F64, normal, uniform

EDGES = np.array([0.5, 1.5, 2.5, -0.5, -2.5, np.nan, np.inf, -np.inf, 1e9, -1e9, 127.5, 0.0], np.float32)


def _model(op: str, feeds: dict, inits: dict | None = None, outputs=("y",), opset: int = 21, **attrs):  # noqa: ANN001, ANN003, ANN202
    inputs = [*feeds, *(inits or {})]
    return make_model([node(op, inputs, outputs, **attrs)], feeds, outputs, inits, opset)


# -- QuantizeLinear / DequantizeLinear / DynamicQuantizeLinear ---------------------------------------------
@pytest.mark.parametrize("zp_type", [np.uint8, np.int8, np.uint16, np.int16, None], ids=str)
def test_quantizelinear_rounds_half_even_and_saturates(zp_type) -> None:  # noqa: ANN001
    x = np.concatenate([EDGES, np.linspace(-300, 300, 12, dtype=np.float32)]).reshape(4, 6)
    feeds = {"x": x, "s": np.array(0.5, np.float32)}
    if zp_type is not None:
        feeds["zp"] = np.array(3, zp_type)
    check_decomposed(_model("QuantizeLinear", feeds), feeds, ["quantizelinear"], EXACT)


@pytest.mark.parametrize("dtype", [F16, BF16, F64], ids=["f16", "bf16", "f64"])
def test_quantizelinear_per_axis(rng, dtype) -> None:  # noqa: ANN001
    feeds = {"x": uniform(rng, (2, 3, 4), -40, 40, dtype), "s": np.array([0.3, 0.7, 0.11], dtype)}
    feeds["zp"] = np.array([0, 10, -7], np.int8)
    check_decomposed(_model("QuantizeLinear", feeds, axis=1), feeds, ["quantizelinear"], EXACT)


def test_quantizelinear_blocked_and_int32_input(rng) -> None:  # noqa: ANN001
    feeds = {"x": uniform(rng, (3, 8), -40, 40), "s": uniform(rng, (3, 3), 0.1, 1)}
    feeds["zp"] = rng.integers(0, 9, (3, 3)).astype(np.uint8)
    check_decomposed(_model("QuantizeLinear", feeds, axis=1, block_size=3), feeds, ["quantizelinear"], EXACT)
    feeds = {"x": rng.integers(-1000, 1000, (5, 4)).astype(np.int32), "s": np.array(4.0, np.float32)}
    check_decomposed(_model("QuantizeLinear", feeds), feeds, ["quantizelinear"], EXACT)


@pytest.mark.parametrize("xt", [np.uint8, np.int8, np.uint16, np.int16, np.int32], ids=str)
def test_dequantizelinear(rng, xt) -> None:  # noqa: ANN001
    info = np.iinfo(xt)
    feeds = {"x": rng.integers(info.min, info.max, (3, 4), endpoint=True).astype(xt)}
    feeds["s"] = np.array([0.5, 0.25, 3.0], np.float32)
    if xt != np.int32:
        feeds["zp"] = np.array([info.min, 0, info.max], xt)
    check_decomposed(_model("DequantizeLinear", feeds, axis=0), feeds, ["dequantizelinear"])


@pytest.mark.parametrize(
    "x",
    [
        np.linspace(-3, 5, 12, dtype=np.float32).reshape(3, 4),
        np.linspace(1, 5, 12, dtype=np.float32).reshape(3, 4),  # all positive: zero point 0
        -np.linspace(1, 5, 12, dtype=np.float32).reshape(3, 4),  # all negative: zero point 255
        np.zeros((2, 3), np.float32),  # scale 0: everything 0
        np.array([[1.0, np.nan, -2.0]], np.float32),  # NaN range: Python's min/max give 0
        np.array([[1.0, np.inf, -2.0, 0.5]], np.float32),
    ],
    ids=["mixed", "positive", "negative", "zeros", "nan", "inf"],
)
def test_dynamicquantizelinear(x: np.ndarray) -> None:
    feeds = {"x": x}
    model = _model("DynamicQuantizeLinear", feeds, outputs=("y", "scale", "zp"))
    check_decomposed(model, feeds, ["dynamicquantizelinear"], EXACT)


# -- NegativeLogLikelihoodLoss / SoftmaxCrossEntropyLoss ---------------------------------------------------
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("weight", [False, True], ids=["noweight", "weight"])
@pytest.mark.parametrize("ignore", [None, 2, -1], ids=["noignore", "ii2", "iineg"])
def test_nll_loss(rng, reduction: str, weight: bool, ignore: int | None) -> None:  # noqa: ANN001
    feeds = {"x": normal(rng, (3, 5, 2, 2)), "t": rng.integers(0, 5, (3, 2, 2)).astype(np.int64)}
    feeds["t"][0, 0, :] = -1  # hit by ignore_index -1; out of range (reads class 0, weight 0) otherwise
    attrs = {"reduction": reduction} | ({"ignore_index": ignore} if ignore is not None else {})
    if weight:
        feeds["w"] = uniform(rng, (5,), 0.1, 2)
    elif ignore is None:
        feeds["t"][0, 0, :] = 1
    check_decomposed(_model("NegativeLogLikelihoodLoss", feeds, **attrs), feeds, ["nll_loss"])


@pytest.mark.parametrize("dtype", [F16, BF16, F64], ids=["f16", "bf16", "f64"])
def test_softmax_cross_entropy_loss(rng, dtype) -> None:  # noqa: ANN001
    feeds = {"x": normal(rng, (4, 6, 3), dtype), "t": rng.integers(0, 6, (4, 3)).astype(np.int32)}
    feeds["w"] = uniform(rng, (6,), 0.1, 2, dtype)
    model = _model("SoftmaxCrossEntropyLoss", feeds, outputs=("y", "logp"), ignore_index=4)
    check_decomposed(model, feeds, ["nll_loss"])


def test_nll_loss_mean_of_all_ignored_is_nan(rng) -> None:  # noqa: ANN001
    feeds = {"x": normal(rng, (3, 4)), "t": np.full((3,), 2, np.int64)}
    check_decomposed(_model("NegativeLogLikelihoodLoss", feeds, ignore_index=2), feeds, ["nll_loss"])


# -- Einsum ------------------------------------------------------------------------------------------------
EINSUM = {
    "transpose": ("ij->ji", [(3, 4)]),
    "sum": ("ij->i", [(3, 4)]),
    "trace": ("ii", [(4, 4)]),
    "batch_diagonal": ("...ii->...i", [(2, 3, 4, 4)]),
    "inner": ("i,i", [(5,), (5,)]),
    "outer": ("i,j->ij", [(3,), (4,)]),
    "batch_matmul": ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    "bilinear": ("bn,anm,bm->ba", [(2, 3), (4, 3, 5), (2, 5)]),
    "permuted_contraction": ("kaj,bjk->abk", [(3, 2, 4), (5, 4, 3)]),
    "ellipsis_implicit": ("...ij,...jk", [(2, 3, 4), (2, 4, 2)]),
    "scalar": ("->", [()]),
}


@pytest.mark.parametrize("name", list(EINSUM))
def test_einsum(rng, name: str) -> None:  # noqa: ANN001
    eq, lens = EINSUM[name]
    feeds = {f"x{k}": normal(rng, s, F64) for k, s in enumerate(lens)}
    check_decomposed(_model("Einsum", feeds, equation=eq), feeds, ["einsum"])


@pytest.mark.parametrize("dtype", [F32, F16, BF16, np.int32], ids=["f32", "f16", "bf16", "i32"])
def test_einsum_types(rng, dtype) -> None:  # noqa: ANN001
    make = (
        (lambda s: rng.integers(-9, 9, s).astype(dtype))
        if dtype == np.int32
        else (lambda s: normal(rng, s, dtype))
    )
    feeds = {"a": make((2, 3, 4)), "b": make((2, 4, 4))}
    check_decomposed(_model("Einsum", feeds, equation="bij,bjj->bi"), feeds, ["einsum"])


# -- LRN, ReverseSequence, BitCast ------------------------------------------------------------------------
@pytest.mark.parametrize("size", [1, 3, 4])
@pytest.mark.parametrize("dtype", [F32, F16], ids=["f32", "f16"])
def test_lrn(rng, size: int, dtype) -> None:  # noqa: ANN001
    feeds = {"x": normal(rng, (2, 5, 3, 2), dtype)}
    model = _model("LRN", feeds, size=size, alpha=0.02, beta=0.6, bias=1.5)
    check_decomposed(model, feeds, ["lrn"])


@pytest.mark.parametrize("axes", [(1, 0), (0, 1)], ids=["time0", "time1"])
def test_reverse_sequence(rng, axes: tuple[int, int]) -> None:  # noqa: ANN001
    batch_axis, time_axis = axes
    x = normal(rng, (4, 4, 3))
    feeds = {"x": x, "lens": np.array([4, 0, 2, 1], np.int64)}
    model = _model("ReverseSequence", feeds, batch_axis=batch_axis, time_axis=time_axis)
    check_decomposed(model, feeds, ["reverse_sequence"], EXACT)
    for bad in ([5, 0, 2, 1], [1, -1, 2, 1]):
        errors_alike(model, {"x": x, "lens": np.array(bad, np.int64)}, IndexError)


@pytest.mark.parametrize(
    "src,dst", [(np.float32, np.int32), (np.float16, np.int16), (np.uint8, np.int8), (np.int64, np.float64)]
)
def test_bitcast_is_a_view(rng, src, dst) -> None:  # noqa: ANN001, ANN201
    from onnx import helper

    x = rng.integers(0, 255, (3, 8), dtype=np.uint8).view(src)
    if np.dtype(src).kind == "f":
        x.reshape(-1)[:3] = np.array([np.nan, -np.inf, -0.0], src)
    feeds = {"x": x}
    to = helper.np_dtype_to_tensor_dtype(np.dtype(dst))
    check_decomposed(_model("BitCast", feeds, opset=26, to=to), feeds, [], EXACT)
    nodes = [node("Transpose", ["x"], ["t"], perm=[1, 0]), node("BitCast", ["t"], ["y"], to=to)]
    check_decomposed(make_model(nodes, feeds, opset=26), feeds, [], EXACT)


@pytest.mark.skipif(nvrtc.nvrtc_available() is not None, reason=str(nvrtc.nvrtc_available()))
def test_decomposed_kernels_compile(rng) -> None:  # noqa: ANN001
    feeds = {"x": normal(rng, (3, 5, 2), F16), "t": rng.integers(0, 5, (3, 2)).astype(np.int64)}
    feeds["w"] = uniform(rng, (5,), 0.1, 2, F16)
    model = _model("SoftmaxCrossEntropyLoss", feeds, outputs=("y", "logp"), ignore_index=1)
    assert compile_kernels(check_decomposed(model, feeds, ["nll_loss"])) >= 3
    feeds = {"x": np.linspace(-3, 5, 12, dtype=np.float32).reshape(3, 4)}
    model = _model("DynamicQuantizeLinear", feeds, outputs=("y", "scale", "zp"))
    assert compile_kernels(check_decomposed(model, feeds, ["dynamicquantizelinear"], EXACT)) >= 3
    feeds = {"x": normal(rng, (4, 4, 3)), "lens": np.array([4, 0, 2, 1], np.int64)}
    model = _model("ReverseSequence", feeds, batch_axis=1, time_axis=0)
    assert compile_kernels(check_decomposed(model, feeds, ["reverse_sequence"], EXACT)) >= 1


# -- ScatterElements / ScatterND -------------------------------------------------------------------------
REDUCTIONS = ["none", "add", "mul", "max", "min"]


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("axis", [0, 1])
def test_scatter_elements(rng, reduction: str, axis: int) -> None:  # noqa: ANN001
    data = normal(rng, (4, 5, 3))
    idx = np.array([[[1, -1, 0], [1, 2, 3]], [[0, 0, -4], [3, 3, 2]]], np.int64)  # duplicates, negatives
    upd = normal(rng, idx.shape)
    upd[0, 0, 0] = np.nan
    feeds = {"data": data, "idx": idx, "upd": upd}
    attrs = {"axis": axis} | ({"reduction": reduction} if reduction != "none" else {})
    model = _model("ScatterElements", feeds, opset=18, **attrs)
    check_decomposed(
        model, feeds, [f"scatter_{reduction}"], EXACT if reduction in ("none", "max", "min") else None
    )


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_scatternd(rng, reduction: str) -> None:  # noqa: ANN001
    data = rng.integers(-20, 20, (4, 3, 2)).astype(np.int32)
    idx = np.array([[[0, 1], [3, -1]], [[0, 1], [-4, 2]]], np.int64)  # (0, 1) twice
    feeds = {"data": data, "idx": idx, "upd": rng.integers(-5, 5, (2, 2, 2)).astype(np.int32)}
    attrs = {"reduction": reduction} if reduction != "none" else {}
    check_decomposed(_model("ScatterND", feeds, opset=18, **attrs), feeds, [f"scatternd_{reduction}"], EXACT)


def test_scatter_out_of_range_raises_like_the_ref(rng) -> None:  # noqa: ANN001
    feeds = {"data": normal(rng, (3, 4)), "idx": np.array([[0, 3]], np.int64), "upd": normal(rng, (1, 2))}
    model = _model("ScatterElements", feeds, opset=18, axis=0)
    errors_alike(model, feeds, IndexError)
    feeds = {"data": normal(rng, (3, 4)), "idx": np.array([[1], [-4]], np.int64), "upd": normal(rng, (2, 4))}
    errors_alike(_model("ScatterND", feeds, opset=18), feeds, IndexError)


# -- ConvTranspose -----------------------------------------------------------------------------------------
CONV_T = {
    "plain_1d": ((1, 2, 5), (2, 3, 3), {}),
    "stride_dilation_pads": (
        (2, 4, 4, 3),
        (4, 2, 3, 2),
        {"strides": [2, 3], "dilations": [2, 1], "pads": [1, 0, 2, 1]},
    ),
    "pads_over_edge": ((1, 2, 6, 6), (2, 2, 2, 2), {"strides": [3, 2], "pads": [2, 3, 2, 1]}),  # crops input
    "output_padding_groups": (
        (1, 4, 3, 3),
        (4, 3, 3, 3),
        {"strides": [2, 2], "output_padding": [1, 1], "group": 2},
    ),
    "3d": ((1, 2, 2, 3, 2), (2, 2, 2, 2, 2), {"strides": [1, 2, 2]}),
}


@pytest.mark.parametrize("name", list(CONV_T))
def test_conv_transpose(rng, name: str) -> None:  # noqa: ANN001
    xs, ws, attrs = CONV_T[name]
    feeds = {"x": normal(rng, xs), "w": normal(rng, ws)}
    check_decomposed(_model("ConvTranspose", feeds, **attrs), feeds, ["convolution_backwards"])


def test_conv_transpose_half_with_bias(rng) -> None:  # noqa: ANN001
    feeds = {
        "x": normal(rng, (2, 3, 4, 4), F16),
        "w": normal(rng, (3, 2, 3, 3), F16),
        "b": normal(rng, (2,), F16),
    }
    model = _model("ConvTranspose", feeds, strides=[2, 2], pads=[1, 1, 1, 1])
    check_decomposed(model, feeds, ["convolution_backwards"])


# -- the pass and the partitioner's question ---------------------------------------------------------------
def test_decompose_ops_pass_is_idempotent_and_leaves_no_op_behind() -> None:
    from migraphx_ep.ir.dtypes import DType
    from migraphx_ep.ir.module import Module
    from migraphx_ep.ir.operation import make_op
    from migraphx_ep.ir.shape import Shape
    from migraphx_ep.passes import DEAD_CODE_ELIMINATION
    from migraphx_ep.targets.gpu.decompose import decompose_ops
    from migraphx_ep.targets.gpu.support import instruction_supported

    m = Module()
    x = m.add_parameter("x", Shape(DType.float_type, (2, 3)))
    s = m.add_parameter("s", Shape(DType.float_type, (2, 3)))
    q = m.add_instruction(make_op("quantizelinear", out_type=DType.int8_type), [x, s])
    m.add_return([q])
    assert instruction_supported(q) is None
    assert decompose_ops(m) and DEAD_CODE_ELIMINATION(m)
    names = [i.name for i in m.instructions]
    assert "quantizelinear" not in names and names[-2:] == ["convert", "@return"]
    assert not decompose_ops(m)  # nothing left to decompose
    f8 = m.add_instruction(make_op("quantizelinear", out_type=DType.fp8e4m3fn_type), [x, s])
    assert instruction_supported(f8) is None  # a kernel of its own (targets/gpu/quant.py)
    f8 = m.add_instruction(make_op("quantizelinear", out_type=DType.fp8e5m2_type), [x, s])
    assert instruction_supported(f8) is None  # decomposed: a division and a conversion (the prelude's codec)


def test_scatter_too_large_to_run_densely_is_refused() -> None:
    from migraphx_ep.ir.dtypes import DType
    from migraphx_ep.ir.module import Module
    from migraphx_ep.ir.operation import make_op
    from migraphx_ep.ir.shape import Shape
    from migraphx_ep.targets.gpu.support import instruction_supported

    m = Module()
    d = m.add_parameter("d", Shape(DType.float_type, (4096, 64)))
    i = m.add_parameter("i", Shape(DType.int64_type, (8192, 1)))
    u = m.add_parameter("u", Shape(DType.float_type, (8192, 64)))
    ins = m.add_instruction(make_op("scatternd_add"), [d, i, u])
    assert "too large to run densely" in (instruction_supported(ins) or "")

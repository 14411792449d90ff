"""Ops the gpu target runs through decompositions (``targets/gpu/decompose``), on the device vs ref.

The same graphs as ``test_decompose_*`` (which check the decompositions and the lowering without a GPU);
here the generated kernels, cuBLASLt and cuDNN compute them.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from .gpucheck import (
    BF16,
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
    normal,
    uniform,
)
from .scancases import cumsum_scan, gemm_scan

pytestmark = pytest.mark.gpu

ATTN_TOL = {F32: FP32_SUM, F16: FP16, BF16: Tol(3e-2, 3e-2)}


@pytest.mark.parametrize("dtype", [F32, F16, BF16], ids=["f32", "f16", "bf16"])
def test_attention_gqa_causal_mask_past(gpu, rng, dtype) -> None:  # noqa: ANN001
    feeds = {
        "q": normal(rng, (2, 4, 3, 8), dtype),
        "k": normal(rng, (2, 2, 5, 8), dtype),
        "v": normal(rng, (2, 2, 5, 6), dtype),
        "mask": normal(rng, (3, 7), dtype),
        "pk": normal(rng, (2, 2, 4, 8), dtype),
        "pv": normal(rng, (2, 2, 4, 6), dtype),
    }
    outs = ["y", "present_key", "present_value", "qk"]
    nodes = [node("Attention", list(feeds), outs, is_causal=1, softcap=2.0, qk_matmul_output_mode=2)]
    check_nodes(nodes, feeds, gpu, ATTN_TOL[dtype], outputs=outs, opset=23)


def test_attention_nonpad_bool_mask_window(gpu, rng) -> None:  # noqa: ANN001
    feeds = {"q": normal(rng, (2, 2, 2, 8)), "k": normal(rng, (2, 2, 6, 8)), "v": normal(rng, (2, 2, 6, 8))}
    feeds["mask"] = rng.random((2, 6)) > 0.3
    feeds["nonpad"] = np.array([6, 3], np.int64)
    nodes = [node("Attention", ["q", "k", "v", "mask", "", "", "nonpad"], is_causal=1, left_window_size=2)]
    check_nodes(nodes, feeds, gpu, FP32_SUM, opset=25)


def test_attention_fully_masked_and_poisoned_rows(gpu, rng) -> None:  # noqa: ANN001
    feeds = {"q": normal(rng, (1, 1, 4, 8)), "k": normal(rng, (1, 1, 6, 8)), "v": normal(rng, (1, 1, 6, 8))}
    feeds["q"][0, 0, 1] = np.nan
    mask = np.zeros((4, 6), np.float32)
    mask[1] = mask[3] = -np.inf
    mask[0, 2] = np.nan
    feeds["mask"] = mask
    outs = ["y", "", "", "qk"]
    nodes = [node("Attention", ["q", "k", "v", "mask"], outs, qk_matmul_output_mode=3)]
    check_nodes(nodes, feeds, gpu, FP32_SUM, outputs=["y", "qk"], opset=23)


@pytest.mark.parametrize("interleaved", [0, 1])
def test_rotary_embedding(gpu, rng, interleaved: int) -> None:  # noqa: ANN001
    feeds = {"x": normal(rng, (2, 4, 3, 8)), "cos": normal(rng, (10, 2)), "sin": normal(rng, (10, 2))}
    feeds["pos"] = rng.integers(0, 10, (2, 3)).astype(np.int64)
    attrs = {"interleaved": interleaved, "rotary_embedding_dim": 4}
    check_op("RotaryEmbedding", feeds, gpu, Tol(1e-5, 1e-6), opset=23, **attrs)


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
def test_softmax_cross_entropy_loss(gpu, rng, reduction: str) -> None:  # noqa: ANN001
    feeds = {"x": normal(rng, (4, 6, 3)), "t": rng.integers(0, 6, (4, 3)).astype(np.int64)}
    feeds["w"] = uniform(rng, (6,), 0.1, 2)
    nodes = [node("SoftmaxCrossEntropyLoss", list(feeds), ["y", "logp"], reduction=reduction, ignore_index=4)]
    check_nodes(nodes, feeds, gpu, FP32_SUM, outputs=["y", "logp"])


def test_quantize_dequantize(gpu, rng) -> None:  # noqa: ANN001
    x = np.concatenate([np.array([0.5, 1.5, 2.5, -0.5, np.nan, np.inf, -np.inf, 1e9], np.float32),
                        uniform(rng, (16,), -60, 60)]).reshape(4, 6)  # fmt: skip
    feeds = {
        "x": x,
        "s": np.array([0.5, 0.25, 1.0, 2.0], np.float32),
        "zp": np.array([3, 0, 7, 250], np.uint8),
    }
    nodes = [node("QuantizeLinear", ["x", "s", "zp"], ["q"], axis=0),
             node("DequantizeLinear", ["q", "s", "zp"], ["y"], axis=0)]  # fmt: skip
    check_nodes(nodes, feeds, gpu, EXACT, outputs=["q", "y"])


def test_dynamic_quantize_linear(gpu, rng) -> None:  # noqa: ANN001
    feeds = {"x": uniform(rng, (5, 7), -3, 5)}
    check_nodes(
        [node("DynamicQuantizeLinear", ["x"], ["y", "s", "z"])], feeds, gpu, EXACT, outputs=["y", "s", "z"]
    )


@pytest.mark.parametrize("eq", ["bij,bjk->bik", "...ii->...i", "bn,anm,bm->ba"])
def test_einsum(gpu, rng, eq: str) -> None:  # noqa: ANN001
    shapes = {"bij,bjk->bik": [(2, 3, 4), (2, 4, 5)], "...ii->...i": [(2, 3, 4, 4)],
              "bn,anm,bm->ba": [(2, 3), (4, 3, 5), (2, 5)]}[eq]  # fmt: skip
    feeds = {f"x{k}": normal(rng, s) for k, s in enumerate(shapes)}
    check_op("Einsum", feeds, gpu, FP32_SUM, equation=eq)


def test_bitcast(gpu, rng) -> None:  # noqa: ANN001
    x = rng.integers(0, 255, (3, 8), dtype=np.uint8).view(np.float32)
    nodes = [node("Transpose", ["x"], ["t"], perm=[1, 0]), node("BitCast", ["t"], ["y"], to=6)]
    check_nodes(nodes, {"x": x}, gpu, EXACT, opset=26)
    check_op(
        "BitCast", {"x": x}, gpu, EXACT, opset=26, to=helper.np_dtype_to_tensor_dtype(np.dtype(np.int32))
    )


def test_lrn_reverse_sequence(gpu, rng) -> None:  # noqa: ANN001
    check_op("LRN", {"x": normal(rng, (2, 5, 3, 2))}, gpu, Tol(1e-5, 1e-6), size=3, alpha=0.02, beta=0.6)
    feeds = {"x": normal(rng, (4, 4, 3)), "lens": np.array([4, 0, 2, 1], np.int64)}
    check_op("ReverseSequence", feeds, gpu, EXACT, batch_axis=1, time_axis=0)


@pytest.mark.parametrize("reduction", ["none", "add", "max"])
def test_scatters(gpu, rng, reduction: str) -> None:  # noqa: ANN001
    attrs = {"reduction": reduction} if reduction != "none" else {}
    tol = EXACT if reduction != "add" else FP32_SUM
    idx = np.array([[1, -1, 0], [1, 2, 3]], np.int64)
    feeds = {"data": normal(rng, (4, 3)), "idx": idx, "upd": normal(rng, idx.shape)}
    check_op("ScatterElements", feeds, gpu, tol, opset=18, axis=0, **attrs)
    feeds = {"data": normal(rng, (4, 3, 2)), "idx": np.array([[0, 1], [2, -1], [0, 1]], np.int64)}
    feeds["upd"] = normal(rng, (3, 2))
    check_op("ScatterND", feeds, gpu, tol, opset=18, **attrs)


def test_conv_transpose(gpu, rng) -> None:  # noqa: ANN001
    feeds = {"x": normal(rng, (2, 4, 4, 3)), "w": normal(rng, (4, 2, 3, 2)), "b": normal(rng, (4,))}
    attrs = {
        "strides": [2, 3],
        "dilations": [2, 1],
        "pads": [1, 0, 2, 1],
        "group": 2,
        "output_padding": [1, 0],
    }
    check_op("ConvTranspose", feeds, gpu, FP32_SUM, **attrs)


def test_scan_unrolled(gpu, rng) -> None:  # noqa: ANN001
    feeds = {"s0": normal(rng, (4, 3)), "x": normal(rng, (4, 7, 3))}
    check_model(cumsum_scan(feeds, (1,), (1,), (2,), (0,)), feeds, gpu, FP32_SUM)
    feeds = {"h0": normal(rng, (2, 8)), "x": normal(rng, (2, 5, 8)), "u": normal(rng, (5, 2, 8))}
    check_model(gemm_scan(feeds), feeds, gpu, FP32_SUM)

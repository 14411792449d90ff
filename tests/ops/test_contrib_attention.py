"""com.microsoft MultiHeadAttention and Attention (packed weights): ORT 1.32's CPU EP vs our EP (ref target).

Masks never hide a whole row here: ORT adds a finite -10000 there, and float32 rounding of
``score - 10000`` then differs between any two summation orders (~1e-3); that case is not compared.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from llmcheck import compare, ms_model, refusal
from onnx import helper

RNG = np.random.default_rng(17)
TOL = {np.float32: (1e-5, 1e-5), np.float16: (2e-3, 2e-3)}
B, S, L, N, D, P = 2, 3, 4, 2, 8, 5


def rand(*lens: int, dtype=np.float32) -> np.ndarray:
    return RNG.standard_normal(lens).astype(dtype)


def mha_case(name: str, dtype) -> tuple[bytes, dict[str, np.ndarray], list[str], dict]:
    q = rand(B, S, N * D, dtype=dtype)
    kv_len = S if name.startswith(("self", "past", "unidirectional")) else L
    feeds = {"q": q, "k": rand(B, kv_len, N * D, dtype=dtype), "v": rand(B, kv_len, N * D, dtype=dtype)}
    attrs: dict = {}
    outs = ["y"]
    if name == "bias":
        feeds["bias"] = rand(3 * N * D, dtype=dtype)
    if name == "padding_mask_2d":
        feeds["kpm"] = np.array([[1, 1, 0, 1], [1, 0, 1, 1]], np.int32)
    if name == "padding_mask_lengths":
        feeds["kpm"] = np.array([3, 1], np.int32)
    if name == "padding_mask_3d_filter":
        feeds["kpm"] = (RNG.random((B, S, L)) > 0.3).astype(np.int32)
        feeds["kpm"][..., 0] = 1
        attrs["mask_filter_value"] = -5.0
    if name == "attention_bias":
        feeds["ab"] = rand(B, 1, S, L, dtype=dtype)
    if name == "v_hidden_and_scale":
        feeds["v"] = rand(B, L, N * 16, dtype=dtype)
        attrs["scale"] = 0.2
    if name == "bnsh_key_value":
        feeds["k"], feeds["v"] = rand(B, N, L, D, dtype=dtype), rand(B, N, L, D, dtype=dtype)
    if name.startswith("past"):
        feeds.update(pk=rand(B, N, P, D, dtype=dtype), pv=rand(B, N, P, D, dtype=dtype))
        outs += ["present_k", "present_v"]
    if name == "past_unidirectional_bias":
        feeds["ab"] = rand(1, N, S, P + S, dtype=dtype)
    if name.startswith("unidirectional") or name == "past_unidirectional_bias":
        attrs["unidirectional"] = 1
    if name == "unidirectional_padding":
        feeds["kpm"] = np.array([[1, 0, 1], [1, 1, 0]], np.int32)
    slots = ["q", "k", "v", "bias", "kpm", "ab", "pk", "pv"]
    names = [n if n in feeds else "" for n in slots]
    while names[-1] == "":
        names.pop()
    node = helper.make_node("MultiHeadAttention", names, outs, domain="com.microsoft", num_heads=N, **attrs)
    return ms_model(node, feeds), feeds, outs, attrs


MHA_CASES = [
    "cross",
    "self",
    "bias",
    "padding_mask_2d",
    "padding_mask_lengths",
    "padding_mask_3d_filter",
    "attention_bias",
    "v_hidden_and_scale",
    "bnsh_key_value",
    "past",
    "past_unidirectional_bias",
    "unidirectional",
    "unidirectional_padding",
]


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("name", MHA_CASES)
def test_multi_head_attention_vs_ort(name, dtype):
    model, feeds, _, _ = mha_case(name, dtype)
    compare(model, feeds, *TOL[dtype])


def test_multi_head_attention_refusals():
    q, k, v = rand(B, S, N * D), rand(B, L, N * D), rand(B, L, N * D)
    cases = [
        (["q", "k", "v"], {"unidirectional": 1}, {}, "cross attention"),
        (
            ["q", "k", "v", "", "kpm", "", "pk", "pv"],
            {},
            {"pk": rand(B, N, P, D), "pv": rand(B, N, P, D), "kpm": np.ones((B, P + L), np.int32)},
            "with a past",
        ),
        (["q", "k", "v", "", "kpm"], {}, {"kpm": np.ones(3 * B + 2, np.int32)}, "not supported"),
    ]
    for names, attrs, extra, why in cases:
        feeds = {"q": q, "k": k, "v": v, **extra}
        node = helper.make_node(
            "MultiHeadAttention", names, ["y"], domain="com.microsoft", num_heads=N, **attrs
        )
        assert why in refusal(ms_model(node, feeds), feeds)
    feeds = {"q": rand(B, L, N, 3, D)}  # packed QKV
    node = helper.make_node("MultiHeadAttention", ["q"], ["y"], domain="com.microsoft", num_heads=N)
    assert "packed" in refusal(ms_model(node, feeds), feeds)


IN = 12


def attention_case(name: str, dtype) -> tuple[bytes, dict[str, np.ndarray]]:
    sizes = [16, 16, 32] if name == "qkv_hidden_sizes" else [N * D] * 3
    feeds = {"x": rand(B, S, IN, dtype=dtype)}
    weights = {"w": (rand(IN, sum(sizes)) * 0.3).astype(dtype)}
    if name != "no_bias":
        weights["b"] = rand(sum(sizes), dtype=dtype)
    attrs: dict = {"qkv_hidden_sizes": sizes} if name == "qkv_hidden_sizes" else {}
    outs = ["y"]
    p_len = P if name.startswith("past") else 0
    if name == "mask_2d" or name == "past_mask":
        feeds["m"] = np.ones((B, S + p_len), np.int32)
        feeds["m"][0, 1] = feeds["m"][1, -1] = 0
    if name == "mask_lengths":
        feeds["m"] = np.array([2, 3], np.int32)
    if name == "mask_3d_filter_scale":
        feeds["m"] = (RNG.random((B, S, S)) > 0.3).astype(np.int32)
        feeds["m"][..., 0] = 1
        attrs.update(mask_filter_value=-3.0, scale=0.2)
    if name.startswith("past"):
        feeds["past"] = rand(2, B, N, P, D, dtype=dtype)
        outs.append("present")
        attrs["unidirectional"] = 1
    if name == "unidirectional":
        attrs["unidirectional"] = 1
        outs.append("present")
    if name == "attention_bias":
        feeds["ab"] = rand(1, N, S, S, dtype=dtype)
    slots = ["x", "w", "b", "m", "past", "ab"]
    names = [n if n in feeds or n in weights else "" for n in slots]
    while names[-1] == "":
        names.pop()
    node = helper.make_node("Attention", names, outs, domain="com.microsoft", num_heads=N, **attrs)
    return ms_model(node, feeds, weights), feeds


def zero_bias_twin(model: bytes) -> bytes:
    """The same Attention with an explicit all-zero bias: ORT 1.31's CPU kernel segfaults without one
    (fixed in 1.32), and a zero bias means the same numbers, so the twin is the oracle there."""
    m = onnx.load_from_string(model)
    node, w = m.graph.node[0], onnx.numpy_helper.to_array(m.graph.initializer[0])
    m.graph.initializer.append(onnx.numpy_helper.from_array(np.zeros(w.shape[1], w.dtype), "b"))
    names = list(node.input) + [""] * (3 - len(node.input))
    names[2] = "b"
    del node.input[:]
    node.input.extend(names)
    return m.SerializeToString()


ATTENTION_CASES = [
    "plain",
    "no_bias",
    "mask_2d",
    "mask_lengths",
    "mask_3d_filter_scale",
    "unidirectional",
    "past",
    "past_mask",
    "attention_bias",
    "qkv_hidden_sizes",
]


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("name", ATTENTION_CASES)
def test_ms_attention_vs_ort(name, dtype):
    model, feeds = attention_case(name, dtype)
    compare(model, feeds, *TOL[dtype], oracle=zero_bias_twin(model) if name == "no_bias" else None)


def test_ms_attention_refusals():
    feeds = {"x": rand(B, S, IN), "m": np.ones((B, 1, 4, 4), np.int32)}
    w = {"w": rand(IN, 3 * N * D)}
    node = helper.make_node("Attention", ["x", "w", "", "m"], ["y"], domain="com.microsoft", num_heads=N)
    assert "not supported" in refusal(ms_model(node, feeds, w), feeds)  # 4-D (Megatron) mask
    for attrs in ({"do_rotary": 1}, {"past_present_share_buffer": 1}):
        node = helper.make_node("Attention", ["x", "w"], ["y"], domain="com.microsoft", num_heads=N, **attrs)
        assert "not supported" in refusal(ms_model(node, {"x": feeds["x"]}, w), {"x": feeds["x"]})

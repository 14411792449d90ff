"""ai.onnx Attention and RotaryEmbedding (opset 23) vs ORT CPU."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from migraphx_ep.frontend import ParseError
from opcheck import check_node, make_model, run_ours

RNG = np.random.default_rng(5)


def rand(*lens: int, dtype=np.float32) -> np.ndarray:
    return RNG.standard_normal(lens).astype(dtype)


B, HQ, HKV, S, L, D = 2, 4, 2, 3, 5, 8

CASES = [
    ("plain", {}, {}),
    ("causal", dict(is_causal=1), {}),
    ("scaled_softcap", dict(scale=0.3, softcap=2.0), {}),
    ("float_mask", {}, {"mask": rand(S, L)}),
    ("bool_mask", {}, {"mask": RNG.random((B, 1, S, L)) > 0.3}),
    ("past", {}, {"mask": None, "pk": rand(B, HKV, 2, D), "pv": rand(B, HKV, 2, D)}),
    ("past_causal", dict(is_causal=1), {"mask": None, "pk": rand(B, HKV, 2, D), "pv": rand(B, HKV, 2, D)}),
]


@pytest.mark.parametrize("name,attrs,extra", CASES, ids=[c[0] for c in CASES])
def test_attention_4d_gqa_vs_ort(name, attrs, extra):
    ins = {"q": rand(B, HQ, S, D), "k": rand(B, HKV, L, D), "v": rand(B, HKV, L, D)}
    names = list(ins)
    for k, v in extra.items():
        names.append(k if v is not None else "")
        if v is not None:
            ins[k] = v
    outs = ["y"] + (["present_k", "present_v"] if "pk" in extra else [])
    check_node(helper.make_node("Attention", names, outs, **attrs), ins, opset=23, rtol=1e-4, atol=1e-5)


def test_attention_3d_vs_ort():
    ins = {"q": rand(B, S, HQ * D), "k": rand(B, L, HKV * D), "v": rand(B, L, HKV * 4)}
    check_node(
        helper.make_node("Attention", list(ins), ["y"], q_num_heads=HQ, kv_num_heads=HKV),
        ins,
        opset=23,
        rtol=1e-4,
        atol=1e-5,
    )


def test_attention_fp16_vs_ort():
    ins = {
        "q": rand(1, 2, S, D, dtype=np.float16),
        "k": rand(1, 2, L, D, dtype=np.float16),
        "v": rand(1, 2, L, D, dtype=np.float16),
    }
    check_node(helper.make_node("Attention", list(ins), ["y"]), ins, opset=23, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("interleaved", [0, 1])
def test_rotary_embedding_vs_ort(interleaved):
    x = rand(2, 3, 4, 8)  # (B, H, S, D)
    pos = np.array([[0, 1, 2, 3], [4, 5, 6, 7]], np.int64)
    ins = {"x": x, "cos": rand(8, 3), "sin": rand(8, 3), "pos": pos}
    check_node(
        helper.make_node(
            "RotaryEmbedding", list(ins), ["y"], interleaved=interleaved, rotary_embedding_dim=6
        ),
        ins,
        opset=23,
    )


def test_rotary_embedding_3d_no_positions_vs_ort():
    ins = {"x": rand(2, 4, 16), "cos": rand(2, 4, 4), "sin": rand(2, 4, 4)}
    check_node(helper.make_node("RotaryEmbedding", list(ins), ["y"], num_heads=2), ins, opset=23)


def test_attention_refuses_bad_mode():
    ins = {"q": rand(1, 2, S, D), "k": rand(1, 2, L, D), "v": rand(1, 2, L, D)}
    node = helper.make_node("Attention", list(ins), ["y"], q_num_heads=2, kv_num_heads=2)
    # 3-D heads attributes on 4-D inputs are only rejected from opset 25; at 23 they are ignored
    run_ours(make_model(node, ins, opset=23), ins)
    ins3 = {"q": rand(1, S, 2 * D), "k": rand(1, L, 2 * D), "v": rand(1, L, 2 * D)}
    with pytest.raises(ParseError, match="q_num_heads"):
        run_ours(make_model(helper.make_node("Attention", list(ins3), ["y"]), ins3, opset=23), ins3)

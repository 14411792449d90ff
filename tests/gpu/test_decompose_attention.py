"""Attention and RotaryEmbedding on the gpu target through their decompositions (dot, softmax,
pointwise), checked against the ref target's own ops without a GPU (see ``decomposecheck``)."""

from __future__ import annotations

import numpy as np
import pytest

from migraphx_ep.targets.gpu import nvrtc

from .decomposecheck import check_decomposed, compile_kernels, make_model, node
from .gpucheck import BF16, F16, F32, F64, normal

OUTS = ("y", "present_key", "present_value", "qk")


def _qkv(rng, b=2, hq=4, hkv=2, s=3, lk=5, d=8, dv=6, dtype=F32) -> dict[str, np.ndarray]:
    return {
        "q": normal(rng, (b, hq, s, d), dtype),
        "k": normal(rng, (b, hkv, lk, d), dtype),
        "v": normal(rng, (b, hkv, lk, dv), dtype),
    }


def _attention(feeds: dict, inputs: list[str], opset: int = 23, outputs=OUTS, **attrs):  # noqa: ANN001, ANN003, ANN202
    return make_model([node("Attention", inputs, outputs, **attrs)], feeds, outputs, opset=opset)


CASES = {
    "plain": ({}, {}),
    "gqa_causal_scaled": ({"is_causal": 1, "scale": 0.3}, {}),
    "softcap_mode0": ({"softcap": 2.0, "qk_matmul_output_mode": 0}, {}),
    "float_mask_short_mode2": ({"qk_matmul_output_mode": 2}, {"mask": (3, 4)}),
    "bool_mask_4d_causal_softcap": ({"is_causal": 1, "softcap": 1.5}, {"bmask": (2, 1, 3, 5)}),
    "past_causal_mask3d": ({"is_causal": 1, "qk_matmul_output_mode": 1}, {"past": 4, "mask": (4, 3, 9)}),
    "past_window": ({"is_causal": 1, "left_window_size": 2}, {"past": 3, "opset": 25}),
    "bidirectional_window": ({"left_window_size": 1, "right_window_size": 1}, {"opset": 25}),
    "mode3_softmax_fp32": ({"qk_matmul_output_mode": 3, "softmax_precision": 1}, {"dtype": F16, "opset": 24}),
}


def _case(rng, attrs: dict, extra: dict):  # noqa: ANN001, ANN202
    dtype = extra.get("dtype", F32)
    feeds = _qkv(rng, dtype=dtype)
    inputs = ["q", "k", "v"]
    if "mask" in extra:
        feeds["mask"] = normal(rng, extra["mask"], dtype)
        inputs.append("mask")
    elif "bmask" in extra:
        m = rng.random(extra["bmask"]) > 0.4
        m[1, 0, 2, :] = False  # a fully masked row: zeros, whatever the scores
        feeds["mask"] = m
        inputs.append("mask")
    if "past" in extra:
        inputs += [""] * (4 - len(inputs)) + ["pk", "pv"]
        feeds["pk"] = normal(rng, (2, 2, extra["past"], 8), dtype)
        feeds["pv"] = normal(rng, (2, 2, extra["past"], 6), dtype)
    return _attention(feeds, inputs, extra.get("opset", 23), **attrs), feeds


@pytest.mark.parametrize("name", list(CASES))
def test_attention_decomposes_like_ref(rng, name: str) -> None:
    model, feeds = _case(rng, *CASES[name])
    check_decomposed(model, feeds, ["attention"])


@pytest.mark.parametrize("dtype", [F16, BF16, F64], ids=["f16", "bf16", "f64"])
def test_attention_types(rng, dtype) -> None:  # noqa: ANN001
    model, feeds = _case(rng, {"is_causal": 1, "qk_matmul_output_mode": 2}, {"dtype": dtype, "mask": (3, 5)})
    check_decomposed(model, feeds, ["attention"])


def test_attention_nonpad_causal_window(rng) -> None:  # noqa: ANN001
    feeds = _qkv(rng, s=2, lk=6)
    feeds["nonpad"] = np.array([6, 3], np.int64)
    model = _attention(
        feeds, ["q", "k", "v", "", "", "", "nonpad"], 25, is_causal=1, left_window_size=2,
        right_window_size=0, qk_matmul_output_mode=2,
    )  # fmt: skip
    check_decomposed(model, feeds, ["attention"])


def test_attention_nonpad_bool_mask(rng) -> None:  # noqa: ANN001
    feeds = _qkv(rng, s=2, lk=6)
    feeds["mask"] = rng.random((2, 6)) > 0.3
    feeds["nonpad"] = np.array([1, 6], np.int64)
    check_decomposed(_attention(feeds, ["q", "k", "v", "mask", "", "", "nonpad"], 24), feeds, ["attention"])


def test_attention_nan_poison_in_masked_rows(rng) -> None:  # noqa: ANN001
    # Rows fully masked by the bias give zeros even when their scores are NaN or +inf; a NaN in the
    # float mask of a live row poisons it (NaN).
    feeds = _qkv(rng, b=1, hq=1, hkv=1, s=4, lk=6)
    feeds["q"][0, 0, 1] = np.nan
    feeds["q"][0, 0, 3] = np.inf
    mask = np.zeros((4, 6), np.float32)
    mask[1] = mask[3] = -np.inf
    mask[2, 0] = np.nan
    mask[0] = -np.inf
    mask[0, 2] = np.nan  # NaN among -inf: not a masked row (the ref's max is NaN), so NaN
    feeds["mask"] = mask
    model = _attention(feeds, ["q", "k", "v", "mask"], softcap=0.5, qk_matmul_output_mode=3)
    check_decomposed(model, feeds, ["attention"])
    bmodel = _attention({**feeds, "mask": np.isfinite(mask)}, ["q", "k", "v", "mask"], is_causal=1)
    check_decomposed(bmodel, {**feeds, "mask": np.isfinite(mask)}, ["attention"])


def test_attention_row_of_overflowed_scores_gives_zeros(rng) -> None:  # noqa: ANN001
    # No mask: a row whose scores all overflow to -inf is zeros in the ref (the IR softmax gives NaN).
    feeds = _qkv(rng, b=1, hq=1, hkv=1, s=3, lk=4)
    feeds["q"][0, 0, 1] = 1e38
    feeds["k"] = -np.abs(feeds["k"]) - 1
    check_decomposed(_attention(feeds, ["q", "k", "v"], qk_matmul_output_mode=3), feeds, ["attention"])


def test_attention_3d_inputs(rng) -> None:  # noqa: ANN001
    feeds = {"q": normal(rng, (2, 3, 32)), "k": normal(rng, (2, 5, 16)), "v": normal(rng, (2, 5, 12))}
    model = _attention(feeds, ["q", "k", "v"], q_num_heads=4, kv_num_heads=2, is_causal=1)
    check_decomposed(model, feeds, ["attention"])


# -- RotaryEmbedding ----------------------------------------------------------------------------------
@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("rotary_dim", [0, 4])
def test_rotary_embedding_with_positions(rng, interleaved: int, rotary_dim: int) -> None:  # noqa: ANN001
    half = (rotary_dim or 8) // 2
    feeds = {"x": normal(rng, (2, 4, 3, 8)), "cos": normal(rng, (10, half)), "sin": normal(rng, (10, half))}
    feeds["pos"] = rng.integers(0, 10, (2, 3)).astype(np.int64)
    attrs = {"interleaved": interleaved, "rotary_embedding_dim": rotary_dim}
    model = make_model([node("RotaryEmbedding", list(feeds), **attrs)], feeds, opset=23)
    check_decomposed(model, feeds, ["rotary_embedding"])


@pytest.mark.parametrize("dtype", [F16, BF16], ids=["f16", "bf16"])
def test_rotary_embedding_3d_narrow(rng, dtype) -> None:  # noqa: ANN001
    feeds = {"x": normal(rng, (2, 3, 16), dtype), "cos": normal(rng, (2, 3, 4), dtype)}
    feeds["sin"] = normal(rng, (2, 3, 4), dtype)
    attrs = {"interleaved": 1, "num_heads": 2}
    model = make_model([node("RotaryEmbedding", list(feeds), **attrs)], feeds, opset=23)
    check_decomposed(model, feeds, ["rotary_embedding"])


@pytest.mark.skipif(nvrtc.nvrtc_available() is not None, reason=str(nvrtc.nvrtc_available()))
def test_decomposed_attention_kernels_compile(rng) -> None:  # noqa: ANN001
    model, feeds = _case(
        rng, {"is_causal": 1, "softcap": 1.0}, {"dtype": F16, "bmask": (2, 1, 3, 5), "past": 2}
    )
    assert compile_kernels(check_decomposed(model, feeds, ["attention"])) >= 4


# -- ONNX's own cases: the simulated lowering meets their expected outputs at their tolerances -----------
ONNX_CASES = [
    "test_attention_4d_causal_bf16",
    "test_attention_4d_causal_padded_kv_bf16",
    "test_attention_4d_gqa_with_past_and_present_fp16",
    "test_attention_4d_softcap_neginf_mask_poison",
    "test_attention_23_boolmask_fullymasked_row_nan_robustness",
    "test_attention_24_fullymasked_qk_matmul_output_mode3_zero",
    "test_attention_4d_causal_nonpad_attn_mask_composition",
    "test_attention_local_window_ext_cache_float16_mask",
    "test_rotary_embedding_with_interleaved_rotary_dim",
]


@pytest.mark.parametrize("name", ONNX_CASES)
def test_onnx_case_meets_expected_outputs(name: str) -> None:
    from onnx.backend.test.case.node import collect_testcases

    from migraphx_ep.frontend import model_to_dict, parse_graph
    from migraphx_ep.ir.dtypes import from_numpy
    from migraphx_ep.ir.shape import Shape
    from migraphx_ep.targets.gpu.lowering import lower
    from migraphx_ep.targets.gpu.simulate import run_steps

    from .decomposecheck import DecomposedRef

    case = next(c for c in collect_testcases(None) if c.name == name)
    inputs, outputs = case.data_sets[0]
    names = [i.name for i in case.model.graph.input]
    feeds = {k: np.asarray(v) for k, v in zip(names, inputs, strict=False) if v is not None}
    shapes = {k: Shape(from_numpy(v.dtype), v.shape) for k, v in feeds.items()}
    prog = parse_graph(model_to_dict(case.model), shapes).program
    prog.compile(DecomposedRef())
    got = run_steps(lower(prog.get_main_module(), use_blas=True, use_dnn=True), feeds)
    for g, want in zip(got, outputs, strict=True):
        np.testing.assert_allclose(
            g.astype(np.float64), np.asarray(want).astype(np.float64), rtol=case.rtol, atol=case.atol,
            equal_nan=True,
        )  # fmt: skip

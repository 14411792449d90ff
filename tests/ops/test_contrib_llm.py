"""com.microsoft GroupQueryAttention and RotaryEmbedding: ORT 1.32's CPU EP vs our EP (ref target).

Every case runs two real sessions and checks, through ORT's profiler, that the node ran on our EP.
fp32 tolerances are float32 rounding (different summation orders); fp16 ones are a few fp16 ulps.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from llmcheck import compare, ms_model, refusal
from onnx import helper

from migraphx_ep.frontend import model_to_dict, parse_graph

RNG = np.random.default_rng(11)
TOL = {np.float32: (1e-5, 1e-5), np.float16: (2e-3, 2e-3)}
HQ, HKV = 4, 2


def rand(*lens: int, dtype=np.float32) -> np.ndarray:
    return RNG.standard_normal(lens).astype(dtype)


def rotary_caches(rd: int, dtype, max_len: int = 32) -> tuple[np.ndarray, np.ndarray]:
    ang = RNG.uniform(0, 6, (max_len, rd // 2))
    return np.cos(ang).astype(dtype), np.sin(ang).astype(dtype)


def gqa_case(
    b: int,
    s: int,
    past: int | None,
    seqlens: list[int],
    total: int,
    d: int = 16,
    dtype=np.float32,
    packed: bool = False,
    rotary: int = 0,
    sink: bool = False,
    **attrs,
) -> tuple[bytes, dict[str, np.ndarray]]:
    feeds: dict[str, np.ndarray] = {}
    if packed:
        feeds["q"] = rand(b, s, (HQ + 2 * HKV) * d, dtype=dtype)
        names = ["q", "", ""]
    else:
        feeds.update(q=rand(b, s, HQ * d, dtype=dtype), k=rand(b, s, HKV * d, dtype=dtype))
        feeds["v"] = rand(b, s, HKV * d, dtype=dtype)
        names = ["q", "k", "v"]
    if past is not None:
        feeds.update(pk=rand(b, HKV, past, d, dtype=dtype), pv=rand(b, HKV, past, d, dtype=dtype))
        names += ["pk", "pv"]
    else:
        names += ["", ""]
    feeds.update(sk=np.array(seqlens, np.int32), tl=np.array(total, np.int32))
    names += ["sk", "tl"]
    if rotary:
        feeds["cos"], feeds["sin"] = rotary_caches(rotary, dtype)
        names += ["cos", "sin"]
        attrs["do_rotary"] = 1
    if sink:
        names += [""] * (11 - len(names)) + ["sink"]
        feeds["sink"] = rand(HQ, dtype=dtype)
    node = helper.make_node(
        "GroupQueryAttention",
        names,
        ["y", "present_k", "present_v"],
        domain="com.microsoft",
        num_heads=HQ,
        kv_num_heads=HKV,
        **attrs,
    )
    return ms_model(node, feeds), feeds


GQA_CASES = {
    # name: (b, s, past, seqlens_k, total_sequence_length, kwargs)
    "prompt_no_past": (2, 4, None, [3, 3], 4, {}),
    "prompt_empty_past": (2, 4, 0, [3, 3], 4, {}),
    "decode_growing_past": (2, 1, 5, [5, 5], 6, {}),
    "decode_growing_ragged": (2, 1, 5, [5, 3], 6, {}),
    "decode_share_buffer": (2, 1, 8, [5, 3], 6, {}),
    "prompt_share_buffer": (2, 4, 8, [3, 3], 4, {}),
    "subsequent_prompt": (1, 3, 5, [7], 8, {}),
    "packed_qkv_decode": (2, 1, 6, [6, 4], 7, {"packed": True}),
    "rotary_prompt": (2, 4, 0, [3, 3], 4, {"rotary": 16}),
    "rotary_decode_share": (2, 1, 8, [5, 3], 6, {"rotary": 16}),
    "rotary_interleaved_partial": (2, 1, 8, [6, 2], 7, {"rotary": 16, "rotary_interleaved": 1, "d": 32}),
    "rotary_packed_decode": (2, 1, 8, [5, 3], 6, {"rotary": 16, "packed": True}),
    "local_window_prompt": (2, 6, 0, [5, 5], 6, {"local_window_size": 2}),
    "local_window_decode": (2, 1, 8, [7, 5], 8, {"local_window_size": 3}),
    "scale_softcap": (2, 1, 8, [5, 3], 6, {"scale": 0.3, "softcap": 2.0}),
    "smooth_softmax": (2, 1, 8, [7, 5], 8, {"smooth_softmax": 1}),
    "head_sink": (2, 1, 8, [7, 5], 8, {"sink": True}),
    "non_causal_prompt": (2, 4, 0, [3, 3], 4, {"causal": 0}),
}


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("name", list(GQA_CASES))
def test_group_query_attention_vs_ort(name, dtype):
    b, s, past, seqlens, total, kw = GQA_CASES[name]
    model, feeds = gqa_case(b, s, past, seqlens, total, dtype=dtype, **kw)
    compare(model, feeds, *TOL[dtype])


def test_gqa_decode_steps_reuse_one_session():
    # GenAI-style share-buffer decode: the same session over several steps and batch raggedness.
    model, feeds = gqa_case(2, 1, 8, [4, 2], 5, rotary=16)
    for seqlens in ([4, 2], [5, 3], [7, 6]):
        feeds = {**feeds, "q": rand(2, 1, HQ * 16), "sk": np.array(seqlens, np.int32)}
        feeds["tl"] = np.array(max(seqlens) + 1, np.int32)
        compare(model, feeds, *TOL[np.float32])


def probe_needs(model: bytes) -> dict[int, list[str]]:
    d = model_to_dict(onnx.load_from_string(model))
    return parse_graph(d, tolerant=True, specialize=True).needs_values


def test_gqa_value_inputs_in_the_compile_key():
    # seqlens_k is read at run time, never specialised on. total_sequence_length only decides the
    # present length (ORT: max(past_len, total)): not needed without a past ...
    assert probe_needs(gqa_case(2, 4, 0, [3, 3], 4)[0]) == {}
    assert probe_needs(gqa_case(2, 4, None, [3, 3], 4)[0]) == {}
    # ... but with one, a shared buffer (total <= past_len) and a growing cache (past_len + S) have
    # the same shapes, so its value is needed.
    assert list(probe_needs(gqa_case(2, 1, 8, [5, 3], 6)[0]).values()) == [["tl"]]


def test_gqa_run_time_values_are_checked():
    # A first prompt must have total == S when there is no past; ORT fails such a run too.
    model, feeds = gqa_case(1, 4, None, [3], 4)
    feeds["tl"] = np.array(6, np.int32)
    from llmcheck import ours

    with pytest.raises(Exception, match="present length"):
        ours(model, feeds)


REFUSED = {
    "qk_output": ({"qk_output": 1}, "output_qk"),
    "quantised_cache": ({"k_quant_type": "PER_TENSOR"}, "quantised"),
    "windowed_cache": ({"sliding_window_cache": 1, "local_window_size": 4}, "windowed"),
    "window_not_causal": ({"causal": 0, "local_window_size": 2}, "out of range"),
    "unknown_attr": ({"mask_filter_value": -1.0}, "not supported"),
}


@pytest.mark.parametrize("name", list(REFUSED))
def test_gqa_refusals(name):
    attrs, why = REFUSED[name]
    model, feeds = gqa_case(2, 1, 8, [5, 3], 6, **attrs)
    reason = refusal(model, feeds)
    assert reason is not None and why in reason


def test_gqa_refuses_unimplemented_inputs_and_head_sizes():
    model, feeds = gqa_case(2, 1, 8, [5, 3], 6, d=12)
    assert "multiple of 8" in refusal(model, feeds)
    model, feeds = gqa_case(2, 1, 8, [5, 3], 6)
    m = onnx.load_from_string(model)
    m.graph.node[0].input.extend(["", "", "pos"])  # position_ids
    m.graph.input.append(helper.make_tensor_value_info("pos", onnx.TensorProto.INT64, [2, 1]))
    feeds["pos"] = np.zeros((2, 1), np.int64)
    assert "position_ids" in refusal(m.SerializeToString(), feeds)


ROTARY_CASES = {
    # name: (input dims, position_ids, cos width, attrs)
    "3d_positions": ((2, 3, 64), "bs", 8, {}),
    "3d_num_heads_interleaved": ((2, 3, 64), "bs", 8, {"num_heads": 4, "interleaved": 1}),
    "3d_offset": ((2, 3, 64), "offset", 8, {}),
    "3d_heads_from_cache": ((2, 3, 64), "bs", 4, {}),
    "3d_partial": ((2, 3, 64), "bs", 4, {"num_heads": 4, "rotary_embedding_dim": 8}),
    "4d_bnsh": ((2, 4, 3, 16), "bs", 8, {}),
    "4d_partial_interleaved": (
        (2, 4, 3, 16),
        "offset",
        4,
        {"num_heads": 4, "rotary_embedding_dim": 8, "interleaved": 1},
    ),
}


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("name", list(ROTARY_CASES))
def test_ms_rotary_embedding_vs_ort(name, dtype):
    dims, pos_kind, half, attrs = ROTARY_CASES[name]
    b, s = dims[0], dims[-2] if len(dims) == 4 else dims[1]
    cos, sin = rotary_caches(2 * half, dtype, max_len=20)
    pos = RNG.integers(0, 20, (b, s)) if pos_kind == "bs" else np.array([20 - s])
    feeds = {"x": rand(*dims, dtype=dtype), "pos": pos.astype(np.int64), "cos": cos, "sin": sin}
    node = helper.make_node("RotaryEmbedding", list(feeds), ["y"], domain="com.microsoft", **attrs)
    # ORT computes in float32 and rounds once; so do we: fp16 results are equal, not just close.
    compare(ms_model(node, feeds), feeds, *(TOL[np.float32] if dtype == np.float32 else (0, 0)))


def test_ms_rotary_embedding_refusals():
    feeds = {"x": rand(2, 3, 64), "pos": np.zeros((2, 3), np.int64)}
    feeds["cos"], feeds["sin"] = rotary_caches(16, np.float32)
    for attrs, why in (({"is_packed_batching": 1}, "packed"), ({"scale": 2.0}, "scale")):
        node = helper.make_node("RotaryEmbedding", list(feeds), ["y"], domain="com.microsoft", **attrs)
        assert why in refusal(ms_model(node, feeds), feeds)


def genai_mask_gqa(head_dim: int | str) -> bytes:
    """GenAI's builder derives seqlens_k (ReduceSum(mask) - 1) and total_sequence_length (Shape(mask)[1])
    from attention_mask, and declares the KV cache's head size as a symbol (``kv_cache_dim``)."""
    i64, i32 = onnx.TensorProto.INT64, onnx.TensorProto.INT32
    nodes = [
        helper.make_node("ReduceSum", ["mask", "axes"], ["msum"], keepdims=0),
        helper.make_node("Sub", ["msum", "one"], ["sk64"]),
        helper.make_node("Cast", ["sk64"], ["sk"], to=i32),
        helper.make_node("Shape", ["mask"], ["mshape"]),
        helper.make_node("Gather", ["mshape", "one"], ["tl64"], axis=0),
        helper.make_node("Cast", ["tl64"], ["tl"], to=i32),
        helper.make_node(
            "GroupQueryAttention",
            ["q", "k", "v", "pk", "pv", "sk", "tl"],
            ["y", "present_k", "present_v"],
            domain="com.microsoft",
            num_heads=HQ,
            kv_num_heads=HKV,
        ),
    ]
    f = onnx.TensorProto.FLOAT
    inputs = [helper.make_tensor_value_info("mask", i64, ["B", "T"])]
    inputs += [
        helper.make_tensor_value_info(n, f, ["B", 1, w])
        for n, w in (("q", HQ * 16), ("k", HKV * 16), ("v", HKV * 16))
    ]
    inputs += [helper.make_tensor_value_info(n, f, ["B", HKV, "P", head_dim]) for n in ("pk", "pv")]
    outs = [helper.make_value_info(o, onnx.TypeProto()) for o in ("y", "present_k", "present_v")]
    one = onnx.numpy_helper.from_array(np.array(1, np.int64), "one")
    axes = onnx.numpy_helper.from_array(np.array([1], np.int64), "axes")
    g = helper.make_graph(nodes, "t", inputs, outs, [one, axes])
    m = helper.make_model(
        g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    )
    m.ir_version = 10
    return m.SerializeToString()


@pytest.mark.parametrize("head_dim", [16, "kv_cache_dim"])
def test_gqa_with_genai_mask_subgraph_folds_total(head_dim):
    # In one partition total_sequence_length folds from the mask's dims: no value input at all. A
    # symbolic head size is pinned to the query's in the partition probe (DimMismatch), so the node
    # is claimed (compare checks it ran on our EP) although the probe first made up another size.
    model = genai_mask_gqa(head_dim)
    assert probe_needs(model) == {}
    # Share-buffer decode (past buffer of 8, 6 tokens) and growing-cache decode (past 5, 6 tokens).
    for past in (8, 5):
        feeds = {"mask": np.ones((2, 6), np.int64), "q": rand(2, 1, HQ * 16)}
        feeds.update(k=rand(2, 1, HKV * 16), v=rand(2, 1, HKV * 16))
        feeds.update(pk=rand(2, HKV, past, 16), pv=rand(2, HKV, past, 16))
        compare(model, feeds, *TOL[np.float32])


def test_gqa_symbolic_head_size_checked_at_run():
    # The pin is only the probe's guess: a past whose real head size is not the query's fails the Run
    # with the node's reason (ORT's CPU EP rejects it too), never a wrong number.
    from llmcheck import ours

    feeds = {"mask": np.ones((1, 6), np.int64), "q": rand(1, 1, HQ * 16)}
    feeds.update(k=rand(1, 1, HKV * 16), v=rand(1, 1, HKV * 16))
    feeds.update(pk=rand(1, HKV, 8, 8), pv=rand(1, HKV, 8, 8))
    with pytest.raises(Exception, match="past_key/past_value must be"):
        ours(genai_mask_gqa("kv_cache_dim"), feeds)

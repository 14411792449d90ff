"""GroupQueryAttention cases for the gpu target's tests: one com.microsoft node as an ONNX model, its
feeds, and programs parsed from it (total_sequence_length specialised, as the EP does with a past).

``CASES`` covers what the kernels branch on: first prompt with and without a past, decode from a
growing cache and from GenAI's shared buffer, batch 2 with different lengths, a subsequent prompt,
packed QKV, rotary in both layouts (full and partial width), sliding window, softcap and scale, smooth
softmax, head sink, no causal mask, several query heads per kv head and head sizes not a multiple of 32.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from migraphx_ep.frontend.graph import model_to_dict
from migraphx_ep.frontend.parser import parse_graph
from migraphx_ep.ir.dtypes import from_numpy
from migraphx_ep.ir.operation import make_op
from migraphx_ep.ir.program import Program
from migraphx_ep.ir.shape import Shape

GENAI = Path(__file__).resolve().parents[1] / "models" / "genai"

# name: (b, s, past, seqlens_k, total_sequence_length, keyword arguments of gqa_model)
CASES: dict[str, tuple] = {
    "prompt_no_past": (2, 4, None, [3, 3], 4, {}),
    "prompt_padded_empty_past": (2, 4, 0, [3, 1], 4, {}),
    "decode_growing_ragged": (2, 1, 5, [5, 3], 6, {}),
    "decode_share_buffer": (2, 1, 8, [5, 3], 6, {}),
    "prompt_share_buffer": (2, 4, 8, [3, 3], 4, {}),
    "subsequent_prompt": (1, 3, 5, [7], 8, {}),
    "packed_qkv_decode": (2, 1, 6, [6, 4], 7, {"packed": True}),
    "rotary_prompt": (2, 4, 0, [3, 3], 4, {"rotary": 16}),
    "rotary_decode_share": (2, 1, 8, [5, 3], 6, {"rotary": 16, "packed": True}),
    "rotary_interleaved_partial": (2, 1, 8, [6, 2], 7, {"rotary": 16, "rotary_interleaved": 1, "d": 32}),
    "local_window_prompt": (2, 6, 0, [5, 3], 6, {"local_window_size": 2}),
    "local_window_decode": (2, 1, 8, [7, 5], 8, {"local_window_size": 3}),
    "scale_softcap": (2, 1, 8, [5, 3], 6, {"scale": 0.3, "softcap": 2.0}),
    "smooth_softmax": (2, 1, 8, [7, 5], 8, {"smooth_softmax": 1}),
    "head_sink": (2, 1, 8, [7, 5], 8, {"sink": True}),
    "non_causal_prompt": (2, 4, 0, [3, 3], 4, {"causal": 0}),
    "group_of_4_head_48": (1, 2, 6, [7], 8, {"d": 48, "hq": 8, "hkv": 2, "rotary": 16}),
    "mha_head_80": (1, 1, 9, [8], 9, {"d": 80, "hq": 3, "hkv": 3}),
}


def gqa_model(
    b: int, s: int, past: int | None, seqlens: list[int], total: int, d: int = 16, hq: int = 4,
    hkv: int = 2, dtype=np.float32, packed: bool = False, rotary: int = 0, sink: bool = False,
    seed: int = 0, max_pos: int = 32, **attrs,
) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:  # fmt: skip
    """The model (outputs y, present_k, present_v) and its feeds; ``rotary``: the rotary width."""
    rng = np.random.default_rng(seed)

    def rand(*lens: int) -> np.ndarray:
        return rng.standard_normal(lens).astype(dtype)

    feeds: dict[str, np.ndarray] = {}
    if packed:
        feeds["q"] = rand(b, s, (hq + 2 * hkv) * d)
        names = ["q", "", ""]
    else:
        feeds.update(q=rand(b, s, hq * d), k=rand(b, s, hkv * d), v=rand(b, s, hkv * d))
        names = ["q", "k", "v"]
    if past is not None:
        feeds.update(pk=rand(b, hkv, past, d), pv=rand(b, hkv, past, d))
    names += ["pk", "pv"] if past is not None else ["", ""]
    feeds.update(sk=np.array(seqlens, np.int32), tl=np.array(total, np.int32))
    names += ["sk", "tl"]
    if rotary:
        ang = rng.uniform(0, 6, (max_pos, rotary // 2))
        feeds.update(cos=np.cos(ang).astype(dtype), sin=np.sin(ang).astype(dtype))
        names += ["cos", "sin"]
        attrs["do_rotary"] = 1
    if sink:
        names += [""] * (11 - len(names)) + ["sink"]
        feeds["sink"] = rand(hq)
    node = helper.make_node(
        "GroupQueryAttention", names, ["y", "present_k", "present_v"], domain="com.microsoft",
        num_heads=hq, kv_num_heads=hkv, **attrs,
    )  # fmt: skip
    vis = [
        helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
        for k, v in feeds.items()
    ]
    outs = [helper.make_value_info(o, onnx.TypeProto()) for o in node.output]
    g = helper.make_graph([node], "gqa", vis, outs)
    m = helper.make_model(
        g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    )
    m.ir_version = 10
    return m, feeds


def case(name: str, dtype=np.float32, **over) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    b, s, past, seqlens, total, kw = CASES[name]
    return gqa_model(b, s, past, seqlens, total, dtype=dtype, **{**kw, **over})


def parse(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> Program:
    """The program for these feeds' dims and total_sequence_length (not compiled)."""
    shapes = {k: Shape(from_numpy(v.dtype), v.shape) for k, v in feeds.items()}
    return parse_graph(model_to_dict(model), shapes, input_values={"tl": feeds["tl"]}).program


def other_lengths(name: str, feeds: dict[str, np.ndarray], seed: int = 7) -> dict[str, np.ndarray]:
    """New data and other valid seqlens_k for the same total_sequence_length (the program was specialised
    on it): T_b in [1, S] on a first prompt, else in [S, min(past + S, present length)]."""
    b, s, past, _, total, _ = CASES[name]
    rng = np.random.default_rng(seed)
    lo, hi = (1, s) if total == s else (s, min((past or 0) + s, max(past or 0, total)))
    new = {
        k: rng.standard_normal(v.shape).astype(v.dtype) if v.dtype.kind == "f" else v
        for k, v in feeds.items()
    }
    return {**new, "sk": (rng.integers(lo, hi + 1, size=b) - 1).astype(np.int32)}


def runtime_program(model: onnx.ModelProto, feeds: dict[str, np.ndarray], **attrs) -> Program:
    """The model's group_query_attention (``attrs`` replaced) as a program of its own whose every input
    is a parameter, total_sequence_length too (the EP's programs hold its value as a constant), so a
    run can contradict the present length the op was compiled for."""
    (ins,) = [
        i for i in parse(model, feeds).get_main_module().instructions if i.name == "group_query_attention"
    ]
    op = dataclasses.replace(ins.op, **attrs)
    names = ["q", "k", "v", *(["pk", "pv"] if op.has_past else []), "sk", "tl"]
    names += (["cos", "sin"] if op.rotary else []) + (["sink"] if op.has_sink else [])
    prog = Program()
    m = prog.get_main_module()
    args = [m.add_parameter(n, Shape(from_numpy(feeds[n].dtype), feeds[n].shape)) for n in names]
    t = m.add_instruction(op, args)
    m.add_return([m.add_instruction(make_op("get_tuple_elem", index=i), [t]) for i in range(3)])
    return prog


def genai_graph(name: str) -> onnx.ModelProto:
    """A GenAI decoder with its Constant nodes turned into initializers, as ORT loads it."""
    m = onnx.load(GENAI / name / "model.onnx")
    for n in [n for n in m.graph.node if n.op_type == "Constant"]:
        t = helper.get_attribute_value(n.attribute[0])
        t.name = n.output[0]
        m.graph.initializer.append(t)
        m.graph.node.remove(n)
        for vi in [v for v in m.graph.value_info if v.name == n.output[0]]:
            m.graph.value_info.remove(vi)
    return m

"""com.microsoft ops of ORT GenAI's decoder models: GroupQueryAttention and RotaryEmbedding.

Semantics are ORT 1.32's CPU kernels (tests/ops/test_contrib_llm.py runs both). Anything else the
schema allows (quantised KV cache, windowed cache, position_ids, attention_bias, q/k norms,
query_seqlens, output_qk) is refused with a reason and stays on ORT.
"""

from __future__ import annotations

import numpy as np

from ...ir.dtypes import DType
from ...ir.instruction import Instruction
from ..context import NodeDesc, ParseContext
from ..table import DimMismatch, Unsupported, onnx_op
from .normalize import wanted
from .pointwise import check_attrs, fattr

MS = "com.microsoft"
LLM_TYPES = {DType.float_type, DType.half_type}  # ORT's CPU kernels: no bf16 to check against

GQA_ATTRS = (
    "num_heads",
    "kv_num_heads",
    "scale",
    "softcap",
    "local_window_size",
    "do_rotary",
    "rotary_interleaved",
    "causal",
    "smooth_softmax",
    "qk_output",
    "k_quant_type",
    "v_quant_type",
    "kv_cache_bit_width",
    "sliding_window_cache",
    "qk_norm_epsilon",  # the norm epsilons only matter with q/k_norm_weight, which are refused
    "q_norm_epsilon",
    "k_norm_epsilon",
)
GQA_REFUSED_INPUTS = {
    9: "position_ids",
    10: "attention_bias",
    12: "k_scale (quantised KV cache)",
    13: "v_scale (quantised KV cache)",
    14: "q_norm_weight",
    15: "k_norm_weight",
    16: "query_seqlens",
}


def _arg(args: list, i: int) -> Instruction | None:
    return args[i] if len(args) > i else None


def _slice(ctx: ParseContext, x: Instruction, start: int, end: int) -> Instruction:
    return ctx.add("slice", [x], axes=[2], starts=[start], ends=[end])


def _gqa_present_len(
    ctx: ParseContext, s: int, past: Instruction | None, total: Instruction
) -> tuple[int, bool]:
    """ORT's present length is max(past_len, total_sequence_length): with no (or an empty) past it is
    S (a first prompt: total == S, checked at run time), otherwise it depends on the value -- a
    shared past/present buffer (total <= past_len) keeps past_len, a growing cache gets
    past_len + S -- and nothing in the shapes tells the two apart, so that value is needed. Compiled
    for run-time dims (total follows from the attention mask's length), the value is not known: take
    the shared buffer, which every decode step of GenAI's share-buffer mode is, and let the op check it
    (the second result: assumed)."""
    past_len = past.shape.lens[2] if past is not None else 0
    if past_len == 0:
        return s, False
    if ctx.assume_runtime and ctx.const(total) is None:
        return past_len, True
    value = ctx.require_const(total, "GroupQueryAttention total_sequence_length (the present length)")
    return max(past_len, int(value.ravel()[0])), False


@onnx_op("GroupQueryAttention", domain=MS)
def parse_group_query_attention(ctx: ParseContext, node: NodeDesc, args):
    check_attrs(node, GQA_ATTRS)
    for i, what in GQA_REFUSED_INPUTS.items():
        if _arg(args, i) is not None:
            raise Unsupported(f"GroupQueryAttention with {what} is not supported")
    if wanted(node, 3) or int(node.attr("qk_output", 0)) != 0:
        raise Unsupported("GroupQueryAttention output_qk is not supported")
    for a in ("k_quant_type", "v_quant_type"):
        if str(node.attr(a, "NONE")) != "NONE":
            raise Unsupported("GroupQueryAttention with a quantised KV cache is not supported")
    if int(node.attr("kv_cache_bit_width", 0)) != 0 or int(node.attr("sliding_window_cache", 0)) != 0:
        raise Unsupported("GroupQueryAttention with a quantised or windowed KV cache is not supported")
    q, k, v, pk, pv, seqlens, total = (_arg(args, i) for i in range(7))
    cos, sin, sink = _arg(args, 7), _arg(args, 8), _arg(args, 11)
    if seqlens is None or total is None:
        raise Unsupported("GroupQueryAttention needs seqlens_k and total_sequence_length")
    if q.shape.type not in LLM_TYPES or q.shape.ndim() != 3:
        raise Unsupported(f"GroupQueryAttention query must be 3-D float or float16, got {q.shape}")
    if (k is None) != (v is None) or (pk is None) != (pv is None):
        raise Unsupported("GroupQueryAttention key/value (and past_key/past_value) come in pairs")
    if seqlens.shape.type != DType.int32_type or total.shape.type != DType.int32_type:
        raise Unsupported("GroupQueryAttention seqlens_k / total_sequence_length must be int32")
    hq, hkv = int(node.attr("num_heads", 0)), int(node.attr("kv_num_heads", 0))
    if hq <= 0 or hkv <= 0 or hq % hkv:
        raise Unsupported(f"GroupQueryAttention num_heads {hq} / kv_num_heads {hkv}")
    b, s, hidden = q.shape.lens
    if k is None:  # packed QKV: (B, S, (Hq + 2 Hkv) * D)
        if hidden % (hq + 2 * hkv):
            raise Unsupported("GroupQueryAttention packed QKV width does not split into heads")
        d = hidden // (hq + 2 * hkv)
        q, k, v = (
            _slice(ctx, q, 0, hq * d),
            _slice(ctx, q, hq * d, (hq + hkv) * d),
            _slice(ctx, q, (hq + hkv) * d, hidden),
        )
    elif hidden % hq:
        raise Unsupported("GroupQueryAttention hidden size not divisible by num_heads")
    d = q.shape.lens[2] // hq
    if d % 8:
        raise Unsupported(f"GroupQueryAttention head size {d} is not a multiple of 8 (ORT rejects it)")
    if k.shape.lens != (b, s, hkv * d) or v.shape.lens != k.shape.lens or k.shape.type != q.shape.type:
        raise Unsupported("GroupQueryAttention key/value dims do not match query")
    past_dims = "GroupQueryAttention past_key/past_value must be (B, kv_num_heads, L, head_size)"
    if pk is not None and (
        pk.shape.ndim() != 4 or pk.shape.lens != pv.shape.lens or pk.shape.lens[:2] != (b, hkv)
    ):
        raise Unsupported(past_dims)
    for past in (pk, pv) if pk is not None else ():
        if past.shape.lens[3] != d:  # GenAI declares it as a symbol of its own: kv_cache_dim
            raise DimMismatch(past, 3, d, past_dims)
    if pk is not None and {pk.shape.type, pv.shape.type} != {q.shape.type}:
        raise Unsupported(
            "GroupQueryAttention with a past cache of another type (quantised) is not supported"
        )
    do_rotary = int(node.attr("do_rotary", 0)) == 1
    if (cos is None) != (sin is None) or do_rotary != (cos is not None):
        raise Unsupported("GroupQueryAttention: cos_cache/sin_cache must be given exactly when do_rotary=1")
    if do_rotary:
        half = cos.shape.lens[1] if cos.shape.ndim() == 2 else -1
        if d % 16 or half <= 0 or half % 8 or half > d // 2 or cos.shape.lens != sin.shape.lens:
            raise Unsupported("GroupQueryAttention rotary caches must be (max_len, k*8 <= head_size/2)")
    causal = int(node.attr("causal", 1))
    window = int(node.attr("local_window_size", -1))
    softcap = fattr(node, "softcap", 0.0)
    if causal not in (0, 1) or (window != -1 and (window <= 0 or not causal)) or softcap < 0:
        raise Unsupported("GroupQueryAttention causal/local_window_size/softcap out of range")
    if sink is not None and (sink.shape.lens != (hq,) or sink.shape.type != q.shape.type):
        raise Unsupported("GroupQueryAttention head_sink must be (num_heads,) of the query type")
    present_len, assumed = _gqa_present_len(ctx, s, pk, total)
    ins = [q, k, v] + ([pk, pv] if pk is not None else []) + [seqlens, total]
    ins += ([cos, sin] if do_rotary else []) + ([sink] if sink is not None else [])
    t = ctx.add(
        "group_query_attention",
        ins,
        num_heads=hq,
        kv_num_heads=hkv,
        present_len=present_len,
        scale=fattr(node, "scale", 0.0),
        softcap=softcap,
        local_window=window,
        causal=bool(causal),
        smooth_softmax=int(node.attr("smooth_softmax", 0)) == 1,
        rotary_interleaved=int(node.attr("rotary_interleaved", 0)) == 1,
        has_past=pk is not None,
        rotary=do_rotary,
        has_sink=sink is not None,
        assumed_present=assumed,
    )
    return [ctx.add("get_tuple_elem", [t], index=i) for i in range(3)]


def _positions(ctx: ParseContext, pos: Instruction, b: int, s: int) -> Instruction:
    """position_ids as (B, S): a (B, S) tensor as is; one element is the first position of every row."""
    if pos.shape.type != DType.int64_type:
        raise Unsupported("RotaryEmbedding position_ids must be int64")
    if pos.shape.lens == (b, s):
        return pos
    if pos.shape.elements() != 1 or pos.shape.ndim() > 1:
        raise Unsupported(f"RotaryEmbedding position_ids of dims {list(pos.shape.lens)}")
    start = ctx.broadcast_to(ctx.add("reshape", [pos], dims=[1, 1]), (b, s))
    steps = ctx.broadcast_to(ctx.literal(np.arange(s, dtype=np.int64).reshape(1, s)), (b, s))
    return ctx.add("add", [start, steps])


@onnx_op("RotaryEmbedding", domain=MS)
def parse_ms_rotary_embedding(ctx: ParseContext, node: NodeDesc, args):
    check_attrs(node, ("num_heads", "rotary_embedding_dim", "interleaved", "is_packed_batching", "scale"))
    if int(node.attr("is_packed_batching", 0)) != 0:
        raise Unsupported("RotaryEmbedding with is_packed_batching is not supported")
    if fattr(node, "scale", 1.0) != 1.0:  # ORT's CPU kernel ignores it; other EPs may not
        raise Unsupported("RotaryEmbedding with a custom scale is not supported")
    x, pos, cos, sin = args[:4]
    t = x.shape.type
    if t not in LLM_TYPES or {cos.shape.type, sin.shape.type} != {t}:
        raise Unsupported(f"RotaryEmbedding of {t.name} (caches {cos.shape.type.name})")
    if cos.shape.ndim() != 2 or cos.shape.lens != sin.shape.lens:
        raise Unsupported("RotaryEmbedding cos_cache/sin_cache must be equal 2-D")
    heads, rd = int(node.attr("num_heads", 0)), int(node.attr("rotary_embedding_dim", 0))
    if rd > 0 and heads <= 0:
        raise Unsupported("RotaryEmbedding rotary_embedding_dim needs num_heads (ORT rejects it)")
    half = cos.shape.lens[1]
    if x.shape.ndim() == 4:
        b, h, s, d = x.shape.lens
        xt = ctx.add("transpose", [x], permutation=[0, 2, 1, 3])
    elif x.shape.ndim() == 3:
        b, s, hidden = x.shape.lens
        d = hidden // heads if heads > 0 else 2 * half
        if d <= 0 or hidden % d:
            raise Unsupported("3-D RotaryEmbedding hidden size does not split into heads")
        xt = ctx.add("reshape", [x], dims=[b, s, hidden // d, d])
    else:
        raise Unsupported(f"RotaryEmbedding of rank {x.shape.ndim()}")
    rd = rd or d
    if rd % 2 or rd > d or 2 * half != rd:
        raise Unsupported(f"RotaryEmbedding caches of width {half} do not fit rotary dim {rd}")
    p = _positions(ctx, pos, b, s)
    f32 = DType.float_type
    # Computed in float32 and rounded once, as ORT's kernel does for float16.
    cg, sg = (ctx.convert(ctx.add("gather", [c, p], axis=0), f32) for c in (cos, sin))
    y = ctx.add(
        "rotary_embedding",
        [ctx.convert(xt, f32), cg, sg],
        interleaved=int(node.attr("interleaved", 0)) == 1,
        rotary_dim=rd,
    )
    y = ctx.convert(y, t)
    if x.shape.ndim() == 4:
        return ctx.add("transpose", [y], permutation=[0, 2, 1, 3])
    return ctx.add("reshape", [y], dims=list(x.shape.lens))

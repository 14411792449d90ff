"""Attention-family parsers: ai.onnx Attention (opset 23+) and RotaryEmbedding (opset 23+).

The com.microsoft attention ops live in contrib_attention.py (Attention, MultiHeadAttention),
contrib_llm.py (GroupQueryAttention, RotaryEmbedding) and contrib_nbits.py (MatMulNBits,
GatherBlockQuantized).
"""

from __future__ import annotations

from ...ir.dtypes import DType
from ...ir.instruction import Instruction
from ..context import NodeDesc, ParseContext, onnx_type
from ..table import Unsupported, onnx_op

ATTN_DTYPES = {DType.float_type, DType.half_type, DType.bf16_type, DType.double_type}


def split_heads(ctx: ParseContext, x: Instruction, heads: int, what: str) -> Instruction:
    """(B, S, H*D) -> (B, H, S, D)."""
    b, s, hidden = x.shape.lens
    if heads <= 0 or hidden % heads:
        raise Unsupported(f"{what} hidden size {hidden} not divisible by {heads} heads")
    r = ctx.add("reshape", [x], dims=[b, s, heads, hidden // heads])
    return ctx.add("transpose", [r], permutation=[0, 2, 1, 3])


@onnx_op("Attention", min_opset=23)
def parse_attention(ctx: ParseContext, node: NodeDesc, args):
    q, k, v = args[:3]
    opt = list(args[3:]) + [None] * (7 - len(args))
    mask, pk, pv, nonpad = opt[0], opt[1], opt[2], opt[3]
    if q.shape.type not in ATTN_DTYPES:
        raise Unsupported(f"Attention of {q.shape.type.name}")
    if (pk is None) != (pv is None):
        raise Unsupported("Attention needs past_key and past_value together")
    if nonpad is not None and pk is not None:
        raise Unsupported("Attention with both nonpad_kv_seqlen and a past cache")
    rank = q.shape.ndim()
    if rank != k.shape.ndim() or rank != v.shape.ndim() or rank not in (3, 4):
        raise Unsupported("Attention Q/K/V must all be 3-D or all 4-D")
    qh, kvh = node.attr("q_num_heads"), node.attr("kv_num_heads")
    if rank == 3:
        if qh is None or kvh is None:
            raise Unsupported("3-D Attention without q_num_heads/kv_num_heads")
        q, k, v = (
            split_heads(ctx, q, int(qh), "Q"),
            split_heads(ctx, k, int(kvh), "K"),
            split_heads(ctx, v, int(kvh), "V"),
        )
    elif ctx.opset >= 25 and (qh is not None or kvh is not None):
        raise Unsupported("q_num_heads/kv_num_heads given for 4-D inputs")
    sp = node.attr("softmax_precision")
    attrs = dict(
        scale=float(node.attr("scale", 0.0)),
        is_causal=bool(node.attr("is_causal", 0)),
        softcap=float(node.attr("softcap", 0.0)),
        qk_matmul_output_mode=int(node.attr("qk_matmul_output_mode", 0)),
        softmax_type=int(onnx_type(sp)) if sp else -1,
        left_window=int(node.attr("left_window_size", -1)),
        right_window=int(node.attr("right_window_size", -1)),
        has_mask=mask is not None,
        has_past=pk is not None,
        has_nonpad=nonpad is not None,
    )
    if attrs["scale"] < 0 or attrs["softcap"] < 0 or attrs["qk_matmul_output_mode"] not in (0, 1, 2, 3):
        raise Unsupported("Attention scale/softcap/qk_matmul_output_mode out of range")
    if attrs["left_window"] < -1 or attrs["right_window"] < -1:
        raise Unsupported("Attention window sizes must be -1 or non-negative")
    ins = [q, k, v] + [x for x in (mask, pk, pv, nonpad) if x is not None]
    t = ctx.add("attention", ins, **attrs)
    y, pres_k, pres_v, qk = (ctx.add("get_tuple_elem", [t], index=i) for i in range(4))
    if rank == 3:
        b, h, s, dv = y.shape.lens
        y = ctx.add("reshape", [ctx.add("transpose", [y], permutation=[0, 2, 1, 3])], dims=[b, s, h * dv])
    return [y, pres_k, pres_v, qk]


@onnx_op("RotaryEmbedding", min_opset=23)
def parse_rotary_embedding(ctx: ParseContext, node: NodeDesc, args):
    x, cos, sin = args[:3]
    pos = args[3] if len(args) > 3 else None
    if x.shape.type not in ATTN_DTYPES:
        raise Unsupported(f"RotaryEmbedding of {x.shape.type.name}")
    rank = x.shape.ndim()
    if rank == 4:
        xt = ctx.add("transpose", [x], permutation=[0, 2, 1, 3])
    elif rank == 3:
        heads = int(node.attr("num_heads", 0))
        b, s, hidden = x.shape.lens
        if heads <= 0 or hidden % heads:
            raise Unsupported("3-D RotaryEmbedding needs num_heads dividing the hidden size")
        xt = ctx.add("reshape", [x], dims=[b, s, heads, hidden // heads])
    else:
        raise Unsupported(f"RotaryEmbedding of rank {rank}")
    if pos is not None:
        if cos.shape.ndim() != 2 or sin.shape.ndim() != 2:
            raise Unsupported("with position_ids the caches must be 2-D")
        cos = ctx.add("gather", [cos, pos], axis=0)
        sin = ctx.add("gather", [sin, pos], axis=0)
    rd = int(node.attr("rotary_embedding_dim", 0))
    y = ctx.add(
        "rotary_embedding", [xt, cos, sin], interleaved=bool(node.attr("interleaved", 0)), rotary_dim=rd
    )
    if rank == 4:
        return ctx.add("transpose", [y], permutation=[0, 2, 1, 3])
    return ctx.add("reshape", [y], dims=list(x.shape.lens))

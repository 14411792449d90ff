"""com.microsoft MultiHeadAttention and Attention (BERT-style, packed QKV weights) as the ``attention`` op.

ORT's CPU kernels (checked by tests/ops/test_contrib_attention.py) add masks as a *finite*
``mask_filter_value`` (-10000 by default) where a key is padded, add ``attention_bias`` as is, and
exclude causally hidden keys outright (-inf, after the past). So the parsers build one additive float32
mask and pass ``is_causal`` to ``attention``; float16 is computed in float32 and rounded once.
Combinations ORT computes differently or not at all (unidirectional cross attention, a padding mask with
a past in MultiHeadAttention, packed QKV/KV, 4-D Megatron masks, shared past buffers, rotary) are refused.
"""

from __future__ import annotations

import numpy as np

from ...ir.dtypes import DType
from ...ir.instruction import Instruction
from ..context import NodeDesc, ParseContext
from ..table import Unsupported, onnx_op
from .contrib_nn import split_heads
from .normalize import wanted
from .pointwise import check_attrs, fattr

MS = "com.microsoft"
F32 = DType.float_type
MS_ATTN_TYPES = {DType.float_type, DType.half_type}


def _opt(args: list, i: int) -> Instruction | None:
    return args[i] if len(args) > i else None


def _padding_mask(
    ctx: ParseContext, mask: Instruction, b: int, s: int, t: int, fill: float, what: str
) -> Instruction:
    """An int32 key mask as an additive float32 (B, 1, S|1, T): 0 where kept, ``fill`` where padded.
    Forms: raw (B, T) or (B, S, T) with 0 = padded, or (B,) valid lengths (right padding)."""
    if mask.shape.type != DType.int32_type:
        raise Unsupported(f"{what} must be int32")
    lens = mask.shape.lens
    if lens == (b,):
        cols = ctx.broadcast_to(ctx.literal(np.arange(t, dtype=np.int32).reshape(1, t)), (b, t))
        keep = ctx.add("less", [cols, ctx.broadcast_to(ctx.add("reshape", [mask], dims=[b, 1]), (b, t))])
        dims = [b, 1, 1, t]
    elif lens in ((b, t), (b, s, t)):
        keep = ctx.elementwise("greater", mask, ctx.literal(np.int32(0)))
        dims = [b, 1, 1, t] if len(lens) == 2 else [b, 1, s, t]
    else:
        raise Unsupported(f"{what} of dims {list(lens)} is not supported")
    add = ctx.elementwise("where", keep, ctx.literal(np.float32(0)), ctx.literal(np.float32(fill)))
    return ctx.add("reshape", [add], dims=dims)


def _bias_mask(ctx: ParseContext, bias: Instruction, b: int, h: int, s: int, t: int) -> Instruction:
    lens = bias.shape.lens
    if bias.shape.ndim() != 4 or lens[0] not in (1, b) or lens[1] not in (1, h) or lens[2:] != (s, t):
        raise Unsupported(f"attention_bias of dims {list(lens)} is not (B|1, N|1, S, T)")
    return ctx.convert(bias, F32)


def attend(
    ctx: ParseContext,
    q: Instruction,
    k: Instruction,
    v: Instruction,
    masks: list[Instruction],
    past: tuple[Instruction, Instruction] | None,
    causal: bool,
    scale: float,
    out_type: DType,
) -> tuple[Instruction, Instruction, Instruction]:
    """``attention`` over float32 (B, N, S|T, D) heads; returns (Y (B, S, N*Dv), present_k, present_v)
    in ``out_type``. ``masks`` are additive float32 masks, summed."""
    mask = None
    for m in masks:
        mask = m if mask is None else ctx.elementwise("add", mask, m)
    ins = [q, k, v] + ([mask] if mask is not None else []) + (list(past) if past else [])
    t = ctx.add(
        "attention", ins, scale=scale, is_causal=causal, has_mask=mask is not None, has_past=past is not None
    )
    y, pk, pv = (ctx.add("get_tuple_elem", [t], index=i) for i in range(3))
    b, h, s, dv = y.shape.lens
    y = ctx.add("reshape", [ctx.add("transpose", [y], permutation=[0, 2, 1, 3])], dims=[b, s, h * dv])
    return ctx.convert(y, out_type), ctx.convert(pk, out_type), ctx.convert(pv, out_type)


def _common_attrs(node: NodeDesc, extra: tuple[str, ...]) -> tuple[int, float, float, bool]:
    check_attrs(node, ("num_heads", "scale", "mask_filter_value", "unidirectional", *extra))
    heads = int(node.attr("num_heads", 0))
    uni = int(node.attr("unidirectional", 0))
    if heads <= 0 or uni not in (0, 1):
        raise Unsupported(f"{node.op_type} num_heads {heads} / unidirectional {uni}")
    return heads, fattr(node, "scale", 0.0), fattr(node, "mask_filter_value", -10000.0), bool(uni)


@onnx_op("MultiHeadAttention", domain=MS)
def parse_multi_head_attention(ctx: ParseContext, node: NodeDesc, args):
    heads, scale, fill, causal = _common_attrs(node, ())
    q, k, v, bias, kpm, abias, pk, pv = (_opt(args, i) for i in range(8))
    if _opt(args, 8) is not None or _opt(args, 9) is not None:
        raise Unsupported("MultiHeadAttention with past_sequence_length / cache_indirection is not supported")
    if wanted(node, 3):
        raise Unsupported("MultiHeadAttention qk output is not supported")
    t = q.shape.type
    if t not in MS_ATTN_TYPES or q.shape.ndim() != 3:
        raise Unsupported(
            f"MultiHeadAttention query must be 3-D float/float16 (packed QKV is not supported), got {q.shape}"
        )
    if k is None or v is None or k.shape.ndim() not in (3, 4) or v.shape.ndim() != k.shape.ndim():
        raise Unsupported(
            "MultiHeadAttention needs separate 3-D or BNSH 4-D key and value (packed KV is not supported)"
        )
    if {k.shape.type, v.shape.type} != {t} or (pk is None) != (pv is None):
        raise Unsupported("MultiHeadAttention key/value types or past pairs do not match")
    b, s, hidden = q.shape.lens
    if hidden % heads:
        raise Unsupported("MultiHeadAttention hidden size not divisible by num_heads")
    d = hidden // heads
    qf, kf, vf = (ctx.convert(x, F32) for x in (q, k, v))
    if bias is not None:
        vh = v.shape.lens[2] if v.shape.ndim() == 3 else -1
        if k.shape.ndim() != 3 or bias.shape.lens != (2 * hidden + vh,) or bias.shape.type != t:
            raise Unsupported("MultiHeadAttention bias needs 3-D key/value and dims (2*hidden + v_hidden)")
        bf = ctx.convert(bias, F32)
        parts = [
            ctx.add("slice", [bf], axes=[0], starts=[a], ends=[e])
            for a, e in ((0, hidden), (hidden, 2 * hidden), (2 * hidden, 2 * hidden + vh))
        ]
        qf, kf, vf = (ctx.elementwise("add", x, p) for x, p in zip((qf, kf, vf), parts, strict=True))
    qh = split_heads(ctx, qf, heads, "query")
    if k.shape.ndim() == 3:
        if k.shape.lens[:2] != v.shape.lens[:2] or k.shape.lens[0] != b or k.shape.lens[2] != hidden:
            raise Unsupported("MultiHeadAttention key/value dims do not match query")
        kh, vh4 = split_heads(ctx, kf, heads, "key"), split_heads(ctx, vf, heads, "value")
    else:
        if (
            pk is not None
            or k.shape.lens[:2] != (b, heads)
            or k.shape.lens[3] != d
            or v.shape.lens[:3] != k.shape.lens[:3]
        ):
            raise Unsupported(
                "MultiHeadAttention BNSH key/value must be (B, N, L, head_size), without a past"
            )
        kh, vh4 = kf, vf
    past = None
    if pk is not None:
        if (
            pk.shape.ndim() != 4
            or pk.shape.lens[:2] != (b, heads)
            or pk.shape.lens[3] != d
            or {pk.shape.type, pv.shape.type} != {t}
        ):
            raise Unsupported("MultiHeadAttention past_key/past_value must be (B, N, P, head_size)")
        past = (ctx.convert(pk, F32), ctx.convert(pv, F32))
    p = pk.shape.lens[2] if pk is not None else 0
    total = p + kh.shape.lens[2]
    if causal and kh.shape.lens[2] != s:
        raise Unsupported(
            "MultiHeadAttention unidirectional cross attention (ORT's CPU EP masks it differently)"
        )
    masks = []
    if kpm is not None:
        if pk is not None:
            raise Unsupported("MultiHeadAttention key_padding_mask with a past is not supported")
        masks.append(_padding_mask(ctx, kpm, b, s, total, fill, "MultiHeadAttention key_padding_mask"))
    if abias is not None:
        masks.append(_bias_mask(ctx, abias, b, heads, s, total))
    return list(attend(ctx, qh, kh, vh4, masks, past, causal, scale, t))


@onnx_op("Attention", domain=MS)
def parse_ms_attention(ctx: ParseContext, node: NodeDesc, args):
    heads, scale, fill, causal = _common_attrs(
        node, ("qkv_hidden_sizes", "do_rotary", "past_present_share_buffer", "rotary_embedding_dim")
    )
    if int(node.attr("do_rotary", 0)) or int(node.attr("past_present_share_buffer", 0)):
        raise Unsupported("Attention with do_rotary / past_present_share_buffer is not supported")
    x, w, bias, mask, past, abias = (_opt(args, i) for i in range(6))
    if _opt(args, 6) is not None:
        raise Unsupported("Attention with past_sequence_length is not supported")
    t = x.shape.type
    if t not in MS_ATTN_TYPES or x.shape.ndim() != 3 or w.shape.ndim() != 2 or w.shape.type != t:
        raise Unsupported(f"Attention input {x.shape} / weights {w.shape}")
    b, s, width = x.shape.lens
    sizes = [int(v) for v in node.attr("qkv_hidden_sizes", [])] or [w.shape.lens[1] // 3] * 3
    if len(sizes) != 3 or w.shape.lens != (width, sum(sizes)) or any(n <= 0 or n % heads for n in sizes):
        raise Unsupported(
            f"Attention weights {list(w.shape.lens)} do not split into {sizes} over {heads} heads"
        )
    if sizes[0] != sizes[1] or (past is not None and sizes[1] != sizes[2]):
        raise Unsupported("Attention Q/K (and, with a past, V) hidden sizes must be equal")
    x2 = ctx.add("reshape", [ctx.convert(x, F32)], dims=[b * s, width])
    qkv = ctx.add("dot", [x2, ctx.convert(w, F32)])
    if bias is not None:
        if bias.shape.lens != (sum(sizes),) or bias.shape.type != t:
            raise Unsupported(f"Attention bias of dims {list(bias.shape.lens)}")
        qkv = ctx.elementwise("add", qkv, ctx.convert(bias, F32))
    qkv = ctx.add("reshape", [qkv], dims=[b, s, sum(sizes)])
    cuts = np.cumsum([0, *sizes]).tolist()
    q, k, v = (
        split_heads(
            ctx, ctx.add("slice", [qkv], axes=[2], starts=[cuts[i]], ends=[cuts[i + 1]]), heads, "QKV"
        )
        for i in range(3)
    )
    pair = None
    if past is not None:
        d = sizes[0] // heads
        if (
            past.shape.ndim() != 5
            or past.shape.lens[:3] != (2, b, heads)
            or past.shape.lens[4] != d
            or past.shape.type != t
        ):
            raise Unsupported(f"Attention past must be (2, B, N, P, head_size), got {past.shape}")
        p_len = past.shape.lens[3]
        pair = tuple(
            ctx.add(
                "reshape",
                [ctx.add("slice", [ctx.convert(past, F32)], axes=[0], starts=[i], ends=[i + 1])],
                dims=[b, heads, p_len, d],
            )
            for i in range(2)
        )
    total = s + (past.shape.lens[3] if past is not None else 0)
    masks = []
    if mask is not None:
        if past is not None and mask.shape.ndim() == 1:
            raise Unsupported("Attention mask_index of sequence lengths with a past is not supported")
        masks.append(_padding_mask(ctx, mask, b, s, total, fill, "Attention mask_index"))
    if abias is not None:
        masks.append(_bias_mask(ctx, abias, b, heads, s, total))
    y, pk, pv = attend(ctx, q, k, v, masks, pair, causal, scale, t)  # type: ignore[arg-type]
    if not wanted(node, 1):
        return [y]
    present = ctx.add(
        "concat", [ctx.add("unsqueeze", [pk], axes=[0]), ctx.add("unsqueeze", [pv], axes=[0])], axis=0
    )
    return [y, present]

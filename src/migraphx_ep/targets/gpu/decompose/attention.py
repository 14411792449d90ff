"""Attention as GEMMs, softmax and pointwise ops, and rotary embedding as pointwise ops and concats
(``ops/attention.py`` is the meaning, step by step: scaling both Q and K by sqrt(scale) in Q's type,
softcap, the additive mask, softmax in its precision, fully masked rows giving zeros).

The mask is one additive bias: the float mask (if any) plus ``where(allowed, 0, -inf)``, where
``allowed`` ANDs the boolean conditions (bool mask, causal, window, padding). The ref adds each part's
0/-inf bias in turn; with at most one float term those sums are equal in every case (NaN and +inf
included), so the single ``where`` changes no bit. Conditions known at compile time (causal and
window with a fixed offset) become one literal.
"""

from __future__ import annotations

import numpy as np

from ....ir.dtypes import DType, to_numpy
from ....ir.instruction import Instruction
from ....ops.attention import Attention
from ....ops.core import broadcast_lens
from .builder import Builder

NEG_INF = float("-inf")


def _repeat_heads(b: Builder, x: Instruction, reps: int, scale: Instruction | None) -> Instruction:
    """(B, H, L, D) -> (B, H*reps, L, D), head h reading head h // reps (``np.repeat``), times
    ``scale`` when given: one kernel writes the repeated, scaled copy."""
    bsz, h, n, d = x.shape.lens
    if reps == 1:
        return x if scale is None else b.pw("mul", x, scale)
    u = b.add("multibroadcast", b.add("unsqueeze", x, axes=[2]), out_lens=[bsz, h, reps, n, d])
    u = b.pw("mul", u, scale) if scale is not None else b.add("contiguous", u)
    return b.reshape(u, [bsz, h * reps, n, d])


def _static_allowed(op: Attention, s: int, lk: int, offset: int) -> np.ndarray | None:
    """Causal and window conditions for a fixed offset (past length), or None when there are none."""
    i = np.arange(s).reshape(s, 1) + offset
    j = np.arange(lk).reshape(1, lk)
    allowed = np.ones((s, lk), bool)
    if op.is_causal:
        allowed &= j <= i
    if op.left_window >= 0:
        allowed &= (i - j) <= op.left_window
    if op.right_window >= 0:
        allowed &= (j - i) <= op.right_window
    return None if allowed.all() else allowed


def _dynamic_allowed(b: Builder, op: Attention, nonpad: Instruction, s: int, lk: int) -> Instruction:
    """Causal/window conditions with offset nonpad - S per batch, and the padding condition j < nonpad."""
    i64 = DType.int64_type
    bsz = nonpad.shape.lens[0]
    n = b.reshape(nonpad, [bsz, 1, 1, 1])
    j = b.literal(np.arange(lk).reshape(1, 1, 1, lk), i64)
    allowed = b.pw("less", j, n)
    if op.is_causal or op.left_window >= 0 or op.right_window >= 0:
        i = b.pw("add", b.literal(np.arange(s).reshape(1, 1, s, 1), i64), b.pw("sub", n, s))
        diff = b.pw("sub", i, j)  # (i + offset) - j
        if op.is_causal:
            allowed = b.pw("logical_and", allowed, b.pw("greater_or_equal", diff, 0))
        if op.left_window >= 0:
            allowed = b.pw("logical_and", allowed, b.pw("less_or_equal", diff, op.left_window))
        if op.right_window >= 0:
            allowed = b.pw("logical_and", allowed, b.pw("greater_or_equal", diff, -op.right_window))
    return allowed


def _all_neg_inf(b: Builder, x: Instruction) -> Instruction:
    """Rows (last axis) that are all -inf: the ref's ``isneginf(max(row))``, NaN making it false (the
    IR's reduce_max skips NaN, so the test is "every element equals -inf")."""
    return b.reduce("reduce_min", b.pw("equal", x, NEG_INF), [-1])


def _pad_last(b: Builder, x: Instruction, lk: int, value: float) -> Instruction:
    """A mask shorter than the keys, padded as the ref pads it (False / -inf)."""
    extra = lk - x.shape.lens[-1]
    if extra <= 0:
        return x
    pads = [0] * (2 * x.shape.ndim())
    pads[-1] = extra
    return b.add("pad", x, pads=pads, value=value)


def _bias(
    b: Builder,
    ins: Instruction,
    mask: Instruction | None,
    nonpad: Instruction | None,
    past: int,
    s: int,
    lk: int,
) -> tuple[Instruction | None, Instruction | None]:
    """(additive bias or None, bool "row fully masked" of the bias or None)."""
    op, dt = ins.op, ins.inputs[0].shape.type
    assert isinstance(op, Attention)
    float_mask = None
    allowed: Instruction | None = None
    static = None
    if nonpad is not None and past == 0:
        allowed = _dynamic_allowed(b, op, nonpad, s, lk)
    else:
        static = _static_allowed(op, s, lk, past)
        if nonpad is not None:  # past and padding both: padding alone is dynamic
            bsz = nonpad.shape.lens[0]
            j = b.literal(np.arange(lk).reshape(1, 1, 1, lk), DType.int64_type)
            allowed = b.pw("less", j, b.reshape(nonpad, [bsz, 1, 1, 1]))
    if mask is not None and mask.shape.type == DType.bool_type:
        m = _pad_last(b, mask, lk, 0)
        allowed = m if allowed is None else b.pw("logical_and", allowed, m)
    elif mask is not None:
        float_mask = _pad_last(b, mask, lk, NEG_INF)
    if allowed is None and float_mask is None:
        if static is None:
            return None, None
        bias = np.where(static, 0, NEG_INF).astype(to_numpy(dt))
        rows = ~static.any(axis=-1, keepdims=True)
        return b.literal(bias, dt), (b.literal(rows, DType.bool_type) if rows.any() else None)
    if static is not None:
        lit = b.literal(static, DType.bool_type)
        allowed = lit if allowed is None else b.pw("logical_and", allowed, lit)
    bias = None if allowed is None else b.pw("where", allowed, 0, NEG_INF, t=dt)
    if float_mask is not None:
        bias = float_mask if bias is None else b.pw("add", float_mask, bias)
    return bias, _all_neg_inf(b, bias)


def decompose_attention(b: Builder, ins: Instruction) -> list[Instruction]:
    op = ins.op
    q, k, v, mask, pk, pv, nonpad = op._split(list(ins.inputs))  # type: ignore[attr-defined]
    dt = q.shape.type
    bsz, hq, s, d = q.shape.lens
    if pk is not None:
        k, v = b.add("concat", pk, k, axis=2), b.add("concat", pv, v, axis=2)
    present_k, present_v = k, v
    hkv, lk = k.shape.lens[1], k.shape.lens[2]
    scale = op.scale or 1 / np.sqrt(d)  # type: ignore[attr-defined]
    root = b.literal(to_numpy(dt).type(np.sqrt(scale)), dt)
    qs = b.pw("mul", q, root)
    ks = _repeat_heads(b, k, hq // hkv, root)
    vr = _repeat_heads(b, v, hq // hkv, None)
    qk = b.add("dot", qs, b.transpose(ks, [0, 1, 3, 2]))
    if op.softcap > 0:  # type: ignore[attr-defined]
        cap = b.literal(op.softcap, dt)  # type: ignore[attr-defined]
        qk = b.pw("mul", b.pw("tanh", b.pw("div", qk, cap)), cap)
    bias, masked = _bias(b, ins, mask, nonpad, pk.shape.lens[2] if pk is not None else 0, s, lk)
    with_bias = qk
    if bias is not None and dt in (DType.half_type, DType.bf16_type):
        # The ref rounds the scores to half/bf16, then adds (in float, rounded again): spelled with
        # converts, so the lowering does not fold the add into the GEMM's epilogue (one rounding).
        f32 = DType.float_type
        with_bias = b.convert(b.pw("add", b.convert(qk, f32), b.convert(bias, f32)), dt)
    elif bias is not None:
        with_bias = b.pw("add", qk, bias)
    st = DType(op.softmax_type) if op.softmax_type >= 0 else dt  # type: ignore[attr-defined]
    probs = b.add("softmax", b.convert(with_bias, st), axis=3)
    # The ref's softmax gives zeros for an all -inf row (the IR softmax gives NaN), and rows whose
    # bias is all -inf are zeroed whatever the scores (NaN and +inf included).
    rows = _all_neg_inf(b, with_bias)
    if masked is not None:
        lens = broadcast_lens(rows.shape.lens, masked.shape.lens)
        rows = b.pw("logical_or", b.broadcast_to(rows, lens), masked)
    probs = b.convert(b.pw("where", rows, 0, probs), dt)
    y = b.add("dot", probs, vr)
    mode = op.qk_matmul_output_mode  # type: ignore[attr-defined]
    qk_out = with_bias if mode == 2 else probs if mode == 3 else qk
    return [y, present_k, present_v, qk_out]


def decompose_rotary_embedding(b: Builder, ins: Instruction) -> Instruction:
    x, cos, sin = ins.inputs
    bsz, s, h, d = x.shape.lens
    rd = ins.op.rotary_dim or d  # type: ignore[attr-defined]
    half = rd // 2
    lens = [bsz, s, h, half]
    c = b.broadcast_to(b.add("unsqueeze", cos, axes=[2]), lens)
    sn = b.broadcast_to(b.add("unsqueeze", sin, axes=[2]), lens)
    if ins.op.interleaved:  # type: ignore[attr-defined]
        x1 = b.add("step", b.add("slice", x, axes=[3], starts=[0], ends=[rd]), axes=[3], steps=[2])
        x2 = b.add("step", b.add("slice", x, axes=[3], starts=[1], ends=[rd]), axes=[3], steps=[2])
    else:
        x1 = b.add("slice", x, axes=[3], starts=[0], ends=[half])
        x2 = b.add("slice", x, axes=[3], starts=[half], ends=[rd])
    real = b.pw("sub", b.pw("mul", c, x1), b.pw("mul", sn, x2))
    imag = b.pw("add", b.pw("mul", sn, x1), b.pw("mul", c, x2))
    if ins.op.interleaved:  # type: ignore[attr-defined]
        pair = b.add("concat", b.add("unsqueeze", real, axes=[4]), b.add("unsqueeze", imag, axes=[4]), axis=4)
        parts = [b.reshape(pair, [bsz, s, h, rd])]
    else:
        parts = [real, imag]
    if rd < d:
        parts.append(b.add("slice", x, axes=[3], starts=[rd], ends=[d]))
    return b.add("concat", *parts, axis=3) if len(parts) > 1 else parts[0]

"""Attention (ONNX opset 23-25, 4-D Q/K/V) and rotary embedding as whole ops.

They follow ONNX's reference step by step, rounding to the input type where it does (numpy's half
loops compute each elementwise step in float32 and round once; matmuls accumulate in float32), so the
fp16/bf16 results match ONNX's expected outputs, not just its formula. The frontend does the 3-D
head split/merge with reshape/transpose views around ``attention``.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from ..ir.dtypes import DType, to_numpy
from ..ir.operation import Op, op_class, register_op
from ..ir.shape import Shape, ShapeError, check_shapes
from .nn import matmul

ATTN_TYPES = frozenset({DType.float_type, DType.half_type, DType.bf16_type, DType.double_type})


def _softmax(x: np.ndarray) -> np.ndarray:
    """Last-axis softmax; an all -inf row gives zeros (ONNX's fully-masked convention)."""
    m = np.max(x, axis=-1, keepdims=True)
    zero, one = np.zeros((), x.dtype), np.ones((), x.dtype)
    t = np.exp(x - np.where(np.isneginf(m), zero, m))
    s = np.sum(t, axis=-1, keepdims=True)
    return t / np.where(s == zero, one, s)


def _mask_bias(allowed: np.ndarray, dtype: np.dtype) -> np.ndarray:
    return np.where(allowed, dtype.type(0), dtype.type(-np.inf))


@register_op
@op_class
class Attention(Op):
    """Inputs: Q (B,Hq,S,D), K (B,Hkv,L,D), V (B,Hkv,L,Dv), then the optional inputs flagged by
    ``has_mask``, ``has_past`` (past_key, past_value), ``has_nonpad`` (nonpad_kv_seqlen), in order.

    Output tuple: (Y (B,Hq,S,Dv), present_key, present_value, qk_matmul_output).
    ``scale`` 0 means 1/sqrt(D); ``softcap`` 0 means none; ``softmax_type`` -1 means Q's type.
    """

    name: ClassVar[str] = "attention"
    scale: float = 0.0
    is_causal: bool = False
    softcap: float = 0.0
    qk_matmul_output_mode: int = 0
    softmax_type: int = -1
    left_window: int = -1
    right_window: int = -1
    has_mask: bool = False
    has_past: bool = False
    has_nonpad: bool = False

    def _split(self, xs: list) -> tuple:
        q, k, v, *rest = xs
        mask = rest.pop(0) if self.has_mask else None
        pk, pv = (rest.pop(0), rest.pop(0)) if self.has_past else (None, None)
        nonpad = rest.pop(0) if self.has_nonpad else None
        if rest:
            raise ShapeError("attention: more inputs than its flags announce")
        return q, k, v, mask, pk, pv, nonpad

    def compute_shape(self, inputs: list[Shape]) -> Shape:
        q, k, v, mask, pk, pv, nonpad = self._split(list(inputs))
        check_shapes(self.name, [q, k, v]).same_type().ndims(4).types(ATTN_TYPES)
        b, hq, s, d = q.lens
        _, hkv, lk, _ = k.lens
        if k.lens[0] != b or v.lens[:3] != k.lens[:3] or k.lens[3] != d or hkv == 0 or hq % hkv:
            raise ShapeError(f"attention: Q {list(q.lens)}, K {list(k.lens)}, V {list(v.lens)} disagree")
        if pk is not None:
            if (
                pk.lens[:2] != (b, hkv)
                or pk.lens[3] != d
                or pv.lens[:2] != (b, hkv)
                or pv.lens[3] != v.lens[3]
                or pv.lens[2] != pk.lens[2]
                or pk.type != q.type
                or pv.type != q.type
            ):
                raise ShapeError("attention: past key/value dims disagree with K/V")
            lk += pk.lens[2]
        if mask is not None:
            if mask.type not in (q.type, DType.bool_type) or mask.ndim() > 4 or mask.lens[-1] > lk:
                raise ShapeError(f"attention: bad mask {mask}")
            np.broadcast_shapes(mask.lens[:-1] + (lk,), (b, hq, s, lk))
        if nonpad is not None and (nonpad.lens != (b,) or nonpad.type != DType.int64_type):
            raise ShapeError("attention: nonpad_kv_seqlen must be int64 (batch,)")
        pres_k = Shape(q.type, (b, hkv, lk, d))
        pres_v = Shape(q.type, (b, hkv, lk, v.lens[3]))
        return Shape.tuple_of(
            [Shape(q.type, (b, hq, s, v.lens[3])), pres_k, pres_v, Shape(q.type, (b, hq, s, lk))]
        )

    def compute(self, out: Shape, args: list[np.ndarray]) -> list[np.ndarray]:
        q, k, v, mask, pk, pv, nonpad = self._split(list(args))
        dt = q.dtype
        scale = self.scale or 1 / np.sqrt(q.shape[3])
        scale = dt.type(np.sqrt(scale))
        if pk is not None:
            k, v = np.concatenate((pk, k), axis=2), np.concatenate((pv, v), axis=2)
        present_k, present_v = k, v
        s, lk = q.shape[2], k.shape[2]
        bias = np.zeros((s, lk), dt)
        if mask is not None and mask.shape[-1] < lk:
            fill = False if mask.dtype == np.bool_ else -np.inf
            mask = np.pad(mask, [(0, 0)] * (mask.ndim - 1) + [(0, lk - mask.shape[-1])], constant_values=fill)
        offset: int | np.ndarray = pk.shape[2] if pk is not None else 0
        if pk is None and nonpad is not None:
            offset = nonpad.reshape(-1, 1, 1) - s
        i = np.arange(s).reshape(s, 1)
        j = np.arange(lk).reshape(1, lk)
        windowed = self.left_window >= 0 or self.right_window >= 0
        if self.is_causal:
            base = bias if mask is None else (_mask_bias(mask, dt) if mask.dtype == np.bool_ else mask.copy())
            if windowed:
                base = np.zeros((s, lk), dt) + base
            causal = _mask_bias(j <= i + offset, dt)
            bias = base + (causal.reshape(-1, 1, s, lk) if np.ndim(offset) else causal)
        elif mask is not None:
            bias = bias + (_mask_bias(mask, dt) if mask.dtype == np.bool_ else mask)
        if windowed:
            diff = (i + offset) - j
            allowed = np.ones_like(diff, dtype=np.bool_)
            if self.left_window >= 0:
                allowed &= diff <= self.left_window
            if self.right_window >= 0:
                allowed &= -diff <= self.right_window
            win = _mask_bias(allowed, dt)
            bias = np.zeros((s, lk), dt) + bias + (win.reshape(-1, 1, s, lk) if np.ndim(offset) else win)
        if nonpad is not None:
            pad = np.arange(lk) < nonpad[:, None]
            bias = bias + _mask_bias(pad, dt).reshape(-1, 1, 1, lk)
        reps = q.shape[1] // k.shape[1]
        if reps > 1:
            k, v = np.repeat(k, reps, axis=1), np.repeat(v, reps, axis=1)
        qk = matmul(q * scale, np.swapaxes(k * scale, 2, 3), dt)
        if self.softcap > 0:
            qk = np.tanh(qk / dt.type(self.softcap)) * dt.type(self.softcap)
        with_bias = qk + bias
        qk_out = with_bias.copy() if self.qk_matmul_output_mode == 2 else qk
        sm_in = with_bias if self.softmax_type < 0 else with_bias.astype(to_numpy(DType(self.softmax_type)))
        with np.errstate(invalid="ignore"):
            probs = _softmax(sm_in)
        masked_rows = np.isneginf(np.max(bias, axis=-1, keepdims=True))
        probs = np.where(masked_rows, np.zeros((), probs.dtype), probs)
        if self.qk_matmul_output_mode == 3:
            qk_out = probs
        y = matmul(probs.astype(dt), v, dt)
        qk_out = np.broadcast_to(qk_out.astype(dt), out.sub_shapes[3].lens)
        return [y, present_k, present_v, np.ascontiguousarray(qk_out)]


@register_op
@op_class
class RotaryEmbedding(Op):
    """ONNX RotaryEmbedding on (B, S, H, D) input (the parser transposes 4-D BHSD and splits 3-D).

    Inputs: x, cos, sin where cos/sin are already gathered to (B, S, rotary_dim/2).
    """

    name: ClassVar[str] = "rotary_embedding"
    interleaved: bool = False
    rotary_dim: int = 0

    def compute_shape(self, inputs: list[Shape]) -> Shape:
        check_shapes(self.name, inputs).has(3).same_type().types(ATTN_TYPES)
        x, c, s = inputs
        if x.ndim() != 4:
            raise ShapeError("rotary_embedding: input must be (B, S, H, D)")
        rd = self.rotary_dim or x.lens[3]
        if rd % 2 or rd > x.lens[3] or c.lens != s.lens or c.lens != (x.lens[0], x.lens[1], rd // 2):
            raise ShapeError(f"rotary_embedding: caches {list(c.lens)} do not fit input {list(x.lens)}")
        return x.as_standard()

    def compute(self, out: Shape, args: list[np.ndarray]) -> np.ndarray:
        x, cos, sin = args
        rd = self.rotary_dim or x.shape[3]
        rot, keep = x[..., :rd], x[..., rd:]
        cos, sin = cos[:, :, None, :], sin[:, :, None, :]
        x1, x2 = (rot[..., 0::2], rot[..., 1::2]) if self.interleaved else np.split(rot, 2, axis=-1)
        real = cos * x1 - sin * x2
        imag = sin * x1 + cos * x2
        if self.interleaved:
            rot = np.stack((real, imag), axis=-1).reshape(rot.shape)
        else:
            rot = np.concatenate((real, imag), axis=-1)
        return np.concatenate((rot, keep), axis=-1).astype(out.dtype)


__all__ = ["ATTN_TYPES"]

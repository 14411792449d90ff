"""com.microsoft GroupQueryAttention as one op, with the semantics of ORT's CPU kernel.

Why a whole op and not a decomposition: the valid key length, the causal offset and the rotary
positions of every batch entry come from ``seqlens_k`` (and "first prompt or not" from
``total_sequence_length``) *at run time*, and the new keys/values are written into the cache at a
per-batch offset. Reading those small int32 inputs at run time keeps them out of the compile key.

Semantics (checked against ORT 1.32's CPU EP, see tests/ops/test_contrib_llm.py), per batch entry b:
  T_b = seqlens_k[b] + 1 keys are valid after this step;
  P_b = 0 on a first prompt (total_sequence_length == S), else T_b - S keys came from the past;
  present[b, :, :P_b] = past[b, :, :P_b]; present[b, :, P_b:P_b+S] = new K/V; the rest is zero
  (ORT zeroes a present buffer it does not share with past; with a shared buffer those rows are
  unspecified, so zero is as good an answer);
  query row s sits at absolute position P_b + s (also its rotary position) and attends keys
  j < T_b with j <= P_b + s (causal) and j > P_b + s - local_window (sliding window).
Scores are scale * q.k in float32, optionally softcapped (tanh), then a softmax whose denominator
may carry an extra exp(0 - m) (smooth_softmax) or exp(sink_h - m) (head_sink). Half inputs are
computed in float32 and rounded once at the end, like ORT's x86 kernel; rotary outputs are rounded
to the input type first because ORT stores them (in present_key) before attending.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from ..ir.dtypes import DType
from ..ir.evaluate import AssumptionFailed
from ..ir.operation import Op, op_class, register_op
from ..ir.shape import Shape, ShapeError, check_shapes
from .attention import RotaryEmbedding

GQA_TYPES = frozenset({DType.float_type, DType.half_type})


class GqaRunError(ValueError):
    """Run-time values (seqlens_k, total_sequence_length) that ORT rejects or that contradict the
    present length this program was compiled for: the run fails rather than answer wrongly."""


class GqaPresentAssumed(GqaRunError, AssumptionFailed):
    """total_sequence_length exceeds the past length of a program compiled assuming a shared
    past/present buffer (``assumed_present``): recompile with the value, do not fail the run."""


def rotate(x: np.ndarray, pos: np.ndarray, cos: np.ndarray, sin: np.ndarray, interleaved: bool) -> np.ndarray:
    """Rotary embedding of x (B, S, H, D) at positions pos (B, S); cos/sin are (max_len, rd/2).
    The math is the rotary_embedding op's (one definition of meaning)."""
    op = RotaryEmbedding(interleaved=interleaved, rotary_dim=2 * cos.shape[1])
    return op.compute(Shape.of(x), [x, cos[pos], sin[pos]])


def softmax_rows(x: np.ndarray, extra_logit: np.ndarray | None) -> np.ndarray:
    """Softmax over the last axis where masked entries are -inf; ``extra_logit`` (broadcast to the
    rows) joins the denominator only (smooth softmax / attention sink)."""
    m = np.max(x, axis=-1, keepdims=True)
    if extra_logit is not None:
        m = np.maximum(m, extra_logit)
    e = np.exp(x - m)
    denom = np.sum(e, axis=-1, keepdims=True)
    if extra_logit is not None:
        denom = denom + np.exp(extra_logit - m)
    return e / denom


@register_op
@op_class
class GroupQueryAttention(Op):
    """Inputs: q (B,S,Hq*D), k, v (B,S,Hkv*D), [past_key, past_value (B,Hkv,L,D)] if ``has_past``,
    seqlens_k (B,) int32, total_sequence_length (scalar) int32, [cos, sin (M, rd/2)] if ``rotary``,
    [head_sink (Hq,)] if ``has_sink``.

    Output tuple: (output (B,S,Hq*D), present_key, present_value (B,Hkv,present_len,D)).
    ``present_len`` is fixed at compile time (ORT's max(L, total_sequence_length)); a run whose
    total_sequence_length implies another length fails with GqaRunError. ``assumed_present``: the
    program was compiled without that value (run-time dims), taking present_len = L, the shared buffer
    GenAI uses; a run that needs a longer present raises GqaPresentAssumed to be recompiled.
    """

    name: ClassVar[str] = "group_query_attention"
    num_heads: int = 1
    kv_num_heads: int = 1
    present_len: int = 0
    scale: float = 0.0
    softcap: float = 0.0
    local_window: int = -1
    causal: bool = True
    smooth_softmax: bool = False
    rotary_interleaved: bool = False
    has_past: bool = False
    rotary: bool = False
    has_sink: bool = False
    assumed_present: bool = False

    def split_args(self, xs: list) -> tuple:
        """(q, k, v, past_key, past_value, seqlens_k, total, cos, sin, head_sink); None where absent."""
        q, k, v, *rest = xs
        pk, pv = (rest.pop(0), rest.pop(0)) if self.has_past else (None, None)
        seqlens, total = rest.pop(0), rest.pop(0)
        cos, sin = (rest.pop(0), rest.pop(0)) if self.rotary else (None, None)
        sink = rest.pop(0) if self.has_sink else None
        if rest:
            raise ShapeError("group_query_attention: more inputs than its flags announce")
        return q, k, v, pk, pv, seqlens, total, cos, sin, sink

    def compute_shape(self, inputs: list[Shape]) -> Shape:
        q, k, v, pk, pv, seqlens, total, cos, sin, sink = self.split_args(list(inputs))
        check_shapes(self.name, [q, k, v]).same_type().ndims(3).types(GQA_TYPES)
        hq, hkv = self.num_heads, self.kv_num_heads
        b, s, hidden = q.lens
        if hq <= 0 or hkv <= 0 or hq % hkv or hidden % hq:
            raise ShapeError(f"group_query_attention: {hq} heads over {hkv} kv heads, hidden {hidden}")
        d = hidden // hq
        if k.lens != (b, s, hkv * d) or v.lens != k.lens:
            raise ShapeError(f"group_query_attention: K {list(k.lens)} / V {list(v.lens)} do not fit Q")
        if pk is not None:
            if (
                pk.lens != pv.lens
                or pk.lens[:2] != (b, hkv)
                or pk.lens[3] != d
                or {pk.type, pv.type} != {q.type}
            ):
                raise ShapeError(f"group_query_attention: bad past {pk} / {pv}")
            if self.present_len < pk.lens[2]:
                raise ShapeError("group_query_attention: present shorter than past")
        if seqlens.type != DType.int32_type or seqlens.lens != (b,):
            raise ShapeError("group_query_attention: seqlens_k must be int32 (batch,)")
        if total.type != DType.int32_type or total.elements() != 1:
            raise ShapeError("group_query_attention: total_sequence_length must be one int32")
        if cos is not None:
            if (
                cos.lens != sin.lens
                or cos.ndim() != 2
                or 2 * cos.lens[1] > d
                or {cos.type, sin.type} != {q.type}
            ):
                raise ShapeError(f"group_query_attention: rotary caches {cos} do not fit head size {d}")
        if sink is not None and (sink.lens != (hq,) or sink.type != q.type):
            raise ShapeError("group_query_attention: head_sink must be (num_heads,) of Q's type")
        if self.present_len < 1:
            raise ShapeError("group_query_attention: present_len must be positive")
        present = Shape(q.type, (b, hkv, self.present_len, d))
        return Shape.tuple_of([q.as_standard(), present, present])

    def lengths(self, b: int, s: int, seqlens: np.ndarray, total: int, past_len: int) -> tuple:
        """(T, P) per batch entry, validated the way ORT's CheckInputs does, plus our compile-time
        present length. Each message starts with a fixed text (the gpu kernels' checks say just that)."""
        want = max(past_len, total) if self.has_past else total
        if want != self.present_len:
            raise (GqaPresentAssumed if self.assumed_present else GqaRunError)(
                f"{present_message(self.present_len)}: total_sequence_length {total} with a past of "
                f"{past_len} gives {want}"
            )
        first = total == s
        if not first and s > 1 and b != 1:
            raise GqaRunError(BATCH_MESSAGE)
        t = seqlens.astype(np.int64) + 1
        p = np.zeros_like(t) if first else t - s
        if np.any(t < 1) or np.any(p < 0) or np.any(p > past_len) or np.any(p + s > self.present_len):
            raise GqaRunError(f"{RANGE_MESSAGE}: {seqlens.tolist()}")
        if np.any(t > p + s):
            raise GqaRunError(f"{BEYOND_MESSAGE}: {seqlens.tolist()}")
        return t, p

    def run_lengths(self, q: np.ndarray, past: np.ndarray | None, seqlens, total, cos) -> tuple:
        """(T, P) of a run from its inputs, the rotary positions checked too (every error the op raises)."""
        b, s = q.shape[:2]
        past_len = past.shape[2] if past is not None else 0
        t, p = self.lengths(
            b, s, np.asarray(seqlens).reshape(-1), int(np.asarray(total).ravel()[0]), past_len
        )
        if cos is not None and int(p.max(initial=0)) + s - 1 >= cos.shape[0]:
            raise GqaRunError(ROTARY_MESSAGE)
        return t, p

    def rotated(self, x: np.ndarray, p: np.ndarray, cos, sin) -> np.ndarray:
        """x (B, S, H, D) with rotary at positions P_b + s, rounded to x's type: ORT writes the rotated
        keys into present_key before attending (and the queries go the same way)."""
        if cos is None:
            return x
        s = x.shape[1]
        pos = p[:, None] + np.arange(s)[None]
        f32 = np.float32
        return rotate(x.astype(f32), pos, cos.astype(f32), sin.astype(f32), self.rotary_interleaved).astype(
            x.dtype
        )

    def update(self, k, v, pk, pv, t, p, cos, sin, present: Shape) -> tuple[np.ndarray, np.ndarray]:
        """present_key/value: past rows < P_b, then the new (rotated) keys and values, zeros after."""
        b, s = k.shape[:2]
        hkv = self.kv_num_heads
        d = k.shape[2] // hkv
        kh = self.rotated(k.reshape(b, s, hkv, d), p, cos, sin).transpose(0, 2, 1, 3)
        vh = v.reshape(b, s, hkv, d).transpose(0, 2, 1, 3)
        present_k = np.zeros(present.lens, k.dtype)
        present_v = np.zeros_like(present_k)
        for i in range(b):
            pi = int(p[i])
            if pk is not None:
                present_k[i, :, :pi], present_v[i, :, :pi] = pk[i, :, :pi], pv[i, :, :pi]
            present_k[i, :, pi : pi + s], present_v[i, :, pi : pi + s] = kh[i], vh[i]
        return present_k, present_v

    def extra_logit(self, sink: np.ndarray | None) -> np.ndarray | None:
        """The logit that joins every softmax denominator: head_sink (per head), 0 (smooth), or none."""
        if sink is not None:
            return sink.astype(np.float32).reshape(-1, 1, 1)
        return np.zeros((1, 1, 1), np.float32) if self.smooth_softmax else None

    def scores(self, qh: np.ndarray, keys: np.ndarray, pi: int, ti: int) -> np.ndarray:
        """Scores (Hq, S, T) of one batch entry, -inf where a query may not attend: qh (Hq, S, D) are
        the (rotated, rounded) queries in float32, keys the present keys (Hkv, >=T, D)."""
        f32 = np.float32
        s, d = qh.shape[1], qh.shape[2]
        group = self.num_heads // self.kv_num_heads
        keys = np.repeat(keys[:, :ti].astype(f32), group, axis=0)  # (Hq, T, D)
        scale = f32(self.scale or 1 / np.sqrt(d))
        sc = np.matmul(qh, keys.transpose(0, 2, 1)) * scale
        if self.softcap > 0:
            sc = np.tanh(sc / f32(self.softcap)) * f32(self.softcap)
        return np.where(self.allowed(s, pi, ti), sc, f32(-np.inf))

    def allowed(self, s: int, pi: int, ti: int) -> np.ndarray:
        """(S, T): which keys each query row of a batch entry attends (causal, sliding window)."""
        row = pi + np.arange(s)[:, None]
        col = np.arange(ti)[None]
        allowed = col <= row if self.causal else np.ones((s, ti), bool)
        if self.local_window > 0:
            allowed &= col > row - self.local_window
        # A row with nothing to attend is a padding row of a first prompt (ORT leaves it
        # unspecified); let it attend key 0 rather than produce NaN.
        allowed[~allowed.any(axis=1), 0] = True
        return allowed

    def attend(self, q, present_k, present_v, t, p, cos, sin, sink) -> np.ndarray:
        """The attention output (B, S, Hq*D) over the present keys and values."""
        b, s, hidden = q.shape
        hq = self.num_heads
        d = hidden // hq
        group = hq // self.kv_num_heads
        qh = self.rotated(q.reshape(b, s, hq, d), p, cos, sin).transpose(0, 2, 1, 3).astype(np.float32)
        extra = self.extra_logit(sink)
        y = np.zeros((b, hq, s, d), np.float32)
        for i in range(b):
            ti = int(t[i])
            vals = np.repeat(present_v[i, :, :ti].astype(np.float32), group, axis=0)
            y[i] = np.matmul(softmax_rows(self.scores(qh[i], present_k[i], int(p[i]), ti), extra), vals)
        return y.transpose(0, 2, 1, 3).reshape(b, s, hidden).astype(q.dtype)

    def compute(self, out: Shape, args: list[np.ndarray]) -> list[np.ndarray]:
        q, k, v, pk, pv, seqlens, total, cos, sin, sink = self.split_args(list(args))
        t, p = self.run_lengths(q, pk, seqlens, total, cos)
        present_k, present_v = self.update(k, v, pk, pv, t, p, cos, sin, out.sub_shapes[1])
        return [self.attend(q, present_k, present_v, t, p, cos, sin, sink), present_k, present_v]


def present_message(present_len: int) -> str:
    return (
        f"group_query_attention: the present length this program was compiled for ({present_len}) "
        "does not fit"
    )


BATCH_MESSAGE = "group_query_attention: batch_size must be 1 when S > 1 and past context is given"
RANGE_MESSAGE = "group_query_attention: seqlens_k out of range"
BEYOND_MESSAGE = "group_query_attention: seqlens_k beyond the new tokens"
ROTARY_MESSAGE = "group_query_attention: position beyond the rotary caches"


__all__ = ["GQA_TYPES", "GqaPresentAssumed", "GqaRunError", "present_message", "rotate"]

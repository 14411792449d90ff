"""GroupQueryAttention on the gpu target: two or three kernel steps (``kernels/gqa.py``) per instruction.

1. update: present_key/value (and the run-time checks, through the kernel's error slot);
2. attend: the output rows, or with a flash-decoding split each split's partial softmax state;
3. combine (split only): the output rows from the partials.

The instruction's tuple (output, present_key, present_value) becomes the three buffers its
``get_tuple_elem`` readers take. Each step carries an op whose ``compute`` is what its kernel computes,
for the numpy simulator (``simulate.py``): update and the unsplit attend are the ref op's own pieces
(``ops/gqa.py``); the split attend and combine work on the ref's scores.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from ...ir.dtypes import DType
from ...ir.instruction import Instruction
from ...ir.operation import Op
from ...ir.shape import Shape
from ...ops.gqa import GroupQueryAttention
from .kernels import gqa as KG
from .steps import Buf, KernelStep

if TYPE_CHECKING:
    from .lowering import Lowering


@dataclasses.dataclass(frozen=True)
class GqaUpdate(Op):
    """Inputs k, v, [past_key, past_value], seqlens_k, total, [cos, sin]; outputs the presents."""

    name: ClassVar[str] = "gqa_update"
    gqa: GroupQueryAttention = None  # type: ignore[assignment]

    def compute(self, out: Shape, args: list[np.ndarray]) -> list[np.ndarray]:  # type: ignore[override]
        g = self.gqa
        k, v, *rest = args
        pk, pv = (rest.pop(0), rest.pop(0)) if g.has_past else (None, None)
        seqlens, total, *rot = rest
        cos, sin = rot if rot else (None, None)
        t, p = g.run_lengths(k, pk, seqlens, total, cos)
        return list(g.update(k, v, pk, pv, t, p, cos, sin, out))


@dataclasses.dataclass(frozen=True)
class GqaAttend(Op):
    """Inputs q, present_key, present_value, seqlens_k, total, [cos, sin], [head_sink unless split]:
    the output, or with ``splits`` > 1 the partials (B*S*Hq, splits, D + 2): max, sum, acc[D]."""

    name: ClassVar[str] = "gqa_attend"
    gqa: GroupQueryAttention = None  # type: ignore[assignment]
    splits: int = 1
    min_chunk: int = 1
    past_len: int = 0  # what the update step validated the lengths against

    def compute(self, out: Shape, args: list[np.ndarray]) -> np.ndarray:
        g = self.gqa
        q, present_k, present_v, seqlens, total, *rest = args
        cos, sin = (rest.pop(0), rest.pop(0)) if g.rotary else (None, None)
        sink = rest.pop(0) if rest else None
        b, s, hidden = q.shape
        lens = np.asarray(seqlens).reshape(-1), int(np.asarray(total).ravel()[0])
        t, p = g.lengths(b, s, *lens, self.past_len)
        if self.splits == 1:
            return g.attend(q, present_k, present_v, t, p, cos, sin, sink)
        return self._partials(q, present_k, present_v, t, p, cos, sin)

    def _partials(self, q, present_k, present_v, t, p, cos, sin) -> np.ndarray:
        g, ns, f32 = self.gqa, self.splits, np.float32
        b, s, hidden = q.shape
        hq = g.num_heads
        d = hidden // hq
        group = hq // g.kv_num_heads
        qh = g.rotated(q.reshape(b, s, hq, d), p, cos, sin).transpose(0, 2, 1, 3).astype(f32)
        part = np.zeros((b, s, hq, ns, d + 2), f32)
        for i in range(b):
            pi, ti = int(p[i]), int(t[i])
            sc = g.scores(qh[i], present_k[i], pi, ti)
            vals = np.repeat(present_v[i, :, :ti].astype(f32), group, axis=0)
            for r, row in enumerate(g.allowed(s, pi, ti)):
                keys = np.flatnonzero(row)
                lo, hi = int(keys[0]), int(keys[-1]) + 1  # one run of keys: causal and window cut its ends
                chunk = max(-(-(hi - lo) // ns), self.min_chunk)
                for k in range(ns):
                    a, e = lo + k * chunk, min(hi, lo + (k + 1) * chunk)
                    if a >= e:
                        part[i, r, :, k, 0] = -np.inf
                        continue
                    x = sc[:, r, a:e]
                    m = x.max(axis=1, keepdims=True)
                    w = np.exp(x - m)
                    part[i, r, :, k, 0], part[i, r, :, k, 1] = m[:, 0], w.sum(axis=1)
                    part[i, r, :, k, 2:] = np.einsum("ht,htd->hd", w, vals[:, a:e])
        return part.reshape(b * s * hq, ns, d + 2)


@dataclasses.dataclass(frozen=True)
class GqaCombine(Op):
    """Inputs the partials of ``GqaAttend``, [head_sink]: the output rows (B, S, Hq*D)."""

    name: ClassVar[str] = "gqa_combine"
    gqa: GroupQueryAttention = None  # type: ignore[assignment]

    def compute(self, out: Shape, args: list[np.ndarray]) -> np.ndarray:
        part, *sink = args
        rows, hq = part.shape[0], self.gqa.num_heads
        extra = self.gqa.extra_logit(sink[0] if sink else None)
        m, sums, acc = part[:, :, 0], part[:, :, 1], part[:, :, 2:]
        with np.errstate(invalid="ignore"):
            top = m.max(axis=1)
            if extra is not None:
                x = np.broadcast_to(extra.reshape(-1), (hq,))[np.arange(rows) % hq]
                top = np.maximum(top, x)
            w = np.where(m == -np.inf, np.float32(0), np.exp(m - top[:, None]))
        den = (sums * w).sum(axis=1)
        if extra is not None:
            den = den + np.exp(x - top)
        y = (acc * w[:, :, None]).sum(axis=1) / den[:, None]
        return y.reshape(out.lens).astype(out.dtype)


def gqa_supported(ins: Instruction) -> str | None:
    """Why the gpu kernels cannot run this group_query_attention (None: they can)."""
    q, *_, cos, _sin, _sink = ins.op.split_args([a.shape for a in ins.inputs])
    if any(u.name != "get_tuple_elem" for u in ins.outputs):
        return "group_query_attention: its tuple is read whole"
    return KG.gqa_supported(KG.gqa_layout(ins.op, q, cos))


def _unit_rows(low: Lowering, b: Buf, label: str) -> Buf:
    """``b`` with unit stride along its last dim (the kernels take the other strides at run time)."""
    return b if b.shape.strides[-1] == 1 or b.shape.lens[-1] == 1 else low._copy(b, label)


def _standard(low: Lowering, b: Buf | None, label: str) -> Buf | None:
    return b if b is None or b.shape.standard() else low._copy(b, label)


def lower_gqa(low: Lowering, ins: Instruction) -> list[Buf]:
    """Emit ``ins``'s steps; returns its tuple's buffers (output, present_key, present_value)."""

    op = ins.op
    q, k, v, pk, pv, sk, tot, cos, sin, sink = op.split_args([low._read(a) for a in ins.inputs])
    q, k, v = (_unit_rows(low, x, "gqa input") for x in (q, k, v))
    if pk is not None:
        pk, pv = _unit_rows(low, pk, "gqa past"), _unit_rows(low, pv, "gqa past")
    sk, tot, cos, sin, sink = (_standard(low, x, "gqa input") for x in (sk, tot, cos, sin, sink))
    out_shape, present, _ = ins.shape.sub_shapes
    lay = KG.gqa_layout(op, q.shape, cos.shape if cos is not None else None)
    name = low._name(ins)
    present_k, present_v = low._new(present, "present_key"), low._new(present, "present_value")
    past = (pk.shape, pv.shape) if pk is not None else None
    rot = [cos, sin] if cos is not None else []
    cos_shape = cos.shape if cos is not None else None
    spec = KG.gqa_update_kernel(f"{name}_update", lay, k.shape, v.shape, past, cos_shape, present)
    reads = [k, v, *([pk, pv] if pk is not None else []), sk, tot, *rot]
    low._emit(KernelStep("gqa update", reads, [present_k, present_v], spec=spec, op=GqaUpdate(op)))

    b, s = q.shape.lens[:2]
    splits, min_chunk = KG.attention_splits(lay, b, s, present.lens[2]), KG.MIN_CHUNK
    past_len = pk.shape.lens[2] if pk is not None else 0
    spec = KG.gqa_attend_kernel(
        f"{name}_attend", lay, q.shape, present, past_len, cos_shape, splits, min_chunk
    )
    reads = [q, present_k, present_v, sk, tot, *rot]
    y = low._new(out_shape.as_standard(), "gqa output")
    sinks = [sink] if sink is not None else []
    attend = GqaAttend(op, splits, min_chunk, past_len)
    if splits == 1:
        low._emit(KernelStep("gqa attention", reads + sinks, [y], spec=spec, op=attend))
        return [y, present_k, present_v]
    part = low._new(Shape(DType.float_type, (b * s * lay.hq, splits, lay.d + 2)), "gqa splits")
    low._emit(KernelStep(f"gqa attention ({splits} splits)", reads, [part], spec=spec, op=attend))
    spec = KG.gqa_combine_kernel(f"{name}_combine", lay, part.shape, y.shape)
    low._emit(KernelStep("gqa combine", [part, *sinks], [y], spec=spec, op=GqaCombine(op)))
    return [y, present_k, present_v]


__all__ = ["GqaAttend", "GqaCombine", "GqaUpdate", "gqa_supported", "lower_gqa"]

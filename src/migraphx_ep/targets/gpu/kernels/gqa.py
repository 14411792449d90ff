"""GroupQueryAttention kernels: the KV-cache update, the attention rows, and a flash-decoding combine.

Semantics are ``ops/gqa.py``'s; the device code is ``include/mx_gqa*.cuh``, a header per kernel.
``seqlens_k`` and ``total_sequence_length`` are read from device memory at run time, so the per-batch
past length P_b and valid length T_b never reach the source or the compile key; B, S, the present and
past lengths, the rotary table length and every stride are run-time sizes too (``Params``: one compiled
kernel per head layout and attribute set). What the source bakes:
the element type, head size D, heads, rotary width and layout, causal/window/softcap/scale, and the
softmax's extra logit (smooth softmax or a head sink).

* update (a thread per 16-byte chunk of present, grid-stride): present[b, h, l] is past[b, h, l] for
  l < P_b, the new key/value row l - P_b for l < P_b + S (keys rotated at position l and rounded to the
  element type, as ORT stores them), else zero. Thread 0 also runs the ref's run-time checks in the
  ref's order and stores the first failing one in the error slot; every thread skips a batch entry
  whose lengths are out of range, so nothing is read or written out of bounds.
* attend (a warp per (b, s, kv head, group of query heads), 4 warps a block, lanes across D): the warp
  keeps ``HW`` query heads that share the kv head in registers (rotated and rounded like the keys), so
  each key and value row is read once for all of them; an online softmax in float over the row's keys
  [lo, hi) (causal, window), ``KU`` keys per step so the warp reductions overlap. ``gridDim.y`` splits
  the keys (flash decoding, for decode steps with few rows and long caches): each split writes
  (max, sum, acc[D]) in float and ``combine`` (a warp per output row) merges them, adding the extra
  logit. With one split the attend kernel finishes the row itself.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ....ir.dtypes import DType
from ....ir.shape import Shape
from ....ops import gqa
from ....ops.gqa import GroupQueryAttention
from .headers import include
from .params import Params
from .prelude import BLOCK, PRELUDE, c_literal, c_type, grid_for, index_type, signature, span
from .spec import Check, KernelSpec

WARPS = 4  # rows per block of the attend and combine kernels
MAX_HEAD = 256  # lanes hold ceil(D / 32) elements of each query head and accumulator: 8 at most
MAX_SPLITS = 64
MIN_CHUNK = 64  # keys per split at least (a run-time argument: tests lower it)
TARGET_BLOCKS = 2 * 132  # blocks that keep an H100's SMs busy


@dataclass(frozen=True)
class GqaLayout:
    """What a GroupQueryAttention kernel bakes in, from the op and its input shapes."""

    op: GroupQueryAttention
    t: DType
    d: int
    half: int  # rotary half width (0: no rotary)

    @property
    def hq(self) -> int:
        return self.op.num_heads

    @property
    def hkv(self) -> int:
        return self.op.kv_num_heads

    @property
    def lane_elems(self) -> int:
        return -(-self.d // 32)

    @property
    def heads_per_warp(self) -> int:
        """The most query heads of one kv head a warp keeps in registers (<= 32 floats of each)."""
        g = self.hq // self.hkv
        return max(h for h in range(1, g + 1) if g % h == 0 and h * self.lane_elems <= 32)

    def consts(self) -> str:
        op = self.op
        scale = op.scale or 1 / math.sqrt(self.d)
        flags = {
            "INTERLEAVED": op.rotary_interleaved,
            "ROTARY": self.half > 0,
            "HAS_PAST": op.has_past,
            "CAUSAL": op.causal,
        }
        lines = [f"typedef {c_type(self.t)} T;", f"constexpr u32 WARPS = {WARPS}u;"]
        lines += [f"constexpr u32 D = {self.d}u, HQ = {self.hq}u, HKV = {self.hkv}u, G = HQ / HKV;"]
        lines += [f"constexpr u32 HALF = {max(self.half, 1)}u, RD = {2 * self.half}u;"]
        lines += [f"constexpr bool {k} = {'true' if v else 'false'};" for k, v in flags.items()]
        lines += [f"constexpr i64 WINDOW = {op.local_window};"]
        lines += [f"constexpr float SCALE = {c_literal(scale, DType.float_type)};"]
        lines += [f"constexpr float CAP = {c_literal(op.softcap, DType.float_type)};"]
        extra = 2 if op.has_sink else 1 if op.smooth_softmax else 0
        lines += [f"constexpr int EXTRA = {extra};  // the softmax's extra logit: 1 smooth (0), 2 head sink"]
        return "\n".join(lines) + "\n"


def gqa_layout(op: GroupQueryAttention, q: Shape, cos: Shape | None) -> GqaLayout:
    return GqaLayout(op, q.type, q.lens[2] // op.num_heads, cos.lens[1] if cos is not None else 0)


def gqa_supported(layout: GqaLayout) -> str | None:
    """Why these kernels cannot run this GroupQueryAttention (None: they can)."""
    if layout.t not in (DType.float_type, DType.half_type):
        return f"group_query_attention of {layout.t.name}"
    if layout.d % 8 or layout.d > MAX_HEAD:
        why = f"the gpu kernels take multiples of 8 up to {MAX_HEAD}"
        return f"group_query_attention head size {layout.d}: {why}"
    if layout.half % 8:
        why = "the gpu kernels take multiples of 16"
        return f"group_query_attention rotary width {2 * layout.half}: {why}"
    return None


def checks(op: GroupQueryAttention) -> tuple[Check, ...]:
    """The update kernel's checks, codes 1..5 in the ref's order (GroupQueryAttention.run_lengths)."""
    first = "GqaPresentAssumed" if op.assumed_present else "GqaRunError"
    return (
        Check(first, gqa.present_message(op.present_len)),
        Check("GqaRunError", gqa.BATCH_MESSAGE),
        Check("GqaRunError", gqa.RANGE_MESSAGE),
        Check("GqaRunError", gqa.BEYOND_MESSAGE),
        Check("GqaRunError", gqa.ROTARY_MESSAGE),
    )


def _kernel(
    name: str, lay: GqaLayout, idx: str, consts: str, ins: list[str | None], outs: list[str], call: str,
    sizes: list[int], grid: tuple[int, int, int], threads: int, chk: tuple[Check, ...] = (),
) -> KernelSpec:  # fmt: skip
    """A kernel defining the constants ``consts`` (after the layout's), including ``{call}.cuh`` and
    calling ``call`` with one pointer per element of ``ins`` (a C type; None: absent, passed as nullptr),
    the outputs, the error slot when checked, and ``sizes`` (run-time arguments by default)."""
    p = Params(idx)
    present = [t for t in ins if t is not None]
    names, k = [], 0
    for t in ins:
        names.append("nullptr" if t is None else f"in{k}")
        k += t is not None
    names += [f"out{i}" for i in range(len(outs))] + (["err"] if chk else [])
    args = ", ".join(names + [p(v) for v in sizes])
    sig = signature(name, present, outs, threads=threads, checked=bool(chk), scalars=p.decls())
    head = PRELUDE + lay.consts() + f"typedef {idx} IDX;\n" + consts + include(f"{call}.cuh")
    src = head + sig + f" {{\n  {call}({{{args}}});\n}}\n"
    bits = 64 if idx == "u64" else 32
    return KernelSpec(
        name, src, grid, (threads, 1, 1), 0, len(present), len(outs), chk, tuple(p.values), bits
    )


def gqa_update_kernel(
    name: str, lay: GqaLayout, k: Shape, v: Shape, past: tuple[Shape, Shape] | None, cos: Shape | None,
    present: Shape,
) -> KernelSpec:  # fmt: skip
    """present_key/value from the past, the new keys (rotated) and values; the ref's run-time checks."""
    t = c_type(lay.t)
    b, s = k.lens[:2]
    pk, pv = past if past else (None, None)
    sizes = [b, s, present.lens[2], pk.lens[2] if pk else 0, cos.lens[0] if cos is not None else 0]
    sizes += [*k.strides[:2], *v.strides[:2]]
    sizes += [*pk.strides[:3], *pv.strides[:3]] if pk and pv else [0] * 6
    opt = t if past else None
    ins = [t, t, opt, opt, "i32", "i32", *([t if cos is not None else None] * 2)]
    idx = index_type(span(k, v, present, *(past or ())))
    grid = grid_for(present.elements() * k.type_size() // 16)
    return _kernel(name, lay, idx, "", ins, [t, t], "mx_gqa_update", sizes, grid, BLOCK, checks(lay.op))


def attention_splits(lay: GqaLayout, b: int, s: int, present_len: int) -> int:
    """How many blocks share each row's keys: enough rows fill the GPU alone (1, no combine step);
    a decode step's few rows over a long cache split it, ``MIN_CHUNK`` keys per split at least."""
    blocks = -(-_rows(lay, b, s) // WARPS)
    if blocks >= TARGET_BLOCKS:
        return 1
    return max(1, min(MAX_SPLITS, -(-TARGET_BLOCKS // blocks), -(-present_len // MIN_CHUNK)))


def _rows(lay: GqaLayout, b: int, s: int) -> int:
    return b * s * lay.hkv * (lay.hq // lay.hkv // lay.heads_per_warp)


def gqa_attend_kernel(
    name: str, lay: GqaLayout, q: Shape, present: Shape, past_len: int, cos: Shape | None, splits: int,
    min_chunk: int,
) -> KernelSpec:  # fmt: skip
    """The attention rows over the present keys/values: the output (B, S, Hq*D), or with ``splits`` > 1
    each split's (max, sum, acc[D]) in float, (B*S*Hq, splits, D + 2), for ``gqa_combine_kernel``."""
    t, e, hw = c_type(lay.t), lay.lane_elems, lay.heads_per_warp
    b, s = q.lens[:2]
    rows, split = _rows(lay, b, s), splits > 1
    part = Shape(DType.float_type, (b * s * lay.hq, splits, lay.d + 2))
    rot = t if cos is not None else None
    ins = [t, t, t, "i32", "i32", rot, rot, t if lay.op.has_sink and not split else None]
    flags = {"VEC": e in (1, 2, 4, 8), "SPLIT": split}  # VEC: lanes load whole E-element runs
    consts = f"constexpr u32 E = {e}u, HW = {hw}u, KU = {max(1, 4 // hw)}u;\n"
    consts += "".join(f"constexpr bool {k} = {'true' if v else 'false'};\n" for k, v in flags.items())
    consts += f"typedef {'float' if split else t} OUT;\n"
    positions = cos.lens[0] if cos is not None else 0
    sizes = [s, present.lens[2], past_len, positions, *q.strides[:2], rows, min_chunk]
    idx = index_type(span(q, present, part))
    grid = (max(1, -(-rows // WARPS)), splits, 1)
    out = "float" if split else t
    return _kernel(name, lay, idx, consts, ins, [out], "mx_gqa_attend", sizes, grid, WARPS * 32)


def gqa_combine_kernel(name: str, lay: GqaLayout, part: Shape, out: Shape) -> KernelSpec:
    """The output rows from the splits' (max, sum, acc[D]), with the extra logit in the denominator."""
    t = c_type(lay.t)
    rows, splits = part.lens[0], part.lens[1]
    ins = ["float", t if lay.op.has_sink else None]
    grid = (max(1, -(-rows // WARPS)), 1, 1)
    idx = index_type(span(part, out))
    return _kernel(name, lay, idx, "", ins, [t], "mx_gqa_combine", [rows, splits], grid, WARPS * 32)

"""rnn, gru and lstm unrolled into per-step GEMMs and pointwise ops, as MIGraphX's ``rewrite_rnn``
does (``ops/rnn.py`` is the meaning, step by step, in its order of additions).

* The input contributions of every step and direction are one GEMM, (S*B, I) x (I, D*G*H), plus the
  input bias; each step then adds one small batched GEMM of the state, (D', B, H) x (D', H, G*H).
  Directions with the same activations share that GEMM and the step's pointwise ops (D' = 2).
* A reverse direction runs forward over its input reversed per batch row within the row's length
  (``perm[t, b] = len[b] - 1 - t`` for ``t < len[b]``, else ``t``): the ref's step t reads and writes
  time ``len[b] - 1 - t`` exactly there. ``perm`` is its own inverse, so one gather undoes it on Y.
* Sequence lengths (clipped to [0, S], as the ref clips them) become masks: at step t a row with
  ``t >= len`` keeps its state (so Y_h / Y_c hold the state of its last valid step) and writes zeros.
* half computes in float32, as the ref does (double in double); outputs convert back at the end.
"""

from __future__ import annotations

import numpy as np

from ....ir.dtypes import DType
from ....ir.instruction import Instruction
from ....ops.rnn import GATES
from ..kernels.spec import Unsupported
from .builder import Builder

# Unrolling emits ~10-30 instructions per step and every pass and the lowering walks them all, so
# compile time grows faster than S (a bidirectional LSTM decomposes, compiles and simulates in about
# 0.8 s at 128 steps on one CPU core, 5.5 s at 512); past this cap the node stays on ORT's CPU EP.
MAX_STEPS = 128
I64 = DType.int64_type


def _slice(b: Builder, x: Instruction, axis: int, start: int, end: int) -> Instruction:
    if (start, end) == (0, x.shape.lens[axis]):
        return x
    return b.add("slice", x, axes=[axis], starts=[start], ends=[end])


def _cat(b: Builder, parts: list[Instruction], axis: int) -> Instruction:
    return b.add("concat", *parts, axis=axis) if len(parts) > 1 else parts[0]


class _Unroll:
    """The state and helpers of one op being unrolled (``op``'s attributes, the compute type)."""

    def __init__(self, b: Builder, ins: Instruction) -> None:
        self.b, self.op = b, ins.op
        self.kind = ins.name
        x = ins.inputs[0]
        self.ct = DType.double_type if x.shape.type == DType.double_type else DType.float_type
        self.s, self.bsz, _ = x.shape.lens
        self.h = self.op.hidden_size  # type: ignore[attr-defined]
        self.gh = GATES[self.kind] * self.h

    def act(self, name: str, v: Instruction) -> Instruction:
        clip = self.op.clip  # type: ignore[attr-defined]
        if clip > 0:
            v = self.b.pw("clip", v, -clip, clip)
        return self.b.add(name, v)

    def gate(self, x: Instruction, k: int) -> Instruction:
        """Gate k (of width H) of the last axis."""
        return _slice(self.b, x, x.shape.ndim() - 1, k * self.h, (k + 1) * self.h)

    def add_bias(self, x: Instruction, rb: Instruction, k: int) -> Instruction:
        # Gate by gate (the same sums as the ref's whole-width add): each is read by one gate's
        # kernel only, so it fuses there instead of being a kernel of its own.
        return self.b.pw("add", self.gate(x, k), self.gate(rb, k))

    def dot(self, x: Instruction, rt: Instruction) -> Instruction:
        return self.b.add("dot", x, rt)

    # -- one step of a group of directions: state (n, B, H) each; gx (n, B, G*H) --------------------------
    def step(self, acts: tuple[str, ...], gx, state, rt, rb, p):  # noqa: ANN001, ANN201
        b, h = self.b, state[0]
        if self.kind == "rnn":
            return [self.act(acts[0], b.pw("add", b.pw("add", gx, self.dot(h, rt)), rb))]
        if self.kind == "gru":
            return self._gru(acts, gx, h, rt, rb)
        c = state[1]
        pre = b.pw("add", gx, self.dot(h, rt))
        a = [self.add_bias(pre, rb, k) for k in range(4)]
        pi, po, pf = (self.gate(p, k) for k in range(3))
        i = self.act(acts[0], b.pw("add", a[0], b.pw("mul", pi, c)))
        if self.op.input_forget:  # type: ignore[attr-defined]
            fg = b.pw("sub", 1, i)
        else:
            fg = self.act(acts[0], b.pw("add", a[2], b.pw("mul", pf, c)))
        c_new = b.pw("add", b.pw("mul", fg, c), b.pw("mul", i, self.act(acts[1], a[3])))
        o = self.act(acts[0], b.pw("add", a[1], b.pw("mul", po, c_new)))
        return [b.pw("mul", o, self.act(acts[2], c_new)), c_new]

    def _gru(self, acts, gx, h, rt, rb):  # noqa: ANN001, ANN202
        b, hs = self.b, self.h
        lbr = self.op.linear_before_reset  # type: ignore[attr-defined]
        # linear_before_reset: the whole recurrent product at once (the reset applies after it)
        hr = self.dot(h, rt if lbr else _slice(b, rt, 2, 0, 2 * hs))
        z = self.act(acts[0], b.pw("add", self.gate(gx, 0), self.add_bias(hr, rb, 0)))
        rr = self.act(acts[0], b.pw("add", self.gate(gx, 1), self.add_bias(hr, rb, 1)))
        rb_h = self.gate(rb, 2)
        if lbr:
            inner = b.pw("add", self.gate(gx, 2), b.pw("mul", rr, b.pw("add", self.gate(hr, 2), rb_h)))
        else:
            rh = self.dot(b.pw("mul", rr, h), _slice(b, rt, 2, 2 * hs, 3 * hs))
            inner = b.pw("add", b.pw("add", self.gate(gx, 2), rh), rb_h)
        hh = self.act(acts[1], inner)
        return [b.pw("add", b.pw("mul", b.pw("sub", 1, z), hh), b.pw("mul", z, h))]


def _perm(b: Builder, lens: Instruction, s: int) -> Instruction:
    """(S, B) int64: the time each row's step t reads in a reverse direction (its own inverse)."""
    t = b.literal(np.arange(s).reshape(s, 1), I64)
    return b.pw("where", b.pw("less", t, lens), b.pw("sub", b.pw("sub", lens, 1), t), t)


def _reorder(b: Builder, x: Instruction, perm: Instruction) -> Instruction:
    """x (S, 1, B, K) with row b's times permuted by ``perm`` (S, B)."""
    s, _, bsz, _ = x.shape.lens
    idx = b.broadcast_to(b.reshape(perm, [s, 1, bsz, 1]), x.shape.lens)
    return b.add("gather_elements", x, idx, axis=0)


def decompose_recurrent(b: Builder, ins: Instruction) -> list[Instruction]:
    u = _Unroll(b, ins)
    op, kind, ct, s, bsz, hs, gh = u.op, u.kind, u.ct, u.s, u.bsz, u.h, u.gh
    if s > MAX_STEPS:
        raise Unsupported(f"{kind} of {s} steps (unrolled; over {MAX_STEPS} would compile too long)")
    x, w, r, bias, seq, h0, *rest = ins.inputs
    isz = x.shape.lens[2]
    if min(s, bsz, hs, isz) == 0:
        raise Unsupported(f"{kind} with an empty dimension")
    d_n = op.dirs()  # type: ignore[attr-defined]
    x, w, r, bias, h0 = (b.convert(v, ct) for v in (x, w, r, bias, h0))
    c0, p = (b.convert(v, ct) for v in rest) if kind == "lstm" else (None, None)
    lens = b.reshape(b.pw("clip", b.convert(seq, I64), 0, s), [1, bsz])
    active = b.pw("less", b.literal(np.arange(s).reshape(s, 1), I64), lens)  # (S, B)
    reverse = [op.direction == "reverse" or d == 1 for d in range(d_n)]  # type: ignore[attr-defined]
    perm = _perm(b, lens, s) if any(reverse) else None

    # Input contributions of every step and direction: one GEMM, then the input bias.
    wt = b.transpose(b.reshape(w, [d_n * gh, isz]), [1, 0])
    gx = b.add("dot", b.reshape(x, [s * bsz, isz]), wt)
    gx = b.pw("add", gx, b.reshape(_slice(b, bias, 1, 0, gh), [1, d_n * gh]))
    gx = b.reshape(gx, [s, bsz, d_n, gh])
    per_dir = []
    for d in range(d_n):
        g = b.transpose(_slice(b, gx, 2, d, d + 1), [0, 2, 1, 3])  # (S, 1, B, G*H)
        per_dir.append(_reorder(b, g, perm) if reverse[d] else g)
    gx_all = _cat(b, per_dir, 1)  # (S, D, B, G*H)

    acts = op.actv_funcs  # type: ignore[attr-defined]
    k = len(acts) // d_n
    dir_acts = [tuple(acts[d * k : (d + 1) * k]) for d in range(d_n)]
    same = d_n == 2 and dir_acts[0] == dir_acts[1]
    groups = [(0, d_n)] if same or d_n == 1 else [(0, 1), (1, 2)]
    ys: list[list[Instruction]] = [[] for _ in groups]
    finals: list[list[Instruction]] = []
    for gi, (d0, d1) in enumerate(groups):
        n = d1 - d0
        rt = b.transpose(_slice(b, r, 0, d0, d1), [0, 2, 1])  # (n, H, G*H)
        rb = b.reshape(_slice(b, _slice(b, bias, 0, d0, d1), 1, gh, 2 * gh), [n, 1, gh])
        pg = b.reshape(_slice(b, p, 0, d0, d1), [n, 1, 3 * hs]) if p is not None else None
        state = [_slice(b, v, 0, d0, d1) for v in ([h0, c0] if c0 is not None else [h0])]
        for t in range(s):
            gxt = b.reshape(_slice(b, _slice(b, gx_all, 0, t, t + 1), 1, d0, d1), [n, bsz, gh])
            new = u.step(dir_acts[d0], gxt, state, rt, rb, pg)
            on = b.reshape(_slice(b, active, 0, t, t + 1), [1, bsz, 1])
            state = [b.pw("where", on, nv, old) for nv, old in zip(new, state, strict=True)]
            ys[gi].append(state[0])  # masked once for all steps below: one output per step's kernel
        finals.append(state)

    # Y: each step's outputs stacked over time, reverse directions put back in time order.
    y = _cat(b, [b.reshape(_cat(b, list(parts), 0), [1, d_n, bsz, hs]) for parts in zip(*ys, strict=True)], 0)
    y = b.pw("where", b.reshape(active, [s, 1, bsz, 1]), y, 0.0)  # zeros past each row's length
    if perm is not None:
        y = _cat(b, [_reorder(b, _slice(b, y, 1, d, d + 1), perm) if rev else _slice(b, y, 1, d, d + 1)
                     for d, rev in enumerate(reverse)], 1)  # fmt: skip
    outs = [y] + [_cat(b, [st[k] for st in finals], 0) for k in range(len(finals[0]))]
    return [b.convert(v, sub.type) for v, sub in zip(outs, ins.shape.sub_shapes, strict=True)]

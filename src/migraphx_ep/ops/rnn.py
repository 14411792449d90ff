"""Recurrent ops: rnn, gru, lstm (ONNX semantics, time-major layout, every input explicit).

The parser supplies absent optional inputs (zero bias/states/peepholes, full sequence lengths) and
transposes batch-major layouts, so each op has a fixed input list:
``X (S,B,I), W (D,G*H,I), R (D,G*H,H), B (D,2*G*H), seq_lens (B,) int32, initial_h (D,B,H)``
(+ ``initial_c (D,B,H), P (D,3*H)`` for lstm). Output is a tuple (Y (S,D,B,H), Y_h (D,B,H)[, Y_c]).
Steps past a batch entry's sequence length leave its state alone and write zeros to Y, as ORT does.
Arithmetic is float32 (float64 for double), like ORT's CPU kernels.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

import numpy as np

from ..ir.dtypes import DType
from ..ir.operation import Op, op_class, register_op
from ..ir.shape import Shape, ShapeError, check_shapes


def _sigmoid(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return 1 / (1 + np.exp(-x))


ACTIVATIONS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "tanh": np.tanh,
    "sigmoid": _sigmoid,
    "relu": lambda x: np.maximum(x, 0),
    "softsign": lambda x: x / (1 + np.abs(x)),
    "softplus": lambda x: np.logaddexp(0, x),
}
RNN_TYPES = frozenset({DType.float_type, DType.half_type, DType.double_type})
GATES = {"rnn": 1, "gru": 3, "lstm": 4}


@op_class
class _Recurrent(Op):
    hidden_size: int = 0
    direction: str = "forward"  # forward | reverse | bidirectional
    actv_funcs: tuple[str, ...] = ()
    clip: float = 0.0  # 0: no clipping of gate pre-activations

    def dirs(self) -> int:
        return 2 if self.direction == "bidirectional" else 1

    def compute_shape(self, inputs: list[Shape]) -> Shape:
        n_in = 8 if self.name == "lstm" else 6
        check_shapes(self.name, inputs).has(n_in)
        x, w, r, b, seq, h0 = inputs[:6]
        check_shapes(self.name, [x, w, r, b, h0] + inputs[6:]).same_type().types(RNN_TYPES)
        g, h, d = GATES[self.name], self.hidden_size, self.dirs()
        if self.direction not in ("forward", "reverse", "bidirectional"):
            raise ShapeError(f"{self.name}: direction {self.direction!r}")
        per_dir = {"rnn": 1, "gru": 2, "lstm": 3}[self.name]
        if len(self.actv_funcs) != per_dir * d or any(a not in ACTIVATIONS for a in self.actv_funcs):
            raise ShapeError(f"{self.name}: activations {list(self.actv_funcs)}")
        s_, bsz, i = x.lens if x.ndim() == 3 else (0, 0, 0)
        want = [(w, (d, g * h, i)), (r, (d, g * h, h)), (b, (d, 2 * g * h)), (seq, (bsz,)), (h0, (d, bsz, h))]
        if self.name == "lstm":
            want += [(inputs[6], (d, bsz, h)), (inputs[7], (d, 3 * h))]
        for s, lens in want:
            if s.lens != lens:
                raise ShapeError(f"{self.name}: input dims {list(s.lens)}, expected {list(lens)}")
        if seq.type != DType.int32_type:
            raise ShapeError(f"{self.name}: sequence lengths must be int32")
        outs = [Shape(x.type, (s_, d, bsz, h)), Shape(x.type, (d, bsz, h))]
        if self.name == "lstm":
            outs.append(Shape(x.type, (d, bsz, h)))
        return Shape.tuple_of(outs)

    def act(self, d: int, k: int) -> Callable[[np.ndarray], np.ndarray]:
        fn = ACTIVATIONS[self.actv_funcs[d * (len(self.actv_funcs) // self.dirs()) + k]]
        if self.clip > 0:
            return lambda v: fn(np.clip(v, -self.clip, self.clip))
        return fn

    def compute(self, out: Shape, args: list[np.ndarray]) -> list[np.ndarray]:
        ct = np.float64 if args[0].dtype == np.float64 else np.float32
        x, w, r, b, seq, h0, *rest = [a.astype(ct) if a.dtype.kind == "f" else a for a in args]
        s, bsz, _ = x.shape
        d_n, h = self.dirs(), self.hidden_size
        gh = GATES[self.name] * h
        y = np.zeros((s, d_n, bsz, h), ct)
        finals: list[list[np.ndarray]] = [[], []]
        seq = np.clip(seq.astype(np.int64), 0, s)
        rows = np.arange(bsz)
        for d in range(d_n):
            reverse = self.direction == "reverse" or d == 1
            gx = x @ w[d].T + b[d, :gh]  # (S, B, G*H), input contributions for every step at once
            state = [h0[d].copy()] + ([rest[0][d].copy()] if self.name == "lstm" else [])
            for t in range(s):
                active = t < seq
                idx = np.where(active, seq - 1 - t, 0) if reverse else np.full(bsz, t)
                new = self.step(d, gx[idx, rows], state, r[d], b[d, gh:], rest[1][d] if rest else None)
                state = [np.where(active[:, None], n, o) for n, o in zip(new, state, strict=True)]
                y[idx[active], d, rows[active]] = new[0][active]
            for k, st in enumerate(state):
                finals[k].append(st)
        outs = [y] + [np.stack(f) for f in finals if f]
        return [o.astype(out.sub_shapes[0].dtype) for o in outs]

    def step(
        self,
        d: int,
        gx: np.ndarray,
        state: list[np.ndarray],
        r: np.ndarray,
        rb: np.ndarray,
        p: np.ndarray | None,
    ) -> list[np.ndarray]:
        raise NotImplementedError


@register_op
@op_class
class Rnn(_Recurrent):
    name: ClassVar[str] = "rnn"

    def step(self, d, gx, state, r, rb, p):
        return [self.act(d, 0)(gx + state[0] @ r.T + rb)]


@register_op
@op_class
class Gru(_Recurrent):
    """Gates z, r, h; ``linear_before_reset`` applies r after the recurrent product (cuDNN style)."""

    name: ClassVar[str] = "gru"
    linear_before_reset: bool = False

    def step(self, d, gx, state, r, rb, p):
        h_prev, hs = state[0], self.hidden_size
        f, g = self.act(d, 0), self.act(d, 1)
        rz = h_prev @ r[: 2 * hs].T + rb[: 2 * hs]
        z = f(gx[:, :hs] + rz[:, :hs])
        rr = f(gx[:, hs : 2 * hs] + rz[:, hs:])
        if self.linear_before_reset:
            hh = g(gx[:, 2 * hs :] + rr * (h_prev @ r[2 * hs :].T + rb[2 * hs :]))
        else:
            hh = g(gx[:, 2 * hs :] + (rr * h_prev) @ r[2 * hs :].T + rb[2 * hs :])
        return [(1 - z) * hh + z * h_prev]


@register_op
@op_class
class Lstm(_Recurrent):
    """Gates i, o, f, c with peepholes P = [Pi, Po, Pf]; ``input_forget`` couples f = 1 - i."""

    name: ClassVar[str] = "lstm"
    input_forget: bool = False

    def step(self, d, gx, state, r, rb, p):
        h_prev, c_prev = state
        hs = self.hidden_size
        f, g, hf = self.act(d, 0), self.act(d, 1), self.act(d, 2)
        a = gx + h_prev @ r.T + rb
        i = f(a[:, :hs] + p[:hs] * c_prev)
        fg = 1 - i if self.input_forget else f(a[:, 2 * hs : 3 * hs] + p[2 * hs :] * c_prev)
        c = fg * c_prev + i * g(a[:, 3 * hs :])
        o = f(a[:, hs : 2 * hs] + p[hs : 2 * hs] * c)
        return [o * hf(c), c]


__all__ = ["ACTIVATIONS", "GATES", "RNN_TYPES"]

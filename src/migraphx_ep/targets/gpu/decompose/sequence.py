"""reverse_sequence as one gather_elements along the time axis (``ops/data.py`` is the meaning)."""

from __future__ import annotations

import numpy as np

from ....ir.dtypes import DType
from ....ir.instruction import Instruction
from .builder import Builder


def decompose_reverse_sequence(b: Builder, ins: Instruction) -> Instruction:
    # index[t, b] = len[b] - 1 - t for t < len[b], else t. A length outside [0, T] makes every index
    # of its batch T, out of range, so the gather raises IndexError where the ref raises it.
    op = ins.op
    x, seq = ins.inputs
    rank, i64 = x.shape.ndim(), DType.int64_type
    ta, ba = op.time_axis, op.batch_axis  # type: ignore[attr-defined]
    steps = x.shape.lens[ta]
    t_lens, b_lens = [1] * rank, [1] * rank
    t_lens[ta], b_lens[ba] = steps, x.shape.lens[ba]
    t = b.literal(np.arange(steps).reshape(t_lens), i64)
    n = b.reshape(seq, b_lens)
    valid = b.pw("logical_and", b.pw("greater_or_equal", n, 0), b.pw("less_or_equal", n, steps))
    rev = b.pw("where", b.pw("less", t, n), b.pw("sub", b.pw("sub", n, 1), t), t)
    idx = b.pw("where", valid, rev, steps)
    return b.add("gather_elements", x, b.broadcast_to(idx, x.shape.lens), axis=ta)

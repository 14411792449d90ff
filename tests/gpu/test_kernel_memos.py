"""The kernel generators' memos give what they compute afresh. element_function's: for expressions that
compare equal as dataclasses but emit differently (0.0 vs -0.0, attribute values, input types); a
resize op's tables: for each input size it is asked about. No GPU needed."""

from __future__ import annotations

import numpy as np

from migraphx_ep.ir.dtypes import DType
from migraphx_ep.ir.operation import make_op
from migraphx_ep.ir.shape import Shape
from migraphx_ep.targets.gpu.kernels import pointwise as P
from migraphx_ep.targets.gpu.kernels import resize as R
from migraphx_ep.targets.gpu.kernels.spec import PwConst, PwInput, PwOp

F, H, I32 = DType.float_type, DType.half_type, DType.int32_type


def _add(c: float | int | bool, t: DType = F) -> PwOp:
    return PwOp(make_op("add"), (PwInput(0), PwConst(c, t)), t)


def _leaky(alpha: float) -> PwOp:
    return PwOp(make_op("leaky_relu", alpha=alpha), (PwInput(0),), F)


CASES = [
    (_add(0.0), [F], F),
    (_add(-0.0), [F], F),
    (_add(0.0), [H], H),
    (_add(1, I32), [I32], I32),
    (_add(True, I32), [I32], I32),
    (_leaky(0.1), [F], F),
    (_leaky(0.2), [F], F),
    (PwOp(make_op("div"), (PwInput(0), PwInput(1)), I32), [I32, I32], I32),  # a checking one
    (_add(np.float64(0.1)), [F], F),
    (_add(np.float32(0.1)), [F], F),  # equal to the float 0.1 neither in value nor in type
]


def test_memo_matches_a_fresh_emitter():
    P._ELEMENT_FUNCTIONS.clear()
    fresh = [P._element_function(e, list(i), o) for e, i, o in CASES]
    assert fresh[0] != fresh[1] and fresh[5] != fresh[6] and fresh[0] != fresh[2]
    assert fresh[7][1]  # the integer division checks its divisor
    for _ in range(2):  # cold, then from the memo, in an order where equal-as-dataclass cases alternate
        for (e, i, o), want in zip(CASES, fresh, strict=True):
            assert P.element_function(e, list(i), o) == want


def test_memo_starts_afresh_when_full(monkeypatch):
    monkeypatch.setattr(P, "MAX_ELEMENT_FUNCTIONS", 2)
    P._ELEMENT_FUNCTIONS.clear()
    for e, i, o in CASES:
        assert P.element_function(e, list(i), o) == P._element_function(e, list(i), o)
        assert len(P._ELEMENT_FUNCTIONS) <= 2


def test_resize_tables_per_input_size():
    op = make_op("resize", out_lens=[1, 1, 8, 8], scales=[1.0, 1.0, 2.0, 2.0], mode="linear")
    small, large = Shape(DType.float_type, (1, 1, 4, 4)), Shape(DType.float_type, (1, 1, 6, 5))
    want = {s.lens: R._make_layout(op, s.lens) for s in (small, large)}
    assert not np.array_equal(want[small.lens][0], want[large.lens][0])
    for _ in range(2):
        for s in (small, large, large, small):
            table = R.resize_table(op, s)
            assert np.array_equal(table, want[s.lens][0]) and not table.flags.writeable
            assert R._layout(op, s.lens)[1] == want[s.lens][1]

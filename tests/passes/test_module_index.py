"""Module edits find their instruction near the last edit first (``Module._index``), and anywhere else
after that: edits far apart and in any order still land where they were asked to."""

from __future__ import annotations

import numpy as np
import pytest
from passcheck import Build

from migraphx_ep.ir import module as module_mod
from migraphx_ep.ir.evaluate import run_module
from migraphx_ep.ir.module import ModuleError
from migraphx_ep.ir.operation import make_op


def chain(n: int):
    b = Build()
    x = b.param("x", [4])
    ys = [x]
    for _ in range(n):
        ys.append(b("neg", ys[-1]))
    return b.ret(ys[-1]), ys


@pytest.mark.parametrize("order", ["forward", "backward", "alternating"])
def test_edits_far_apart_land_in_place(order, monkeypatch):
    monkeypatch.setattr(module_mod, "INDEX_WINDOW", 2)  # most lookups miss the window
    m, ys = chain(40)
    picks = list(range(1, 41))
    if order == "backward":
        picks.reverse()
    elif order == "alternating":
        picks = [p for pair in zip(picks[:20], reversed(picks[20:]), strict=True) for p in pair]
    for k in picks:  # relu(y_k) inserted just before y_k's user, which then reads it
        user = ys[k + 1] if k < 40 else m.get_return()
        r = m.insert_instruction(user, make_op("relu"), [ys[k]])
        user.replace_inputs([r if i is ys[k] else i for i in user.inputs])
        assert m.instructions[m.instructions.index(user) - 1] is r
    m.validate()
    x = np.array([-2.0, -1.0, 1.0, 2.0], np.float32)
    (got,) = run_module(m, {"x": x})
    assert np.array_equal(got, np.zeros(4, np.float32))  # relu after each negation: all zeros after two


def test_an_instruction_of_another_module_is_an_error():
    m, _ = chain(3)
    _, theirs = chain(3)
    with pytest.raises(ModuleError, match="not in module"):
        m.move_instruction(theirs[1], m.instructions[-1])

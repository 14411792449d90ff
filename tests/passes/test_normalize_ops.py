"""normalize_ops: negative axes become non-negative, per the op's rank convention; shapes unchanged."""

from __future__ import annotations

import numpy as np
import pytest
from passcheck import Build, check_pass

from migraphx_ep.ir.operation import OPS
from migraphx_ep.passes import NORMALIZE_OPS, normalize_ops
from migraphx_ep.passes.normalize_ops import AXIS_ATTRIBUTES

LENS = [2, 3, 4]


@pytest.mark.parametrize(
    "name,lens,attrs,want",
    [
        ("softmax", LENS, {"axis": -1}, {"axis": 2}),
        ("reduce_sum", LENS, {"axes": [-1, 0]}, {"axes": (2, 0)}),
        ("squeeze", [2, 1, 4], {"axes": [-2]}, {"axes": (1,)}),
        ("unsqueeze", LENS, {"axes": [-1]}, {"axes": (3,)}),  # counted from the output rank 4
        ("flatten", LENS, {"axis": -3}, {"axis": 0}),
        ("argmax", LENS, {"axis": -2}, {"axis": 1}),
        ("prefix_scan_sum", LENS, {"axis": -3}, {"axis": 0}),
        ("slice", LENS, {"axes": [-1], "starts": [1], "ends": [3]}, {"axes": (2,)}),
        ("reverse", LENS, {"axes": [-1, -3]}, {"axes": (2, 0)}),
    ],
)
def test_negative_axes(name, lens, attrs, want):
    def build(a=attrs):
        b = Build()
        x = b.param("x", lens)
        return b.ret(b(name, x, **a))

    check_pass(NORMALIZE_OPS, build, lambda: build({**attrs, **want}))


def test_concat_gather_onehot():
    def build(axis_c=-1, axis_g=-3, axis_o=-1):
        b = Build()
        x, y = b.param("x", LENS), b.param("y", [2, 3, 1])
        idx = b.lit([1, 0], np.int64)
        return b.ret(
            b("concat", x, y, axis=axis_c),
            b("gather", x, idx, axis=axis_g),
            b("onehot", idx, b.lit([0.0, 1.0]), depth=3, axis=axis_o),
        )

    check_pass(NORMALIZE_OPS, build, lambda: build(2, 0, 1))


def test_already_normal_unchanged():
    b = Build()
    x = b.param("x", LENS)
    m = b.ret(b("softmax", x, axis=1), b("transpose", x, permutation=[2, 0, 1]))
    assert not normalize_ops(m)


def test_table_names_real_ops_and_attributes():
    for name, spec in AXIS_ATTRIBUTES.items():
        assert name in OPS, name
        fields = OPS[name].__dataclass_fields__
        for attr, _ in spec:
            assert attr in fields, (name, attr)

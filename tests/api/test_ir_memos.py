"""The IR's memos (standard strides, a literal's shape, an op class's field names) return what they
would compute afresh, whatever was asked before."""

from __future__ import annotations

import numpy as np
import pytest

import migraphx_ep.ops  # noqa: F401 - registers the ops make_op builds
from migraphx_ep.ir import Shape
from migraphx_ep.ir.dtypes import DType
from migraphx_ep.ir.module import Module
from migraphx_ep.ir.operation import Literal, field_names, make_op, op_shape_memo
from migraphx_ep.ir.shape import ShapeError, standard_strides
from migraphx_ep.ops.core import broadcast_lens


def test_standard_strides_per_lens():
    for lens, strides in [
        ((2, 3, 4), (12, 4, 1)),
        ((4, 3, 2), (6, 2, 1)),
        ((2, 3, 4), (12, 4, 1)),
        ((1, 0, 5), (5, 5, 1)),
        ((7,), (1,)),
        ((), ()),
    ]:
        assert Shape(DType.float_type, lens).strides == strides
        assert Shape(DType.float_type, list(lens)).strides == strides
        assert standard_strides(lens) == strides


def test_shape_takes_ints_and_types_of_any_kind():
    s = Shape(2, np.array([2, 3], dtype=np.int64))
    assert s.type is DType.float_type and s.lens == (2, 3) and all(type(n) is int for n in s.lens)
    assert s == Shape(DType.float_type, (2, 3), (3, 1))
    assert Shape(DType.half_type, (2, 3), [1, 2]).standard() is False
    with pytest.raises(ValueError):
        Shape(DType.float_type, (2, -1))


def test_literal_shape_is_its_own():
    a, b = Literal(np.zeros((2, 3), np.float32)), Literal(np.zeros((3, 2), np.int64))
    for _ in range(2):
        assert a.compute_shape([]) == Shape(DType.float_type, (2, 3))
        assert b.compute_shape([]) == Shape(DType.int64_type, (3, 2))
    assert Literal(np.float16(1)).compute_shape([]) == Shape(DType.half_type, ())


def test_field_names_per_op_class():
    assert field_names(type(make_op("transpose", permutation=[1, 0]))) == ("permutation",)
    assert "axes" in field_names(type(make_op("squeeze", axes=[0])))
    assert make_op("transpose", permutation=[1, 0]).permutation == (1, 0)  # lists still frozen
    frozen = make_op("transpose", permutation=[np.int64(1), 0]).permutation
    assert frozen == (1, 0) and all(type(v) is int for v in frozen)  # numpy ints still plain ints
    nested = make_op("pad", pads=[[1, 2], (3, np.int32(4))]).pads
    assert nested == ((1, 2), (3, 4)) and type(nested[1][1]) is int
    with pytest.raises(ValueError, match="unknown attribute"):
        make_op("transpose", axes=[0])


def test_op_shape_memo_follows_the_inputs():
    """One op object on alternating input shapes (a body copy, then another use): each gets its own."""
    op = make_op("multibroadcast", out_lens=[2, 3, 4])
    a, b = Shape(DType.float_type, (3, 1)), Shape(DType.half_type, (1, 4))
    for _ in range(2):
        assert op_shape_memo(op, [a]) == Shape(DType.float_type, (2, 3, 4), (0, 1, 0))
        assert op_shape_memo(op, [b]) == Shape(DType.half_type, (2, 3, 4), (0, 0, 1))
    with pytest.raises(ShapeError):
        op_shape_memo(op, [Shape(DType.float_type, (5, 4))])
    assert op_shape_memo(op, [a]) == op.compute_shape([a])
    assert make_op("multibroadcast", out_lens=[2, 3, 4]) == op  # the memo is no part of equality


def test_module_shapes_through_the_memo():
    m = Module()
    x = m.add_parameter("x", Shape(DType.float_type, (2, 3)))
    y = m.add_parameter("y", Shape(DType.float_type, (4, 3)))
    t = make_op("transpose", permutation=[1, 0])
    assert m.add_instruction(t, [x]).shape == Shape(DType.float_type, (3, 2), (1, 3))
    assert m.add_instruction(t, [y]).shape == Shape(DType.float_type, (3, 4), (1, 3))
    assert m.add_instruction(t, [x]).shape == Shape(DType.float_type, (3, 2), (1, 3))
    m.validate()


def test_broadcast_lens():
    assert broadcast_lens((2, 1, 4), (3, 1)) == (2, 3, 4)
    assert broadcast_lens((1,), (1, 1), ()) == (1, 1)
    assert broadcast_lens((5, 0), (1, 0)) == (5, 0)
    assert broadcast_lens() == ()
    with pytest.raises(ShapeError, match=r"dims \[\[2, 3\], \[4, 3\]\] are not broadcastable"):
        broadcast_lens((2, 3), (4, 3))

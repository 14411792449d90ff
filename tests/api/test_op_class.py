"""``op_class``: an op class with no field of its own keeps its base's generated methods instead of
generating them again (import time), and behaves exactly as the frozen dataclass it used to be."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import pytest

import migraphx_ep.ops  # noqa: F401 - fills the op table
from migraphx_ep.ir.operation import OPS, Op, make_op, op_class


def _built() -> list[Op]:
    """One instance of every registered op class whose fields all have defaults."""
    out = []
    for cls in OPS.values():
        try:
            out.append(cls())
        except TypeError:
            continue  # a field without a default
    return out


def test_most_op_classes_take_their_bases_methods():
    fieldless = [c for c in OPS.values() if "__init__" not in vars(c)]
    assert len(fieldless) > 80  # the elementwise ops, most views, reductions...
    for cls in fieldless:
        assert "__dataclass_fields__" not in vars(cls)
        assert dataclasses.is_dataclass(cls)
        assert [f.name for f in dataclasses.fields(cls)] == [f.name for f in dataclasses.fields(cls.__base__)]


def test_every_op_class_behaves_as_a_frozen_dataclass():
    ops = _built()
    assert len(ops) > 120
    for op in ops:
        cls = type(op)
        again = cls()
        assert op == again and hash(op) == hash(again), cls.__name__
        assert repr(op).startswith(cls.__qualname__ + "("), repr(op)
        assert dataclasses.replace(op) == op
        for name in ["not_a_field", *(f.name for f in dataclasses.fields(op))]:
            with pytest.raises(dataclasses.FrozenInstanceError):
                setattr(op, name, 1)
        with pytest.raises(dataclasses.FrozenInstanceError):
            delattr(op, "not_a_field")
    # Equal fields, different ops: never equal (``__eq__`` compares classes first).
    by_fields: dict[tuple, list[Op]] = {}
    for op in ops:
        by_fields.setdefault(tuple(dataclasses.astuple(op)), []).append(op)
    pairs = [(a, b) for group in by_fields.values() for a, b in zip(group, group[1:], strict=False)]
    assert len(pairs) > 50
    assert all(a != b for a, b in pairs)


def test_a_fieldless_op_still_freezes_its_attributes():
    op = make_op("reduce_sum", axes=[1, 2])
    assert "__init__" not in vars(type(op))
    assert op.axes == (1, 2) and op == make_op("reduce_sum", axes=(1, 2))
    assert hash(op) == hash(make_op("reduce_sum", axes=(1, 2)))
    assert op != make_op("reduce_max", axes=(1, 2))


def test_op_class_generates_what_a_class_declares():
    @op_class
    class Base(Op):
        name: ClassVar[str] = "test_base"
        size: int = 3

    @op_class
    class Plain(Base):
        name: ClassVar[str] = "test_plain"

    @op_class
    class Sized(Base):
        name: ClassVar[str] = "test_sized"
        extra: int = 5

    assert "__init__" in vars(Base) and "__init__" not in vars(Plain) and "__init__" in vars(Sized)
    assert Plain(size=4).size == 4 and Plain() != Base() and Plain(4) == Plain(4)
    assert Sized(1, 2).extra == 2 and [f.name for f in dataclasses.fields(Sized)] == ["size", "extra"]

    @op_class
    class Loose:  # no dataclass base: a dataclass of its own
        x: int = 1

    assert dataclasses.is_dataclass(Loose) and Loose() == Loose()
    with pytest.raises(dataclasses.FrozenInstanceError):
        Loose().x = 2  # type: ignore[misc]

"""Operations: one small frozen dataclass each, registered by name (MIGraphX's ``operation``).

An op gives its output shape (``compute_shape``) and its meaning as numpy (``compute``). The ref target,
constant propagation and verification all call ``compute``; other targets only lower.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import numpy as np

from .shape import Shape, ShapeError

if TYPE_CHECKING:
    from .module import Module

# run(module, params) -> outputs: how ops that own submodules (if, loop) evaluate them.
RunModule = Callable[["Module", dict[str, np.ndarray]], list[np.ndarray]]

OPS: dict[str, type[Op]] = {}
_C = TypeVar("_C")


def register_op(cls: type[Op]) -> type[Op]:
    """Class decorator: add ``cls`` to the name → op table (its ``name`` must be unique)."""
    if not cls.name:
        raise TypeError(f"{cls.__name__} has no op name")
    if cls.name in OPS and OPS[cls.name] is not cls:
        raise TypeError(f"op {cls.name!r} registered twice ({OPS[cls.name].__name__}, {cls.__name__})")
    OPS[cls.name] = cls
    return cls


def op_class(cls: type[_C]) -> type[_C]:
    """``@dataclasses.dataclass(frozen=True)`` for an op class, cheaper for most of them.

    A class that declares no field of its own (an elementwise op is its name, function and types: 102
    of the 171 op classes) keeps the ``__init__``, ``__eq__``, ``__hash__`` and ``__repr__`` its
    dataclass base generated, which serve it unchanged (they compare ``__class__`` and read the same
    fields; ``Op.__post_init__`` runs). Generating them again costs ~0.5 ms a class (an ``exec`` per
    method), which every process paid in its first session's creation (``import``: ~50 ms here,
    ~100 ms on the GPU machine's host). Its instances refuse every assignment, as a frozen dataclass's."""
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen or _own_fields(cls):
        return dataclasses.dataclass(frozen=True)(cls)
    cls.__setattr__ = _frozen_setattr  # type: ignore[method-assign,assignment]
    cls.__delattr__ = _frozen_delattr  # type: ignore[method-assign,assignment]
    return cls


def _own_fields(cls: type) -> list[str]:
    """Names ``cls`` annotates itself that a dataclass would make fields (not ``ClassVar``s)."""
    out = []
    for name, t in vars(cls).get("__annotations__", {}).items():
        text = t if isinstance(t, str) else repr(t)
        if not text.replace("typing.", "").startswith("ClassVar"):
            out.append(name)
    return out


def _frozen_setattr(self: object, name: str, value: object) -> None:
    raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")


def _frozen_delattr(self: object, name: str) -> None:
    raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")


@functools.cache
def field_names(cls: type) -> tuple[str, ...]:
    """A dataclass's field names, in order (``dataclasses.fields`` rebuilds its tuple on every call,
    and every op built runs ``__post_init__``). A class's fields never change once it is defined."""
    return tuple(f.name for f in dataclasses.fields(cls))


def _freeze(v: Any) -> Any:
    if isinstance(v, list | tuple):
        if all(type(x) is int for x in v):  # dims, axes, permutations: nothing inside to freeze
            return v if type(v) is tuple else tuple(v)
        return tuple(_freeze(x) for x in v)
    if isinstance(v, np.generic):
        return v.item()
    return v


def _thaw(v: Any) -> Any:
    if isinstance(v, tuple):
        return [_thaw(x) for x in v]
    if isinstance(v, Shape):
        return v.to_dict()
    return v


@dataclasses.dataclass(frozen=True)
class Op:
    """Base of every operation. Subclasses are ``@register_op @dataclass(frozen=True)``."""

    name: ClassVar[str] = ""

    def __post_init__(self) -> None:
        # Attributes arrive from ONNX, JSON and users as lists; ops must stay hashable for CSE.
        for name in field_names(type(self)):
            v = getattr(self, name)
            fv = _freeze(v)
            if fv is not v:
                object.__setattr__(self, name, fv)

    def compute_shape(self, inputs: list[Shape]) -> Shape:
        raise NotImplementedError(f"{self.name}: compute_shape")

    def compute(self, out: Shape, args: list[np.ndarray]) -> np.ndarray:
        raise NotImplementedError(f"{self.name}: no reference implementation")

    def output_alias(self, inputs: Sequence[Shape]) -> int:
        """Index of the input whose buffer the output is a view of, or -1 (drives memory planning)."""
        return -1

    def attributes(self) -> dict[str, Any]:
        return {name: _thaw(getattr(self, name)) for name in field_names(type(self))}

    def __str__(self) -> str:
        attrs = self.attributes()
        if not attrs:
            return self.name
        return f"{self.name}[" + ",".join(f"{k}={_fmt(v)}" for k, v in attrs.items()) + "]"


def op_shape_memo(op: Op, inputs: list[Shape]) -> Shape:
    """``op.compute_shape(inputs)``, remembered on ``op`` for the last inputs it was asked about: an op
    is immutable, so its shape is a function of the input shapes alone, and passes that copy a chain into
    a fused op's body (or re-add a value to a module) build the same op on the same shapes again."""
    key = tuple(inputs)
    last = op.__dict__.get("_shape_memo")
    if last is not None and last[0] == key:
        return last[1]
    out = op.compute_shape(inputs)
    object.__setattr__(op, "_shape_memo", (key, out))  # one tuple: a reader sees a whole entry or none
    return out


def _plain(v: object) -> bool:
    if isinstance(v, tuple | list):
        return all(_plain(x) for x in v)
    return v is None or isinstance(v, int | float | str | enum.Enum | np.generic | Shape)


_MISSING = object()


def op_key(op: Op) -> Hashable | None:
    """Equal only for ops of one class whose attributes print alike, so equal keys mean the same
    shapes and the same kernels (``repr`` tells 0.0 from -0.0 and 1 from True); literals go by their
    bytes. None: an attribute's repr is not exact (an array's). The gpu lowering's kernel memo and the
    shape templates' shape memo key on it."""
    if isinstance(op, Literal):
        return ("literal", op.digest())
    memo = op.__dict__.get("_kernel_key", _MISSING)  # ops are immutable: computed once per op
    if memo is _MISSING:
        values = [getattr(op, f) for f in field_names(type(op))]
        memo = (type(op), tuple(repr(v) for v in values)) if all(_plain(v) for v in values) else None
        object.__setattr__(op, "_kernel_key", memo)
    return memo


class ModuleOp(Op):
    """An op that owns submodules (control flow, fused kernels): shape and compute see them."""

    def compute_shape_with_modules(self, inputs: list[Shape], mods: list[Module]) -> Shape:
        raise NotImplementedError(f"{self.name}: compute_shape_with_modules")

    def compute_with_modules(
        self, out: Shape, args: list[np.ndarray], mods: list[Module], run: RunModule
    ) -> np.ndarray | list[np.ndarray]:
        raise NotImplementedError(f"{self.name}: compute_with_modules")


def _fmt(v: Any) -> str:
    if isinstance(v, list):
        return "{" + ", ".join(_fmt(x) for x in v) + "}"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {_fmt(x)}" for k, x in v.items()) + "}"
    return str(v)


def make_op(name: str, **attrs: Any) -> Op:
    """``op(name, **kwargs)`` of the MIGraphX Python API; unknown names and attributes are errors."""
    cls = OPS.get(name)
    if cls is None:
        raise ValueError(f"unknown operator {name!r}")
    if cls.name == "@literal":
        raise ValueError("use module.add_literal for literals")
    known = field_names(cls)
    bad = [k for k in attrs if k not in known]
    if bad:
        raise ValueError(f"operator {name!r}: unknown attribute(s) {sorted(bad)}; valid: {sorted(known)}")
    if "shape" in attrs and isinstance(attrs["shape"], dict):
        attrs = {**attrs, "shape": Shape.from_dict(attrs["shape"])}
    return cls(**attrs)


# -- builtins: parameters, literals, return ----------------------------------------------------------
@register_op
@dataclasses.dataclass(frozen=True)
class Param(Op):
    """A program input. ``runtime_axes``: axes whose size may differ at run from ``shape`` (the program
    was proven not to depend on them: see ep/runtime_dims.py); only ``dimensions_of`` reads them."""

    name: ClassVar[str] = "@param"
    parameter: str = ""
    shape: Shape = dataclasses.field(default_factory=lambda: Shape(0))
    runtime_axes: tuple[int, ...] = ()

    def compute_shape(self, inputs: list[Shape]) -> Shape:
        return self.shape

    def __str__(self) -> str:
        return f"@param:{self.parameter}"


class Literal(Op):
    """A constant. Equality and hashing go by shape and bytes so CSE can merge equal constants."""

    name: ClassVar[str] = "@literal"

    def __init__(self, value: np.ndarray) -> None:
        # A view: freezing it leaves the caller's array alone. The reshape keeps 0-d values 0-d
        # (ascontiguousarray returns at least 1-d).
        arr = np.ascontiguousarray(value).reshape(np.shape(value)).view()
        arr.setflags(write=False)
        object.__setattr__(self, "value", arr)
        object.__setattr__(self, "_digest", None)
        object.__setattr__(self, "_shape", None)

    value: np.ndarray

    def __setattr__(self, key: str, val: Any) -> None:
        raise dataclasses.FrozenInstanceError(key)

    def digest(self) -> bytes:
        if self._digest is None:  # type: ignore[has-type]
            h = hashlib.blake2b(self.value.tobytes(), digest_size=16)
            h.update(str((self.value.dtype.str, self.value.shape)).encode())
            object.__setattr__(self, "_digest", h.digest())
        return self._digest  # type: ignore[has-type]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Literal) and self.digest() == other.digest()

    def __hash__(self) -> int:
        return hash(self.digest())

    def compute_shape(self, inputs: list[Shape]) -> Shape:
        # The value is read-only, and the weight cache hands every compile the same Literal: one Shape.
        if self._shape is None:  # type: ignore[has-type]
            object.__setattr__(self, "_shape", Shape.of(self.value))
        return self._shape  # type: ignore[has-type]

    def compute(self, out: Shape, args: list[np.ndarray]) -> np.ndarray:
        return self.value

    def attributes(self) -> dict[str, Any]:
        return {}

    def __str__(self) -> str:
        v = self.value
        if v.size <= 8:
            return "@literal{" + ", ".join(str(x) for x in v.ravel().tolist()) + "}"
        return "@literal{...}"

    def __repr__(self) -> str:
        return f"Literal({self.value!r})"


OPS[Literal.name] = Literal  # type: ignore[assignment]


@register_op
@dataclasses.dataclass(frozen=True)
class Return(Op):
    name: ClassVar[str] = "@return"

    def compute_shape(self, inputs: list[Shape]) -> Shape:
        return Shape.tuple_of(inputs)


__all__ = [
    "OPS",
    "Literal",
    "ModuleOp",
    "Op",
    "Param",
    "Return",
    "ShapeError",
    "make_op",
    "op_key",
    "op_shape_memo",
    "register_op",
]

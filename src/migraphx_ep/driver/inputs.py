"""Generated inputs for the driver: random values, with index inputs kept inside what they index.

``generate_inputs`` draws signed integers from [-8, 8), which is fine for arithmetic but not for token
ids or type ids: an embedding table of 2 rows (BERT's token types) or a gather over a short axis would
fail with an out-of-range index. So an integer parameter that reaches the indices of a gather (through
value-preserving ops such as convert, reshape or unsqueeze) is drawn from [0, N) instead, N being the
smallest dimension it indexes.
"""

from __future__ import annotations

import zlib

import numpy as np

from ..ir.dtypes import is_integer
from ..ir.instruction import Instruction
from ..ir.program import Program
from ..migraphx import generate_inputs

# Ops whose output holds (a subset or copy of) the values of their first input: indices keep meaning.
VALUE_PRESERVING = frozenset(
    {
        "broadcast",
        "concat",
        "contiguous",
        "convert",
        "flatten",
        "identity",
        "layout",
        "multibroadcast",
        "reshape",
        "reshape_lazy",
        "slice",
        "squeeze",
        "step",
        "transpose",
        "unsqueeze",
    }
)


def _base(name: str) -> str:
    return name.rpartition("::")[2]  # lowered names such as gpu::gather index like the op itself


def _indexed_size(user: Instruction) -> int | None:
    """The size of the dimension(s) ``user`` indexes with its second input, or None if not an index."""
    op, data = _base(user.name), user.inputs[0].shape
    if op in ("gather", "gather_elements"):
        axis = getattr(user.op, "axis", 0)
        return data.lens[axis] if -data.ndim() <= axis < data.ndim() else None
    if op == "gathernd":
        b = getattr(user.op, "batch_dims", 0)
        k = user.inputs[1].shape.lens[-1] if user.inputs[1].shape.lens else 0
        dims = data.lens[b : b + k]
        return min(dims) if dims else None
    return None


def index_bound(param: Instruction) -> int | None:
    """Exclusive upper bound for the values of ``param``, or None when it indexes nothing."""
    bound: int | None = None
    stack, seen = [param], {id(param)}
    while stack:
        ins = stack.pop()
        for user in ins.outputs:
            if len(user.inputs) > 1 and user.inputs[1] is ins:
                n = _indexed_size(user)
                if n is not None:
                    bound = n if bound is None else min(bound, n)
            if _base(user.name) in VALUE_PRESERVING and id(user) not in seen:
                seen.add(id(user))
                stack.append(user)
    return bound


def index_bounds(prog: Program) -> dict[str, int]:
    """Parameter name -> exclusive bound, for every integer parameter that feeds gather indices."""
    bounds = {}
    for ins in prog.get_main_module().instructions:
        if ins.is_param() and is_integer(ins.shape.type):
            n = index_bound(ins)
            if n is not None:
                bounds[ins.op.parameter] = n  # type: ignore[attr-defined]
    return bounds


def generate_driver_inputs(prog: Program, seed: int = 0) -> dict[str, np.ndarray]:
    """``generate_inputs`` for every parameter, index parameters redrawn inside [0, bound)."""
    inputs = generate_inputs(prog.get_parameter_shapes(), seed=seed)
    for name, n in index_bounds(prog).items():
        if n <= 0:
            continue  # an empty axis has no valid index; the run reports the out-of-range one
        a = inputs[name]
        high = min(n, int(np.iinfo(a.dtype).max) + 1)
        rng = np.random.default_rng(seed + zlib.crc32(name.encode()))
        if not a.flags.writeable:
            a = inputs[name] = a.copy()
        a[...] = rng.integers(0, high, a.shape).astype(a.dtype)  # in place: keeps the parameter's strides
    return inputs


__all__ = ["generate_driver_inputs", "index_bound", "index_bounds"]

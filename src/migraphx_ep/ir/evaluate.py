"""The reference interpreter: runs a module by calling each op's numpy ``compute``.

Intermediates are dropped after their last use so whole models run in bounded memory.
"""

from __future__ import annotations

import numpy as np

from .instruction import Instruction
from .module import Module
from .operation import ModuleOp
from .shape import Shape


class RunError(RuntimeError):
    """A program was run with missing, extra or mis-shaped inputs."""


class AssumptionFailed(RuntimeError):
    """A run broke an assumption its program was compiled under (a program for run-time dims assumes
    what those dims cannot tell at compile time, e.g. GQA's shared past/present buffer). Nothing wrong
    was returned: the EP recompiles without the assumption and runs again (ep/compiled.py)."""


def check_params(
    module: Module, params: dict[str, np.ndarray], expected: dict[str, Shape] | None = None
) -> None:
    """``expected`` (the module's parameter shapes) may be passed in by callers that cache it."""
    expected = module.get_parameter_shapes() if expected is None else expected
    missing = sorted(set(expected) - set(params))
    if missing:
        raise RunError(f"missing input(s) {missing}; expected {sorted(expected)}")
    for name, shape in expected.items():
        arr = params[name]
        if tuple(arr.shape) != shape.lens and not shape.dynamic() and not _free_axes_match(module, name, arr):
            raise RunError(f"input {name!r}: expected dims {list(shape.lens)}, got {list(arr.shape)}")
        if arr.dtype != shape.dtype:
            raise RunError(f"input {name!r}: expected element type {shape.dtype}, got {arr.dtype}")


def _free_axes_match(module: Module, name: str, arr: np.ndarray) -> bool:
    """Whether ``arr`` fits parameter ``name`` once its run-time axes are left free (only looked up when
    the dims differ, so a program without run-time axes pays nothing)."""
    param = module.get_parameter(name)
    free = getattr(getattr(param, "op", None), "runtime_axes", ())
    lens = param.shape.lens if param is not None else ()
    return (
        bool(free)
        and arr.ndim == len(lens)
        and all(a == b or i in free for i, (a, b) in enumerate(zip(arr.shape, lens, strict=True)))
    )


def last_uses(module: Module) -> dict[int, list[Instruction]]:
    """Map position → values whose last reader is the instruction at that position."""
    last: dict[int, int] = {}
    pos = {id(ins): n for n, ins in enumerate(module.instructions)}
    for ins in module.instructions:
        for a in ins.inputs:
            last[id(a)] = pos[id(ins)]
    drop: dict[int, list[Instruction]] = {}
    for ins in module.instructions:
        if id(ins) in last and not ins.is_literal():
            drop.setdefault(last[id(ins)], []).append(ins)
    return drop


def run_module(
    module: Module, params: dict[str, np.ndarray], drop: dict[int, list[Instruction]] | None = None
) -> list[np.ndarray]:
    """``drop`` is ``last_uses(module)``; executables compute it once instead of on every run."""
    values: dict[int, np.ndarray] = {}
    drop = last_uses(module) if drop is None else drop
    result: list[np.ndarray] | None = None
    for n, ins in enumerate(module.instructions):
        op = ins.op
        if ins.is_param():
            values[id(ins)] = params[op.parameter]  # type: ignore[attr-defined]
        elif ins.is_return():
            result = [values[id(a)] for a in ins.inputs]
        else:
            args = [values[id(a)] for a in ins.inputs]
            if isinstance(op, ModuleOp):
                values[id(ins)] = op.compute_with_modules(ins.shape, args, ins.module_args, run_module)
            else:
                values[id(ins)] = op.compute(ins.shape, args)
        for dead in drop.get(n, ()):
            values.pop(id(dead), None)
    if result is None:
        last = module.instructions[-1]
        result = [values[id(last)]]
    return result


def result_matches(shape: Shape, value: np.ndarray) -> bool:
    return tuple(value.shape) == shape.lens and value.dtype == shape.dtype

"""Programs: named modules (``main`` first), compiled for a target and run (MIGraphX ``program``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from .argument import Argument
from .evaluate import check_params, run_module
from .instruction import Instruction
from .module import Module
from .shape import Shape
from .weights import WeightCache


@dataclass(frozen=True)
class CompileOptions:
    offload_copy: bool = True
    fast_math: bool = True
    exhaustive_tune: bool = False
    # The program's ``weights`` (``Program.compile`` passes them): what the passes, the lowering and
    # the executable may share with the other compiles of the same subgraph. Not an option as such.
    weights: WeightCache | None = field(default=None, compare=False, repr=False)
    # The program is already optimised (an instantiated shape template, ep/shape_template.py): the
    # target lowers it without running its passes again.
    optimised: bool = False


class Executable(Protocol):
    def run(self, params: dict[str, np.ndarray]) -> list[np.ndarray]: ...


class Target(Protocol):
    name: str

    def compile(self, prog: Program, options: CompileOptions) -> Executable: ...


class Program:
    def __init__(self) -> None:
        self.modules: dict[str, Module] = {"main": Module("main")}
        self.target_name: str | None = None
        self._exe: Executable | None = None
        # Where its literals' weights came from (``ir/weights.py``): the cache the compiles of one
        # subgraph share; compiling with it reuses what other input shapes computed from the weights.
        self.weights: WeightCache | None = None
        self.derived_weights: list = []  # what its compile took from ``weights``: alive while it is

    # -- modules --------------------------------------------------------------------------------
    def get_main_module(self) -> Module:
        return self.modules["main"]

    def create_module(self, name: str) -> Module:
        if name in self.modules:
            raise ValueError(f"module {name!r} already exists")
        self.modules[name] = Module(name)
        return self.modules[name]

    def get_module(self, name: str) -> Module:
        try:
            return self.modules[name]
        except KeyError:
            raise ValueError(f"no module named {name!r}") from None

    # -- queries --------------------------------------------------------------------------------
    def get_parameter_names(self) -> list[str]:
        return self.get_main_module().get_parameter_names()

    def get_parameter_shapes(self) -> dict[str, Shape]:
        return self.get_main_module().get_parameter_shapes()

    def get_output_shapes(self) -> list[Shape]:
        return self.get_main_module().get_output_shapes()

    def is_compiled(self) -> bool:
        return self._exe is not None

    # -- compile and run ------------------------------------------------------------------------
    def compile(
        self,
        t: Target,
        offload_copy: bool = True,
        fast_math: bool = True,
        exhaustive_tune: bool = False,
        optimised: bool = False,
    ) -> None:
        """``optimised``: the target's passes already ran on this program (see ``CompileOptions``)."""
        if self._exe is not None:
            raise RuntimeError("program is already compiled")
        options = CompileOptions(offload_copy, fast_math, exhaustive_tune, self.weights, optimised)
        self._exe = t.compile(self, options)
        self.target_name = t.name

    def run_numpy(self, params: Mapping[str, Any], borrow_outputs: bool = False) -> list[np.ndarray]:
        """``borrow_outputs``: the caller copies the results before its thread runs a program again, so
        an executable may return views of staging memory (the gpu target's per-thread pinned buffer)."""
        arrays = {k: np.asarray(v) for k, v in params.items()}
        main = self.get_main_module()
        prepare = getattr(self._exe, "prepare", None)
        if prepare is not None:  # e.g. the gpu target pads run-time axes (targets/gpu/runtime_dims.py)
            arrays = prepare(arrays)
        check_params(main, arrays, getattr(self._exe, "param_shapes", None))
        if self._exe is None:
            return run_module(main, arrays)
        if borrow_outputs and getattr(self._exe, "borrows_outputs", False):
            return self._exe.run(arrays, borrow=True)  # type: ignore[call-arg]
        return self._exe.run(arrays)

    def run(self, params: Mapping[str, Any]) -> list[Argument]:
        return [Argument(r) for r in self.run_numpy(params)]

    def sort(self) -> None:
        for m in self.modules.values():
            m.sort()

    # -- copying, printing, equality ------------------------------------------------------------
    def clone(self) -> Program:
        p = Program()
        p.modules = {}
        for name in self.modules:
            p.modules[name] = Module(name)
        for name, src in self.modules.items():
            dst = p.modules[name]
            mapping: dict[int, Instruction] = {}
            for ins in src.instructions:
                new = Instruction(
                    ins.op,
                    [mapping[id(a)] for a in ins.inputs],
                    ins.shape,
                    [p.modules[m.name] for m in ins.module_args],
                )
                new.module = dst
                for a in new.inputs:
                    a.outputs.append(new)
                dst.instructions.append(new)
                mapping[id(ins)] = new
        p.target_name = self.target_name
        p._exe = self._exe
        p.weights = self.weights
        p.derived_weights = self.derived_weights
        return p

    def __str__(self) -> str:
        return "\n".join(m.to_text() for m in self.modules.values())

    def print(self) -> None:  # noqa: A003 - MIGraphX API name
        print(self)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Program) and {k: m.structure() for k, m in self.modules.items()} == {
            k: m.structure() for k, m in other.modules.items()
        }

    __hash__ = None  # type: ignore[assignment]

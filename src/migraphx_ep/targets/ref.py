"""The ref target: numpy reference semantics. The oracle for every other target (MIGraphX ``ref``)."""

from __future__ import annotations

import numpy as np

from ..ir.evaluate import last_uses, run_module
from ..ir.program import CompileOptions, Program
from ..passes import Pass, run_passes
from ..passes.pipelines import ref_pipeline


class RefExecutable:
    """A compiled module is frozen, so its per-run bookkeeping is computed once here."""

    def __init__(self, prog: Program) -> None:
        self.main = prog.get_main_module()
        self.param_shapes = self.main.get_parameter_shapes()
        self._drop = last_uses(self.main)

    def run(self, params: dict[str, np.ndarray]) -> list[np.ndarray]:
        return run_module(self.main, params, self._drop)


class RefTarget:
    name = "ref"

    def get_passes(self, options: CompileOptions) -> list[Pass]:
        return ref_pipeline(options.weights)

    def compile(self, prog: Program, options: CompileOptions) -> RefExecutable:
        if not options.optimised:
            passes = self.get_passes(options)
            for m in prog.modules.values():
                run_passes(m, passes)
        return RefExecutable(prog)

    def __repr__(self) -> str:
        return "target('ref')"

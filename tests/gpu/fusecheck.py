"""What the fusion-pass tests share: a module lowered, its steps run in the numpy simulator and compared
with the ref interpretation of the unfused module."""

from __future__ import annotations

import numpy as np

from migraphx_ep.ir.evaluate import run_module
from migraphx_ep.ir.module import Module
from migraphx_ep.targets.gpu.lowering import Step, lower
from migraphx_ep.targets.gpu.simulate import run_steps
from passes.passcheck import random_inputs


def simulated(m: Module, ref: Module, tol: float = 1e-5, **lower_args: object) -> list[Step]:
    """The lowered steps of ``m`` (``lower_args`` over cuBLASLt and cuDNN on), simulated and compared
    with the ref interpretation of ``ref`` on random inputs, to ``tol``."""
    low = lower(m, **{"use_blas": True, "use_dnn": True, **lower_args})  # type: ignore[arg-type]
    feeds = random_inputs(ref, specials=False)
    for got, want in zip(run_steps(low, feeds), run_module(ref, feeds), strict=True):
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=tol, atol=tol)
    return low.steps

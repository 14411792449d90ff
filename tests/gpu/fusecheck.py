"""What the fusion-pass tests share: a module lowered, its steps run in the numpy simulator and compared
with the ref interpretation of the unfused module. The module gets ``fuse_pointwise`` and then the
layout pass first, the gpu pipeline's last passes, so its steps are the ones the pipeline would lower
it to."""

from __future__ import annotations

import numpy as np

from migraphx_ep.ir.evaluate import run_module
from migraphx_ep.ir.module import Module
from migraphx_ep.passes import DEAD_CODE_ELIMINATION, run_passes
from migraphx_ep.targets.gpu.fuse import FUSE_POINTWISE
from migraphx_ep.targets.gpu.layout import layout_convolution
from migraphx_ep.targets.gpu.lowering import lower
from migraphx_ep.targets.gpu.simulate import run_steps
from migraphx_ep.targets.gpu.steps import Step
from passes.passcheck import random_inputs


def simulated(
    m: Module, ref: Module, tol: float = 1e-5, channels_last: bool | None = None, **lower_args: bool
) -> list[Step]:
    """The lowered steps of ``m`` (``lower_args`` over cuBLASLt and cuDNN on), simulated and compared
    with the ref interpretation of ``ref`` on random inputs, to ``tol``. ``m`` gets ``fuse_pointwise``
    and the layout pass (channels-last as it decides, or as ``channels_last`` says)."""
    libs = {"use_blas": True, "use_dnn": True, **lower_args}
    run_passes(m, [FUSE_POINTWISE, DEAD_CODE_ELIMINATION])
    mode = None if channels_last is None else str(int(channels_last))
    layout_convolution(m, **libs, mode=mode)
    m.validate()
    low = lower(m, **libs)
    feeds = random_inputs(ref, specials=False)
    for got, want in zip(run_steps(low, feeds), run_module(ref, feeds), strict=True):
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=tol, atol=tol)
    return low.steps

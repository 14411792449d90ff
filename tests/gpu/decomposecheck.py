"""Checks for the gpu target's decompositions (``targets/gpu/decompose``), no GPU needed.

One ONNX graph is parsed and compiled three ways: for the ref target (the ops' own ``compute``, the
oracle), for the ref target after the gpu pipeline (the decomposed module evaluated by the same numpy
ops), and lowered for the gpu target with its steps run by the numpy simulator. All three must agree,
the partitioner must claim every node, and nothing the lowering emits may lack a kernel.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx

from migraphx_ep.ep.partition import partition
from migraphx_ep.frontend import model_to_dict, parse_graph
from migraphx_ep.ir.dtypes import from_numpy
from migraphx_ep.ir.shape import Shape
from migraphx_ep.targets import get_target
from migraphx_ep.targets.gpu import nvrtc
from migraphx_ep.targets.gpu.decompose import gpu_pipeline
from migraphx_ep.targets.gpu.lowering import lower
from migraphx_ep.targets.gpu.simulate import run_steps
from migraphx_ep.targets.gpu.steps import KernelStep, Lowered
from migraphx_ep.targets.gpu.support import instruction_supported, unsupported
from migraphx_ep.targets.ref import RefTarget

from .gpucheck import BF16, F16, F64, Tol, assert_matches, make_model, node

__all__ = ["check_decomposed", "compile_kernels", "default_tol", "errors_alike", "make_model", "node"]


class DecomposedRef(RefTarget):
    """The ref target running the gpu target's passes: decomposed modules evaluated by numpy."""

    def get_passes(self, options):  # noqa: ANN001, ANN201
        return gpu_pipeline()


def default_tol(dtype: np.dtype) -> Tol:
    dt = np.dtype(dtype)
    if dt == F16:
        return Tol(2e-3, 2e-3)
    if dt == BF16:
        return Tol(1.6e-2, 1.6e-2)
    if dt == F64:
        return Tol(1e-12, 1e-12, scaled=True)
    return Tol(1e-5, 1e-6, scaled=True)  # sums in another order


def _programs(model: onnx.ModelProto, feeds: dict[str, np.ndarray]):
    graph = model_to_dict(model)
    shapes = {k: Shape(from_numpy(v.dtype), v.shape) for k, v in feeds.items()}
    ref = parse_graph(graph, shapes).program
    ref.compile(get_target("ref"))
    dec = parse_graph(graph, shapes).program
    dec.compile(DecomposedRef())
    return ref, dec


def check_decomposed(
    model: onnx.ModelProto,
    feeds: dict[str, np.ndarray],
    gone: Sequence[str],
    tol: Tol | None = None,
) -> Lowered:
    """Ref, decomposed-on-ref and simulated lowering agree on ``feeds``; ops ``gone`` were decomposed.
    Returns the lowered program (for kernel checks)."""
    assert partition(model_to_dict(model), instruction_supported).refused == {}
    ref, dec = _programs(model, feeds)
    main = dec.get_main_module()
    names = {i.name for i in main.instructions}
    assert not names & set(gone), f"not decomposed: {names & set(gone)}"
    assert unsupported(main) is None
    want = ref.run_numpy(feeds)
    low = lower(main, use_blas=True, use_dnn=True)
    for what, got in (("decomposed", dec.run_numpy(feeds)), ("simulated", run_steps(low, feeds))):
        assert len(got) == len(want)
        for k, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_matches(np.asarray(g), w, tol or default_tol(w.dtype), f"{what} output {k}")
    return low


def errors_alike(model: onnx.ModelProto, feeds: dict[str, np.ndarray], error: type[Exception]) -> None:
    """The ref, the decomposed module and the simulated lowering all raise ``error`` on ``feeds``."""
    ref, dec = _programs(model, feeds)
    low = lower(dec.get_main_module(), use_blas=True, use_dnn=True)
    for run in (ref.run_numpy, dec.run_numpy, lambda f: run_steps(low, f)):
        try:
            run(feeds)
        except error:
            continue
        raise AssertionError(f"{run} did not raise {error.__name__}")


def compile_kernels(low: Lowered, arch: str = "sm_90") -> int:
    """NVRTC-compile every generated kernel of ``low``; returns how many distinct sources there were."""
    sources = {s.spec.source: s.spec.name for s in low.steps if isinstance(s, KernelStep)}
    for src, name in sources.items():
        assert nvrtc.compile_source(src, arch, name)
    return len(sources)

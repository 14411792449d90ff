"""How a convolution's plan gets its algorithm (``dnn.plan_conv``): cudnnFind, timed again, for a timed
pick; for a quick one (a compile on a Run's critical path) the layer's last pick at another input size
(``tuning.LayerPicks``) or cuDNN's heuristic, and bias and activation as calls of their own.
"""

from __future__ import annotations

import ctypes
import itertools
from collections.abc import Callable
from typing import Any

from .dnn import (
    _TRANSFORM_ALGOS,
    CUDNN_CONVOLUTION_FWD_ALGO_COUNT,
    CUDNN_STATUS_NOT_SUPPORTED,
    CUDNN_STATUS_SUCCESS,
    ConvPlan,
    _fusable,
    borrow_handle,
    lib,
)
from .kernels.spec import Unsupported
from .libs import FwdAlgoPerf
from .tuning import LAYERS


def search(plan: ConvPlan, limit: int, exhaustive: bool) -> None:
    """Choose the algorithm (cudnnFind on scratch buffers, else cuDNN's heuristic) and whether the fused
    call takes it (a trial run), on a private stream and a borrowed handle; the scratch memory is freed
    before returning."""
    if not exhaustive and _layer_pick(plan, limit):
        return
    with borrow_handle() as h:
        _search_on(plan, limit, exhaustive, h)
    LAYERS.put((plan.handle, plan.layer), plan.algo, plan.math, timed=exhaustive)


def _layer_pick(plan: ConvPlan, limit: int) -> bool:
    """Whether a quick pick took the algorithm picked for the same layer at another input size
    (tuning.LayerPicks): no heuristic query; bias and activation run as their own calls."""
    pick = LAYERS.get((plan.handle, plan.layer))
    if pick is None or (plan.no_tf32 and pick[0] in _TRANSFORM_ALGOS):
        return False
    return plan.choose(*pick, limit)


def _search_on(plan: ConvPlan, limit: int, exhaustive: bool, h: int) -> None:
    from . import cuda

    x, w, y, z = plan.shapes
    dnn = lib()
    stream, bufs = cuda.Stream(), []

    def scratch(nbytes: int) -> int:
        bufs.append(cuda.alloc(max(nbytes, 1)))
        return bufs[-1].ptr

    try:
        plan._call("cudnnSetStream", h, stream.handle)
        # Scratch tensors for Find and the fused call's trial; a quick pick runs neither (below).
        xp, wp, yp = (scratch(t.bytes()) if exhaustive else 0 for t in (x, w, y))
        zp = scratch(z.bytes()) if plan.residual and exhaustive else 0
        bp = scratch(y.lens[1] * y.type_size()) if plan.bias and exhaustive else 0
        count = ctypes.c_int(0)
        plan._call("cudnnGetConvolutionForwardAlgorithmMaxCount", h, ctypes.byref(count))
        n = max(count.value, CUDNN_CONVOLUTION_FWD_ALGO_COUNT)
        perfs, got = (FwdAlgoPerf * n)(), ctypes.c_int(0)
        descs = (plan.x_desc, plan.w_desc, plan.conv_desc, plan.y_desc)
        st = CUDNN_STATUS_NOT_SUPPORTED
        if exhaustive:  # room for every algorithm that fits the limit, so Find can time them all
            sizes = [plan.workspace(a) for a in range(CUDNN_CONVOLUTION_FWD_ALGO_COUNT)]
            find_ws = max([s for s in sizes if s is not None and s <= limit], default=0)
            ws = scratch(find_ws) if find_ws else 0
            args = (h, plan.x_desc, xp, plan.w_desc, wp, plan.conv_desc, plan.y_desc, yp)
            st = dnn.cudnnFindConvolutionForwardAlgorithmEx(*args, n, ctypes.byref(got), perfs, ws, find_ws)
        timed = st == CUDNN_STATUS_SUCCESS and any(plan.acceptable(p, limit) for p in perfs[: got.value])
        if not timed:
            plan._call("cudnnGetConvolutionForwardAlgorithm_v7", h, *descs, n, ctypes.byref(got), perfs)
        taken = [(p.algo, p.mathType) for p in perfs[: got.value] if plan.acceptable(p, limit)]
        runs = (c for c in dict.fromkeys(taken) if plan.choose(*c, limit))  # a workspace query each
        taken = list(runs) if timed else list(itertools.islice(runs, 1))  # a quick pick takes the first
        if not taken:
            raise Unsupported(
                f"cuDNN has no algorithm within {limit} bytes of workspace for {plan.describe()}"
            )
        if timed and len(taken) > 1:  # Find times each once: time its best few again, steadily
            taken.insert(0, _retimed(plan, taken[:_RETIME], limit, stream, h, xp, wp, yp, bp, zp, scratch))
        plan.choose(*taken[0], limit)
        # A quick pick (a program on a Run's critical path, replaced by a timed one soon) runs the
        # bias and activation as calls of their own: whether cuDNN takes the fused call is learnt only
        # by making it, on scratch memory, with a sync; for ~60 convolutions of a detector's new image
        # size that trial was most of the search.
        if exhaustive and _fusable(plan.bias, plan.relu, plan.algo):
            plan.fused = True
            ws = scratch(plan.workspace_size) if plan.workspace_size else 0
            plan.fused = plan.enqueue(h, xp, wp, yp, bp, zp, ws)[1] == CUDNN_STATUS_SUCCESS
    finally:
        try:
            stream.sync()
            dnn.cudnnSetStream(h, None)  # the private stream dies here; run() sets its own each call
        finally:
            for b in bufs:
                b.free()


_RETIME = 4  # Find's fastest few, timed again (autotune.fastest)


def _retimed(
    plan: ConvPlan, cands: list[tuple[int, int]], limit: int, stream: Any, h: int, *buffers: Any
) -> tuple[int, int]:
    """The fastest of ``cands`` ((algo, math) pairs cuDNN runs within ``limit``) as the plan will call it,
    fused or not, timed by ``autotune.fastest`` on ``buffers`` (x, w, y, bias, z pointers and the scratch
    allocator); the first when none can be timed. The runs go to handle ``h``'s stream, ``stream``."""
    from .autotune import fastest

    x, w, y, bias, z, scratch = buffers
    need = max((plan.workspace_size for a, m in cands if plan.choose(a, m, limit)), default=0)
    ws = scratch(need) if need else 0

    def trial(algo: int, math: int) -> Callable[[int], bool]:
        def run(_stream: int) -> bool:  # cuDNN enqueues on the handle's stream: the one being timed
            if not plan.choose(algo, math, limit):
                return False
            plan.fused = _fusable(plan.bias, plan.relu, algo)
            if plan.enqueue(h, x, w, y, bias, z, ws)[1] == CUDNN_STATUS_SUCCESS:
                return True
            # cuDNN refused the fused call: the plan runs this algorithm unfused then (plan_conv's
            # end), so time it that way rather than drop what may be the fastest algorithm.
            if not plan.fused:
                return False
            plan.fused = False
            return plan.enqueue(h, x, w, y, bias, z, ws)[1] == CUDNN_STATUS_SUCCESS

        return run

    try:
        best = fastest([trial(a, m) for a, m in cands], stream)
    finally:
        plan.fused = False
    return cands[best if best is not None else 0]

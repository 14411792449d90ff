"""Planning a cuBLASLt GEMM: cuBLASLt's candidates for a problem, and which one a program keeps -- a
stored pick, the fastest when timed (``migraphx_exhaustive_tune``, the background's timed compiles), else a
quick pick that prefers an algorithm this process has already run (``warm_algos.py``): the same layer's
at another M without a heuristic query, else the best warm one of cuBLASLt's candidates. ``blas.py`` holds
the plan itself (descriptors, layouts, the call); ``conv_search.py`` is cuDNN's counterpart of this file.
"""

from __future__ import annotations

from collections.abc import Callable

from ...ir.dtypes import DType, to_numpy
from . import warm_algos
from .blas import BlasError, GemmPlan, MatLayout, handle, span
from .kernels.spec import Unsupported
from .libs import HeuristicResult
from .tuning import keep_pick, restore_pick


def fastest_candidate(plan: GemmPlan, candidates: list[HeuristicResult]) -> HeuristicResult:
    """The fastest candidate on scratch buffers of the GEMM's extents (``autotune.fastest``: runs captured
    in CUDA graphs, interleaved rounds); cuBLASLt's first when none can be timed."""
    from . import cuda
    from .autotune import fastest

    size, out_size = to_numpy(plan.dtype).itemsize, to_numpy(plan.out_dtype).itemsize
    dims = ((plan.m, plan.k, size), (plan.k, plan.n, size), (plan.m, plan.n, out_size))
    bufs = [
        cuda.alloc(span(x, r, c, plan.batch) * sz) for x, (r, c, sz) in zip(plan.layouts, dims, strict=True)
    ]
    bufs.append(cuda.alloc(plan.n * out_size))  # bias
    ws = cuda.alloc(max(int(r.workspaceSize) for r in candidates))
    stream = cuda.Stream()
    args = (bufs[0].ptr, bufs[1].ptr, bufs[2].ptr, bufs[2].ptr, bufs[3].ptr, ws.ptr)

    def trial(cand: HeuristicResult) -> Callable[[int], bool]:
        def run(h: int) -> bool:
            plan.choose(cand)
            try:
                plan.run(h, *args)
            except BlasError:
                return False
            return True

        return run

    try:
        best = fastest([trial(c) for c in candidates], stream)
    finally:
        stream.sync()
        for buf in (*bufs, ws):
            buf.free()
    return candidates[best if best is not None else 0]


def plan_gemm(
    dtype: DType, batch: int, m: int, n: int, k: int, a: MatLayout, b: MatLayout, c: MatLayout, *,
    alpha: float = 1.0, beta: float = 0.0, bias: bool = False, relu: bool = False, allow_tf32: bool,
    workspace_limit: int = 32 << 20, tuned: dict | None = None, tune: bool = False, alignment: int = 256,
) -> GemmPlan:  # fmt: skip
    """Plan ``D[b] = relu?(alpha * A[b] @ B[b] + beta * C[b] + bias[n]?)`` in row-major terms.

    Layouts are in elements; D has C's layout (the bias is one value per column of D, in D's type).
    ``tuned`` (a ``to_dict()``) reloads a chosen algorithm without heuristics; ``tune`` times cuBLASLt's
    candidates and keeps the fastest. ``alignment`` is the least byte alignment of every pointer ``run``
    will get. Raises Unsupported for what cuBLASLt cannot take (the caller makes a contiguous copy or
    uses a kernel), BlasError when a call fails, libs.LibraryUnavailable when cuBLASLt is missing.
    """
    if min(batch, m, n, k) < 1:
        raise Unsupported(f"cuBLASLt GEMM: empty problem batch={batch} m={m} n={n} k={k}")
    plan = GemmPlan(dtype, batch, m, n, k, (a, b, c), alpha, beta, bias, relu, allow_tf32, alignment)
    plan.handle = handle()
    if tuned and plan.restore(tuned, workspace_limit):
        return plan
    if restore_pick(plan, "gemm", workspace_limit, tune):
        return plan  # the same GEMM was planned before (another layer, another program)
    if not tune and warm_algos.same_layer(plan, lambda raw: plan.take(raw, workspace_limit)) is not None:
        keep_pick(plan, "gemm", workspace_limit, tune)  # the same layer at another M: no heuristic query
        return plan
    found = plan.heuristics(workspace_limit)
    if not found:
        raise Unsupported(f"cuBLASLt has no algorithm for {plan.describe()}")
    if tune:
        plan.choose(fastest_candidate(plan, found) if len(found) > 1 else found[0])
    else:  # a quick pick: an algorithm this process has run, where one serves (warm_algos.py)
        raws = [bytes(r.algo) for r in found]
        warm = warm_algos.pick(plan, raws, lambda raw: plan.take(raw, workspace_limit))
        if warm in raws:
            plan.choose(found[raws.index(warm)])
        elif warm is None:
            plan.choose(found[0])  # else pick() took a warm algorithm of the family (plan.take)
    keep_pick(plan, "gemm", workspace_limit, tune)
    return plan


__all__ = ["fastest_candidate", "plan_gemm"]

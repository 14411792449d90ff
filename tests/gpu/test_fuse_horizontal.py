"""fuse_horizontal_dots: products of one activation with several weights become one product with the
concatenated weights (and biases), sliced apart; the module before/after on the ref interpreter, what
stays unfused, the lowered GEMM count, BERT's layers, and the numbers on a GPU."""

from __future__ import annotations

import collections

import numpy as np
import pytest

from migraphx_ep.ir.evaluate import run_module
from migraphx_ep.ir.module import Module
from migraphx_ep.ir.program import Program
from migraphx_ep.passes import DEAD_CODE_ELIMINATION, run_passes
from migraphx_ep.targets.gpu.decompose import gpu_pipeline
from migraphx_ep.targets.gpu.fuse.horizontal import FUSE_HORIZONTAL_DOTS
from migraphx_ep.targets.gpu.lowering import lower
from passes.passcheck import Build

from .gpucheck import Tol, assert_matches

WIDTHS = (8, 12, 4)  # Q, K, V of different widths (a grouped-query attention's K/V are narrower)


def projections(widths=WIDTHS, bias=(True, True, True), dtype=np.float32, batch=(2, 3)) -> Module:
    """x [*batch, 16] times W_i [16, n_i] (+ b_i), each broadcast over the batch as the parser leaves a
    MatMul of a 3-D activation by a 2-D initializer; every result returned (plus x @ W_0 reversed: x
    as the right operand, never fused)."""
    b = Build()
    rng = np.random.default_rng(1)
    x = b.param("x", [*batch, 16], dtype)
    outs = []
    for n, biased in zip(widths, bias, strict=True):
        w = b("multibroadcast", b.lit(rng.integers(-3, 4, (16, n)), dtype), out_lens=[batch[0], 16, n])
        y = b("dot", x, w)
        if biased:
            row = b.lit(rng.integers(-3, 4, n), dtype)
            y = b("add", y, b("multibroadcast", row, out_lens=list(y.shape.lens)))
        outs.append(y)
    return b.ret(*outs)


def names(m: Module) -> collections.Counter:
    return collections.Counter(i.name for i in m.instructions)


def integer_feeds(m: Module) -> dict[str, np.ndarray]:
    """Small integers: every sum exact, so the wider product gives the same bits as the narrow ones."""
    rng = np.random.default_rng(0)
    return {n: rng.integers(-4, 5, s.lens).astype(s.dtype) for n, s in m.get_parameter_shapes().items()}


def fused(build) -> Module:  # noqa: ANN001
    m = build()
    run_passes(m, [FUSE_HORIZONTAL_DOTS, DEAD_CODE_ELIMINATION])
    return m


def test_three_biased_projections_become_one_product() -> None:
    m = fused(projections)
    assert names(m)["dot"] == 1 and names(m)["slice"] == 3 and names(m)["concat"] == 2
    (dot,) = [i for i in m.instructions if i.name == "dot"]
    assert dot.shape.lens == (2, 3, sum(WIDTHS))
    feeds = integer_feeds(m)
    for got, want in zip(run_module(m, feeds), run_module(projections(), feeds), strict=True):
        assert got.shape == want.shape and np.array_equal(got, want)


def test_what_one_concatenation_cannot_hold_stays_apart() -> None:
    # two biased products fuse; the unbiased one is a group of one (its result is no slice of the sum)
    m = fused(lambda: projections(bias=(True, False, True)))
    assert names(m)["dot"] == 2 and names(m)["slice"] == 2
    one = fused(lambda: projections(widths=(8,), bias=(True,)))
    assert one == projections(widths=(8,), bias=(True,))
    b = Build()  # x on the right of each product: not the shape this fuses
    x = b.param("x", [16, 16])
    ws = [b.lit(np.eye(16), np.float32) for _ in range(2)]
    m2 = b.ret(*(b("dot", w, x) for w in ws))
    run_passes(m2, [FUSE_HORIZONTAL_DOTS, DEAD_CODE_ELIMINATION])
    assert names(m2)["dot"] == 2


def test_the_lowered_program_runs_one_gemm() -> None:
    """After the whole gpu pipeline (the concatenations folded into weights, the bias in the epilogue):
    one library GEMM where there were three, its parts read as views."""
    m = projections(dtype=np.float16)
    run_passes(m, gpu_pipeline())
    steps = [s.label.split()[0] for s in lower(m, True, True).steps]
    assert steps.count("gemm") == 1 and "concat" not in names(m), steps
    assert not [s for s in steps if s not in ("gemm", "copy")], steps


@pytest.mark.gpu
def test_numbers_on_the_gpu(gpu) -> None:  # noqa: ANN001
    tols = {np.float16: Tol(2e-3, 2e-3, scaled=True), np.float32: Tol(1e-5, 1e-5, scaled=True)}
    for dtype, tol in tols.items():
        prog = Program()
        prog.modules["main"] = projections(dtype=dtype, batch=(4, 33))
        prog.compile(gpu)
        rng = np.random.default_rng(2)
        feeds = {"x": rng.standard_normal((4, 33, 16)).astype(dtype)}
        want = run_module(projections(dtype=dtype, batch=(4, 33)), feeds)
        for got, exp in zip(prog.run_numpy(feeds), want, strict=True):
            assert_matches(got, exp, tol, str(dtype))

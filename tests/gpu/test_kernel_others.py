"""Kernels carry the variants the same op takes at other size classes (``KernelSpec.others``), compiled
beside them so a later shape compiles nothing: here, for reductions, the schedule family (a global
average pool's sizes cross from the wide schedule to the split one as images shrink). No GPU needed."""

from __future__ import annotations

import pytest

from migraphx_ep.ir.dtypes import DType
from migraphx_ep.ir.operation import make_op
from migraphx_ep.ir.shape import Shape
from migraphx_ep.targets.gpu.kernels import pooling_kernel, reduce_kernel
from migraphx_ep.targets.gpu.kernels.spec import canonical

F = DType.float_type


def _nhwc(c: int, h: int, w: int, n: int = 1) -> Shape:
    return Shape(F, (n, c, h, w), (h * w * c, 1, w * c, c))


def _sources(spec) -> set[str]:
    return {canonical(spec).source} | {o.source for o in (spec.others() if spec.others else [])}


@pytest.mark.parametrize("first", [(29, 23), (120, 80), (2, 3)])
def test_a_global_pool_of_any_image_size_was_compiled_with_the_first(first):
    # NHWC global average pool over h*w: 6 (thread), 120 (split), 667 (wide 256), 9600 (wide 1024).
    out = Shape(F, (1, 24, 1, 1), (24, 1, 24, 24))

    def pool(h: int, w: int):
        op = make_op("pooling", mode="average", lengths=(h, w))
        return pooling_kernel("k_pool", op, _nhwc(24, h, w), out)

    seen = _sources(pool(*first))
    got = {canonical(pool(h, w)).source for h, w in [(2, 3), (15, 8), (29, 23), (120, 80)]}
    assert len(got) == 4 and got <= seen


def test_row_reductions_carry_their_threads_per_row():
    # Rows of the reduced (fastest) axis: 32 threads a row, or the block for long rows of few outputs.
    def mean(rows: int, n: int):
        x = Shape(F, (rows, n))
        return reduce_kernel("k_mean", make_op("reduce_mean", axes=(1,)), x, Shape(F, (rows, 1)))

    seen = _sources(mean(64, 300))
    got = {canonical(mean(rows, n)).source for rows, n in [(64, 300), (8, 10000), (64, 9)]}
    assert len(got) == 3 and got <= seen


def test_a_reduction_at_batch_n_carries_its_batch_1_family():
    # ResNet's global pool over 7 x 7 at batch 55 (the thread schedule: 112640 outputs) and at batch 1
    # (2048 outputs, split; the batch dim drops out of the index math): compiled with the first.
    def pool(n: int, h: int, w: int):
        op = make_op("pooling", mode="average", lengths=(h, w))
        out = Shape(F, (n, 2048, 1, 1), (2048, 1, 2048, 2048))
        return pooling_kernel("k_pool", op, _nhwc(2048, h, w, n), out)

    seen = _sources(pool(55, 7, 7))
    got = {canonical(pool(n, h, w)).source for n, h, w in [(55, 7, 7), (1, 7, 7), (1, 30, 30), (40, 2, 2)]}
    assert len(got) >= 3 and got <= seen

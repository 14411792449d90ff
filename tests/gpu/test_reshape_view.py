"""A reshape of a strided buffer is a view where numpy's no-copy rule allows (``views.reshape_strides``):
GPT-2's head split of each Q/K/V slice of its fused QKV projection then costs no copy kernel."""

from __future__ import annotations

import numpy as np
import pytest

from migraphx_ep.ir.evaluate import run_module
from migraphx_ep.targets.gpu.lowering import lower
from migraphx_ep.targets.gpu.simulate import run_steps
from migraphx_ep.targets.gpu.steps import KernelStep
from migraphx_ep.targets.gpu.views import reshape_strides
from passes.passcheck import Build


def _case(rng: np.random.Generator) -> tuple[np.ndarray, tuple[int, ...]]:
    """A sliced, maybe transposed view of an array and a shape with its element count."""
    lens = [int(n) for n in rng.integers(1, 5, rng.integers(1, 5))]
    a = np.arange(np.prod([2 * n for n in lens])).reshape([2 * n for n in lens])
    v = a[tuple(slice(0, 2 * n, 2) if rng.random() < 0.5 else slice(0, n) for n in lens)]
    if rng.random() < 0.5:
        v = v.transpose(rng.permutation(v.ndim))
    new, left = [], v.size
    while left > 1 and len(new) < 4:
        d = int(rng.choice([d for d in range(2, left + 1) if left % d == 0]))
        new.append(d)
        left //= d
    if left > 1:
        new.append(left)
    if rng.random() < 0.3:
        new.insert(int(rng.integers(0, len(new) + 1)), 1)
    return v, tuple(new) or (1,)


def test_reshape_strides_is_numpys_no_copy_rule() -> None:
    rng = np.random.default_rng(3)
    views = 0
    for _ in range(2000):
        v, new = _case(rng)
        es = tuple(s // v.itemsize for s in v.strides)
        got = reshape_strides(v.shape, es, new)
        w = v.view()
        try:
            w.shape = new  # numpy's own no-copy reshape, or AttributeError
            want = tuple(s // v.itemsize for s in w.strides)
        except AttributeError:
            want = None
        assert (got is None) == (want is None), (v.shape, es, new)
        if got is not None:
            views += 1
            seen = np.lib.stride_tricks.as_strided(v, new, tuple(s * v.itemsize for s in got))
            np.testing.assert_array_equal(seen, v.reshape(new))
    assert 300 < views < 1900  # both outcomes were exercised


@pytest.mark.parametrize("split", [True, False], ids=["head_split", "merge_across_transpose"])
def test_lowering_views_a_strided_reshape_and_copies_otherwise(split: bool) -> None:
    b = Build()
    qkv = b.param("qkv", [6, 24])
    q = b("slice", b("neg", qkv), axes=[1], starts=[8], ends=[16])  # [6, 8], row stride 24
    if split:
        y = b("transpose", b("reshape", q, dims=[6, 2, 4]), permutation=[1, 0, 2])
    else:  # [6, 8] -> transpose [8, 6] -> reshape [48]: a real copy
        y = b("reshape", b("transpose", q, permutation=[1, 0]), dims=[48])
    b.ret(b("relu", y))
    low = lower(b.m, use_blas=True, use_dnn=True)
    labels = [s.label for s in low.steps if isinstance(s, KernelStep)]
    assert any(lab.startswith("copy") for lab in labels) is not split
    x = np.random.default_rng(0).standard_normal((6, 24)).astype(np.float32)
    np.testing.assert_array_equal(run_steps(low, {"qkv": x})[0], run_module(b.m, {"qkv": x})[0])

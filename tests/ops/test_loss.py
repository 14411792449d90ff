"""NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss vs ORT CPU and numpy."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from migraphx_ep.frontend import ParseError
from migraphx_ep.ir.shape import Shape
from migraphx_ep.ops.loss import NllLoss
from opcheck import check_node, make_model, run_ours

RNG = np.random.default_rng(7)
N, C, D1, D2 = 3, 5, 2, 4


def targets(dims, dtype=np.int64, ignore: int | None = None) -> np.ndarray:
    t = RNG.integers(0, C, size=dims).astype(dtype)
    if ignore is not None:
        t.flat[::3] = ignore  # some entries ignored, not all
    return t


CASES = [
    # (name, x dims, attrs, with weight, ignore_index)
    ("nc_mean", (N, C), {}, False, None),
    ("nc_none_w", (N, C), dict(reduction="none"), True, None),
    ("ncd_sum", (N, C, D1), dict(reduction="sum"), False, None),
    ("ncdd_mean_w", (N, C, D1, D2), {}, True, None),
    ("ncd_mean_ii", (N, C, D1), dict(ignore_index=2), False, 2),
    ("ncdd_mean_w_ii", (N, C, D1, D2), dict(ignore_index=1), True, 1),
    ("ncd_none_neg_ii", (N, C, D1), dict(reduction="none", ignore_index=-1), False, -1),
    ("nc_sum_w_neg_ii", (N, C), dict(reduction="sum", ignore_index=-3), True, -3),
    ("ncd_mean_w_high_ii", (N, C, D1), dict(ignore_index=10), True, 10),
]


@pytest.mark.parametrize("op", ["NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss"])
@pytest.mark.parametrize("name,dims,attrs,weighted,ii", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_loss_vs_ort(op, name, dims, attrs, weighted, ii, dtype):
    ins = {"x": RNG.standard_normal(dims).astype(dtype), "t": targets((dims[0],) + dims[2:], ignore=ii)}
    if weighted:
        ins["w"] = RNG.random(C).astype(dtype) + 0.1
    outs = ["loss", "log_prob"] if op == "SoftmaxCrossEntropyLoss" else ["loss"]
    tol = 2e-3 if dtype == np.float16 else 1e-5
    check_node(helper.make_node(op, list(ins), outs, **attrs), ins, opset=13, rtol=tol, atol=tol)


def test_int32_target_vs_ort():
    ins = {"x": RNG.standard_normal((N, C, D1)).astype(np.float32), "t": targets((N, D1), np.int32)}
    node = helper.make_node("SoftmaxCrossEntropyLoss", list(ins), ["loss"], reduction="sum")
    check_node(node, ins, opset=13)


def test_nll_vs_numpy():
    x = RNG.standard_normal((N, C, D1)).astype(np.float32)
    t = targets((N, D1), ignore=0)
    w = RNG.random(C).astype(np.float32)
    op = NllLoss(reduction="mean", ignore_index=0, has_ignore=True)
    got = op.compute(op.compute_shape([Shape.of(x), Shape.of(t), Shape.of(w)]), [x, t, w])
    keep = t != 0
    picked = np.take_along_axis(x, t[:, None], axis=1)[:, 0]
    want = -(picked * w[t] * keep).sum() / (w[t] * keep).sum()
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_bad_reduction_refused():
    ins = {"x": RNG.standard_normal((N, C)).astype(np.float32), "t": targets((N,))}
    m = make_model(
        helper.make_node("NegativeLogLikelihoodLoss", ["x", "t"], ["y"], reduction="max"), ins, opset=13
    )
    with pytest.raises(ParseError, match="reduction"):
        run_ours(m, ins)

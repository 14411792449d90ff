"""Reductions, arg-reductions and cumulative sums: numpy meaning and one-node models vs ORT's CPU EP."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from onnx import helper
from test_pointwise import refuses, run_op

from opcheck import check_node

RNG = np.random.default_rng(11)
X = RNG.standard_normal((2, 3, 4)).astype(np.float32)
XI = RNG.integers(-20, 20, (2, 3, 4)).astype(np.int32)

SIMPLE = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd"]
COMPOSITE = ["ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"]


def test_reduce_ops_keep_axes_and_identities():
    assert run_op("reduce_sum", X, axes=[0, 2]).shape == (1, 3, 1)
    np.testing.assert_allclose(run_op("reduce_sum", X, axes=[-1]), X.sum(-1, keepdims=True), rtol=1e-6)
    big = np.full(4, 2**30, np.int32)
    assert run_op("reduce_sum", big, axes=[0]).dtype == np.int32  # wraps in its own type, like ORT
    neg = np.array([-7, 0], np.int32)
    np.testing.assert_array_equal(run_op("reduce_mean", neg, axes=[0]), [-3])  # truncates toward zero
    empty = np.zeros((2, 0), np.float32)
    np.testing.assert_array_equal(run_op("reduce_max", empty, axes=[1]), [[-np.inf], [-np.inf]])
    np.testing.assert_array_equal(run_op("reduce_prod", empty, axes=[1]), [[1], [1]])
    h = (X * 30).astype(np.float16)
    np.testing.assert_array_equal(
        run_op("reduce_sum", h, axes=[2]), h.astype(np.float32).sum(2, keepdims=True).astype(np.float16)
    )


def test_arg_and_scan_ops():
    x = np.array([[1, 3, 3, 0], [2, 2, 1, 2]], np.float32)
    np.testing.assert_array_equal(run_op("argmax", x, axis=1), [[1], [0]])
    np.testing.assert_array_equal(run_op("argmax", x, axis=1, select_last_index=True), [[2], [3]])
    np.testing.assert_array_equal(run_op("argmin", x, axis=1, select_last_index=True), [[3], [2]])
    v = np.array([1, 2, 3, 4], np.int64)
    np.testing.assert_array_equal(run_op("prefix_scan_sum", v, axis=0), [1, 3, 6, 10])
    np.testing.assert_array_equal(run_op("prefix_scan_sum", v, axis=0, exclusive=True), [0, 1, 3, 6])
    np.testing.assert_array_equal(run_op("prefix_scan_sum", v, axis=0, reverse=True), [10, 9, 7, 4])
    both = run_op("prefix_scan_sum", v, axis=0, exclusive=True, reverse=True)
    np.testing.assert_array_equal(both, [9, 7, 4, 0])


@pytest.mark.parametrize("op", SIMPLE + COMPOSITE)
@pytest.mark.parametrize("keepdims", [0, 1])
def test_reduce_axes_input_vs_ort(op, keepdims):
    x = np.abs(X) + 0.5 if op == "ReduceLogSum" else X
    node = helper.make_node(op, ["x", "axes"], ["y"], keepdims=keepdims)
    check_node(node, {"x": x}, opset=18, initializers={"axes": np.array([0, -1], np.int64)})


@pytest.mark.parametrize("op", SIMPLE + COMPOSITE)
def test_reduce_axes_attribute_and_defaults_vs_ort(op):
    x = np.abs(X) + 0.5 if op == "ReduceLogSum" else X
    check_node(
        helper.make_node(op, ["x"], ["y"], axes=[1], keepdims=0),
        {"x": x},
        opset=11 if op == "ReduceSum" else 13,
    )
    check_node(helper.make_node(op, ["x"], ["y"]), {"x": x}, opset=18)  # all axes
    check_node(helper.make_node(op, ["x"], ["y"], noop_with_empty_axes=1), {"x": x}, opset=18)


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceMean"])
@pytest.mark.parametrize("dt", [np.int32, np.int64])
def test_reduce_integers_vs_ort(op, dt):
    x = (XI % 4 + 1).astype(dt) if op == "ReduceProd" else XI.astype(dt)
    check_node(
        helper.make_node(op, ["x", "axes"], ["y"], keepdims=0),
        {"x": x},
        opset=18,
        initializers={"axes": np.array([1], np.int64)},
    )


def test_reduce_sum_float16_vs_ort():
    h = X.astype(np.float16)
    check_node(
        helper.make_node("ReduceSum", ["x", "axes"], ["y"]),
        {"x": h},
        rtol=1e-3,
        atol=1e-3,
        initializers={"axes": np.array([2], np.int64)},
    )


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("last", [0, 1])
def test_arg_vs_ort(op, last):
    ties = np.round(X * 2).astype(np.float32)  # plenty of ties
    for keepdims in (0, 1):
        node = helper.make_node(op, ["x"], ["y"], axis=-1, keepdims=keepdims, select_last_index=last)
        check_node(node, {"x": ties})
    check_node(helper.make_node(op, ["x"], ["y"], axis=1, select_last_index=last), {"x": XI})


@pytest.mark.parametrize(("exclusive", "reverse"), [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_cumsum_vs_ort(exclusive, reverse):
    for x in (X, XI, XI.astype(np.int64)):
        node = helper.make_node("CumSum", ["x", "axis"], ["y"], exclusive=exclusive, reverse=reverse)
        check_node(node, {"x": x}, initializers={"axis": np.array(-2, np.int32)})


def test_reduce_refusals():
    node = helper.make_node("ReduceSum", ["x", "axes"], ["y"])
    assert "compile-time constant" in refuses(node, {"x": X, "axes": np.array([1], np.int64)})
    node = helper.make_node("CumSum", ["x", "axis"], ["y"])
    assert "compile-time constant" in refuses(node, {"x": X, "axis": np.array(0, np.int64)})
    node = helper.make_node("ReduceMax", ["x"], ["y"], axes=[1], bogus=3)
    assert "bogus" in refuses(node, {"x": X}, opset=13)


# -- NaN: reduce_max/min and argmax/argmin skip it --------------------------------------------------------
XN = X.copy()
XN[1, 1, 2] = XN[1, 2, 3] = XN[1, 2, 1] = np.nan  # never first along an axis: ORT's CPU EP skips these


@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin"])
@pytest.mark.parametrize("axes", [[0], [1], [2], [0, 2], [0, 1, 2]])
def test_reduce_max_min_skip_nan_vs_ort(op, axes):
    node = helper.make_node(op, ["x", "axes"], ["y"], keepdims=1)
    check_node(node, {"x": XN}, opset=18, initializers={"axes": np.array(axes, np.int64)})


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("axis", [0, 1, 2])
@pytest.mark.parametrize("last", [0, 1])
def test_arg_skips_nan_vs_ort(op, axis, last):
    check_node(helper.make_node(op, ["x"], ["y"], axis=axis, select_last_index=last), {"x": XN})


@pytest.mark.parametrize("dt", [np.float32, np.float16, ml_dtypes.bfloat16, np.float64])
def test_nan_first_or_everywhere(dt):
    # One rule wherever the NaN sits (ORT's CPU EP lets a NaN in the first position win: [nan, 3, nan]);
    # only NaN gives NaN, and index 0 for arg*, whichever index rule is asked for.
    nan = np.nan
    x = np.array([[nan, 1, 3, 3, 2], [nan] * 5, [nan, -np.inf, nan, nan, nan]], np.float32).astype(dt)
    got = run_op("reduce_max", x, axes=[1]).astype(np.float32).ravel()
    np.testing.assert_array_equal(got, [3, nan, -np.inf])
    np.testing.assert_array_equal(
        run_op("reduce_min", x, axes=[1]).astype(np.float32).ravel(), [1, nan, -np.inf]
    )
    np.testing.assert_array_equal(run_op("argmax", x, axis=1).ravel(), [2, 0, 1])
    np.testing.assert_array_equal(run_op("argmax", x, axis=1, select_last_index=True).ravel(), [3, 0, 1])
    np.testing.assert_array_equal(run_op("argmin", x, axis=1, select_last_index=True).ravel(), [1, 0, 1])

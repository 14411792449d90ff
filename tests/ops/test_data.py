"""Data movement ops (numpy semantics) and their ONNX parsers vs ORT's CPU EP."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from migraphx_ep.frontend import ParseError, model_to_dict, parse_graph
from migraphx_ep.ir import Shape, make_op
from migraphx_ep.ir.dtypes import from_numpy
from opcheck import check_node, make_model, run_ours

RNG = np.random.default_rng(5)
X = RNG.standard_normal((3, 4, 5)).astype(np.float32)
XI = RNG.integers(-100, 100, (3, 4, 5)).astype(np.int64)
XB = RNG.integers(0, 2, (3, 4, 5)).astype(bool)
TYPES = [X, X.astype(np.float16), XI, XI.astype(np.int32), XB]
I64 = np.int64


def run_op(name: str, *args: np.ndarray, **attrs):
    op = make_op(name, **attrs)
    out = op.compute_shape([Shape(from_numpy(a.dtype), a.shape) for a in args])
    return op.compute(out, list(args))


def refuses(node, inputs: dict, **kw) -> str:
    d = model_to_dict(make_model(node, inputs, **kw))
    with pytest.raises(ParseError) as e:
        parse_graph(d, {k: Shape(from_numpy(v.dtype), v.shape) for k, v in inputs.items()})
    return str(e.value)


def consts(**kw) -> dict:
    return {k: np.asarray(v, I64) for k, v in kw.items()}


# -- op level -------------------------------------------------------------------------------------------
def test_gather_negative_and_out_of_range_indices():
    idx = np.array([[-1, 0], [2, -3]], I64)
    np.testing.assert_array_equal(run_op("gather", X, idx, axis=1), np.take(X, idx % 4, axis=1))
    with pytest.raises(IndexError, match="out of range"):
        run_op("gather", X, np.array([4], I64), axis=1)
    with pytest.raises(IndexError):
        run_op("gather_elements", X, np.full((3, 4, 5), -6, I64), axis=2)


def test_scatter_reductions_accumulate_duplicates():
    data = np.ones((2, 3), np.float32)
    idx = np.array([[0, 0, 2]], I64)
    upd = np.array([[2.0, 3.0, 4.0]], np.float32)
    np.testing.assert_array_equal(run_op("scatter_add", data, idx, upd, axis=1), [[6, 1, 5], [1, 1, 1]])
    np.testing.assert_array_equal(run_op("scatter_mul", data, idx, upd, axis=1), [[6, 1, 4], [1, 1, 1]])
    nd = run_op("scatternd_max", data, np.array([[0, 1], [0, 1]], I64), np.array([5.0, 7.0], np.float32))
    np.testing.assert_array_equal(nd, [[1, 7, 1], [1, 1, 1]])


def test_topk_ties_keep_lower_index():
    x = np.array([[3, 1, 3, 2, 1]], np.int32)
    v, i = run_op("topk", x, k=3, axis=1, largest=True)
    np.testing.assert_array_equal(i, [[0, 2, 3]])
    v, i = run_op("topk", x, k=2, axis=1, largest=False)
    np.testing.assert_array_equal(i, [[1, 4]])
    np.testing.assert_array_equal(v, [[1, 1]])


def test_pad_modes_and_crop():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(
        run_op("pad", x, pads=[0, -1, 1, 2], mode="constant", value=9.0),
        np.pad(x[:, 1:], [(0, 1), (0, 2)], constant_values=9),
    )
    for mode in ("reflect", "edge", "wrap"):
        np.testing.assert_array_equal(
            run_op("pad", x, pads=[1, 2, 1, 2], mode=mode), np.pad(x, [(1, 1), (2, 2)], mode=mode)
        )
    with pytest.raises(ValueError):
        make_op("pad", pads=[0, 3, 0, 0], mode="reflect").compute_shape([Shape.of(x)])


# -- parsers vs ORT ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("x", TYPES, ids=lambda a: str(a.dtype))
def test_slice_all_step_kinds(x):
    for starts, ends, axes, steps in (
        ([1, -1], [3, -6], [1, 2], [1, -2]),
        ([-1], [-100], [0], [-1]),
        ([0, 4], [5, 0], [2, 1], [2, -3]),
        ([9], [99], [1], [1]),
    ):
        check_node(
            helper.make_node("Slice", ["x", "s", "e", "a", "t"], ["y"]),
            {"x": x},
            initializers=consts(s=starts, e=ends, a=axes, t=steps),
        )
    check_node(helper.make_node("Slice", ["x"], ["y"], starts=[1], ends=[-1], axes=[2]), {"x": x}, opset=9)


def test_split_forms():
    check_node(helper.make_node("Split", ["x"], ["a", "b"], axis=1), {"x": X}, opset=13)
    assert "num_outputs" in refuses(helper.make_node("Split", ["x"], ["a", "b"], axis=1), {"x": X}, opset=18)
    check_node(
        helper.make_node("Split", ["x", "s"], ["a", "b", "c"], axis=-1),
        {"x": XI},
        initializers=consts(s=[1, 0, 4]),
    )
    check_node(helper.make_node("Split", ["x"], ["a", "b"], axis=2, split=[3, 2]), {"x": X}, opset=11)
    check_node(helper.make_node("Split", ["x"], ["a", "b", "c"], axis=2, num_outputs=3), {"x": X}, opset=18)


@pytest.mark.parametrize("x", TYPES, ids=lambda a: str(a.dtype))
def test_concat_gathers(x):
    check_node(helper.make_node("Concat", ["x", "y"], ["z"], axis=-2), {"x": x, "y": x[:, :2]})
    idx = RNG.integers(-4, 4, (2, 3)).astype(I64)
    check_node(helper.make_node("Gather", ["x", "i"], ["y"], axis=1), {"x": x, "i": idx})
    check_node(
        helper.make_node("Gather", ["x", "i"], ["y"], axis=0),
        {"x": x, "i": (idx[0, :2] % 3).astype(np.int32)},
    )
    ge = RNG.integers(-5, 5, (3, 4, 2)).astype(I64)
    check_node(helper.make_node("GatherElements", ["x", "i"], ["y"], axis=2), {"x": x, "i": ge})
    nd = RNG.integers(-3, 3, (4, 2, 2)).astype(I64)
    check_node(helper.make_node("GatherND", ["x", "i"], ["y"]), {"x": x, "i": nd})
    bnd = RNG.integers(0, 4, (3, 2, 1)).astype(I64)
    check_node(helper.make_node("GatherND", ["x", "i"], ["y"], batch_dims=1), {"x": x, "i": bnd})


@pytest.mark.parametrize("red", ["none", "add", "mul", "max", "min"])
def test_scatters(red):
    data = RNG.standard_normal((4, 5)).astype(np.float32)
    idx = np.array([[1, -1, 3], [0, 2, 2]], I64) if red != "none" else np.array([[1, -1, 3], [0, 2, 4]], I64)
    upd = RNG.standard_normal((2, 3)).astype(np.float32)
    check_node(
        helper.make_node("ScatterElements", ["d", "i", "u"], ["y"], axis=1, reduction=red),
        {"d": data, "i": idx, "u": upd},
        opset=18,
    )
    nd_idx = np.array([[1], [3], [-4]], I64) if red != "none" else np.array([[1], [3], [-2]], I64)
    nd_upd = RNG.standard_normal((3, 5)).astype(np.float32)
    check_node(
        helper.make_node("ScatterND", ["d", "i", "u"], ["y"], reduction=red),
        {"d": data, "i": nd_idx, "u": nd_upd},
        opset=18,
    )
    di = RNG.integers(-9, 9, (4, 5)).astype(I64)
    check_node(
        helper.make_node("ScatterElements", ["d", "i", "u"], ["y"], axis=0, reduction=red),
        {"d": di, "i": idx[:, :2] % 4, "u": di[:2, :2] + 1},
        opset=18,
    )


def test_pad_all_opsets_and_modes():
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    for mode in ("constant", "reflect", "edge", "wrap"):
        check_node(
            helper.make_node("Pad", ["x", "p"], ["y"], mode=mode),
            {"x": x},
            opset=19,
            initializers=consts(p=[1, 2, 2, 3]),
        )
    check_node(
        helper.make_node("Pad", ["x", "p", "v"], ["y"]),
        {"x": x},
        initializers={"p": np.array([0, -1, 2, 1], I64), "v": np.array(4.5, np.float32)},
    )
    check_node(
        helper.make_node("Pad", ["x", "p", "v", "a"], ["y"]),
        {"x": XI},
        opset=18,
        initializers={"p": np.array([1, 2], I64), "v": np.array(-7, I64), "a": np.array([-1], I64)},
    )
    check_node(helper.make_node("Pad", ["x"], ["y"], pads=[1, 0, 0, 2], value=1.5), {"x": x}, opset=10)


def test_pad_refusals():
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    why = refuses(
        helper.make_node("Pad", ["x", "p"], ["y"], mode="reflect"),
        {"x": x},
        initializers=consts(p=[0, -1, 0, 0]),
    )
    assert "negative pads" in why
    assert "compile-time constant" in refuses(
        helper.make_node("Pad", ["x", "p"], ["y"]), {"x": x, "p": np.array([0, 1, 0, 0], I64)}
    )


@pytest.mark.parametrize("x", TYPES, ids=lambda a: str(a.dtype))
def test_tile_trilu_depth_space(x):
    check_node(helper.make_node("Tile", ["x", "r"], ["y"]), {"x": x}, initializers=consts(r=[2, 1, 3]))
    for upper, k in ((1, 0), (0, -1), (1, 2)):
        check_node(
            helper.make_node("Trilu", ["x", "k"], ["y"], upper=upper), {"x": x}, initializers=consts(k=k)
        )
    if x.dtype.kind != "f":
        return  # ORT's CPU EP implements DepthToSpace/SpaceToDepth for floats only
    x4 = x.reshape(1, 12, 5, 1)[:, :, :4]
    y4 = np.concatenate([x4, x4], axis=3)
    check_node(helper.make_node("DepthToSpace", ["x"], ["y"], blocksize=2), {"x": x4})
    check_node(helper.make_node("DepthToSpace", ["x"], ["y"], blocksize=2, mode="CRD"), {"x": x4})
    check_node(helper.make_node("SpaceToDepth", ["x"], ["y"], blocksize=2), {"x": y4})


def test_topk_onehot_reverse_sequence():
    x = RNG.integers(0, 4, (3, 6)).astype(np.float32)  # many ties
    for largest in (0, 1):
        check_node(
            helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=-1, largest=largest),
            {"x": x},
            initializers=consts(k=[4]),
        )
    check_node(helper.make_node("TopK", ["x"], ["v", "i"], k=2, axis=0), {"x": X[:, :, 0]}, opset=9)
    why = refuses(
        helper.make_node("TopK", ["x", "k"], ["v", "i"], sorted=0), {"x": x}, initializers=consts(k=[3])
    )
    assert "sorted=0" in why
    idx = np.array([[0, -1, 5], [2, 7, -4]], I64)
    for axis in (-1, 0, 1):
        check_node(
            helper.make_node("OneHot", ["i", "d", "v"], ["y"], axis=axis),
            {"i": idx},
            initializers={"d": np.array(5, I64), "v": np.array([-1.0, 3.0], np.float32)},
        )
    xs = RNG.standard_normal((4, 3, 2)).astype(np.float32)
    check_node(
        helper.make_node("ReverseSequence", ["x", "l"], ["y"], batch_axis=1, time_axis=0),
        {"x": xs},
        initializers=consts(l=[4, 1, 2]),
    )
    check_node(
        helper.make_node("ReverseSequence", ["x", "l"], ["y"], batch_axis=0, time_axis=1),
        {"x": xs},
        initializers=consts(l=[3, 0, 2, 1]),
    )


def test_center_crop_pad():
    x = RNG.standard_normal((5, 4, 3)).astype(np.float32)
    node = helper.make_node("CenterCropPad", ["x", "s"], ["y"], axes=[0, -1])
    m = make_model(node, {"x": x}, opset=18, initializers=consts(s=[2, 6]))
    np.testing.assert_array_equal(run_ours(m, {"x": x})[0], np.pad(x[1:3], [(0, 0), (0, 0), (1, 2)]))


def test_out_of_range_index_is_a_run_time_error():
    m = make_model(helper.make_node("Gather", ["x", "i"], ["y"]), {"x": X, "i": np.array([0], I64)})
    with pytest.raises(IndexError):
        run_ours(m, {"x": X, "i": np.array([3], I64)})

"""View ops (numpy semantics, strides, aliasing) and the shape/constant ONNX parsers vs ORT's CPU EP."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from migraphx_ep.frontend import ParseError, model_to_dict, parse_graph
from migraphx_ep.ir import DType, Shape, make_op
from migraphx_ep.ir.dtypes import from_numpy
from opcheck import check_node, make_model, run_ours

RNG = np.random.default_rng(11)
X = RNG.standard_normal((2, 3, 4)).astype(np.float32)
XI = RNG.integers(-50, 50, (2, 3, 4)).astype(np.int64)
XB = RNG.integers(0, 2, (2, 3, 4)).astype(bool)
XH = X.astype(np.float16)
XI32 = XI.astype(np.int32)
ALL = [X, XH, XI, XI32, XB]


def run_op(name: str, *args: np.ndarray, **attrs) -> tuple[Shape, np.ndarray]:
    op = make_op(name, **attrs)
    out = op.compute_shape([Shape(from_numpy(a.dtype), a.shape) for a in args])
    return out, op.compute(out, list(args))


def refuses(node, inputs: dict, **kw) -> str:
    d = model_to_dict(make_model(node, inputs, **kw))
    with pytest.raises(ParseError) as e:
        parse_graph(d, {k: Shape(from_numpy(v.dtype), v.shape) for k, v in inputs.items()})
    return str(e.value)


# -- op level -----------------------------------------------------------------------------------------
def test_transpose_is_a_strided_view():
    s, y = run_op("transpose", X, permutation=[2, 0, 1])
    assert s.lens == (4, 2, 3) and s.strides == (1, 12, 4) and not s.standard()
    np.testing.assert_array_equal(y, X.transpose(2, 0, 1))
    assert make_op("transpose", permutation=[2, 0, 1]).output_alias([Shape.of(X)]) == 0


def test_reshape_infers_and_aliases_only_standard_inputs():
    s, y = run_op("reshape", X, dims=[4, -1])
    assert s.lens == (4, 6)
    np.testing.assert_array_equal(y, X.reshape(4, 6))
    op = make_op("reshape", dims=[24])
    assert op.output_alias([Shape.of(X)]) == 0
    assert op.output_alias([Shape(DType.float_type, (4, 2, 3), (1, 12, 4))]) == -1
    with pytest.raises(ValueError):
        run_op("reshape", X, dims=[5, -1])


def test_squeeze_unsqueeze_strides():
    s, y = run_op("unsqueeze", X, axes=[0, 4])
    assert s.lens == (1, 2, 3, 4, 1) and s.standard()
    s2, y2 = run_op("squeeze", y, axes=[0, 4])
    assert s2.lens == (2, 3, 4)
    np.testing.assert_array_equal(y2, X)
    with pytest.raises(ValueError):
        run_op("squeeze", X, axes=[1])


def test_slice_step_broadcast():
    s, y = run_op("slice", X, axes=[2, 0], starts=[-3, 1], ends=[100, 2])
    assert s.lens == (1, 3, 3) and s.strides == (12, 4, 1)
    np.testing.assert_array_equal(y, X[1:2, :, 1:])
    s, y = run_op("step", X, axes=[2], steps=[3])
    assert s.lens == (2, 3, 2) and s.strides == (12, 4, 3)
    np.testing.assert_array_equal(y, X[:, :, ::3])
    b = np.arange(3, dtype=np.float32)
    s, y = run_op("broadcast", b, axis=1, out_lens=[2, 3, 4])
    assert s.strides == (0, 1, 0)
    np.testing.assert_array_equal(y, np.broadcast_to(b[None, :, None], (2, 3, 4)))


def test_flatten_op():
    s, y = run_op("flatten", X, axis=2)
    assert s.lens == (6, 4)
    np.testing.assert_array_equal(y, X.reshape(6, 4))


# -- parsers vs ORT ------------------------------------------------------------------------------------
@pytest.mark.parametrize("x", ALL, ids=lambda a: str(a.dtype))
def test_transpose_reshape_flatten(x):
    check_node(helper.make_node("Transpose", ["x"], ["y"], perm=[1, 2, 0]), {"x": x})
    check_node(helper.make_node("Transpose", ["x"], ["y"]), {"x": x})
    check_node(helper.make_node("Flatten", ["x"], ["y"], axis=-1), {"x": x})
    check_node(helper.make_node("Flatten", ["x"], ["y"], axis=0), {"x": x})
    shape = np.array([0, -1, 2], np.int64)  # 0 copies dim 0
    check_node(helper.make_node("Reshape", ["x", "s"], ["y"]), {"x": x}, initializers={"s": shape})


def test_reshape_allowzero_and_opset4_attr():
    x = np.zeros((0, 3), np.float32)
    check_node(
        helper.make_node("Reshape", ["x", "s"], ["y"], allowzero=1),
        {"x": x},
        initializers={"s": np.array([3, 0], np.int64)},
    )
    check_node(helper.make_node("Reshape", ["x"], ["y"], shape=[4, 6]), {"x": X}, opset=4)


@pytest.mark.parametrize("opset", [11, 13])
def test_squeeze_unsqueeze_both_opsets(opset):
    x = RNG.standard_normal((1, 3, 1, 2)).astype(np.float32)
    if opset < 13:
        check_node(helper.make_node("Squeeze", ["x"], ["y"], axes=[-2, 0]), {"x": x}, opset=opset)
        check_node(helper.make_node("Unsqueeze", ["x"], ["y"], axes=[4, 0]), {"x": x}, opset=opset)
    else:
        check_node(
            helper.make_node("Squeeze", ["x", "a"], ["y"]),
            {"x": x},
            opset=opset,
            initializers={"a": np.array([-2, 0], np.int64)},
        )
        check_node(
            helper.make_node("Unsqueeze", ["x", "a"], ["y"]),
            {"x": x},
            opset=opset,
            initializers={"a": np.array([-1, 1], np.int64)},
        )
    check_node(helper.make_node("Squeeze", ["x"], ["y"]), {"x": x}, opset=opset)


def test_shape_size_are_literals():
    for kw in ({}, {"start": 1}, {"end": -1}, {"start": -2, "end": 10}, {"start": 2, "end": 1}):
        check_node(helper.make_node("Shape", ["x"], ["y"], **kw), {"x": X})
    check_node(helper.make_node("Size", ["x"], ["y"]), {"x": XI})
    m = make_model(helper.make_node("Shape", ["x"], ["y"]), {"x": X})
    prog = parse_graph(model_to_dict(m), {"x": Shape.of(X)}).program
    assert prog.get_main_module().outputs()[0].is_literal()


def test_shape_arithmetic_folds_into_reshape():
    """Shape -> Gather -> Concat -> Reshape, as PyTorch exports it: the shape folds at compile time."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "i0"], ["d0"], axis=0),
        helper.make_node("Concat", ["d0", "m1"], ["dims"], axis=0),
        helper.make_node("Reshape", ["x", "dims"], ["y"]),
    ]
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [helper.make_tensor(n, TensorProto.INT64, [1], v) for n, v in (("i0", [0]), ("m1", [-1]))],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    np.testing.assert_array_equal(run_ours(m, {"x": X})[0], X.reshape(2, 12))


def test_constant_attrs():
    for kw in (
        {"value_float": 2.5},
        {"value_floats": [1.0, -2.0]},
        {"value_int": 7},
        {"value_ints": [3, 4]},
        {"value": helper.make_tensor("t", TensorProto.INT32, [2, 2], [1, 2, 3, 4])},
    ):
        check_node(helper.make_node("Constant", [], ["y"], **kw), {})
    assert "element type" in refuses(helper.make_node("Constant", [], ["y"], value_string="a"), {})


def test_constant_of_shape_range_expand_eyelike():
    check_node(
        helper.make_node(
            "ConstantOfShape", ["s"], ["y"], value=helper.make_tensor("v", TensorProto.INT32, [1], [5])
        ),
        {},
        initializers={"s": np.array([2, 3], np.int64)},
    )
    check_node(
        helper.make_node("ConstantOfShape", ["s"], ["y"]), {}, initializers={"s": np.array([4], np.int64)}
    )
    for s, lim, d, t in ((0, 10, 3, np.int64), (10, -3, -4, np.int32), (1.0, 2.0, 0.25, np.float32)):
        check_node(
            helper.make_node("Range", ["a", "b", "c"], ["y"]),
            {},
            initializers={"a": np.array(s, t), "b": np.array(lim, t), "c": np.array(d, t)},
        )
    check_node(
        helper.make_node("Expand", ["x", "s"], ["y"]),
        {"x": XI[:, :1, :]},
        initializers={"s": np.array([3, 1, 1, 1], np.int64)},
    )
    for kw in ({}, {"k": 1}, {"k": -2, "dtype": TensorProto.INT64}):
        check_node(helper.make_node("EyeLike", ["x"], ["y"], **kw), {"x": X[0]})


def test_float_range_accumulates_like_ort():
    # 0.1 + i * 0.07 differs from ORT's (and ONNX's function body's) running sum in float32.
    init = {"a": np.array(0.1, np.float32), "b": np.array(50.3, np.float32), "c": np.array(0.07, np.float32)}
    check_node(helper.make_node("Range", ["a", "b", "c"], ["y"]), {}, initializers=init, rtol=0, atol=0)


def test_non_constant_shape_is_refused():
    node = helper.make_node("Reshape", ["x", "s"], ["y"])
    why = refuses(node, {"x": X, "s": np.array([4, 6], np.int64)})
    assert "compile-time constant" in why
    assert "not all size 1" in refuses(
        helper.make_node("Squeeze", ["x"], ["y"], axes=[1]), {"x": X}, opset=11
    )

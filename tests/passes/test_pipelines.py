"""The ref pipeline end to end: ONNX graphs through the frontend, compiled for ref, bits unchanged."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from passcheck import random_inputs, run_twice, same_bits

from migraphx_ep.frontend import model_to_dict, parse_graph
from migraphx_ep.ir.dtypes import from_numpy
from migraphx_ep.ir.shape import Shape
from migraphx_ep.passes.pipelines import ref_pipeline
from migraphx_ep.targets import get_target


def _model(nodes, inputs, outputs, inits=()):
    g = helper.make_graph(nodes, "g", inputs, outputs, [numpy_helper.from_array(v, k) for k, v in inits])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    m.ir_version = 10
    return m


def _vi(name, dims, t=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, t, dims)


W = np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4)
N = helper.make_node
I32 = TensorProto.INT32
GRAPHS = {
    # x*1 with the constant from an initializer; Identity; transposes that cancel; double negation
    "algebra": (
        _model(
            [
                N("Mul", ["x", "one"], ["a"]),
                N("Identity", ["a"], ["b"]),
                N("Transpose", ["b"], ["c"], perm=[1, 0]),
                N("Transpose", ["c"], ["d"], perm=[1, 0]),
                N("Neg", ["d"], ["e"]),
                N("Neg", ["e"], ["y"]),
            ],
            [_vi("x", [3, 4])],
            [_vi("y", [3, 4])],
            [("one", np.array(1, np.float32))],
        ),
        2,
    ),
    # a constant subgraph folded to one literal, and duplicated work for CSE
    "constants": (
        _model(
            [
                N("Transpose", ["w"], ["wt"], perm=[1, 0]),
                N("Neg", ["wt"], ["nw"]),
                N("Transpose", ["nw"], ["w2"], perm=[1, 0]),
                N("Add", ["x", "w2"], ["s1"]),
                N("Add", ["x", "w2"], ["s2"]),
                N("Mul", ["s1", "s2"], ["y"]),
            ],
            [_vi("x", [3, 4])],
            [_vi("y", [3, 4])],
            [("w", W)],
        ),
        5,
    ),
    # a reshape chain, and an integer x + 0
    "reshapes": (
        _model(
            [
                N("Reshape", ["x", "s1"], ["r1"]),
                N("Reshape", ["r1", "s2"], ["r2"]),
                N("Add", ["r2", "zero"], ["y"]),
            ],
            [_vi("x", [2, 6], I32)],
            [_vi("y", [3, 4], I32)],
            [
                ("s1", np.array([12], np.int64)),
                ("s2", np.array([3, 4], np.int64)),
                ("zero", np.zeros([1], np.int32)),
            ],
        ),
        3,
    ),
}


def _shape(vi) -> Shape:
    t = vi.type.tensor_type
    return Shape(from_numpy(helper.tensor_dtype_to_np_dtype(t.elem_type)), [x.dim_value for x in t.shape.dim])


@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_ref_pipeline_keeps_numbers(name):
    model, length = GRAPHS[name]
    d = model_to_dict(model)
    shapes = {i.name: _shape(i) for i in model.graph.input}
    plain = parse_graph(d, shapes).program
    compiled = parse_graph(d, shapes).program
    compiled.compile(get_target("ref"))
    main = compiled.get_main_module()
    assert len(main) == length, str(main)
    for seed in (0, 1):
        feeds = random_inputs(plain.get_main_module(), seed)
        for got, want in zip(compiled.run_numpy(feeds), plain.run_numpy(feeds), strict=True):
            assert same_bits(got, want)
    run_twice(ref_pipeline(), main)  # the whole pipeline is idempotent too

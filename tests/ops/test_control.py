"""If / Loop / Scan: subgraphs reading outer-scope values, vs ORT's CPU EP."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from migraphx_ep.frontend import ParseError, model_to_dict, parse_graph
from migraphx_ep.ir import Shape
from opcheck import assert_close, run_ort, run_ours

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
RNG = np.random.default_rng(9)
A = RNG.standard_normal((2, 3)).astype(np.float32)
Bv = RNG.standard_normal((2, 3)).astype(np.float32)


def vi(name: str, t: int, shape) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, t, shape)


def model(nodes, inputs, outputs, inits=(), opset: int = 17) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 9
    return onnx.shape_inference.infer_shapes(m)


def compare(m: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    want, got = run_ort(m, feeds), run_ours(m, feeds)
    assert len(want) == len(got)
    for g, w in zip(got, want, strict=True):
        assert_close(g, w)
    return got


def branches() -> tuple[onnx.GraphProto, onnx.GraphProto]:
    # then reads a, b and the outer initializer k; else reads only b: each gets its own parameters.
    then_g = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["t"]), helper.make_node("Mul", ["t", "k"], ["o"])],
        "then",
        [],
        [vi("o", F, [2, 3])],
    )
    else_g = helper.make_graph(
        [helper.make_node("Sub", ["b", "b2"], ["o2"])], "else", [], [vi("o2", F, [2, 3])]
    )
    return then_g, else_g


def test_if_with_run_time_condition_reads_outer_values():
    then_g, else_g = branches()
    nodes = [
        helper.make_node("Mul", ["b", "b"], ["b2"]),
        helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g),
    ]
    m = model(
        nodes,
        [vi("a", F, [2, 3]), vi("b", F, [2, 3]), vi("c", B, [])],
        [vi("y", F, [2, 3])],
        [helper.make_tensor("k", F, [], [3.0])],
    )
    for c in (True, False):
        compare(m, {"a": A, "b": Bv, "c": np.array(c)})
    prog = parse_graph(
        model_to_dict(m), {"a": Shape.of(A), "b": Shape.of(Bv), "c": Shape.of(np.array(True))}
    ).program
    ifs = [i for i in prog.get_main_module() if i.name == "if"]
    assert len(ifs) == 1 and len(prog.modules) == 3
    then_m, else_m = ifs[0].module_args
    assert then_m.get_parameter_names() == ["a", "b"]  # k became a literal inside the branch
    assert else_m.get_parameter_names() == ["b", "b2"]
    assert len(ifs[0].inputs) == 1 + 2 + 2


def test_if_with_constant_condition_is_inlined():
    then_g, else_g = branches()
    nodes = [
        helper.make_node("Mul", ["b", "b"], ["b2"]),
        helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g),
    ]
    m = model(
        nodes,
        [vi("a", F, [2, 3]), vi("b", F, [2, 3])],
        [vi("y", F, [2, 3])],
        [helper.make_tensor("k", F, [], [3.0]), helper.make_tensor("c", B, [], [False])],
    )
    compare(m, {"a": A, "b": Bv})
    prog = parse_graph(model_to_dict(m), {"a": Shape.of(A), "b": Shape.of(Bv)}).program
    assert len(prog.modules) == 1 and not any(i.name == "if" for i in prog.get_main_module())


def loop_body(with_scan: bool, dynamic_cond: bool) -> onnx.GraphProto:
    nodes = [
        helper.make_node("Add", ["v_in", "x"], ["v_out"]),
        helper.make_node("Cast", ["i"], ["fi"], to=F),
        helper.make_node("Mul", ["v_out", "fi"], ["s"]),
    ]
    if dynamic_cond:
        nodes += [
            helper.make_node("ReduceSum", ["v_out"], ["tot"], keepdims=0),
            helper.make_node("Less", ["tot", "limit"], ["c_out"]),
        ]
    else:
        nodes.append(helper.make_node("Identity", ["c_in"], ["c_out"]))
    outs = [vi("c_out", B, []), vi("v_out", F, [2, 3])] + ([vi("s", F, [2, 3])] if with_scan else [])
    return helper.make_graph(
        nodes, "body", [vi("i", I64, []), vi("c_in", B, []), vi("v_in", F, [2, 3])], outs
    )


def test_loop_static_count_with_scan_outputs():
    node = helper.make_node("Loop", ["M", "", "v0"], ["v", "scan"], body=loop_body(True, False))
    m = model(
        [node],
        [vi("v0", F, [2, 3]), vi("x", F, [2, 3])],
        [vi("v", F, [2, 3]), vi("scan", F, [4, 2, 3])],
        [helper.make_tensor("M", I64, [], [4])],
    )
    v, scan = compare(m, {"v0": A, "x": Bv})
    assert scan.shape == (4, 2, 3)
    np.testing.assert_allclose(v, A + 4 * Bv, rtol=1e-5)


@pytest.mark.parametrize("trip", [0, 3, 50])
def test_loop_run_time_count_and_condition(trip):
    node = helper.make_node("Loop", ["M", "c", "v0"], ["v"], body=loop_body(False, True))
    m = model(
        [node],
        [vi("M", I64, []), vi("c", B, []), vi("v0", F, [2, 3]), vi("x", F, [2, 3])],
        [vi("v", F, [2, 3])],
        [helper.make_tensor("limit", F, [], [20.0])],
    )
    x = np.abs(Bv) + 0.5
    compare(m, {"M": np.array(trip, np.int64), "c": np.array(True), "v0": A, "x": x})
    compare(m, {"M": np.array(trip, np.int64), "c": np.array(False), "v0": A, "x": x})


def test_loop_scan_outputs_with_run_time_count_are_refused():
    node = helper.make_node("Loop", ["M", "", "v0"], ["v", "scan"], body=loop_body(True, False))
    m = model(
        [node],
        [vi("M", I64, []), vi("v0", F, [2, 3]), vi("x", F, [2, 3])],
        [vi("v", F, [2, 3]), vi("scan", F, [None, 2, 3])],
    )
    shapes = {"M": Shape.of(np.array(1)), "v0": Shape.of(A), "x": Shape.of(A)}
    with pytest.raises(ParseError, match="run-time trip count"):
        parse_graph(model_to_dict(m), shapes)


def test_nested_subgraph_reads_the_outermost_scope():
    inner_then = helper.make_graph(
        [helper.make_node("Add", ["v_in", "w"], ["r"])], "t", [], [vi("r", F, [2, 3])]
    )
    inner_else = helper.make_graph(
        [helper.make_node("Sub", ["v_in", "w"], ["r2"])], "e", [], [vi("r2", F, [2, 3])]
    )
    body = helper.make_graph(
        [
            helper.make_node("If", ["flag"], ["v_out"], then_branch=inner_then, else_branch=inner_else),
            helper.make_node("Identity", ["c_in"], ["c_out"]),
        ],
        "body",
        [vi("i", I64, []), vi("c_in", B, []), vi("v_in", F, [2, 3])],
        [vi("c_out", B, []), vi("v_out", F, [2, 3])],
    )
    node = helper.make_node("Loop", ["M", "", "v0"], ["v"], body=body)
    m = model(
        [node],
        [vi("v0", F, [2, 3]), vi("w", F, [2, 3]), vi("flag", B, [])],
        [vi("v", F, [2, 3])],
        [helper.make_tensor("M", I64, [], [3])],
    )
    for flag in (True, False):
        compare(m, {"v0": A, "w": Bv, "flag": np.array(flag)})


@pytest.mark.parametrize("in_dir,out_dir,out_axis", [(0, 0, 0), (1, 0, 1), (0, 1, -1)])
def test_scan(in_dir, out_dir, out_axis):
    body = helper.make_graph(
        [
            helper.make_node("Add", ["s_in", "x_t"], ["s_out"]),
            helper.make_node("Mul", ["s_out", "x_t"], ["y_t"]),
        ],
        "body",
        [vi("s_in", F, [3]), vi("x_t", F, [3])],
        [vi("s_out", F, [3]), vi("y_t", F, [3])],
    )
    node = helper.make_node(
        "Scan",
        ["s0", "xs"],
        ["s", "ys"],
        body=body,
        num_scan_inputs=1,
        scan_input_axes=[1],
        scan_input_directions=[in_dir],
        scan_output_axes=[out_axis],
        scan_output_directions=[out_dir],
    )
    xs = RNG.standard_normal((3, 5)).astype(np.float32)
    m = model([node], [vi("s0", F, [3]), vi("xs", F, [3, 5])], [vi("s", F, [3]), vi("ys", F, None)])
    compare(m, {"s0": RNG.standard_normal(3).astype(np.float32), "xs": xs})

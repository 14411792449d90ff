"""Control flow through real ORT: bodies reading outer-scope values, our fused nodes inside bodies, and
one refusal summary per session."""

from __future__ import annotations

import logging

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper as oh
from onnx import numpy_helper as nh

import migraphx_ep  # noqa: F401 - registers the EP and routes its name
from conftest import make_model, node_providers, profiled_options, tensor
from migraphx_ep.ep.subgraphs import expand_fused, with_outer_scope_inputs

EP = "MIGraphXExecutionProvider"
F = onnx.TensorProto.FLOAT


def _if_model(extra_nodes=(), extra_outputs=()) -> bytes:
    """z = If(c, relu(x + one), sigmoid(-x))^2 with x = exp(x0): both branches read x and one from
    the enclosing graph, so ORT offers them first, on their own."""
    then_g = oh.make_graph(
        [oh.make_node("Add", ["x", "one"], ["t0"]), oh.make_node("Relu", ["t0"], ["t1"])],
        "then",
        [],
        [tensor("t1", F, [2, 3])],
    )
    else_g = oh.make_graph(
        [oh.make_node("Neg", ["x"], ["e0"]), oh.make_node("Sigmoid", ["e0"], ["e1"])],
        "else",
        [],
        [tensor("e1", F, [2, 3])],
    )
    nodes = [
        oh.make_node("Exp", ["x0"], ["x"]),
        oh.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g),
        oh.make_node("Mul", ["y", "y"], ["z"]),
        *extra_nodes,
    ]
    return make_model(
        nodes,
        [tensor("x0", F, [2, 3]), tensor("c", onnx.TensorProto.BOOL, [])],
        [tensor("z", F, [2, 3]), *extra_outputs],
        [nh.from_array(np.ones(1, np.float32), "one")],
    )


def _expected(x0: np.ndarray, c: bool) -> np.ndarray:
    x = np.exp(x0)
    y = np.maximum(x + 1, 0) if c else 1 / (1 + np.exp(x))
    return y * y


def test_if_reading_outer_scope_is_claimed_whole():
    sess = ort.InferenceSession(_if_model(), profiled_options(), providers=[EP, "CPUExecutionProvider"])
    x0 = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
    for c in (True, False):
        (z,) = sess.run(None, {"x0": x0, "c": np.array(c)})
        np.testing.assert_allclose(z, _expected(x0, c), rtol=1e-5)
    assert set(node_providers(sess).values()) == {EP}


def test_one_refusal_summary_per_session(caplog):
    # Claimed whole: GetCapability runs per body and per graph, and nothing is reported.
    with caplog.at_level(logging.WARNING, logger="migraphx_ep"):
        ort.InferenceSession(_if_model(), providers=[EP, "CPUExecutionProvider"])
    assert not [r for r in caplog.records if "left to other providers" in r.getMessage()]
    # Unique has a data-dependent output shape: refused, and said once, with where to see why.
    model = make_model(
        [oh.make_node("Exp", ["x0"], ["x"]), oh.make_node("Unique", ["x"], ["u"])],
        [tensor("x0", F, [6])],
        [tensor("u", F, [None])],
    )
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="migraphx_ep"):
        ort.InferenceSession(model, providers=[EP, "CPUExecutionProvider"])
    lines = [r.getMessage() for r in caplog.records if "left to other providers" in r.getMessage()]
    assert len(lines) == 1, lines
    assert "Unique x1" in lines[0] and "ORT_MIGRAPHX_DUMP_MODEL_OPS" in lines[0]


def test_outer_scope_values_become_inputs():
    body = {
        "inputs": ["i"],
        "outputs": ["o"],
        "initializers": {"w": np.ones(2, np.float32)},
        "values": {"x": {"dtype": 1, "shape": [2]}, "i": {"dtype": 1, "shape": [2]}},
        "nodes": [
            {"index": 0, "op_type": "Add", "domain": "", "inputs": ["i", "x"], "outputs": ["t"]},
            {"index": 1, "op_type": "Mul", "domain": "", "inputs": ["t", "w"], "outputs": ["o"]},
            {"index": 2, "op_type": "Neg", "domain": "", "inputs": ["untyped"], "outputs": ["u"]},
        ],
    }
    graph, refuse = with_outer_scope_inputs(body)
    assert graph["inputs"] == ["i", "x"]  # typed outer values only
    assert refuse == {}
    # A node reading an outer value only inside its own subgraph is left for the enclosing graph.
    nested = {"index": 3, "op_type": "If", "domain": "", "inputs": ["c"], "outputs": ["v"]}
    nested["implicit_inputs"] = ["x"]
    nested["subgraphs"] = {"then_branch": {"nodes": [], "inputs": [], "outputs": ["x"]}}
    _, refuse = with_outer_scope_inputs({**body, "nodes": [*body["nodes"], nested]})
    assert list(refuse) == [3] and "'x'" in refuse[3]


def test_expand_fused_restores_nodes_inside_bodies():
    inner = {
        "nodes": [{"index": 0, "op_type": "Relu", "domain": "", "inputs": ["a"], "outputs": ["b"]}],
        "values": {"b": {"dtype": 1, "shape": [2]}},
        "initializers": {"k": np.arange(3.0)},
    }
    fused = {"name": "f0", "op_type": "X_0", "domain": EP, "inputs": ["a"], "outputs": ["b"]}
    body = {"nodes": [fused], "values": {}, "initializers": {}, "inputs": [], "outputs": ["b"]}
    graph = {"nodes": [{"index": 0, "op_type": "If", "domain": "", "subgraphs": {"then_branch": body}}]}
    out = expand_fused(graph, {"f0": inner})
    got = out["nodes"][0]["subgraphs"]["then_branch"]
    assert [n["op_type"] for n in got["nodes"]] == ["Relu"]
    assert got["values"]["b"] == {"dtype": 1, "shape": [2]}
    assert got["initializers"]["k"] is not inner["initializers"]["k"]  # owned copy
    np.testing.assert_array_equal(got["initializers"]["k"], inner["initializers"]["k"])
    assert expand_fused(graph, {}) is graph  # nothing of ours: untouched


@pytest.mark.parametrize("c", [True, False])
def test_if_with_condition_from_another_partition_compiles_taken_branch_only(c):
    # The then-branch squeezes axis 0, valid only when that dim is 1: ONNX runs only the taken branch,
    # so the EP must not compile the other one for these shapes.
    then_g = oh.make_graph(
        [oh.make_node("Squeeze", ["x", "ax"], ["s"]), oh.make_node("Unsqueeze", ["s", "ax"], ["t"])],
        "then",
        [],
        [tensor("t", F, [None, 3])],
    )
    else_g = oh.make_graph([oh.make_node("Neg", ["x"], ["t2"])], "else", [], [tensor("t2", F, [None, 3])])
    nodes = [
        oh.make_node("Shape", ["x"], ["sh"], start=0, end=1),
        oh.make_node("Equal", ["sh", "one"], ["c1"]),
        oh.make_node("Squeeze", ["c1"], ["c"]),
        oh.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g),
    ]
    model = make_model(
        nodes,
        [tensor("x", F, ["n", 3])],
        [tensor("y", F, ["n", 3])],
        [nh.from_array(np.array([0], np.int64), "ax"), nh.from_array(np.array([1], np.int64), "one")],
        opset=18,
    )
    sess = ort.InferenceSession(model, providers=[EP, "CPUExecutionProvider"])
    x = np.arange(3 if c else 6, dtype=np.float32).reshape(-1, 3)
    (y,) = sess.run(None, {"x": x})
    np.testing.assert_array_equal(y, x if c else -x)

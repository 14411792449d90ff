"""A claimed subgraph at Run: per-shape compile cache, LRU bound, input checks, dynamic batch."""

from __future__ import annotations

import logging
import re

import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper as h

from migraphx_ep.ep.compiled import InputError
from migraphx_ep.ep.provider import create_ep
from migraphx_ep.frontend import model_to_dict


def graph(dims=("N", 3)) -> dict:
    g = h.make_graph(
        [h.make_node("Add", ["x", "w"], ["a"]), h.make_node("Relu", ["a"], ["y"])],
        "g",
        [h.make_tensor_value_info("x", T.FLOAT, list(dims))],
        [h.make_tensor_value_info("y", T.FLOAT, list(dims))],
        [h.make_tensor("w", T.FLOAT, [3], [1.0, -2.0, 3.0])],
    )
    return model_to_dict(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]))


def compiled(options=None, dims=("N", 3)):
    ep = create_ep({"migraphx_target": "ref", **(options or {})})
    return ep.compile(graph(dims), "fused_0")


def ref(x):
    return np.maximum(x + np.array([1.0, -2.0, 3.0], np.float32), 0)


def test_new_shape_compiles_once_and_is_cached():
    c = compiled()
    assert c.compiles == 0  # symbolic batch: nothing to compile before the first Run
    rng = np.random.default_rng(0)
    for n in (2, 5, 2, 5, 7):
        x = rng.standard_normal((n, 3)).astype(np.float32)
        np.testing.assert_allclose(c.run([x])[0], ref(x), rtol=1e-6)
    assert c.compiles == 3


def test_static_shape_compiles_at_creation():
    c = compiled(dims=(4, 3))
    assert c.compiles == 1
    x = np.ones((4, 3), np.float32)
    np.testing.assert_allclose(c.run([x])[0], ref(x))


def test_lru_bound_evicts_least_recent():
    c = compiled({"migraphx_max_compiled_models": "2"})
    for n in (1, 2, 3):
        c.run([np.ones((n, 3), np.float32)])
    assert list(c.programs) == [((2, 3),), ((3, 3),)]
    c.run([np.ones((1, 3), np.float32)])
    assert c.compiles == 4


def test_max_dynamic_batch_precompiles_powers_of_two():
    c = compiled({"migraphx_max_dynamic_batch": "8"})
    assert sorted(k[0][0] for k in c.programs) == [1, 2, 4, 8]
    c.run([np.ones((4, 3), np.float32)])
    assert c.compiles == 4


@pytest.mark.parametrize(
    "x,msg",
    [
        (np.ones((2, 3), np.float64), "element type float64, expected float32"),
        (np.ones((2, 4), np.float32), "dim 1 is 4, expected 3"),
        (np.ones((2, 3, 1), np.float32), "rank 3, expected 2"),
    ],
)
def test_bad_inputs_are_clear_errors(x, msg):
    with pytest.raises(InputError, match=msg):
        compiled().run([x])


def test_wrong_input_count():
    with pytest.raises(InputError, match="expected 1 inputs, got 2"):
        compiled().run([np.ones((1, 3), np.float32)] * 2)


def reduce_graph() -> dict:
    g = h.make_graph(
        [h.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=0)],
        "g",
        [h.make_tensor_value_info("x", T.FLOAT, [2, 3, 4]), h.make_tensor_value_info("axes", T.INT64, [1])],
        [h.make_tensor_value_info("y", T.FLOAT, None)],
    )
    return model_to_dict(h.make_model(g, opset_imports=[h.make_opsetid("", 18)]))


def test_value_specialisation_of_small_inputs():
    from migraphx_ep.ep.partition import partition

    graph = reduce_graph()
    assert partition(graph).groups == [[0]]  # claimed although axes is a run-time input
    ep = create_ep({"migraphx_target": "ref"})
    c = ep.compile(graph, "fused_0")
    assert c.value_inputs == [1] and c.compiles == 0  # x (24 elements) is data, never specialised
    x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    for axis in (1, 2, 1, -1):
        got = c.run([x, np.array([axis], np.int64)])[0]
        np.testing.assert_allclose(got, x.sum(axis=axis), rtol=1e-6)
    assert c.compiles == 3  # axes 1, 2, -1: one program per distinct value


def test_value_specialisation_is_not_used_for_data():
    # Gather indices are data: a node never needs their value, so nothing is specialised.
    g = h.make_graph(
        [h.make_node("Gather", ["x", "i"], ["y"])],
        "g",
        [h.make_tensor_value_info("x", T.FLOAT, [5, 2]), h.make_tensor_value_info("i", T.INT64, [3])],
        [h.make_tensor_value_info("y", T.FLOAT, [3, 2])],
    )
    c = create_ep({"migraphx_target": "ref"}).compile(
        model_to_dict(h.make_model(g, opset_imports=[h.make_opsetid("", 18)])), "fused_0"
    )
    assert c.value_inputs == [] and c.compiles == 1


def test_value_specialisation_learns_every_needed_input():
    # Slice needs starts *and* ends by value; the probe only sees the first. Run learns the rest,
    # and the small data input x (12 elements) is never specialised.
    g = h.make_graph(
        [h.make_node("Slice", ["x", "starts", "ends"], ["y"])],
        "g",
        [
            h.make_tensor_value_info("x", T.FLOAT, [3, 4]),
            h.make_tensor_value_info("starts", T.INT64, [1]),
            h.make_tensor_value_info("ends", T.INT64, [1]),
        ],
        [h.make_tensor_value_info("y", T.FLOAT, None)],
    )
    c = create_ep({"migraphx_target": "ref"}).compile(
        model_to_dict(h.make_model(g, opset_imports=[h.make_opsetid("", 18)])), "fused_0"
    )
    rng = np.random.default_rng(0)
    for s, e in ((0, 2), (1, 3), (0, 2)):
        x = rng.standard_normal((3, 4)).astype(np.float32)
        got = c.run([x, np.array([s], np.int64), np.array([e], np.int64)])[0]
        np.testing.assert_array_equal(got, x[s:e])
    assert c.value_inputs == [1, 2] and c.compiles == 2


def test_every_compile_logs_what_it_cost(caplog):
    c = compiled()
    with caplog.at_level(logging.INFO, logger="migraphx_ep"):
        for n in (2, 5, 2):  # the repeat is a cached program: no compile, no line
            c.run([np.ones((n, 3), np.float32)])
    lines = [r.getMessage() for r in caplog.records if "compiled for" in r.getMessage()]
    assert len(lines) == c.compiles == 2
    for n, line in zip((2, 5), lines, strict=True):
        m = re.fullmatch(
            rf"MIGraphXExecutionProvider: compiled for ref, inputs x\[{n}, 3\], in (\S+) s: (.*)", line
        )
        assert m, line
        stages = dict(re.findall(r"(\w+) ([\d.]+) s", m.group(2)))
        assert "passes" in stages and "nvrtc" not in stages  # the ref target compiles no kernels
        assert sum(float(s) for s in stages.values()) <= float(m.group(1)) + 0.004


def test_a_graph_claimed_whole_is_not_parsed_again_to_find_its_value_inputs(monkeypatch):
    """GetCapability's probe of a graph it claims whole tells the Compile of that graph which inputs need
    their values (ep/partition.py): a second parse of a large model was 0.1 s of every session. Another
    graph's Compile parses its own."""
    from migraphx_ep.ep import compiled as compiled_mod

    ep = create_ep({"migraphx_target": "ref"})
    parses: list[dict] = []
    real = compiled_mod.probe_parse
    monkeypatch.setattr(compiled_mod, "probe_parse", lambda g, **kw: parses.append(g) or real(g, **kw))
    assert ep.get_capability(reduce_graph()) == [[0]]
    c = ep.compile(reduce_graph(), "fused_0")  # the same graph, another dict (as ORT hands it)
    assert parses == [] and c.value_inputs == [1]
    x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    np.testing.assert_allclose(c.run([x, np.array([2], np.int64)])[0], x.sum(axis=2), rtol=1e-6)
    assert ep.get_capability(reduce_graph()) == [[0]]
    c = ep.compile(graph(), "fused_1")  # not the graph claimed last: parsed
    assert len(parses) == 1 and c.value_inputs == []
    assert ep.compile(reduce_graph(), "fused_2").value_inputs == [1] and len(parses) == 2  # used once

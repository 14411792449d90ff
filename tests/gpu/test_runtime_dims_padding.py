"""Run-time dims on the gpu target (targets/gpu/runtime_dims.py): an input axis the graph only sums
away or reads the size of is compiled once per capacity and zero-padded at run.

Host-level tests (no GPU): the pass reads ``dimensions_of`` from an ``@dims`` input and refuses
padding that would change a result, and a padded program gives the ref's answers at the real size.
GPU tests: through the EP, lengths up to a capacity share one program, the next capacity compiles once,
and a graph that padding would change compiles per size, as before -- every answer exact.
"""

from __future__ import annotations

import logging

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h

from migraphx_ep.ep.provider import create_ep
from migraphx_ep.ep.runtime_dims import MIN_CAPACITY, capacity
from migraphx_ep.frontend import model_to_dict
from migraphx_ep.frontend.parser import parse_graph
from migraphx_ep.ir.dtypes import DType
from migraphx_ep.ir.shape import Shape
from migraphx_ep.targets.gpu.runtime_dims import DIMS_SUFFIX, PaddingNotExact, dims_as_inputs, pad_inputs


def mask_graph(reduce: str = "ReduceSum", before: list | None = None) -> dict:
    return model_to_dict(mask_model(reduce, before))


def mask_model(reduce: str = "ReduceSum", before: list | None = None) -> onnx.ModelProto:
    """y = x * (reduce(m, axis 1) + Shape(mask)[1]), m = ``before`` applied to mask (B, T)."""
    m = before[-1].output[0] if before else "mask"
    nodes = [
        *(before or []),
        h.make_node(reduce, [m, "axis1"], ["red"], keepdims=1),
        h.make_node("Shape", ["mask"], ["shape"]),
        h.make_node("Gather", ["shape", "idx1"], ["total"]),
        h.make_node("Cast", ["red"], ["redi"], to=T.INT64),
        h.make_node("Add", ["redi", "total"], ["sum"]),
        h.make_node("Cast", ["sum"], ["sumf"], to=T.FLOAT),
        h.make_node("Mul", ["x", "sumf"], ["y"]),
    ]
    g = h.make_graph(
        nodes,
        "g",
        [
            h.make_tensor_value_info("x", T.FLOAT, ["B", 4]),
            h.make_tensor_value_info("mask", T.INT64, ["B", "T"]),
        ],
        [h.make_tensor_value_info("y", T.FLOAT, ["B", 4])],
        [h.make_tensor("axis1", T.INT64, [1], [1]), h.make_tensor("idx1", T.INT64, [], [1])],
    )
    return h.make_model(g, opset_imports=[h.make_opsetid("", 18)])


def expected(x: np.ndarray, mask: np.ndarray, reduce=np.sum) -> np.ndarray:
    return x * (reduce(mask, axis=1, keepdims=True) + mask.shape[1]).astype(np.float32)


def feeds(b: int, t: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed + t)
    return [rng.standard_normal((b, 4)).astype(np.float32), (rng.random((b, t)) < 0.7).astype(np.int64)]


def parsed(graph: dict, t: int):
    shapes = {"x": Shape(DType.float_type, (2, 4)), "mask": Shape(DType.int64_type, (2, t))}
    return parse_graph(graph, shapes, specialize=True, runtime_dims={"mask": (1,)}).program


def test_capacity_is_a_power_of_two_from_the_minimum():
    assert [capacity(n) for n in (1, 7, MIN_CAPACITY, MIN_CAPACITY + 1, 3000)] == [
        MIN_CAPACITY,
        MIN_CAPACITY,
        MIN_CAPACITY,
        2 * MIN_CAPACITY,
        4096,
    ]


def test_dims_become_an_input_and_a_padded_run_gives_the_unpadded_answer():
    graph = mask_graph()
    prog = parsed(graph, 64)  # compiled at a capacity of 64
    main = prog.get_main_module()
    assert [i.name for i in main.instructions].count("dimensions_of") == 1
    assert dims_as_inputs(main)
    assert "dimensions_of" not in [i.name for i in main.instructions]
    assert main.get_parameter_shapes()["mask" + DIMS_SUFFIX] == Shape(DType.int64_type, (2,))
    padded = {"mask": (main.get_parameter_shapes()["mask"], frozenset({1}))}
    for t in (1, 9, 64):
        x, mask = feeds(2, t)
        got = prog.run_numpy(pad_inputs({"x": x, "mask": mask}, padded))[0]
        np.testing.assert_array_equal(got, expected(x, mask))


NOT = [
    h.make_node("Cast", ["mask"], ["b"], to=T.BOOL),
    h.make_node("Not", ["b"], ["n"]),
    h.make_node("Cast", ["n"], ["ni"], to=T.INT64),
]
EXP = [h.make_node("Cast", ["mask"], ["f"], to=T.FLOAT), h.make_node("Exp", ["f"], ["e"])]


@pytest.mark.parametrize(
    ("reduce", "before", "what"),
    [
        ("ReduceMax", None, "reduce_max"),  # a padded 0 can be the maximum
        ("ReduceSum", NOT, "not"),  # Not(0) is 1
        ("ReduceSum", EXP, "exp"),  # exp(0) is 1
    ],
)
def test_padding_that_would_change_a_result_is_refused(reduce, before, what):
    main = parsed(mask_graph(reduce, before), 16).get_main_module()
    with pytest.raises(PaddingNotExact, match=rf"axes \[1\] of input 'mask' reach {what}: zero padding"):
        dims_as_inputs(main)


def test_an_input_that_does_not_fit_its_capacity_is_named():
    padded = {"mask": (Shape(DType.int64_type, (2, 8)), frozenset({1}))}
    with pytest.raises(ValueError, match=r"input 'mask' has dims \[2, 9\]; this program takes \[2, 8\]"):
        pad_inputs({"mask": np.zeros((2, 9), np.int64)}, padded)
    with pytest.raises(ValueError, match=r"input 'mask' has dims \[3, 4\]"):  # a fixed axis changed
        pad_inputs({"mask": np.zeros((3, 4), np.int64)}, padded)


# -- through the EP, on the GPU ------------------------------------------------------------------------
@pytest.mark.gpu
def test_lengths_share_a_program_per_capacity_on_the_gpu(caplog):
    c = create_ep({"migraphx_target": "gpu"}).compile(mask_graph(), "fused_0")
    assert c.runtime == {"mask": (1,)}
    with caplog.at_level(logging.INFO, logger="migraphx_ep"):
        for t in (5, 6, 700, MIN_CAPACITY, 3, MIN_CAPACITY + 1, 2000):
            ins = feeds(2, t)
            np.testing.assert_array_equal(c.run(ins)[0], expected(*ins))
    assert c.runtime == {"mask": (1,)}
    assert c.compiles == 2, "one program up to the minimum capacity, one for the next"
    assert set(c.programs) == {((2, 4), (2, -MIN_CAPACITY)), ((2, 4), (2, -2 * MIN_CAPACITY))}
    plan = c.native_plan(feeds(2, 700))
    assert plan is not None and plan["pads"] == [None, (MIN_CAPACITY, 8)]  # mask: int64 rows


@pytest.mark.gpu
@pytest.mark.parametrize("bound", [False, True], ids=["numpy", "iobinding"])
def test_the_native_path_pads_every_length_up_to_the_capacity(python_runs, bound):
    import onnxruntime as ort

    ep = ("MIGraphXExecutionProvider", {"migraphx_target": "gpu"})
    sess = ort.InferenceSession(mask_model().SerializeToString(), providers=[ep])

    def run(x: np.ndarray, mask: np.ndarray) -> np.ndarray:
        if not bound:
            return sess.run(None, {"x": x, "mask": mask})[0]
        io = sess.io_binding()
        io.bind_ortvalue_input("x", ort.OrtValue.ortvalue_from_numpy(x, "cuda", 0))
        io.bind_ortvalue_input("mask", ort.OrtValue.ortvalue_from_numpy(mask, "cuda", 0))
        io.bind_output("y", "cuda")
        sess.run_with_iobinding(io)
        return io.copy_outputs_to_cpu()[0]

    # 700 then 1: the slot is zeroed again, so no row of an earlier, longer mask is summed
    for t in (5, 700, 1, 6, MIN_CAPACITY, 3):
        ins = feeds(2, t)
        np.testing.assert_array_equal(run(*ins), expected(*ins))
    assert python_runs["n"] == 1, "the first length compiles in Python; its padded plan serves the rest"
    for t in (MIN_CAPACITY + 1, 1500):  # past the capacity: Python compiles the next one, once
        ins = feeds(2, t)
        np.testing.assert_array_equal(run(*ins), expected(*ins))
    assert python_runs["n"] == 2
    ins = feeds(3, 9)  # another batch is another program
    np.testing.assert_array_equal(run(*ins), expected(*ins))
    assert python_runs["n"] == 3


@pytest.mark.gpu
def test_a_graph_padding_would_change_compiles_per_length_on_the_gpu(caplog):
    c = create_ep({"migraphx_target": "gpu"}).compile(mask_graph("ReduceMax"), "fused_0")
    with caplog.at_level(logging.INFO, logger="migraphx_ep"):
        for t in (4, 6, 4):
            ins = feeds(2, t)
            np.testing.assert_array_equal(c.run(ins)[0], expected(*ins, reduce=np.max))
    assert c.runtime == {}
    assert "compile key: PaddingNotExact: run-time axes [1] of input 'mask' reach reduce_max" in caplog.text
    assert c.compiles == 2  # T=4 and T=6; the padded attempt failed in its first pass

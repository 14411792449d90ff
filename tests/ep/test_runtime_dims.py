"""Run-time dims (ep/runtime_dims.py): an input axis that the graph only reduces away or reads the size
of is served by one program at every size -- proven by comparing two compiles, else keyed as before."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper as h

from migraphx_ep.ep.compiled import CompiledSubgraph
from migraphx_ep.ep.options import parse_options
from migraphx_ep.ep.provider import create_ep
from migraphx_ep.ep.runtime_dims import candidates, prove
from migraphx_ep.frontend import model_to_dict
from migraphx_ep.frontend.parser import parse_graph
from migraphx_ep.ir.dtypes import DType
from migraphx_ep.ir.evaluate import RunError
from migraphx_ep.ir.shape import Shape
from migraphx_ep.targets import get_target


def mask_graph(extra: list | None = None, out_of_mask: str = "y") -> dict:
    """GenAI's attention-mask pattern: lengths = ReduceSum(mask, axis 1) - 1, total = Shape(mask)[1];
    y = x * lengths + total (x: (B, 4), mask: (B, T), T symbolic)."""
    nodes = [
        h.make_node("ReduceSum", ["mask", "axis1"], ["sum"], keepdims=1),
        h.make_node("Sub", ["sum", "one"], ["len"]),
        h.make_node("Shape", ["mask"], ["shape"]),
        h.make_node("Gather", ["shape", "idx1"], ["total"]),
        h.make_node("Add", ["len", "total"], ["lt"]),
        h.make_node("Cast", ["lt"], ["ltf"], to=T.FLOAT),
        h.make_node("Mul", ["x", "ltf"], ["y"]),
    ] + (extra or [])
    outputs = [h.make_tensor_value_info(out_of_mask, T.FLOAT, None)]
    if out_of_mask != "y":
        outputs.insert(0, h.make_tensor_value_info("y", T.FLOAT, ["B", 4]))
    g = h.make_graph(
        nodes,
        "g",
        [
            h.make_tensor_value_info("x", T.FLOAT, ["B", 4]),
            h.make_tensor_value_info("mask", T.INT64, ["B", "T"]),
        ],
        outputs,
        [
            h.make_tensor("axis1", T.INT64, [1], [1]),
            h.make_tensor("one", T.INT64, [], [1]),
            h.make_tensor("idx1", T.INT64, [], [1]),
        ],
    )
    return model_to_dict(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]))


def expected(x: np.ndarray, mask: np.ndarray) -> np.ndarray:
    return x * (mask.sum(1, keepdims=True) - 1 + mask.shape[1]).astype(np.float32)


def feeds(b: int, t: int, rng: np.random.Generator) -> list[np.ndarray]:
    x = rng.standard_normal((b, 4)).astype(np.float32)
    return [x, (rng.random((b, t)) < 0.7).astype(np.int64)]


def test_candidates_are_the_reduced_symbolic_axes():
    assert candidates(mask_graph()) == {"mask": (1,)}  # batch is kept: the result has it


def test_an_axis_that_reaches_a_result_is_no_candidate():
    # mask also feeds an output through Unsqueeze: its length is part of a result
    g = mask_graph([h.make_node("Unsqueeze", ["mask", "axis1"], ["m2"])], out_of_mask="m2")
    assert candidates(g) == {}


def test_one_program_serves_every_length(caplog):
    c = create_ep({"migraphx_target": "ref"}).compile(mask_graph(), "fused_0")
    rng = np.random.default_rng(0)
    with caplog.at_level(logging.INFO, logger="migraphx_ep"):
        for t in (5, 6, 7, 12, 3, 40):
            ins = feeds(2, t, rng)
            np.testing.assert_array_equal(c.run(ins)[0], expected(*ins))
    assert c.runtime == {"mask": (1,)}
    assert c.compiles == 2, "the program for T=5 and the proof's second size, then nothing"
    assert list(c.programs) == [((2, 4), (2, -1))]
    assert "one program serves every size of mask axes [1]" in caplog.text
    c.run(feeds(3, 9, rng))  # another batch is another program: batch stays in the key
    assert c.compiles == 3


CAST_SHAPE = [
    h.make_node("Cast", ["mask"], ["mc"], to=T.FLOAT),
    h.make_node("Shape", ["mc"], ["s2"]),
    h.make_node("Gather", ["s2", "idx1"], ["t2"]),
    h.make_node("Cast", ["t2"], ["t2f"], to=T.FLOAT),
    h.make_node("Mul", ["x", "t2f"], ["y2"]),
]


def _run_cast_shape(c, caplog) -> None:
    rng = np.random.default_rng(1)
    with caplog.at_level(logging.INFO, logger="migraphx_ep"):
        for t in (4, 6):
            ins = feeds(2, t, rng)
            y, y2 = c.run(ins)
            np.testing.assert_array_equal(y, expected(*ins))
            np.testing.assert_array_equal(y2, ins[0] * np.float32(t))


def test_the_shape_of_a_cast_of_the_mask_is_read_at_run(caplog):
    # A Cast keeps its input's dims, at run too: Shape(Cast(mask)) reads the mask's run-time dims.
    c = create_ep({"migraphx_target": "ref"}).compile(mask_graph(CAST_SHAPE, out_of_mask="y2"), "fused_0")
    _run_cast_shape(c, caplog)
    assert c.runtime == {"mask": (1,)}
    assert c.compiles == 2  # T=4 and the proof's T=5, then nothing


def test_a_size_that_changes_the_program_stays_in_the_key(caplog, monkeypatch):
    # When the two sizes' programs differ (the proof gives a reason), the axes go back into the key.
    monkeypatch.setattr("migraphx_ep.ep.compiled.prove", lambda a, b: "a constant follows the size")
    c = create_ep({"migraphx_target": "ref"}).compile(mask_graph(CAST_SHAPE, out_of_mask="y2"), "fused_0")
    assert c.runtime == {"mask": (1,)}  # the static filter lets it through; the proof must not
    _run_cast_shape(c, caplog)
    assert c.runtime == {}
    assert "stay in the compile key: a constant follows the size" in caplog.text
    # T=4 with run-time axes and the proof's T=5 (both thrown away), then T=4 and T=6 keyed as before
    assert c.compiles == 4


def test_prove_refuses_a_constant_that_follows_the_size():
    g = mask_graph()
    progs = []
    for t in (5, 6):
        shapes = {"x": Shape(DType.float_type, (2, 4)), "mask": Shape(DType.int64_type, (2, t))}
        # Without run-time axes Shape(mask) folds to a constant of each size: not the same program.
        p = parse_graph(g, shapes, specialize=True).program
        p.compile(get_target("ref"))
        progs.append(p)
    assert prove(*progs) is not None
    runtime = []
    for t in (5, 6):
        shapes = {"x": Shape(DType.float_type, (2, 4)), "mask": Shape(DType.int64_type, (2, t))}
        p = parse_graph(g, shapes, specialize=True, runtime_dims={"mask": (1,)}).program
        p.compile(get_target("ref"))
        runtime.append(p)
    assert prove(*runtime) is None


def test_switch_off(monkeypatch):
    monkeypatch.setenv("MIGRAPHX_EP_RUNTIME_DIMS", "0")
    c = create_ep({"migraphx_target": "ref"}).compile(mask_graph(), "fused_0")
    rng = np.random.default_rng(0)
    for t in (5, 6, 7):
        ins = feeds(2, t, rng)
        np.testing.assert_array_equal(c.run(ins)[0], expected(*ins))
    assert c.runtime == {} and c.compiles == 3


def test_a_cached_program_keeps_its_runtime_axes(tmp_path):
    opts = {"migraphx_target": "ref", "migraphx_model_cache_dir": str(tmp_path)}
    rng = np.random.default_rng(2)
    first = create_ep(opts).compile(mask_graph(), "fused_0")
    first.run(feeds(2, 5, rng))
    again = create_ep(opts).compile(mask_graph(), "fused_0")
    for t in (5, 8, 11):
        ins = feeds(2, t, rng)
        np.testing.assert_array_equal(again.run(ins)[0], expected(*ins))
    assert again.loads == 1 and again.compiles == 1  # the proof's second size; the program was loaded


@pytest.mark.parametrize("bad", [(3, 5), (2, 5, 1)])
def test_fixed_axes_are_still_checked(bad):
    c = create_ep({"migraphx_target": "ref"}).compile(mask_graph(), "fused_0")
    c.run(feeds(2, 5, np.random.default_rng(0)))
    prog = c.programs[((2, 4), (2, -1))]
    with pytest.raises(RunError, match="input 'mask'"):
        prog.run_numpy({"x": np.ones((2, 4), np.float32), "mask": np.ones(bad, np.int64)})


def test_with_a_value_specialised_input():
    # x is reshaped by an input's *values*: the first Run learns them (value specialisation), then the
    # run-time-dims proof runs with them; each new value compiles, a new mask length does not.
    g = mask_graph([h.make_node("Reshape", ["y", "dims"], ["yr"])], out_of_mask="yr")
    g["inputs"].append("dims")
    g["values"]["dims"] = {"dtype": T.INT64, "shape": [2]}
    c = create_ep({"migraphx_target": "ref"}).compile(g, "fused_0")
    rng = np.random.default_rng(3)
    for t, dims in ((5, (4, 2)), (9, (4, 2)), (6, (8, 1)), (3, (8, 1))):
        x, mask = feeds(2, t, rng)
        y, yr = c.run([x, mask, np.array(dims, np.int64)])
        np.testing.assert_array_equal(yr, expected(x, mask).reshape(dims))
    assert c.runtime == {"mask": (1,)} and c.value_inputs == [2]
    assert c.compiles == 3  # (4, 2) and its proof, then (8, 1)


def test_a_gpu_subgraph_compiled_for_the_ref_target_is_proven_as_the_ref_proves(caplog, monkeypatch):
    # The gpu target proves padding in its pipeline; a gpu subgraph the EP compiles for the ref target
    # instead (value-specialised nodes it cannot lower) never runs that pipeline, so the ref's proof
    # must run: here it refuses, and the sizes go back into the key.
    def compile_for_ref(prog, options, tensors):
        prog.compile(get_target("ref"))

    monkeypatch.setattr("migraphx_ep.ep.compiled.prove", lambda a, b: "a constant follows the size")
    c = CompiledSubgraph(mask_graph(), "fused_0", parse_options({}, {}), compile_for_ref, target="gpu")
    assert c.padded and c.runtime == {"mask": (1,)}
    rng = np.random.default_rng(2)
    with caplog.at_level(logging.INFO, logger="migraphx_ep"):
        for t in (4, 6):
            ins = feeds(2, t, rng)
            np.testing.assert_array_equal(c.run(ins)[0], expected(*ins))
    assert c.runtime == {}
    assert c.compiles == 4  # the capacity's program and the proof's, then T=4 and T=6 keyed as before

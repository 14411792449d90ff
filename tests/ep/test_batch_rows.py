"""Batch rows (ep/batch_rows.py, ep/batch_serve.py): a program compiled for batch C answers every batch
B < C, padded, when each output row depends on its own input row only -- proven on two parses, refused
for every way a graph can mix rows -- and the smaller batch's own program compiles in the background."""

from __future__ import annotations

import gc
import logging
import os
import threading
import time
import weakref

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper as h

from migraphx_ep import timing
from migraphx_ep.ep import background_compiles
from migraphx_ep.ep.background import BACKGROUND, Background, wait_for_compiles
from migraphx_ep.ep.batch_rows import NotRowwise, capacity, prove
from migraphx_ep.ep.batch_serve import batch_inputs
from migraphx_ep.ep.provider import create_ep
from migraphx_ep.frontend import model_to_dict
from migraphx_ep.frontend.parser import parse_graph
from migraphx_ep.ir.dtypes import from_onnx
from migraphx_ep.ir.shape import Shape

MODELS = os.path.join(os.path.dirname(os.path.dirname(__file__)), "models")
EP = "MIGraphXExecutionProvider"


def one_node_graph(nodes: list, out_dims: list | None = None, inits: list | None = None) -> dict:
    """x: (B, 6) float -> y, through ``nodes``."""
    g = h.make_graph(
        nodes,
        "g",
        [h.make_tensor_value_info("x", T.FLOAT, ["B", 6])],
        [h.make_tensor_value_info("y", T.FLOAT, out_dims)],
        inits or [],
    )
    return model_to_dict(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]))


def prove_graph(graph: dict):
    mods = []
    for b in (3, 5):
        shapes = {}
        for n in graph["inputs"]:
            info = graph["values"][n]
            dims = [b if i == 0 else (d if isinstance(d, int) else 16) for i, d in enumerate(info["shape"])]
            shapes[n] = Shape(from_onnx(info["dtype"]), dims)
        mods.append(parse_graph(graph, shapes, specialize=True).program.get_main_module())
    return prove(mods[0], mods[1], (3, 5), {graph["inputs"][i] for i in batch_inputs(graph)})


def ints(name: str, values: list[int]):
    return h.make_tensor(name, T.INT64, [len(values)], values)


# -- the proof on real exported models ---------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "outputs"),
    [("bert", (1, 1)), ("gpt2", (1,)), ("vit", (1, 1)), ("resnet_bn", (1,)), ("mobilenet_v2", (1,))],
)
def test_exported_models_are_rowwise(name, outputs):
    # HF's BERT/GPT-2 build their attention mask by gathering a flattened (batch, seq) mask with
    # indices b*seq + j: the gather rule must see those indices stay within each row.
    rows = prove_graph(model_to_dict(onnx.load(os.path.join(MODELS, f"{name}.onnx"))))
    assert rows.outputs == outputs


# -- refusals: every way to mix rows -----------------------------------------------------------------
MIXING = {
    "sum over the batch": ([h.make_node("ReduceSum", ["x", "ax0"], ["y"], keepdims=1)], [ints("ax0", [0])]),
    "mean over the batch (batch norm in training)": (
        [
            h.make_node("ReduceMean", ["x"], ["m"], axes=[0], keepdims=1),
            h.make_node("Sub", ["x", "m"], ["y"]),
        ],
        [],
    ),
    "softmax over the batch": ([h.make_node("Softmax", ["x"], ["y"], axis=0)], []),
    "concat along the batch": ([h.make_node("Concat", ["x", "x"], ["y"], axis=0)], []),
    "gram matrix x^T x": (
        [h.make_node("Transpose", ["x"], ["xt"], perm=[1, 0]), h.make_node("MatMul", ["xt", "x"], ["y"])],
        [],
    ),
    "x x^T": (
        [h.make_node("Transpose", ["x"], ["xt"], perm=[1, 0]), h.make_node("MatMul", ["x", "xt"], ["y"])],
        [],
    ),
    "first row broadcast": (
        [h.make_node("Gather", ["x", "zero"], ["r"], axis=0), h.make_node("Add", ["x", "r"], ["y"])],
        [h.make_tensor("zero", T.INT64, [], [0])],
    ),
    "reshape (B, 6) to (6, B)": (
        [
            h.make_node("Shape", ["x"], ["s"]),
            h.make_node("Gather", ["s", "zero"], ["b"], axis=0),
            h.make_node("Unsqueeze", ["b", "ax0"], ["b1"]),
            h.make_node("Concat", ["six", "b1"], ["shape"], axis=0),
            h.make_node("Reshape", ["x", "shape"], ["y"]),
        ],
        [h.make_tensor("zero", T.INT64, [], [0]), ints("ax0", [0]), ints("six", [6])],
    ),
    "row index added (Range over the batch)": (
        [
            h.make_node("Shape", ["x"], ["s"]),
            h.make_node("Gather", ["s", "zero"], ["b"], axis=0),
            h.make_node("Range", ["zero", "b", "one"], ["r"]),
            h.make_node("Cast", ["r"], ["rf"], to=T.FLOAT),
            h.make_node("Unsqueeze", ["rf", "ax1"], ["r2"]),
            h.make_node("Add", ["x", "r2"], ["y"]),
        ],
        [h.make_tensor("zero", T.INT64, [], [0]), h.make_tensor("one", T.INT64, [], [1]), ints("ax1", [1])],
    ),
    "divided by the batch size": (
        [
            h.make_node("Shape", ["x"], ["s"]),
            h.make_node("Gather", ["s", "zero"], ["b"], axis=0),
            h.make_node("Cast", ["b"], ["bf"], to=T.FLOAT),
            h.make_node("Div", ["x", "bf"], ["y"]),
        ],
        [h.make_tensor("zero", T.INT64, [], [0])],
    ),
    "running sum over the batch": (
        [h.make_node("CumSum", ["x", "zero"], ["y"])],
        [h.make_tensor("zero", T.INT64, [], [0])],
    ),
    "rows reversed": (
        [h.make_node("Slice", ["x", "m1", "big", "zero1", "m1"], ["y"])],
        [ints("m1", [-1]), ints("big", [-(2**62)]), ints("zero1", [0])],
    ),
    "transposed result (rows on axis 1)": ([h.make_node("Transpose", ["x"], ["y"], perm=[1, 0])], []),
    "the input's shape as a result": (
        [h.make_node("Shape", ["x"], ["s"]), h.make_node("Cast", ["s"], ["y"], to=T.FLOAT)],
        [],
    ),
}


@pytest.mark.parametrize("case", sorted(MIXING))
def test_graphs_that_mix_rows_are_refused(case):
    nodes, inits = MIXING[case]
    with pytest.raises(NotRowwise):
        prove_graph(one_node_graph(nodes, None, inits))


ROWWISE = {
    "softmax over features": ([h.make_node("Softmax", ["x"], ["y"], axis=1)], []),
    "per-row layernorm": (
        [
            h.make_node("ReduceMean", ["x"], ["m"], axes=[1], keepdims=1),
            h.make_node("Sub", ["x", "m"], ["y"]),
        ],
        [],
    ),
    "gemm with bias": (
        [h.make_node("Gemm", ["x", "w", "c"], ["y"])],
        [
            h.make_tensor("w", T.FLOAT, [6, 4], np.arange(24, dtype=np.float32) / 24),
            h.make_tensor("c", T.FLOAT, [4], [1, 2, 3, 4]),
        ],
    ),
    "reshape (B, 6) to (B, 2, 3), transposed back": (
        [
            h.make_node("Reshape", ["x", "s"], ["r"]),
            h.make_node("Transpose", ["r"], ["t"], perm=[0, 2, 1]),
            h.make_node("Flatten", ["t"], ["y"], axis=1),
        ],
        [ints("s", [-1, 2, 3])],
    ),
}


@pytest.mark.parametrize("case", sorted(ROWWISE))
def test_rowwise_graphs_are_proven_and_padded_runs_are_exact(case, monkeypatch):
    nodes, inits = ROWWISE[case]
    graph = one_node_graph(nodes, None, inits)
    assert prove_graph(graph).outputs == (1,)
    monkeypatch.setenv("MIGRAPHX_EP_BATCH_ROWS", "1")
    c = create_ep({"migraphx_target": "ref"}).compile(graph, "fused_0")
    exact = create_ep({"migraphx_target": "ref"}).compile(graph, "fused_0")
    rng = np.random.default_rng(0)
    for b in (3, 2, 1, 4):
        x = rng.standard_normal((b, 6)).astype(np.float32)
        got = [o.copy() for o in c.run([x])]
        want = exact.program_for(((b, 6),)).run_numpy({"x": x})
        np.testing.assert_allclose(got[0], want[0], rtol=1e-6, atol=1e-6)
    wait_for_compiles()


def test_batch_inputs_share_one_symbol():
    def graph(a, b):
        g = h.make_graph(
            [h.make_node("Add", ["p", "q"], ["y"])],
            "g",
            [h.make_tensor_value_info("p", T.FLOAT, [a, 4]), h.make_tensor_value_info("q", T.FLOAT, [b, 4])],
            [h.make_tensor_value_info("y", T.FLOAT, None)],
        )
        return model_to_dict(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]))

    assert batch_inputs(graph("N", "N")) == [0, 1]
    assert batch_inputs(graph("N", "M")) == []  # two symbols that may differ: no batch
    assert batch_inputs(graph("N", 1)) == [0]


def test_capacity_is_the_next_power_of_two():
    assert [capacity(b) for b in (1, 2, 3, 5, 8, 9, 33)] == [1, 2, 4, 8, 8, 16, 64]


# -- end to end through ORT ------------------------------------------------------------------------------
def test_a_never_seen_batch_runs_padded_and_compiles_its_own_in_the_background(
    monkeypatch, recording, caplog
):
    monkeypatch.setenv("MIGRAPHX_EP_BATCH_ROWS", "1")
    monkeypatch.setattr(background_compiles, "QUIET_S", 0.0)  # no quiet second to wait for
    model = os.path.join(MODELS, "bert.onnx")
    sess = ort.InferenceSession(model, providers=[(EP, {"migraphx_target": "ref"}), "CPUExecutionProvider"])
    cpu = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)

    def check(b: int) -> None:
        feeds = {
            "input_ids": rng.integers(0, 100, (b, 16)).astype(np.int64),
            "attention_mask": (rng.random((b, 16)) < 0.8).astype(np.int64),
            "token_type_ids": rng.integers(0, 2, (b, 16)).astype(np.int64),
        }
        for got, want in zip(sess.run(None, feeds), cpu.run(None, feeds), strict=True):
            assert got.shape == want.shape
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)

    (sub,) = recording.eps[-1].compiled
    with caplog.at_level(logging.INFO, logger="migraphx_ep"):
        check(3)  # compiles batch 4 (the capacity), serves 3 from it; 3's own program queued
        wait_for_compiles()
        assert sorted(k[0][0] for k in sub.programs) == [3, 4]
        before = sub.compiles
        for b in (2, 1):  # never seen: served by a larger batch's program at once
            check(b)
        assert "one program serves every smaller batch size" in caplog.text
    wait_for_compiles()
    assert sub.compiles == before + 2 and sorted(k[0][0] for k in sub.programs) == [1, 2, 3, 4]
    check(2)  # its own program now
    assert sub.compiles == before + 2


def test_off_by_default_on_the_ref_target(recording):
    model = os.path.join(MODELS, "resnet.onnx")
    sess = ort.InferenceSession(model, providers=[(EP, {"migraphx_target": "ref"}), "CPUExecutionProvider"])
    sess.run(None, {"pixel_values": np.zeros((3, 3, 32, 32), np.float32)})
    (sub,) = recording.eps[-1].compiled
    assert sub.rows is None and [k[0] for k in sub.programs] == [(3, 3, 32, 32)]


def test_background_jobs_run_in_order_and_restore_the_switch_interval():
    import sys

    from migraphx_ep.ep.background import Background

    bg, seen = Background(), []
    before = sys.getswitchinterval()
    for i in range(3):
        assert bg.submit(lambda i=i: seen.append((i, sys.getswitchinterval())))
    assert bg.wait(30)
    assert [i for i, _ in seen] == [0, 1, 2] and all(s <= 0.0005 for _, s in seen)
    assert sys.getswitchinterval() == before and bg.done == 3
    bg.stop()
    assert not bg.submit(lambda: None)  # stopped: nothing more is queued


def test_off_with_room_for_one_program(monkeypatch):
    # A capacity and a size's own program cannot both stay: the size would compile, evict, recompile.
    monkeypatch.setenv("MIGRAPHX_EP_BATCH_ROWS", "1")
    graph = one_node_graph(*ROWWISE["softmax over features"][:1], None, [])
    c = create_ep({"migraphx_target": "ref", "migraphx_max_compiled_models": "1"}).compile(graph, "fused_0")
    assert c.rows is None


def test_no_background_compile_while_new_shapes_compile(monkeypatch):
    # Within QUIET_S of a compile on the critical path, a padded size does not queue its own compile
    # (it would hold the build lock the next new shape waits for); once quiet, it does.
    monkeypatch.setenv("MIGRAPHX_EP_BATCH_ROWS", "1")
    monkeypatch.setattr(background_compiles, "QUIET_S", 3600.0)
    nodes, inits = ROWWISE["gemm with bias"]
    graph = one_node_graph(nodes, None, inits)
    c = create_ep({"migraphx_target": "ref"}).compile(graph, "fused_0")
    x = np.ones((3, 6), np.float32)
    c.run([x])  # compiles batch 4, serves 3
    wait_for_compiles()
    assert [k[0][0] for k in c.programs] == [4] and not c.rows.pending
    monkeypatch.setattr(background_compiles, "QUIET_S", 0.0)
    c.run([x])
    wait_for_compiles()
    assert sorted(k[0][0] for k in c.programs) == [3, 4]


def test_new_other_dims_compile_as_usual_and_are_proven_in_the_background(monkeypatch):
    # A new sequence length is not a batch size: it compiles like any new shape, and its proof runs in
    # the background, so that its later batch sizes are served padded.
    monkeypatch.setenv("MIGRAPHX_EP_BATCH_ROWS", "1")
    monkeypatch.setattr(background_compiles, "QUIET_S", 0.0)
    g = h.make_graph(
        [h.make_node("Softmax", ["x"], ["y"], axis=1)],
        "g",
        [h.make_tensor_value_info("x", T.FLOAT, ["B", "S"])],
        [h.make_tensor_value_info("y", T.FLOAT, None)],
    )
    c = create_ep({"migraphx_target": "ref"}).compile(
        model_to_dict(h.make_model(g, opset_imports=[h.make_opsetid("", 17)])), "fused_0"
    )
    c.run([np.ones((3, 5), np.float32)])  # the first dims: proven, compiled at batch 4
    c.run([np.ones((3, 7), np.float32)])  # new S: compiled as it is
    assert ((3, 7),) in c.programs and ((4, 7),) not in c.programs
    wait_for_compiles()
    assert c.rows.known(((2, 7),))
    compiles = c.compiles
    got = c.run([np.arange(14, dtype=np.float32).reshape(2, 7)])[0]  # served by batch 3's program
    assert c.compiles == compiles
    np.testing.assert_allclose(got.sum(1), [1, 1], rtol=1e-6)
    wait_for_compiles()


def test_a_quick_program_is_replaced_by_the_timed_one(monkeypatch):
    # MIGRAPHX_EP_QUICK_PICKS: a compile on a Run's critical path takes the libraries' untimed picks
    # (the gpu target); the same shape is compiled again, timed, in the background and replaces it --
    # here on the ref target, where both compiles are alike, to check the replacement itself.
    monkeypatch.setenv("MIGRAPHX_EP_QUICK_PICKS", "1")
    monkeypatch.setattr(background_compiles, "QUIET_S", 0.0)
    nodes, inits = ROWWISE["gemm with bias"]
    c = create_ep({"migraphx_target": "ref"}).compile(one_node_graph(nodes, None, inits), "fused_0")
    x = np.arange(18, dtype=np.float32).reshape(3, 6)
    first = [o.copy() for o in c.run([x])]
    quick = c.programs[((3, 6),)]
    assert quick.quick_picks and c.compiles == 1
    wait_for_compiles()
    timed = c.programs[((3, 6),)]
    assert timed is not quick and not timed.quick_picks and c.compiles == 2
    np.testing.assert_array_equal(c.run([x])[0], first[0])


def test_a_background_compile_gives_way_to_a_new_shape(monkeypatch):
    # A timed compile running in the background holds the subgraph's build lock; a never-seen shape's
    # compile on a Run's critical path must not wait for all of it: the background one stops at its
    # next stage (Preempted), the Run's compile goes first, and the background one runs again after.
    monkeypatch.setenv("MIGRAPHX_EP_QUICK_PICKS", "1")
    monkeypatch.setattr(background_compiles, "QUIET_S", 0.0)
    nodes, inits = ROWWISE["gemm with bias"]
    c = create_ep({"migraphx_target": "ref"}).compile(one_node_graph(nodes, None, inits), "fused_0")
    real, started, attempts = c._compile_program, threading.Event(), []

    def slow_in_background(prog, options, values):  # noqa: ANN001, ANN202
        if BACKGROUND.on_thread():
            attempts.append(1)
            started.set()
            for _ in range(100 if len(attempts) == 1 else 1):  # 2 s the first time, unless it gives way
                with timing.stage("slow step"):
                    time.sleep(0.02)
        real(prog, options, values)

    c._compile_program = slow_in_background
    preempted = BACKGROUND.preempted
    c.run([np.ones((3, 6), np.float32)])  # quick; its timed compile is queued
    assert started.wait(10)
    t0 = time.monotonic()
    x = np.arange(30, dtype=np.float32).reshape(5, 6)
    got = c.run([x])[0]  # a new shape, compiled on this Run's critical path
    assert time.monotonic() - t0 < 1.5  # not the background compile's 2 s
    assert BACKGROUND.preempted > preempted
    wait_for_compiles()
    assert len(attempts) >= 2 and not c.programs[((3, 6),)].quick_picks  # ran again, and replaced it
    np.testing.assert_array_equal(c.run([x])[0], got)


def test_a_checkpoint_raises_only_on_the_background_thread():
    bg = Background()
    seen = []

    def job() -> None:
        bg.checkpoint("a stage")  # gives way while a compile on a Run's critical path runs
        seen.append(bg.on_thread())

    with bg.foreground():
        bg.checkpoint("here")  # not the background thread: nothing
        assert not bg.quiet(0.0)  # a compile on a Run's critical path is running
        assert bg.submit(job)
        time.sleep(0.1)
        assert seen == [] and bg.preempted >= 1  # gave way, queued again, waiting
    assert bg.wait(5) and seen == [True] and bg.done == 1
    bg.stop()


def test_a_model_cache_stores_the_first_program_at_once_and_later_ones_when_timed(monkeypatch, tmp_path):
    # The first compile is timed and stored at once (a one-shape process leaves what the next one
    # loads); later shapes take quick picks on the Run's path, and the timed program compiled in the
    # background is what the cache stores. A path to save to gets timed programs only.
    monkeypatch.setenv("MIGRAPHX_EP_QUICK_PICKS", "1")
    monkeypatch.setenv("MIGRAPHX_EP_BATCH_ROWS", "0")
    monkeypatch.setattr(background_compiles, "QUIET_S", 0.0)
    nodes, inits = ROWWISE["gemm with bias"]
    opts = {"migraphx_target": "ref", "migraphx_model_cache_dir": str(tmp_path / "cache")}
    c = create_ep(opts).compile(one_node_graph(nodes, None, inits), "fused_0")
    c.run([np.ones((3, 6), np.float32)])
    assert not c.programs[((3, 6),)].quick_picks and c.store.saves == 1
    x = np.arange(30, dtype=np.float32).reshape(5, 6)
    got = c.run([x])[0]
    assert c.programs[((5, 6),)].quick_picks and c.store.saves == 1  # not stored while quick
    wait_for_compiles()
    assert not c.programs[((5, 6),)].quick_picks and c.store.saves == 2  # the timed one, stored
    again = create_ep(opts).compile(one_node_graph(nodes, None, inits), "fused_0")
    np.testing.assert_array_equal(again.run([x])[0], got)
    assert again.loads == 1 and again.compiles == 0
    save = {"migraphx_target": "ref", "migraphx_save_compiled_model": "1",
            "migraphx_save_compiled_path": str(tmp_path / "saved.mxr")}  # fmt: skip
    s = create_ep(save).compile(one_node_graph(nodes, None, inits), "fused_0")
    for n in (3, 5):
        s.run([np.ones((n, 6), np.float32)])
        assert not s.programs[((n, 6),)].quick_picks


def test_no_quick_picks_with_exhaustive_tune(monkeypatch):
    monkeypatch.setenv("MIGRAPHX_EP_QUICK_PICKS", "1")
    nodes, inits = ROWWISE["gemm with bias"]
    opts = {"migraphx_target": "ref", "migraphx_exhaustive_tune": "1"}
    c = create_ep(opts).compile(one_node_graph(nodes, None, inits), "fused_0")
    c.run([np.ones((3, 6), np.float32)])
    assert not c.programs[((3, 6),)].quick_picks


def test_a_power_of_two_batch_compiles_as_it_is_and_proves_nothing(monkeypatch):
    # A model run at batch 1 (or 8) only pays nothing for batch rows: no proof, no capacity.
    monkeypatch.setenv("MIGRAPHX_EP_BATCH_ROWS", "1")
    monkeypatch.setattr(background_compiles, "QUIET_S", 3600.0)
    nodes, inits = ROWWISE["gemm with bias"]
    c = create_ep({"migraphx_target": "ref"}).compile(one_node_graph(nodes, None, inits), "fused_0")
    c.run([np.ones((1, 6), np.float32)])
    assert list(c.programs) == [((1, 6),)] and c.rows.first
    c.run([np.ones((3, 6), np.float32)])  # proven now, and served by batch 4's program
    assert not c.rows.first and list(c.programs) == [((1, 6),), ((4, 6),)]


@pytest.mark.parametrize("name", ["MIGRAPHX_EP_BATCH_ROWS", "MIGRAPHX_EP_QUICK_PICKS"])
def test_a_switch_value_it_does_not_know_is_an_error_naming_it(monkeypatch, name):
    monkeypatch.setenv(name, "yes")
    nodes, inits = ROWWISE["gemm with bias"]
    with pytest.raises(ValueError, match=f"{name}='yes': expected one of auto, 0, 1"):
        c = create_ep({"migraphx_target": "ref"}).compile(one_node_graph(nodes, None, inits), "fused_0")
        c.run([np.ones((3, 6), np.float32)])


def test_a_bad_switch_fails_the_session_not_the_process(monkeypatch):
    monkeypatch.setenv("MIGRAPHX_EP_BATCH_ROWS", "on")
    model = os.path.join(MODELS, "resnet.onnx")
    with pytest.raises(Exception, match="MIGRAPHX_EP_BATCH_ROWS='on'"):
        providers = [(EP, {"migraphx_target": "ref"}), "CPUExecutionProvider"]
        sess = ort.InferenceSession(model, providers=providers)
        sess.run(None, {"pixel_values": np.zeros((3, 3, 32, 32), np.float32)})


def test_a_destroyed_session_is_freed_while_its_background_compiles_wait(monkeypatch):
    # Queued background jobs (here: each session's timed recompile, waiting behind a busy background
    # thread) must not keep a destroyed session's subgraph and programs alive: a server creating and
    # dropping sessions would hold every one of them, device memory included, until the queue drains.
    monkeypatch.setenv("MIGRAPHX_EP_QUICK_PICKS", "1")
    monkeypatch.setattr(background_compiles, "QUIET_S", 0.0)
    nodes, inits = ROWWISE["gemm with bias"]
    gate = threading.Event()
    assert BACKGROUND.submit(lambda: gate.wait(30))  # the thread is busy: the jobs below wait
    try:
        refs = []
        for _ in range(3):
            c = create_ep({"migraphx_target": "ref"}).compile(one_node_graph(nodes, None, inits), "fused_0")
            c.run([np.ones((3, 6), np.float32)])  # quick: its timed compile is queued
            assert c.programs[((3, 6),)].quick_picks
            refs += [weakref.ref(c), weakref.ref(c.programs[((3, 6),)])]
            c.release()
            del c
        gc.collect()
        assert [r() for r in refs] == [None] * len(refs)
    finally:
        gate.set()
        assert wait_for_compiles(30)

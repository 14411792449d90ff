"""The shell's native Run path (csrc/native_run.h) on the GPU: after a shape's first Runs (the second
captures its graph), Compute runs the captured graph without entering Python, with right answers,
device errors still raised, concurrent Runs exclusive with Python Runs, and MIGRAPHX_EP_NATIVE_RUN=0 as
the off switch."""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto
from onnx import helper as oh

import migraphx_ep  # noqa: F401 - registers and routes the EP
from conftest import make_model, tensor
from migraphx_ep.testing import capture_compiled
from test_models_ep import MODELS, feeds_for

from .conftest import count_python_runs

pytestmark = pytest.mark.gpu

EP = "MIGraphXExecutionProvider"
GPU = {"migraphx_target": "gpu", "migraphx_tf32_enable": "0"}


def _bert() -> tuple[bytes, onnx.ModelProto]:
    model = onnx.load(os.path.join(MODELS, "bert.onnx"))
    return model.SerializeToString(), model


def _session(blob: bytes) -> ort.InferenceSession:
    return ort.InferenceSession(blob, providers=[(EP, GPU), "CPUExecutionProvider"])


def _cpu(blob: bytes, feeds: dict) -> list[np.ndarray]:
    return ort.InferenceSession(blob, providers=["CPUExecutionProvider"]).run(None, feeds)


def _close(got: list[np.ndarray], want: list[np.ndarray]) -> None:
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4 * float(np.abs(w).max()))


def test_repeat_runs_skip_python_and_stay_right(python_runs):
    blob, model = _bert()
    sess = _session(blob)
    feeds = [feeds_for(model, batch=2, seq=9, seed=s) for s in range(4)]
    for f in feeds:  # one shape: the first Run compiles in Python, the rest are native
        _close(sess.run(None, f), _cpu(blob, f))
    assert python_runs["n"] == 1
    other = feeds_for(model, batch=3, seq=5, seed=7)  # a new shape: Python once more, then native
    for _ in range(3):
        _close(sess.run(None, other), _cpu(blob, other))
    assert python_runs["n"] == 2
    _close(sess.run(None, feeds[0]), _cpu(blob, feeds[0]))  # the first plan is still there
    assert python_runs["n"] == 2


def test_switch_off(python_runs, monkeypatch):
    monkeypatch.setenv("MIGRAPHX_EP_NATIVE_RUN", "0")  # read when the session compiles
    blob, model = _bert()
    sess = _session(blob)
    f = feeds_for(model, batch=2, seq=9)
    for _ in range(3):
        _close(sess.run(None, f), _cpu(blob, f))
    assert python_runs["n"] == 3


def _gather_model() -> bytes:
    table = oh.make_tensor("table", TensorProto.FLOAT, [5, 3], np.arange(15, dtype=np.float32).tolist())
    return make_model(
        [oh.make_node("Gather", ["table", "idx"], ["g"]), oh.make_node("Relu", ["g"], ["y"])],
        [tensor("idx", TensorProto.INT64, [4])],
        [tensor("y", TensorProto.FLOAT, [4, 3])],
        [table],
    )


def test_device_error_after_native_runs(python_runs):
    """An index out of range found by a kernel on the native path is raised as the ref raises it, and the
    session keeps working."""
    blob = _gather_model()
    sess = _session(blob)
    good = {"idx": np.array([0, 4, 2, -1], np.int64)}
    for _ in range(2):
        _close(sess.run(None, good), _cpu(blob, good))
    assert python_runs["n"] == 1
    with pytest.raises(Exception, match="out of range|out of bounds"):
        sess.run(None, {"idx": np.array([0, 5, 1, 1], np.int64)})
    _close(sess.run(None, good), _cpu(blob, good))


def test_constant_outputs_native(python_runs):
    """An output computed at compile time is copied by the shell too (here Abs(c) is a partition of its
    own with no inputs and nothing to launch)."""
    c = oh.make_tensor("c", TensorProto.FLOAT, [2], [1.5, -2.0])
    blob = make_model(
        [oh.make_node("Relu", ["x"], ["y"]), oh.make_node("Abs", ["c"], ["k"])],
        [tensor("x", TensorProto.FLOAT, [2, 3])],
        [tensor("y", TensorProto.FLOAT, [2, 3]), tensor("k", TensorProto.FLOAT, [2])],
        [c],
    )
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # keep Abs(c) for the EP
    sess = ort.InferenceSession(blob, so, providers=[(EP, GPU), "CPUExecutionProvider"])
    x = np.array([[-1, 2, -3], [4, -5, 6]], np.float32)
    first = 0
    for _ in range(3):
        y, k = sess.run(None, {"x": x})
        np.testing.assert_array_equal(y, np.maximum(x, 0))
        np.testing.assert_array_equal(k, [1.5, 2.0])
        first = first or python_runs["n"]
    assert 1 <= first == python_runs["n"]  # each partition's first Run only


def test_threads_mix_native_and_python_runs():
    """Threads run one session at two shapes while new shapes compile: every answer is right (the native
    and Python Runs of one executable share its lock)."""
    blob, model = _bert()
    sess = _session(blob)
    shapes = [(1, 7), (2, 9), (3, 4), (2, 16)]
    feeds = {s: feeds_for(model, batch=s[0], seq=s[1], seed=sum(s)) for s in shapes}
    want = {s: _cpu(blob, f) for s, f in feeds.items()}
    errors: list[BaseException] = []
    lock = threading.Lock()

    def work(k: int) -> None:
        for j in range(12):
            s = shapes[(k + j) % len(shapes)]
            try:
                _close(sess.run(None, feeds[s]), want[s])
            except BaseException as e:  # noqa: BLE001 - reported below
                with lock:
                    errors.append(e)

    with ThreadPoolExecutor(4) as ex:
        list(ex.map(work, range(4)))
    assert not errors, errors[:3]


def test_concurrent_native_runs_get_their_own_contexts():
    """Threads hammering one shape make the program grow execution contexts (their own arenas and graphs)
    and every answer stays exact."""
    blob, model = _bert()
    with capture_compiled() as compiled:
        sess = _session(blob)
    f = feeds_for(model, batch=2, seq=9)
    want = sess.run(None, f)
    barrier = threading.Barrier(4)

    def work(_: int) -> bool:
        barrier.wait()
        return all(
            all(np.array_equal(g, w) for g, w in zip(sess.run(None, f), want, strict=True)) for _ in range(40)
        )

    with ThreadPoolExecutor(4) as ex:
        assert all(ex.map(work, range(4)))
    exes = [p._exe for c in compiled for p in c.programs.values()]
    assert max(len(e.contexts) for e in exes) > 1


def test_a_refused_plan_is_not_asked_for_again(monkeypatch):
    # The ref target has no native plan: Compute asks Python once per dims, not after every Run.
    from migraphx_ep.ep import bridge

    asked = {"n": 0}
    real = bridge.native_plan

    def counting(*args):
        asked["n"] += 1
        return real(*args)

    monkeypatch.setattr(bridge, "native_plan", counting)
    blob, model = _bert()
    sess = ort.InferenceSession(blob, providers=[(EP, {"migraphx_target": "ref"}), "CPUExecutionProvider"])
    f = feeds_for(model, batch=2, seq=9, seed=0)
    for _ in range(4):
        _close(sess.run(None, f), _cpu(blob, f))
    assert asked["n"] == 1
    g = feeds_for(model, batch=3, seq=5, seed=1)
    for _ in range(3):
        _close(sess.run(None, g), _cpu(blob, g))
    assert asked["n"] == 2


def test_more_shapes_than_plans_keep_the_hot_ones_native(python_runs):
    # max_compiled_models=2: a third shape's plan replaces the least recently used one (whose
    # executable is freed once no Run holds it), so every shape in use runs natively again after one
    # Python Run -- before, past two plans every new shape ran through Python for good.
    blob, model = _bert()
    sess = ort.InferenceSession(
        blob, providers=[(EP, {**GPU, "migraphx_max_compiled_models": "2"}), "CPUExecutionProvider"]
    )
    shapes = [feeds_for(model, batch=b, seq=9, seed=b) for b in (1, 2, 3)]
    want = [_cpu(blob, f) for f in shapes]
    for i in (0, 1, 2, 1, 2, 0):  # each first Run of a shape (or of an evicted one) goes through Python
        n = python_runs["n"]
        _close(sess.run(None, shapes[i]), want[i])
        went_python = python_runs["n"] - n
        _close(sess.run(None, shapes[i]), want[i])
        _close(sess.run(None, shapes[i]), want[i])
        assert python_runs["n"] - n == went_python <= 1  # the repeats are native
    assert python_runs["n"] == 4  # shapes 1, 2, 3 once each, and 1 again after its plan was evicted


def test_a_programs_first_run_is_its_warm_up(gpu, monkeypatch):
    # A new program does not warm up when compiled: its first Run launches the steps eagerly, which
    # warms them up; no graph is captured for a shape met once. The second Run captures and replays the
    # graph, and the native plan asked for after it uses that graph. One execution per Run, the same
    # answers.
    from migraphx_ep.frontend import model_to_dict, parse_graph
    from migraphx_ep.ir.dtypes import from_onnx
    from migraphx_ep.ir.shape import Shape
    from migraphx_ep.timing import record

    monkeypatch.delenv("MIGRAPHX_EP_CAPTURE_RUN", raising=False)
    blob, model = _bert()
    g = model_to_dict(model)
    shapes = {n: Shape(from_onnx(g["values"][n]["dtype"]), (2, 9)) for n in g["inputs"]}
    prog = parse_graph(g, shapes, specialize=True).program
    with record() as t:
        prog.compile(gpu)  # TF32 off, as the CPU EP it is compared with
    exe = prog._exe
    assert "warm-up" not in t.stages and "graph capture" not in t.stages
    ctx = exe.contexts[0]
    assert not ctx.warm and not ctx.captured
    feeds = [feeds_for(model, batch=2, seq=9, seed=s) for s in range(4)]
    names = list(exe.lowered.inputs)
    with record() as first:
        got = prog.run_numpy(feeds[0])
    assert ctx.warm and not ctx.captured and "warm-up" not in first.stages and "first run" in first.stages
    _close(got, _cpu(blob, feeds[0]))
    assert exe.native_plan(names, [feeds[0][n] for n in names], 4) is False  # not yet: ask after a Run
    assert not ctx.captured
    with record() as second:
        got = prog.run_numpy(feeds[1])
    assert ctx.captured and ctx.graph is not None
    assert "graph capture" in second.stages and not {"warm-up", "first run"} & set(second.stages)
    _close(got, _cpu(blob, feeds[1]))
    assert exe.native_plan(names, [feeds[1][n] for n in names], 4) is not None
    for f in feeds[2:]:  # graph replays now
        _close(prog.run_numpy(f), _cpu(blob, f))


def test_a_shape_met_once_captures_no_graph(monkeypatch):
    # The default (MIGRAPHX_EP_CAPTURE_RUN=2) through ORT: a shape's first Run is eager and captures
    # nothing, its second captures in Python, the rest run natively; MIGRAPHX_EP_CAPTURE_RUN=1 captures
    # at the first Run (test_repeat_runs_skip_python_and_stay_right counts that).
    monkeypatch.setenv("MIGRAPHX_EP_BATCH_ROWS", "0")
    monkeypatch.setenv("MIGRAPHX_EP_QUICK_PICKS", "0")  # no timed program replacing one meanwhile
    calls = count_python_runs(monkeypatch)
    monkeypatch.delenv("MIGRAPHX_EP_CAPTURE_RUN")  # the helper pins it to 1: the default here
    blob, model = _bert()
    with capture_compiled() as compiled:
        sess = _session(blob)
    once = feeds_for(model, batch=1, seq=5, seed=3)
    _close(sess.run(None, once), _cpu(blob, once))
    often = [feeds_for(model, batch=2, seq=9, seed=s) for s in range(5)]
    for f in often:
        _close(sess.run(None, f), _cpu(blob, f))
    assert calls["n"] == 3  # once: 1; often: 2 (eager, then the capture), then native
    progs = {k: p for c in compiled for k, p in c.programs.items()}
    captured = {k[0]: p._exe.contexts[0].captured for k, p in progs.items()}
    assert captured == {(1, 5): False, (2, 9): True}


def test_python_runs_borrow_one_pinned_buffer_per_thread(monkeypatch):
    # A never-seen shape's first Runs go through Python, their outputs staged in pinned memory: one
    # buffer per thread (and device), which every program borrows and which grows with the outputs.
    from migraphx_ep.targets.gpu import executable

    monkeypatch.setenv("MIGRAPHX_EP_NATIVE_RUN", "0")  # every Run through Python
    monkeypatch.setattr(executable, "_STAGING", threading.local())
    blob, model = _bert()
    sess = _session(blob)
    bufs = []
    for batch, seq in ((1, 4), (2, 9), (1, 5), (3, 31), (2, 9)):
        f = feeds_for(model, batch=batch, seq=seq, seed=batch + seq)
        _close(sess.run(None, f), _cpu(blob, f))
        (buf,) = executable._STAGING.pools.values()
        bufs.append(buf)
    assert bufs[0] is not bufs[1]  # grown for the larger outputs
    assert bufs[1] is bufs[2] and bufs[3] is bufs[4]  # shared by programs that fit (and kept)

    def run(batch: int, seq: int) -> None:  # other threads: buffers of their own, right answers
        for s in range(3):
            f = feeds_for(model, batch=batch, seq=seq, seed=s)
            _close(sess.run(None, f), _cpu(blob, f))

    with ThreadPoolExecutor(3) as ex:
        list(ex.map(run, (1, 2, 3), (7, 11, 13)))

"""Batch rows on the GPU (ep/batch_serve.py, on by default for the gpu target): a never-seen batch size
runs at once on a larger batch's program -- right answers with numpy feeds and with IOBinding -- while
its own program compiles in the background; then its Runs take the native path."""

from __future__ import annotations

import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import migraphx_ep  # noqa: F401 - registers and routes the EP
from migraphx_ep.ep.background import wait_for_compiles
from test_models_ep import MODELS, feeds_for

from .conftest import count_python_runs

pytestmark = pytest.mark.gpu

EP = "MIGraphXExecutionProvider"
GPU = {"migraphx_target": "gpu", "migraphx_tf32_enable": "0"}


def _close(got: list[np.ndarray], want: list[np.ndarray]) -> None:
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
        tol = 2e-2 if w.dtype == np.float16 else 1e-4  # fp16 GEMMs/convs against ORT CPU's fp16
        np.testing.assert_allclose(g, w, rtol=tol, atol=tol * float(np.abs(w).max()))


@pytest.fixture
def counted(monkeypatch, recording):
    """Python Compute calls, and the EP's subgraphs (``recording``), with batch rows on."""
    from migraphx_ep.ep import background_compiles

    monkeypatch.setenv("MIGRAPHX_EP_BATCH_ROWS", "1")
    monkeypatch.setattr(background_compiles, "QUIET_S", 0.0)  # no quiet second to wait for
    return count_python_runs(monkeypatch)


@pytest.mark.parametrize("name", ["bert", "resnet_fp16"])
def test_never_seen_batches_are_served_then_compiled(name, counted, recording):
    model = onnx.load(os.path.join(MODELS, f"{name}.onnx"))
    blob = model.SerializeToString()
    sess = ort.InferenceSession(blob, providers=[(EP, GPU), "CPUExecutionProvider"])
    cpu = ort.InferenceSession(blob, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)

    def feeds(b: int, seed: int) -> dict[str, np.ndarray]:
        if name == "bert":
            return feeds_for(model, batch=b, seq=9, seed=seed)
        return {"pixel_values": rng.standard_normal((b, 3, 32, 32)).astype(np.float16)}

    f3 = feeds(3, 1)
    _close(sess.run(None, f3), cpu.run(None, f3))  # compiles batch 4; 3 is served by it
    (sub,) = [c for c in recording.eps[-1].compiled if c.rows is not None]
    compiles = sub.compiles
    for b in (2, 1, 3):
        f = feeds(b, b)
        _close(sess.run(None, f), cpu.run(None, f))  # never seen (or not compiled yet): no foreground compile
    assert sub.compiles - compiles <= 3  # only background compiles (3's may have finished already)
    wait_for_compiles()
    assert sorted(k[0][0] for k in sub.programs) == [1, 2, 3, 4]
    n = counted["n"]
    _close(sess.run(None, f3), cpu.run(None, f3))  # its own program (Python hands the shell its plan)
    assert counted["n"] - n <= 1
    n = counted["n"]
    for _ in range(3):
        _close(sess.run(None, f3), cpu.run(None, f3))
    assert counted["n"] == n  # native from then on


def test_a_served_batch_with_iobinding(counted, recording):
    model = onnx.load(os.path.join(MODELS, "bert.onnx"))
    blob = model.SerializeToString()
    sess = ort.InferenceSession(blob, providers=[(EP, GPU), "CPUExecutionProvider"])
    cpu = ort.InferenceSession(blob, providers=["CPUExecutionProvider"])
    sess.run(None, feeds_for(model, batch=4, seq=9, seed=0))  # batch 4 compiled
    f = feeds_for(model, batch=3, seq=9, seed=3)
    io = sess.io_binding()
    for k, v in f.items():
        io.bind_ortvalue_input(k, ort.OrtValue.ortvalue_from_numpy(v, "cuda", 0))
    for o in sess.get_outputs():
        io.bind_output(o.name, "cuda", 0)
    sess.run_with_iobinding(io)  # served by batch 4's program, inputs and outputs on the device
    _close(io.copy_outputs_to_cpu(), cpu.run(None, f))
    wait_for_compiles()


def test_a_quick_program_gives_way_to_the_timed_one(monkeypatch, recording):
    # The first compile of a shape takes the libraries' untimed picks; the timed program replaces it in
    # the background and the shell's plan of the quick one is revoked: one Python Run, then native.
    from migraphx_ep.ep import background_compiles

    monkeypatch.setenv("MIGRAPHX_EP_QUICK_PICKS", "1")
    monkeypatch.setenv("MIGRAPHX_EP_BATCH_ROWS", "0")
    monkeypatch.setattr(background_compiles, "QUIET_S", 0.0)
    calls = count_python_runs(monkeypatch)
    blob = onnx.load(os.path.join(MODELS, "resnet_fp16.onnx")).SerializeToString()
    sess = ort.InferenceSession(blob, providers=[(EP, GPU), "CPUExecutionProvider"])
    cpu = ort.InferenceSession(blob, providers=["CPUExecutionProvider"])
    f = {"pixel_values": np.random.default_rng(0).standard_normal((2, 3, 32, 32)).astype(np.float16)}
    want = cpu.run(None, f)
    _close(sess.run(None, f), want)
    (sub,) = recording.eps[-1].compiled
    quick = sub.programs[next(iter(sub.programs))]
    wait_for_compiles()
    timed = sub.programs[next(iter(sub.programs))]
    assert getattr(quick, "quick_picks", False) and timed is not quick and not timed.quick_picks
    assert not quick._exe.token.valid
    _close(sess.run(None, f), want)  # the revoked plan: Python hands the shell the timed program's
    n = calls["n"]
    for _ in range(3):
        _close(sess.run(None, f), want)
    assert calls["n"] == n

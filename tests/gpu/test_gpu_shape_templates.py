"""Shape templates on the GPU (ep/shape_template.py, on by default for the gpu target): once five
sequence lengths compiled, a never-seen one is instantiated -- no parse, no passes, no NVRTC compile --
and answers as ORT's CPU EP does, with numpy feeds and after its timed program replaced it."""

from __future__ import annotations

import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import migraphx_ep  # noqa: F401 - registers and routes the EP
from migraphx_ep.ep.background import wait_for_compiles
from migraphx_ep.targets.gpu import nvrtc
from test_models_ep import MODELS, feeds_for

pytestmark = pytest.mark.gpu

EP = "MIGraphXExecutionProvider"
GPU = {"migraphx_target": "gpu", "migraphx_tf32_enable": "0"}
SEEN = [(2, 8), (3, 5), (2, 13), (4, 9), (3, 16)]  # (batch, sequence): they over-determine the fit
NEW = [(3, 7), (2, 11), (4, 14), (2, 6)]


def _close(got: list[np.ndarray], want: list[np.ndarray]) -> None:
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
        tol = 2e-2 if w.dtype == np.float16 else 1e-4
        np.testing.assert_allclose(g, w, rtol=tol, atol=tol * float(np.abs(w).max()))


@pytest.mark.parametrize("name", ["bert", "bert_fp16", "gpt2_fp16"])
def test_never_seen_sequences_are_instantiated(name, monkeypatch, recording):
    monkeypatch.setenv("MIGRAPHX_EP_BATCH_ROWS", "0")  # every (batch, sequence) is a program of its own
    # Quick picks (off in this suite): the timed programs, compiled in full in the background, are
    # what checks the template.
    monkeypatch.setenv("MIGRAPHX_EP_QUICK_PICKS", "1")
    model = onnx.load(os.path.join(MODELS, f"{name}.onnx"))
    blob = model.SerializeToString()
    sess = ort.InferenceSession(blob, providers=[(EP, GPU), "CPUExecutionProvider"])
    cpu = ort.InferenceSession(blob, providers=["CPUExecutionProvider"])
    for b, s in SEEN:
        f = feeds_for(model, batch=b, seq=s, seed=s)
        _close(sess.run(None, f), cpu.run(None, f))
    (sub,) = [c for c in recording.eps[-1].compiled if c.templates is not None]
    assert sub.templates.templates, "five programs of one structure fit a template"
    compiled = nvrtc.compile_count()
    for b, s in NEW:
        f = feeds_for(model, batch=b, seq=s, seed=s)
        _close(sess.run(None, f), cpu.run(None, f))
    assert sub.templates.served == len(NEW)
    assert nvrtc.compile_count() == compiled, "a never-seen shape compiled kernels"
    wait_for_compiles()  # the timed programs replace the quick ones, and check the template
    assert sub.templates.dropped == 0
    assert any(t.agreed for t in sub.templates.templates.values()), "no full compile checked it"
    for b, s in NEW:
        f = feeds_for(model, batch=b, seq=s, seed=s + 1)
        _close(sess.run(None, f), cpu.run(None, f))


def test_batch_1_and_other_key_splits_compile_no_kernel(monkeypatch):
    # Batch 1 drops the batch dim out of pointwise kernels' sources, and attention splits its keys by
    # block count (here 2 heads: batch 40 and 200 cross both thresholds). The first shapes' kernels
    # compiled those variants beside them (KernelSpec.others): no later shape compiles a kernel.
    monkeypatch.setenv("MIGRAPHX_EP_BATCH_ROWS", "0")
    model = onnx.load(os.path.join(MODELS, "bert_fp16.onnx"))
    blob = model.SerializeToString()
    sess = ort.InferenceSession(blob, providers=[(EP, GPU), "CPUExecutionProvider"])
    cpu = ort.InferenceSession(blob, providers=["CPUExecutionProvider"])
    f = feeds_for(model, batch=2, seq=8, seed=1)
    _close(sess.run(None, f), cpu.run(None, f))
    compiled = nvrtc.compile_count()
    for b, s in [(1, 7), (1, 12), (40, 16), (200, 16), (3, 5)]:
        f = feeds_for(model, batch=b, seq=s, seed=s)
        _close(sess.run(None, f), cpu.run(None, f))
    assert nvrtc.compile_count() == compiled, "a later shape compiled kernels"


def test_new_shapes_after_a_model_cache_load_compile_no_kernel(monkeypatch, tmp_path, recording):
    # A process that loads its program from the model cache holds that program's kernels only in the
    # program: they join the process's cache, and their variants (batch 1, other key splits) compile
    # in the background, so later shapes compile no kernel, as in the process that compiled it.
    monkeypatch.setenv("MIGRAPHX_EP_BATCH_ROWS", "0")
    monkeypatch.delenv("MIGRAPHX_EP_KERNEL_CACHE", raising=False)
    model = onnx.load(os.path.join(MODELS, "bert_fp16.onnx"))
    blob = model.SerializeToString()
    options = {**GPU, "migraphx_model_cache_dir": str(tmp_path)}
    cpu = ort.InferenceSession(blob, providers=["CPUExecutionProvider"])
    f = feeds_for(model, batch=2, seq=8, seed=1)
    ort.InferenceSession(blob, providers=[(EP, options), "CPUExecutionProvider"]).run(None, f)
    wait_for_compiles()
    monkeypatch.setattr(nvrtc, "_CACHE", {})  # as a new process starts: no kernel in memory
    sess = ort.InferenceSession(blob, providers=[(EP, options), "CPUExecutionProvider"])
    _close(sess.run(None, f), cpu.run(None, f))
    assert recording.counts() == (0, 1), "the program was not loaded from the model cache"
    (sub,) = recording.eps[-1].compiled
    (prog,) = sub.programs.values()
    assert prog._exe.variants is not None and prog._exe.variants.result(timeout=300) > 0
    compiled = nvrtc.compile_count()
    for b, s in [(1, 7), (2, 12), (40, 16), (200, 16)]:
        f = feeds_for(model, batch=b, seq=s, seed=s)
        _close(sess.run(None, f), cpu.run(None, f))
    assert recording.counts()[0] >= 4, "the later shapes compiled no program: nothing was tested"
    assert nvrtc.compile_count() == compiled, "a shape after the model-cache load compiled kernels"

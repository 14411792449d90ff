"""A quick cuDNN pick for a convolution layer at a new image size takes the algorithm picked for the
same layer at another size (tuning.LayerPicks) instead of asking cuDNN's heuristic again (~2.5 ms per
convolution on the H100 host; ResNet-50 spent 49 ms of each never-seen image size on it)."""

from __future__ import annotations

import pytest

from migraphx_ep.targets.gpu import conv_search, dnn, tuning

from .test_vendor_libs import CONV_CASES, F16, cudnn, gpu, run_conv  # noqa: F401 - cudnn: a fixture

needs_cudnn = pytest.mark.usefixtures("cudnn")
HEURISTIC = "cudnnGetConvolutionForwardAlgorithm_v7"


def test_a_timed_pick_replaces_any_a_quick_one_only_a_quick_one():
    picks = tuning.LayerPicks()
    picks.put("conv1", 1, 0, timed=False)
    picks.put("conv1", 2, 0, timed=False)
    assert picks.get("conv1") == (2, 0)
    picks.put("conv1", 6, 1, timed=True)
    picks.put("conv1", 3, 0, timed=False)  # a quick pick does not undo a timed one
    assert picks.get("conv1") == (6, 1) and picks.get("conv2") is None


def _fresh(monkeypatch) -> list[str]:
    """Fresh pick memos; returns the names of the cuDNN calls the plans make from now on."""
    layers = tuning.LayerPicks()
    monkeypatch.setattr(tuning, "LAYERS", layers)
    monkeypatch.setattr(conv_search, "LAYERS", layers)
    monkeypatch.setattr(tuning, "PICKS", tuning.PickMemo())
    calls: list[str] = []
    real = dnn.ConvPlan._call

    def counted(self, fn, *args):
        calls.append(fn)
        return real(self, fn, *args)

    monkeypatch.setattr(dnn.ConvPlan, "_call", counted)
    return calls


@gpu
@needs_cudnn
def test_a_layer_at_a_new_size_takes_its_pick_without_the_heuristic(cuda, monkeypatch):
    calls = _fresh(monkeypatch)
    x, w, *geometry = CONV_CASES["3x3"]
    monkeypatch.setitem(CONV_CASES, "3x3-wide", ((1, x[1], 20, 33), w, *geometry))
    monkeypatch.setitem(CONV_CASES, "3x3-other-weights", ((1, x[1], 20, 33), (8, *w[1:]), *geometry))
    opts = dict(nhwc=True, bias=True, relu=True, exhaustive=False)  # run_conv checks the numbers
    first = run_conv(cuda, F16, "3x3", **opts)
    assert calls.count(HEURISTIC) == 1
    wide = run_conv(cuda, F16, "3x3-wide", **opts)
    assert calls.count(HEURISTIC) == 1, "the heuristic was asked again for the same layer"
    assert (wide.algo, wide.math) == (first.algo, first.math) and not wide.fused
    run_conv(cuda, F16, "3x3-other-weights", **opts)  # another layer: its own heuristic query
    assert calls.count(HEURISTIC) == 2


@gpu
@needs_cudnn
def test_timed_searches_search_and_leave_their_pick_for_the_layer(cuda, monkeypatch):
    _fresh(monkeypatch)
    x, w, *geometry = CONV_CASES["3x3"]
    monkeypatch.setitem(CONV_CASES, "3x3-wide", ((1, x[1], 20, 33), w, *geometry))
    run_conv(cuda, F16, "3x3", exhaustive=False)
    taken: list = []
    monkeypatch.setattr(conv_search, "_layer_pick", lambda *a: taken.append(a) or False)
    timed = run_conv(cuda, F16, "3x3-wide", exhaustive=True)
    assert not taken, "a timed search took the layer's pick"
    assert tuning.LAYERS.get((timed.handle, timed.layer)) == (timed.algo, timed.math)

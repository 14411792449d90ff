"""Library plans are shared by the steps of one program that pose the same problem (executable.py
``bind``): BERT's layers repeat their GEMMs, ResNet's blocks their convolutions, and each distinct one
is planned once per program (a new shape's cost). Results still match ORT's CPU EP."""

from __future__ import annotations

import os

import onnx
import pytest

from migraphx_ep.targets.gpu import blas, dnn
from migraphx_ep.testing import light_input, light_model
from test_models_ep import MODELS, feeds_for

from .test_gpu_models import TF32_OFF, run_on_gpu

pytestmark = pytest.mark.gpu


def _counting(monkeypatch, module, name: str) -> list:
    calls: list = []
    real = getattr(module, name)

    def planned(*args, **kw):
        calls.append(repr((args, sorted(kw.items()))))
        return real(*args, **kw)

    monkeypatch.setattr(module, name, planned)
    return calls


def test_repeated_gemms_are_planned_once(monkeypatch):
    calls = _counting(monkeypatch, blas, "plan_gemm")
    model = onnx.load(os.path.join(MODELS, "bert_fp16.onnx"))  # two identical layers
    run_on_gpu(model, feeds_for(model, batch=2, seq=9), TF32_OFF, rtol=2e-2, atol=2e-2)
    assert calls and len(calls) == len(set(calls)), f"{len(calls) - len(set(calls))} GEMMs planned again"


def test_repeated_convolutions_are_planned_once(monkeypatch):
    calls = _counting(monkeypatch, dnn, "plan_conv")
    model = light_model("resnet50")  # 3-6 identical bottleneck blocks per stage
    run_on_gpu(model, light_input(model), TF32_OFF, rtol=1e-3, atol=1e-4)
    assert calls and len(calls) == len(set(calls)), f"{len(calls) - len(set(calls))} convs planned again"

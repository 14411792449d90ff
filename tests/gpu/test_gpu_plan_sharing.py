"""Library plans are shared by the steps of one program that pose the same problem (executable.py
``bind``): BERT's layers repeat their GEMMs, ResNet's blocks their convolutions, and each distinct one
is planned once per program (a new shape's cost). Results still match ORT's CPU EP."""

from __future__ import annotations

import os

import onnx
import pytest

from migraphx_ep.targets.gpu import dnn, gemm_search
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
    calls = _counting(monkeypatch, gemm_search, "plan_gemm")
    model = onnx.load(os.path.join(MODELS, "bert_fp16.onnx"))  # two identical layers
    run_on_gpu(model, feeds_for(model, batch=2, seq=9), TF32_OFF, rtol=2e-2, atol=2e-2)
    assert calls and len(calls) == len(set(calls)), f"{len(calls) - len(set(calls))} GEMMs planned again"


def test_repeated_convolutions_are_planned_once(monkeypatch):
    calls = _counting(monkeypatch, dnn, "plan_conv")
    model = light_model("resnet50")  # 3-6 identical bottleneck blocks per stage
    run_on_gpu(model, light_input(model), TF32_OFF, rtol=1e-3, atol=1e-4)
    assert calls and len(calls) == len(set(calls)), f"{len(calls) - len(set(calls))} convs planned again"


def test_programs_share_loaded_modules_while_they_live(gpu):
    # A never-seen shape's kernels are nearly all loaded by earlier programs: it takes their modules
    # (held weakly by the process: a module goes when the last program holding it goes).
    from migraphx_ep.frontend import model_to_dict, parse_graph
    from migraphx_ep.ir.dtypes import from_onnx
    from migraphx_ep.ir.shape import Shape

    model = onnx.load(os.path.join(MODELS, "bert_fp16.onnx"))
    g = model_to_dict(model)

    def compiled(b: int, s: int):
        shapes = {n: Shape(from_onnx(g["values"][n]["dtype"]), (b, s)) for n in g["inputs"]}
        prog = parse_graph(g, shapes, specialize=True).program
        prog.compile(gpu)
        prog.run_numpy(feeds_for(model, batch=b, seq=s))
        return prog

    a, b = compiled(2, 9), compiled(3, 7)
    common = set(a._exe._modules) & set(b._exe._modules)
    assert common and all(a._exe._modules[k] is b._exe._modules[k] for k in common)

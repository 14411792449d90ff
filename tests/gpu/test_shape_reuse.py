"""With run-time kernel sizes (the default; MIGRAPHX_EP_RUNTIME_SIZES=0 turns them off) a new input
shape compiles no kernels of the families that take their sizes at run time (codegen level, no GPU):
the lowered program at a second shape has the same kernel sources (under the one symbol ``canonical``
gives them) except for the families that still bake sizes in (row kernels: softmax, layernorm; resize
tables; pooling windows)."""

from __future__ import annotations

import collections
import os

import onnx
import pytest

from migraphx_ep.frontend.graph import model_to_dict
from migraphx_ep.frontend.parser import parse_graph
from migraphx_ep.ir.dtypes import from_onnx
from migraphx_ep.ir.shape import Shape
from migraphx_ep.passes import run_passes
from migraphx_ep.targets.gpu.decompose import gpu_pipeline
from migraphx_ep.targets.gpu.kernels.spec import canonical
from migraphx_ep.targets.gpu.lowering import KernelStep, lower

MODELS = os.path.join(os.path.dirname(__file__), "..", "models")
STILL_BAKED = {"softmax", "layernorm", "resize"}


def bodies(name: str, dims: dict[str, int]) -> dict[str, str]:
    """canonical kernel source -> kind, for ``name`` lowered at ``dims`` (symbolic dim -> size)."""
    g = model_to_dict(onnx.load(os.path.join(MODELS, f"{name}.onnx")))
    shapes = {}
    for n in g["inputs"]:
        info = g["values"][n]
        lens = [d if isinstance(d, int) else dims[d] for d in info["shape"]]
        shapes[n] = Shape(from_onnx(info["dtype"]), lens)
    m = parse_graph(g, shapes, specialize=True).program.get_main_module()
    run_passes(m, gpu_pipeline())
    out = {}
    for s in lower(m, True, True).steps:
        if isinstance(s, KernelStep):
            kind = s.op.name if s.op is not None else s.label.split()[0]
            out[canonical(s.spec).source] = "pointwise" if s.expr is not None else kind
    return out


@pytest.fixture(autouse=True)
def runtime_sizes(monkeypatch):
    monkeypatch.setenv("MIGRAPHX_EP_RUNTIME_SIZES", "1")


def new_kinds(name: str, first: dict[str, int], second: dict[str, int]) -> collections.Counter:
    seen = bodies(name, first)
    return collections.Counter(k for src, k in bodies(name, second).items() if src not in seen)


def test_cnn_new_batch_compiles_nothing():
    assert new_kinds("resnet", {"batch": 2}, {"batch": 5}) == collections.Counter()


@pytest.mark.parametrize("name", ["bert", "gpt2"])
def test_transformer_new_shape_compiles_only_row_kernels(name):
    new = new_kinds(name, {"batch": 2, "sequence": 16}, {"batch": 3, "sequence": 24})
    assert set(new) <= STILL_BAKED and sum(new.values()) <= 2, new


def test_without_the_switch_sizes_are_baked(monkeypatch):
    """MIGRAPHX_EP_RUNTIME_SIZES=0 (the fully specialised baseline bench/shapes.py compares with): every
    size is a literal, so a new batch needs new kernels; this is what the tests above rule out."""
    monkeypatch.setenv("MIGRAPHX_EP_RUNTIME_SIZES", "0")
    assert sum(new_kinds("resnet", {"batch": 2}, {"batch": 5}).values()) > 0

"""KernelMemo (targets/gpu/kernel_memo.py): a lowering generates each distinct kernel once and renames it
for the other instructions. Without a GPU: every shipped model lowers to exactly the steps and kernel
specs (source, launch sizes, run-time arguments, checks) it lowers to with every kernel generated anew."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from migraphx_ep.ir.operation import Literal, Op
from migraphx_ep.ir.shape import Shape
from migraphx_ep.ops.views import Transpose
from migraphx_ep.targets.gpu.kernel_memo import KernelMemo, op_key
from migraphx_ep.targets.gpu.steps import KernelStep

from .test_lowering_sim import CASES, _lower, _program

MODELS = Path(__file__).resolve().parents[1] / "models"


def _specs(lowered) -> list:
    return [(s.label, s.spec) for s in lowered.steps if isinstance(s, KernelStep)]


@pytest.mark.parametrize("name", CASES)
def test_every_model_lowers_to_the_kernels_it_generates_anew(name, monkeypatch):
    prog = _program(name)
    memo = _lower(prog)
    monkeypatch.setattr(KernelMemo, "spec", lambda self, key, n, make: make(n))
    fresh = _lower(prog)
    assert _specs(memo) == _specs(fresh)


def test_repeated_layers_generate_one_kernel(monkeypatch):
    made: list[KernelMemo] = []
    init = KernelMemo.__init__

    def record(self) -> None:
        init(self)
        made.append(self)

    monkeypatch.setattr(KernelMemo, "__init__", record)
    lowered = _lower(_program("bert_fp16.onnx"))  # two identical layers
    (memo,) = made
    steps = [s for s in lowered.steps if isinstance(s, KernelStep)]
    assert memo.generated + memo.reused == len(steps)
    assert memo.reused >= len(steps) // 3, (memo.generated, memo.reused)
    names = [s.spec.name for s in steps]
    assert len(set(names)) == len(names)  # each step keeps its own symbol (error messages, traces)
    for s in steps:
        assert f" {s.spec.name}(" in s.spec.source


def test_keys_are_exact():
    t = Transpose(permutation=(0, 2, 1, 3))
    assert op_key(t) == op_key(Transpose(permutation=(0, 2, 1, 3)))
    assert op_key(t) != op_key(Transpose(permutation=(0, 1, 3, 2)))
    a, b = np.zeros(3, np.float32), np.array([0.0, 0.0, -0.0], np.float32)
    assert op_key(Literal(a)) != op_key(Literal(b))  # by bytes: -0.0 is not 0.0

    @dataclasses.dataclass(frozen=True)
    class Table(Op):  # an attribute whose repr is not exact (numpy elides long arrays)
        table: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(2000))

    assert op_key(Table()) is None
    memo, made = KernelMemo(), []
    spec = Shape  # any object stands in for a spec when the key is None: made each time
    for _ in range(2):
        memo.spec(None, "k", lambda n: made.append(n) or spec)
    assert made == ["k", "k"] and memo.generated == 2 and memo.reused == 0

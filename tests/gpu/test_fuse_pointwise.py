"""fuse_pointwise without a GPU: the pass on chains built in the IR (module before/after, numbers bit for
bit on the ref interpreter, what stays unfused), the fused op lowered to one generated kernel whose
simulated result matches the ref (numbers and kernel counts), and on the test models (the pass's
groups are the kernels the lowering used to make of them, launch for launch, source for source)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from migraphx_ep.frontend.graph import model_to_dict
from migraphx_ep.frontend.parser import parse_graph
from migraphx_ep.frontend.probe import fixed_dims
from migraphx_ep.ir.instruction import Instruction
from migraphx_ep.ir.module import Module
from migraphx_ep.ir.operation import make_op
from migraphx_ep.passes import DEAD_CODE_ELIMINATION, run_passes
from migraphx_ep.targets import get_target
from migraphx_ep.targets.gpu.decompose import gpu_pipeline
from migraphx_ep.targets.gpu.fuse import FUSE_POINTWISE, fuse_pointwise
from migraphx_ep.targets.gpu.fuse.pointwise import pointwise_groups
from migraphx_ep.targets.gpu.lowering import lower
from migraphx_ep.targets.gpu.simulate import run_steps
from migraphx_ep.targets.gpu.steps import KernelStep
from migraphx_ep.targets.gpu.support import kernel_supported
from passes.passcheck import Build, check_pass, random_inputs

PASSES = [FUSE_POINTWISE, DEAD_CODE_ELIMINATION]
MODELS = Path(__file__).resolve().parents[1] / "models"


def fused(m: Module) -> list[Instruction]:
    return [i for i in m.instructions if i.name == "fused_pointwise"]


def steps_of(m: Module, ref: Module) -> list[str]:
    """The labels of ``m``'s lowered steps, after checking their simulated numbers against ``ref``."""
    low = lower(m, use_blas=True, use_dnn=True)
    feeds = random_inputs(ref, specials=False)
    for got, want in zip(run_steps(low, feeds), run_steps(lower(ref, True, True), feeds), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    return [s.label for s in low.steps]


def gelu(b: Build, x: Instruction, lens: list[int]) -> Instruction:
    """0.5 * x * (1 + erf(x / sqrt(2))), constants broadcast from one-element literals (as parsed)."""

    def c(v: float) -> Instruction:
        return b("multibroadcast", b.lit(v), out_lens=lens)

    return b("mul", b("mul", x, c(0.5)), b("add", b("erf", b("div", x, c(2**0.5))), c(1.0)))


def gelu_chain() -> Module:
    b = Build()
    return b.ret(gelu(b, b.param("x", [4, 8]), [4, 8]))


def expected_gelu() -> Module:
    """One fused op on x alone: the chain's constants are inside its body."""
    b = Build()
    x = b.param("x", [4, 8])
    body = Module("main:fused_pointwise0")
    inner = Build()
    inner.m = body
    body.add_return([gelu(inner, body.add_parameter("x0", x.shape), [4, 8])])
    return b.ret(b.m.add_instruction(make_op("fused_pointwise"), [x], [body]))


def test_gelu_becomes_one_instruction_owning_it() -> None:
    m = check_pass(PASSES, gelu_chain, expected_gelu)
    (f,) = fused(m)
    assert kernel_supported(f) is None
    assert steps_of(m, gelu_chain()) == ["pointwise mul"]
    with_constants = lower(m, True, True).steps[0]
    assert isinstance(with_constants, KernelStep) and len(with_constants.reads) == 1  # constants are literals


def test_a_value_read_twice_is_computed_once_and_read_by_both() -> None:
    def build() -> Module:
        b = Build()
        x, y = b.param("x", [3, 5]), b.param("y", [3, 5])
        e = b("exp", b("add", x, y))  # read twice: the root of its own kernel
        return b.ret(b("sigmoid", b("mul", e, e)), b("neg", b("abs", e)))

    m = check_pass(PASSES, build)
    groups = sorted(len(f.module_args[0].instructions) for f in fused(m))
    assert len(fused(m)) == 3 and groups == [4, 4, 5]  # exp(x+y), sigmoid(e*e), neg(abs(e)): params + ret
    assert steps_of(m, build()) == ["pointwise exp", "pointwise sigmoid", "pointwise neg"]


def test_inputs_are_the_kernels_arguments_in_walk_order() -> None:
    def build() -> Module:
        b = Build()
        x, y, z = (b.param(n, [2, 6]) for n in "xyz")
        return b.ret(b("add", b("mul", z, y), b("sub", x, z)))

    m = check_pass(PASSES, build)
    (f,) = fused(m)
    assert [a.op.parameter for a in f.inputs] == ["z", "y", "x"]  # z once, though read twice
    assert steps_of(m, build()) == ["pointwise add"]


def test_a_lone_op_a_vector_constant_and_mixed_types() -> None:
    def build() -> Module:
        b = Build()
        x = b.param("x", [4, 3])
        bias = b("multibroadcast", b.lit([1.0, 2.0, 3.0]), out_lens=[4, 3])  # not one element: an input
        lone = b("relu", b("dot", b("neg", x), b.param("w", [3, 3])))  # neg: read by a GEMM, alone
        flag = b("greater", b("add", lone, bias), b("multibroadcast", b.lit(0.5), out_lens=[4, 3]))
        return b.ret(b("convert", flag, target_type=1), lone)  # bool -> float inside the chain

    m = check_pass(PASSES, build)
    (f,) = fused(m)
    assert [a.name for a in f.inputs] == ["relu", "multibroadcast"]
    assert not any(i.name in ("add", "greater") for i in m.instructions)
    assert {i.name for i in m.instructions} >= {"neg", "relu"}  # alone: not wrapped
    assert [s.split()[-1] for s in steps_of(m, build())] == ["neg", "1x4x3x3", "relu", "convert"]


def test_a_returned_intermediate_stays_its_own_value() -> None:
    def build() -> Module:
        b = Build()
        x = b.param("x", [8])
        t = b("tanh", b("mul", x, x))
        return b.ret(b("exp", t), t)

    m = check_pass(PASSES, build)
    assert [len(f.module_args[0].instructions) for f in fused(m)] == [4]  # tanh(x*x); exp stays alone
    assert steps_of(m, build()) == ["pointwise tanh", "pointwise exp"]


def test_fused_bodies_are_left_alone() -> None:
    m = check_pass(PASSES, gelu_chain)
    body = fused(m)[0].module_args[0]
    assert not fuse_pointwise(body)


def test_the_switch_leaves_one_kernel_per_op(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MIGRAPHX_EP_DISABLE_PASSES", "fuse_pointwise")
    m = gelu_chain()
    run_passes(m, gpu_pipeline())
    assert not fused(m)
    assert len(steps_of(m, gelu_chain())) == 5  # div, erf, add, mul, mul


@pytest.mark.parametrize("name", ["bert.onnx", "gpt2_fp16.onnx", "vit_fp16.onnx", "resnet_bn.onnx"])
def test_models_every_group_is_one_kernel_and_nothing_pointwise_is_left_chained(name: str) -> None:
    prog = parse_graph(model_to_dict(onnx.load(MODELS / name)), resolve_dim=fixed_dims(2)).program
    ref = prog.clone()
    ref.compile(get_target("ref"))
    m = prog.get_main_module()
    run_passes(m, gpu_pipeline())
    assert fused(m)
    assert all(len(g) == 1 for g in pointwise_groups(m).values())  # every chain is in a fused op
    low = lower(m, use_blas=True, use_dnn=True)
    pointwise = [s for s in low.steps if s.label.startswith("pointwise")]
    loose = [i for i in m.instructions if i.name == "fused_pointwise" or pointwise_groups(m).get(id(i))]
    assert len(pointwise) == len(loose)  # one kernel per fused op or lone pointwise op
    feeds = random_inputs(ref.get_main_module(), specials=False)
    for n, v in feeds.items():
        if v.dtype.kind == "i":
            feeds[n] = np.zeros_like(v)  # valid token ids
    tol = 2e-2 if "fp16" in name else 2e-4
    for got, want in zip(run_steps(low, feeds), ref.run_numpy(feeds), strict=True):
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=tol, atol=tol)

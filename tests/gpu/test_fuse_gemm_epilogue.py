"""fuse_gemm_epilogue without a GPU: the pass on chains built in the IR (module before/after, numbers bit
for bit on the ref interpreter, what must stay unfused), the fused op lowered to one cuBLASLt step whose
simulated result matches the ref (or, without cuBLASLt, its body's kernels), and on BERT (the switch)."""

from __future__ import annotations

from dataclasses import dataclass
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
from migraphx_ep.targets.gpu.fuse import FUSE_GEMM_EPILOGUE
from migraphx_ep.targets.gpu.lowering import lower
from migraphx_ep.targets.gpu.simulate import run_steps
from migraphx_ep.targets.gpu.steps import GemmStep
from migraphx_ep.targets.gpu.support import kernel_supported
from passes.passcheck import Build, check_pass

from .fusecheck import simulated

PASSES = [FUSE_GEMM_EPILOGUE, DEAD_CODE_ELIMINATION]
MODELS = Path(__file__).resolve().parents[1] / "models"


@dataclass(frozen=True)
class Mm:
    a: tuple[int, ...] = (2, 6, 8)
    b: tuple[int, ...] = (8, 5)  # a weight broadcast over the batch
    dtype: type = np.float32
    bias: bool = True
    residual: bool = False
    relu: bool = False
    bias_lens: tuple[int, ...] = (5,)  # broadcast to the output's dims


def operands(b: Build, c: Mm) -> tuple[Instruction, Instruction]:
    x, w = b.param("a", list(c.a), c.dtype), b.param("b", list(c.b), c.dtype)
    if len(c.b) < len(c.a):
        w = b("multibroadcast", w, out_lens=[*c.a[:-2], *c.b])
    return x, w


def extras(b: Build, c: Mm, lens: list[int]) -> tuple[Instruction | None, Instruction | None]:
    bias = b("multibroadcast", b.param("bias", list(c.bias_lens), c.dtype), out_lens=lens) if c.bias else None
    res = b.param("residual", lens, c.dtype) if c.residual else None
    return bias, res


def add_chain(m: Module, x: Instruction, w: Instruction, bias, res, relu: bool) -> Instruction:
    y = m.add_instruction(make_op("dot"), [x, w])
    if bias is not None:
        y = m.add_instruction(make_op("add"), [y, bias])
    if res is not None:
        y = m.add_instruction(make_op("add"), [y, res])
    return m.add_instruction(make_op("relu"), [y]) if relu else y


def out_lens(c: Mm) -> list[int]:
    return [*c.a[:-1], c.b[-1]]


def chain(c: Mm) -> Module:
    b = Build()
    x, w = operands(b, c)
    bias, res = extras(b, c, out_lens(c))
    return b.ret(add_chain(b.m, x, w, bias, res, c.relu))


def expected(c: Mm) -> Module:
    """dot + bias + residual after the pass: the operands' views stay, the chain is the fused op's body."""
    b = Build()
    x, w = operands(b, c)
    bias, res = extras(b, c, out_lens(c))
    inputs = [("a", x), ("b", w), ("bias", bias), ("residual", res)]
    body = Module("main:fused_gemm0")
    p = [body.add_parameter(n, v.shape) for n, v in inputs]
    body.add_return([add_chain(body, *p, relu=False)])
    fused = make_op("fused_gemm", bias=True, residual=True)
    return b.ret(b.m.add_instruction(fused, [v for _, v in inputs], [body]))


def fused(m: Module) -> list[Instruction]:
    return [i for i in m.instructions if i.name == "fused_gemm"]


def test_chain_becomes_one_instruction_owning_it() -> None:
    c = Mm(residual=True)
    m = check_pass(PASSES, lambda: chain(c), lambda: expected(c))
    (f,) = fused(m)
    assert kernel_supported(f) is None
    (step,) = simulated(m, chain(c))
    assert isinstance(step, GemmStep) and (step.has_bias, step.has_residual, step.relu) == (True, True, False)
    assert step.batch == 1 and step.m == 12  # the shared weight folds the batch into M


@pytest.mark.parametrize(
    "c,flags",
    [
        (Mm(), (True, False)),
        (Mm(bias=False, residual=True), (False, True)),
        (Mm(a=(16, 8), b=(8, 24), residual=True, dtype=np.float16, bias_lens=(24,)), (True, True)),
        (Mm(a=(3, 4, 8), b=(3, 8, 5)), (True, False)),  # batched, one weight per batch
        (Mm(bias_lens=(1, 5), residual=True), (True, True)),
    ],
    ids=str,
)
def test_epilogues_fuse_into_one_gemm(c: Mm, flags: tuple[bool, bool]) -> None:
    m = check_pass(PASSES, lambda: chain(c))
    (f,) = fused(m)
    assert (f.op.bias, f.op.residual, f.op.relu) == (*flags, False)
    assert not [i for i in m.instructions if i.name in ("dot", "add")]
    steps = simulated(m, chain(c), tol=2e-2 if c.dtype == np.float16 else 1e-5)
    assert [type(s).__name__ for s in steps] == ["GemmStep"]


@pytest.mark.parametrize(
    "c,why",
    [
        (Mm(dtype=np.float64), "double GEMMs have no cuBLASLt epilogue here"),
        (Mm(bias_lens=(6, 1)), "broadcast along the rows: neither a bias row nor a standard residual"),
        (Mm(bias_lens=(6, 5)), "varies along two dims: neither a bias row nor a standard residual"),
    ],
    ids=str,
)
def test_what_cublaslt_cannot_add_stays_unfused(c: Mm, why: str) -> None:
    assert not fused(check_pass(PASSES, lambda: chain(c))), why


def test_a_product_read_twice_stays_unfused() -> None:
    def build() -> Module:
        m = chain(Mm())
        ret = m.get_return()
        (dot,) = [i for i in m.instructions if i.name == "dot"]
        m.add_return([ret.inputs[0], dot])
        return m

    assert not fused(check_pass(PASSES, build))


def test_a_bias_sum_read_twice_keeps_the_residual_outside() -> None:
    def build() -> Module:
        m = chain(Mm(residual=True))
        ret = m.get_return()
        biased = [i for i in m.instructions if i.name == "add"][0]
        m.add_return([ret.inputs[0], biased])
        return m

    m = check_pass(PASSES, build)
    (f,) = fused(m)
    assert (f.op.bias, f.op.residual) == (True, False)
    assert [i.name for i in m.instructions].count("add") == 1


def test_a_product_added_to_itself_stays_unfused() -> None:
    def build() -> Module:
        b = Build()
        x, w = operands(b, Mm())
        y = b("dot", x, w)
        return b.ret(b("add", y, y))

    assert not fused(check_pass(PASSES, build))


@pytest.mark.parametrize(
    "c", [Mm(relu=True), Mm(relu=True, residual=True), Mm(relu=True, bias=False)], ids=str
)
def test_relu_goes_into_the_epilogue(c: Mm) -> None:
    """MatMul + bias + Relu is one cuBLASLt call (CUBLASLT_EPILOGUE_RELU_BIAS), not a GEMM and a kernel."""
    m = check_pass(PASSES, lambda: chain(c))
    (f,) = fused(m)
    assert (f.op.bias, f.op.residual, f.op.relu) == (c.bias, c.residual, True)
    (step,) = simulated(m, chain(c))
    assert isinstance(step, GemmStep) and step.relu and step.label.endswith("+relu")


def _conv1d(residual_read_twice: bool = False) -> Module:
    """GPT-2's Conv1D then its residual: reshape(x2d @ W + b) + r, the GEMM on rows, r in [B, S, E]."""
    b = Build()
    x, w = b.param("a", [12, 8]), b.param("b", [8, 5])
    bias = b("multibroadcast", b.param("bias", [5]), out_lens=[12, 5])
    r = b.param("residual", [2, 6, 5])
    y = b("reshape", b("add", b("dot", x, w), bias), dims=[2, 6, 5])
    out = b("add", y, r)
    return b.ret(out, y) if residual_read_twice else b.ret(out)


def test_a_residual_after_the_reshape_joins_the_epilogue() -> None:
    m = check_pass(PASSES, _conv1d)
    (f,) = fused(m)
    assert f.op.bias and f.op.residual
    assert [s.label for s in simulated(m, _conv1d())] == ["gemm 1x12x5x8 +bias +residual"]


def test_a_reshaped_product_read_twice_keeps_its_residual_outside() -> None:
    m = check_pass(PASSES, lambda: _conv1d(residual_read_twice=True))
    (f,) = fused(m)
    assert f.op.bias and not f.op.residual


def test_without_cublaslt_the_body_lowers_as_before() -> None:
    """A program fused where cuBLASLt loads, lowered where it does not (a stored program): the body's
    generated GEMM and one pointwise kernel for both adds, as an unfused module would lower."""
    c = Mm(residual=True)
    m = check_pass(PASSES, lambda: chain(c))
    steps = simulated(m, chain(c), use_blas=False)
    assert [s.label.split()[0] for s in steps] == ["dot", "pointwise"]
    unfused = chain(c)
    run_passes(unfused, gpu_pipeline(use_blas=False))
    assert [s.label.split()[0] for s in lower(unfused, use_blas=False, use_dnn=True).steps] == [
        "dot",
        "pointwise",
    ]


def test_the_pipeline_fuses_only_where_cublaslt_loads() -> None:
    for use_blas in (True, False):
        m = chain(Mm(residual=True))
        run_passes(m, gpu_pipeline(use_blas=use_blas))
        assert len(fused(m)) == use_blas


def _bert(disable: str, monkeypatch):
    monkeypatch.setenv("MIGRAPHX_EP_DISABLE_PASSES", disable)
    prog = parse_graph(model_to_dict(onnx.load(MODELS / "bert.onnx")), resolve_dim=fixed_dims(2)).program
    run_passes(prog.get_main_module(), gpu_pipeline())
    monkeypatch.delenv("MIGRAPHX_EP_DISABLE_PASSES")
    return prog.get_main_module()


def test_bert_fuses_its_epilogues_and_the_switch_turns_it_off(monkeypatch) -> None:
    ref = parse_graph(model_to_dict(onnx.load(MODELS / "bert.onnx")), resolve_dim=fixed_dims(2)).program
    ref.compile(get_target("ref"))
    seen = {}
    for disable in ("", "fuse_gemm_epilogue"):
        m = _bert(disable, monkeypatch)
        low = lower(m, use_blas=True, use_dnn=True)
        gemms = [s for s in low.steps if isinstance(s, GemmStep)]
        seen[disable] = (len(fused(m)), sum(s.has_bias for s in gemms), sum(s.has_residual for s in gemms))
        seen[disable] += (len(low.steps),)
        feeds = {n: np.ones(s.lens, s.dtype) for n, s in m.get_parameter_shapes().items()}
        for got, want in zip(run_steps(low, feeds), ref.run_numpy(feeds), strict=True):
            np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=1e-5, atol=1e-5)
    on, off = seen[""], seen["fuse_gemm_epilogue"]
    # Per layer: Q, K and V as one GEMM (fuse_horizontal_dots), the output projection (+ residual) and
    # the two MLP GEMMs (+ residual), and the pooler's dense layer: 2 * 4 + 1 fused, each bias and
    # residual in the GEMM.
    assert on == (9, 9, 4, on[3]) and off[:3] == (0, 0, 0), (on, off)
    # Unfused, each epilogue is one pointwise kernel (bias and residual adds together), except the pooler's
    # bias add, which joins its tanh's kernel.
    assert off[3] - on[3] == 9 - 1, (on, off)

"""fuse_conv_epilogue without a GPU: the pass on chains built in the IR (module before/after, numbers bit
for bit on the ref interpreter, what must stay unfused), the fused op lowered to one cuDNN step (or one
cuBLASLt GEMM for a 1x1 convolution in NHWC) whose simulated result matches the ref, its switches, and
on the ResNet test model."""

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
from migraphx_ep.targets.gpu.fuse import FUSE_CONV_EPILOGUE
from migraphx_ep.targets.gpu.lowering import lower
from migraphx_ep.targets.gpu.simulate import run_steps
from migraphx_ep.targets.gpu.steps import ConvStep, GemmStep
from migraphx_ep.targets.gpu.support import kernel_supported
from migraphx_ep.targets.ref import RefTarget
from passes.passcheck import Build, check_pass, random_inputs

from . import fusecheck

PASSES = [FUSE_CONV_EPILOGUE, DEAD_CODE_ELIMINATION]
MODELS = Path(__file__).resolve().parents[1] / "models"


@dataclass(frozen=True)
class Cv:
    x: tuple[int, ...] = (2, 4, 6, 6)
    w: tuple[int, ...] = (8, 4, 3, 3)
    padding: tuple[int, ...] = (1, 1, 1, 1)
    dtype: type = np.float32
    bias: bool = True
    residual: bool = False
    relu: bool = True

    @property
    def out(self) -> list[int]:
        spatial = [n + self.padding[i] + self.padding[i + len(self.x) - 2] - k + 1
                   for i, (n, k) in enumerate(zip(self.x[2:], self.w[2:], strict=True))]  # fmt: skip
        return [self.x[0], self.w[0], *spatial]


def inputs(b: Build, c: Cv) -> list[tuple[str, Instruction]]:
    named = [("x", b.param("x", list(c.x), c.dtype)), ("w", b.param("w", list(c.w), c.dtype))]
    if c.bias:
        named.append(("bias", b("broadcast", b.param("bias", [c.w[0]], c.dtype), axis=1, out_lens=c.out)))
    if c.residual:
        named.append(("residual", b.param("residual", c.out, c.dtype)))
    return named


def add_chain(m: Module, c: Cv, x: Instruction, w: Instruction, *extra: Instruction) -> Instruction:
    attrs = {"padding": list(c.padding), "stride": [1] * (len(c.x) - 2), "dilation": [1] * (len(c.x) - 2)}
    y = m.add_instruction(make_op("convolution", **attrs), [x, w])
    for e in extra:  # the bias, then the residual
        y = m.add_instruction(make_op("add"), [y, e])
    return m.add_instruction(make_op("relu"), [y]) if c.relu else y


def chain(c: Cv) -> Module:
    b = Build()
    return b.ret(add_chain(b.m, c, *(v for _, v in inputs(b, c))))


def expected(c: Cv) -> Module:
    """The chain after the pass: the bias's broadcast stays, the rest is the fused op's body."""
    b = Build()
    named = inputs(b, c)
    body = Module("main:fused_conv0")
    body.add_return([add_chain(body, c, *(body.add_parameter(n, v.shape) for n, v in named))])
    fused = make_op("fused_conv", bias=c.bias, residual=c.residual, relu=c.relu)
    return b.ret(b.m.add_instruction(fused, [v for _, v in named], [body]))


def fused(m: Module) -> list[Instruction]:
    return [i for i in m.instructions if i.name == "fused_conv"]


def simulated(m: Module, ref: Module, tol: float = 1e-5, **kw: object) -> list:
    """``fusecheck.simulated`` (NCHW unless ``channels_last``), without the layout copies."""
    steps = fusecheck.simulated(m, ref, tol, **{"channels_last": False, **kw})
    return [s for s in steps if not s.label.startswith(("to NHWC", "copy (output)"))]


@pytest.mark.parametrize("c", [Cv(), Cv(residual=True)], ids=str)
def test_chain_becomes_one_instruction_owning_it(c: Cv) -> None:
    m = check_pass(PASSES, lambda: chain(c), lambda: expected(c))
    (f,) = fused(m)
    assert kernel_supported(f) is None
    for nhwc in (False, True):
        (step,) = simulated(m, chain(c), channels_last=nhwc)
        assert isinstance(step, ConvStep)  # in NHWC too (the activations and filters copied to it)
        assert (step.has_bias, step.has_residual, step.relu) == (True, c.residual, True)


@pytest.mark.parametrize(
    "c",
    [
        Cv(relu=False),
        Cv(bias=False),  # relu straight after the convolution
        Cv(bias=False, residual=True, relu=False),
        Cv(x=(2, 4, 9), w=(6, 4, 3), padding=(1, 1)),  # 1-D
        Cv(dtype=np.float16, residual=True),
        Cv(dtype=np.float64),
    ],
    ids=str,
)
def test_epilogues_fuse_into_one_call(c: Cv) -> None:
    m = check_pass(PASSES, lambda: chain(c))
    (f,) = fused(m)
    assert (f.op.bias, f.op.residual, f.op.relu) == (c.bias, c.residual, c.relu)
    assert not [i for i in m.instructions if i.name in ("convolution", "add", "relu")]
    steps = simulated(m, chain(c), tol=2e-2 if c.dtype == np.float16 else 1e-5)
    assert [type(s).__name__ for s in steps] == ["ConvStep"]


def test_a_1x1_convolution_in_nhwc_is_one_gemm_with_the_epilogue() -> None:
    c = Cv(w=(8, 4, 1, 1), padding=(0, 0, 0, 0), residual=True)
    m = check_pass(PASSES, lambda: chain(c))
    (step,) = simulated(m, chain(c), channels_last=True)
    assert isinstance(step, GemmStep)
    assert step.label.startswith("conv 1x1 as gemm") and (step.has_bias, step.has_residual, step.relu) == (
        True, True, True)  # fmt: skip


def test_what_cudnn_cannot_fuse_stays_unfused() -> None:
    assert not fused(check_pass(PASSES, lambda: chain(Cv(padding=(0, 0, 1, 1)))))  # asymmetric padding


def test_a_product_read_twice_stays_unfused() -> None:
    def build() -> Module:
        m = chain(Cv())
        (conv,) = [i for i in m.instructions if i.name == "convolution"]
        m.add_return([m.get_return().inputs[0], conv])
        return m

    assert not fused(check_pass(PASSES, build))


def test_two_branches_meeting_at_the_residual_add_both_fuse() -> None:
    """A ResNet downsample block: conv+bias on each branch, their sum, relu. The second branch's bias
    fuses into its own convolution, and that result is the first branch's residual: two steps."""

    def build() -> Module:
        b = Build()
        c = Cv(w=(8, 4, 1, 1), padding=(0, 0, 0, 0), relu=False)
        x = b.param("x", list(c.x))
        branches = []
        for k in range(2):
            w, bias = b.param(f"w{k}", list(c.w)), b.param(f"b{k}", [c.w[0]])
            branches.append(add_chain(b.m, c, x, w, b("broadcast", bias, axis=1, out_lens=c.out)))
        return b.ret(b("relu", b("add", *branches)))

    m = check_pass(PASSES, build)
    first, second = fused(m)
    assert (first.op.bias, first.op.residual, first.op.relu) == (True, False, False)
    assert (second.op.bias, second.op.residual, second.op.relu) == (True, True, True)
    assert second.inputs[3] is first
    for nhwc in (False, True):
        assert len(simulated(m, build(), channels_last=nhwc)) == 2


def test_the_kernel_switch_and_missing_cudnn_lower_the_body(monkeypatch) -> None:
    c = Cv(residual=True)
    m = check_pass(PASSES, lambda: chain(c))
    labels = [s.label.split()[0] for s in simulated(m, chain(c), use_dnn=False)]
    assert labels == ["convolution", "pointwise"]  # a generated convolution, then one epilogue kernel
    monkeypatch.setenv("MIGRAPHX_EP_CONV_EPILOGUE", "kernel")
    steps = simulated(m, chain(c))  # fused before the switch was set: a plain cuDNN call, then a kernel
    assert [s.label for s in steps] == ["conv", "pointwise relu"]
    assert not fused(check_pass(PASSES, lambda: chain(c)))  # with the switch set nothing fuses


def test_the_pipeline_fuses_only_where_cudnn_loads() -> None:
    for use_dnn in (True, False):
        m = chain(Cv())
        run_passes(m, gpu_pipeline(use_dnn=use_dnn))
        assert len(fused(m)) == use_dnn


def test_resnet_fuses_every_convolution_and_the_switch_turns_it_off(monkeypatch) -> None:
    def program():  # noqa: ANN202
        return parse_graph(
            model_to_dict(onnx.load(MODELS / "resnet.onnx")), resolve_dim=fixed_dims(2)
        ).program

    ref = program()
    ref.compile(get_target("ref"))
    feeds = random_inputs(ref.get_main_module(), specials=False)
    monkeypatch.setenv("MIGRAPHX_EP_NHWC", "0")  # NCHW: no layout copies among the steps counted
    seen = {}
    for disable in ("", "fuse_conv_epilogue"):
        monkeypatch.setenv("MIGRAPHX_EP_DISABLE_PASSES", disable)
        m = program().get_main_module()
        run_passes(m, gpu_pipeline())
        low = lower(m, use_blas=True, use_dnn=True)
        convs = [s for s in low.steps if isinstance(s, ConvStep)]
        seen[disable] = (len(fused(m)), sum(s.has_bias for s in convs), len(low.steps))
        for got, want in zip(run_steps(low, feeds), ref.run_numpy(feeds), strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # All 9 convolutions take their bias (and relu / residual) into the cuDNN call; unfused, each epilogue
    # is one pointwise kernel, except that each downsample branch's bias add joins its block's sum.
    assert seen[""] == (9, 9, 12) and seen["fuse_conv_epilogue"][:2] == (0, 0), seen
    assert seen["fuse_conv_epilogue"][2] == 12 + 9 - 2, seen


class GpuPassesOnRef(RefTarget):
    """The ref target running the gpu pipeline: what ``driver verify`` compiles, without a GPU."""

    def get_passes(self, options):  # noqa: ANN001, ANN201
        return gpu_pipeline()


@pytest.mark.parametrize("name,ops", [("resnet.onnx", {"fused_conv": 9, "fused_gemm": 1}),
                                      ("bert.onnx", {"fused_layernorm": 5, "fused_gemm": 9})])  # fmt: skip
def test_verify_bisect_and_saving_see_the_fused_ops(name: str, ops: dict, tmp_path) -> None:
    """``driver verify`` (and ``--bisect``) compile a copy through the pipeline, fused ops included, and
    agree with the ref; a compiled program saves and loads back with its fused ops' bodies."""
    from migraphx_ep.driver.verify import bisect, verify_program
    from migraphx_ep.mxr import load, save
    from migraphx_ep.targets.gpu.fuse import adopt_submodules

    prog = parse_graph(model_to_dict(onnx.load(MODELS / name)), resolve_dim=fixed_dims(2)).program
    feeds = random_inputs(prog.get_main_module(), specials=False)
    feeds = {k: np.abs(v) % 2 if v.dtype.kind in "iu" else v for k, v in feeds.items()}
    assert verify_program(prog, GpuPassesOnRef(), feeds, rtol=1e-6, atol=1e-6) == []
    assert bisect(prog, GpuPassesOnRef(), feeds, rtol=1e-6, atol=1e-6) is None
    copy = prog.clone()
    copy.compile(GpuPassesOnRef())
    adopt_submodules(copy)
    names = [i.name for i in copy.get_main_module().instructions]
    assert {k: names.count(k) for k in ops} == ops
    save(copy, str(tmp_path / "p.mxr"))
    back = load(str(tmp_path / "p.mxr"))
    assert back == copy
    for a, b in zip(back.run_numpy(feeds), copy.run_numpy(feeds), strict=True):
        np.testing.assert_array_equal(a, b)

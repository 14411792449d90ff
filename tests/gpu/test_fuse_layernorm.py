"""fuse_layernorm without a GPU: the pass on chains built in the IR (module before/after, numbers bit for
bit on the ref interpreter, what must stay unfused), the fused op lowered to one row kernel whose
simulated result matches the ref, and on BERT (every layernorm fused, its switch, saving)."""

from __future__ import annotations

import collections
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
from migraphx_ep.targets.gpu.fuse import FUSE_LAYERNORM, adopt_submodules
from migraphx_ep.targets.gpu.lowering import lower
from migraphx_ep.targets.gpu.simulate import run_steps
from migraphx_ep.targets.gpu.steps import KernelStep
from migraphx_ep.targets.gpu.support import kernel_supported
from passes.passcheck import Build, check_pass, random_inputs

from .fusecheck import simulated

PASSES = [FUSE_LAYERNORM, DEAD_CODE_ELIMINATION]
MODELS = Path(__file__).resolve().parents[1] / "models"


@dataclass(frozen=True)
class Ln:
    lens: tuple[int, ...] = (2, 3, 16)
    axes: tuple[int, ...] = (2,)
    dtype: type = np.float32
    inv: str = "rsqrt"  # rsqrt | recip | div: the three spellings of 1 / sqrt(v + eps)
    square: str = "mul"  # mul | pow
    gamma: bool = True
    beta: bool = True
    gamma_lens: tuple[int, ...] = (16,)  # broadcast over the leading dims


def add_chain(m: Module, x: Instruction, gamma: Instruction | None, beta: Instruction | None, c: Ln):
    """The decomposed layernorm of ``x`` appended to ``m``: (x - mean) / sqrt(var + eps) * gamma + beta."""

    def ins(name: str, *args: Instruction, **attrs: object) -> Instruction:
        return m.add_instruction(make_op(name, **attrs), list(args))

    def splat(value: float, lens: tuple[int, ...]) -> Instruction:
        return ins("multibroadcast", m.add_literal(np.asarray(value, c.dtype)), out_lens=list(lens))

    lens = list(c.lens)
    d = ins("sub", x, ins("multibroadcast", ins("reduce_mean", x, axes=list(c.axes)), out_lens=lens))
    sq = ins("mul", d, d) if c.square == "mul" else ins("pow", d, splat(2.0, c.lens))
    v = ins("reduce_mean", sq, axes=list(c.axes))
    ve = ins("add", v, splat(1e-5, v.shape.lens))
    if c.inv == "rsqrt":
        norm = ins("mul", d, ins("multibroadcast", ins("rsqrt", ve), out_lens=lens))
    elif c.inv == "recip":
        norm = ins("mul", d, ins("multibroadcast", ins("recip", ins("sqrt", ve)), out_lens=lens))
    else:
        norm = ins("div", d, ins("multibroadcast", ins("sqrt", ve), out_lens=lens))
    y = norm if gamma is None else ins("mul", norm, gamma)
    return y if beta is None else ins("add", y, beta)


def affine(b: Build, c: Ln, name: str) -> Instruction:
    return b("multibroadcast", b.param(name, list(c.gamma_lens), c.dtype), out_lens=list(c.lens))


def chain(c: Ln) -> Module:
    b = Build()
    x = b.param("x", list(c.lens), c.dtype)
    g = affine(b, c, "gamma") if c.gamma else None
    bt = affine(b, c, "beta") if c.beta else None
    return b.ret(add_chain(b.m, x, g, bt, c))


def expected(c: Ln) -> Module:
    """The chain after the pass: gamma's and beta's broadcasts stay, the rest is one fused op whose body
    is the chain as it was."""
    b = Build()
    x = b.param("x", list(c.lens), c.dtype)
    g, bt = affine(b, c, "gamma"), affine(b, c, "beta")
    body = Module("main:fused_layernorm0")
    px, pg, pb = (body.add_parameter(n, v.shape) for n, v in (("x", x), ("scale", g), ("bias", bt)))
    body.add_return([add_chain(body, px, pg, pb, c)])
    attrs = {"axis": c.axes[0], "epsilon": float(np.float32(1e-5)), "scale": True, "bias": True}
    return b.ret(b.m.add_instruction(make_op("fused_layernorm", **attrs), [x, g, bt], [body]))


def fused(m: Module) -> list[Instruction]:
    return [i for i in m.instructions if i.name == "fused_layernorm"]


def test_chain_becomes_one_instruction_owning_it() -> None:
    c = Ln()
    m = check_pass(PASSES, lambda: chain(c), lambda: expected(c))
    (f,) = fused(m)
    assert kernel_supported(f) is None
    steps = simulated(m, chain(c))
    assert [s.label for s in steps] == ["layernorm"] and isinstance(steps[0], KernelStep)
    assert steps[0].args == {"axis": 2, "eps": f.op.epsilon, "scale": True, "bias": True}


@pytest.mark.parametrize(
    "c,attrs",
    [
        (Ln(inv="recip"), {}),
        (Ln(inv="div", square="pow"), {}),
        (Ln(gamma=False), {"scale": False, "bias": True}),
        (Ln(beta=False), {"scale": True, "bias": False}),
        (Ln(gamma=False, beta=False, inv="div"), {"scale": False, "bias": False}),
        (Ln(lens=(2, 3, 4, 8), axes=(2, 3), gamma_lens=(4, 8)), {"axis": 2}),
        (Ln(lens=(4, 16), axes=(-1,)), {"axis": 1}),
        (Ln(dtype=np.float16), {}),
        (Ln(gamma_lens=(3, 16)), {"scale": False, "bias": False}),  # gamma varies along rows: norm only
    ],
    ids=str,
)
def test_spellings_fuse_into_one_kernel(c: Ln, attrs: dict) -> None:
    m = check_pass(PASSES, lambda: chain(c))
    (f,) = fused(m)
    want = {"axis": len(c.lens) - 1, "scale": c.gamma, "bias": c.beta, **attrs}
    assert {k: getattr(f.op, k) for k in want} == want
    assert not [i for i in m.instructions if i.name in ("reduce_mean", "sqrt", "rsqrt", "sub")]
    steps = simulated(m, chain(c), tol=2e-2 if c.dtype == np.float16 else 1e-5)
    outside = (c.gamma and not f.op.scale) + (c.beta and not f.op.bias)  # one pointwise kernel for both
    assert [s.label.split()[0] for s in steps] == ["layernorm"] + ["pointwise"] * bool(outside)


def _read_twice(what: str):
    """A chain whose intermediate ``what`` is also returned: fusing would drop a value still needed."""

    def build() -> Module:
        m = chain(Ln())
        ret = m.get_return()
        names = {"centred": "sub", "variance": "reduce_mean", "inv": "rsqrt"}
        extra = [i for i in m.instructions if i.name == names[what]][-1]
        m.add_return([ret.inputs[0], extra])
        return m

    return build


@pytest.mark.parametrize("what", ["centred", "variance", "inv"])
def test_an_intermediate_read_twice_stays_unfused(what: str) -> None:
    m = check_pass(PASSES, _read_twice(what))
    assert not fused(m)


def test_norm_read_twice_fuses_without_gamma_and_beta() -> None:
    def build() -> Module:
        m = chain(Ln())
        ret = m.get_return()
        norm = ret.inputs[0].inputs[0].inputs[0]  # building the case, not matching it
        m.add_return([ret.inputs[0], norm])
        return m

    (f,) = fused(check_pass(PASSES, build))
    assert not f.op.scale and not f.op.bias


def test_mean_over_leading_axes_stays_unfused() -> None:
    assert not fused(check_pass(PASSES, lambda: chain(Ln(axes=(1,), gamma=False, beta=False))))


def _float_chain_in_half(widened_returned: bool = False) -> Module:
    """GPT-2's fp16 export: x widened to float, normalised there, narrowed, then gamma and beta in half."""
    c = Ln(gamma=False, beta=False)
    b = Build()
    x = b.param("x", list(c.lens), np.float16)
    g = b("multibroadcast", b.param("gamma", [16], np.float16), out_lens=list(c.lens))
    bt = b("multibroadcast", b.param("beta", [16], np.float16), out_lens=list(c.lens))
    wide = b("convert", x, target_type=2)  # float
    norm = add_chain(b.m, wide, None, None, c)
    y = b("add", b("mul", b("convert", norm, target_type=1), g), bt)  # half
    return b.ret(y, wide) if widened_returned else b.ret(y)


def test_converts_around_a_float_layernorm_fuse_into_its_kernel() -> None:
    # The kernel loads half x and computes in float; it rounds once, where the chain rounds after the
    # narrowing, gamma and beta: an fp16 ulp or two apart at most.
    m = check_pass(PASSES, _float_chain_in_half)
    (f,) = fused(m)
    assert [a.name for a in f.inputs] == ["@param", "multibroadcast", "multibroadcast"]
    assert f.inputs[0].shape.type.name == "half_type" and f.op.scale and f.op.bias
    assert not [i for i in m.instructions if i.name in ("convert", "mul", "add")]
    steps = simulated(m, _float_chain_in_half(), tol=2e-3)
    assert [s.label for s in steps] == ["layernorm"]


def test_a_widened_x_read_elsewhere_stays_outside() -> None:
    m = check_pass(PASSES, lambda: _float_chain_in_half(widened_returned=True))
    (f,) = fused(m)
    assert f.inputs[0].name == "convert"  # the float x is an input; the narrowing and affine still fuse
    steps = simulated(m, _float_chain_in_half(widened_returned=True), tol=2e-3)
    assert [s.label.split()[0] for s in steps] == ["pointwise", "layernorm"]  # the convert, returned


# -- BERT ----------------------------------------------------------------------------------------------------
def _bert(disable: str, monkeypatch):
    monkeypatch.setenv("MIGRAPHX_EP_DISABLE_PASSES", disable)
    prog = parse_graph(model_to_dict(onnx.load(MODELS / "bert.onnx")), resolve_dim=fixed_dims(2)).program
    run_passes(prog.get_main_module(), gpu_pipeline())
    monkeypatch.delenv("MIGRAPHX_EP_DISABLE_PASSES")
    return prog


def test_bert_fuses_every_layernorm_and_the_switch_turns_it_off(monkeypatch) -> None:
    ref = parse_graph(model_to_dict(onnx.load(MODELS / "bert.onnx")), resolve_dim=fixed_dims(2)).program
    ref.compile(get_target("ref"))
    counts = {}
    for disable in ("", "fuse_layernorm"):
        m = _bert(disable, monkeypatch).get_main_module()
        names = collections.Counter(i.name for i in m.instructions)
        low = lower(m, use_blas=True, use_dnn=True)
        labels = collections.Counter(s.label.split()[0] for s in low.steps)
        counts[disable] = (names["fused_layernorm"], labels["layernorm"], len(low.steps))
        feeds = random_inputs(m, specials=False)
        feeds = {k: np.abs(v).astype(v.dtype) % 2 if v.dtype.kind in "iu" else v for k, v in feeds.items()}
        for got, want in zip(run_steps(low, feeds), ref.run_numpy(feeds), strict=True):
            np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=1e-5, atol=1e-5)
    on, off = counts[""], counts["fuse_layernorm"]
    assert on[:2] == (5, 5) and off[:2] == (0, 0)  # embeddings + 2 per layer, each one kernel
    # Unfused, each layernorm is 6 steps: the mean, centring, squaring, the variance, + eps and rsqrt, and
    # normalising with gamma and beta.
    assert off[2] - on[2] == 5 * 5, (on, off)


def test_saved_program_loads_back_with_its_bodies(tmp_path, monkeypatch) -> None:
    from migraphx_ep.mxr import load, save

    prog = _bert("", monkeypatch)
    adopt_submodules(prog)
    assert len([n for n in prog.modules if ":fused_layernorm" in n]) == 5
    save(prog, str(tmp_path / "bert.mxr"))
    back = load(str(tmp_path / "bert.mxr"))
    assert back == prog and len(fused(back.get_main_module())) == 5

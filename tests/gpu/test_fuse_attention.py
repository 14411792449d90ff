"""fuse_attention without a GPU: the pass on chains built in the IR (module before/after, numbers bit for
bit, what must stay unfused), on the exported models (every attention fused, the lowered steps simulated
against the ref target, kernels and steps saved), and its switches (pass list, verify, saving)."""

from __future__ import annotations

import collections
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import pytest

from migraphx_ep.frontend.graph import model_to_dict
from migraphx_ep.frontend.parser import parse_graph
from migraphx_ep.frontend.probe import fixed_dims
from migraphx_ep.ir.dtypes import DType, from_onnx
from migraphx_ep.ir.evaluate import run_module
from migraphx_ep.ir.module import Module
from migraphx_ep.ir.operation import make_op
from migraphx_ep.ir.shape import Shape
from migraphx_ep.passes import DEAD_CODE_ELIMINATION, run_passes
from migraphx_ep.targets import get_target
from migraphx_ep.targets.gpu.decompose import gpu_pipeline
from migraphx_ep.targets.gpu.fuse import FUSE_ATTENTION, adopt_submodules
from migraphx_ep.targets.gpu.lowering import lower
from migraphx_ep.targets.gpu.simulate import run_steps
from migraphx_ep.targets.gpu.steps import KernelStep
from migraphx_ep.targets.gpu.support import kernel_supported
from passes.passcheck import check_pass, same_bits

from .attentioncheck import Chain, chain, fused

PASSES = [FUSE_ATTENTION, DEAD_CODE_ELIMINATION]
MODELS = Path(__file__).resolve().parents[1] / "models"


def fuse(c: Chain, **kw: object) -> Module:
    return check_pass(PASSES, lambda: chain(c, **kw))  # type: ignore[arg-type]


def expected_bert(c: Chain) -> Module:
    """The BERT chain after the pass: the head-split views and the mask's broadcast stay, the rest is one
    fused op whose body is the chain as it was."""
    from passes.passcheck import Build

    b = Build()
    t, lens = c.dtype, [c.b, c.h, c.s, c.s]
    qs, ks, vs = (b.param(n, [c.b, c.s, c.h * c.d], t) for n in ("q", "k", "v"))
    mask = b.param("mask", [c.b, 1, 1, c.s], t)
    q = b("transpose", b("reshape", qs, dims=[c.b, c.s, c.h, c.d]), permutation=[0, 2, 1, 3])
    kt = b("transpose", b("reshape", ks, dims=[c.b, c.s, c.h, c.d]), permutation=[0, 2, 3, 1])
    v = b("transpose", b("reshape", vs, dims=[c.b, c.s, c.h, c.d]), permutation=[0, 2, 1, 3])
    bias = b("multibroadcast", mask, out_lens=lens)
    body = Module("main:fused_attention0")
    p = [
        body.add_parameter(n, x.shape)
        for n, x in zip(("q", "kt", "v", "bias"), (q, kt, v, bias), strict=True)
    ]
    x = body.add_instruction(make_op("dot"), p[:2])
    scale = body.add_instruction(
        make_op("multibroadcast", out_lens=lens), [body.add_literal(np.asarray(0.25, t))]
    )
    x = body.add_instruction(make_op("mul"), [x, scale])
    x = body.add_instruction(make_op("add"), [p[3], x])
    x = body.add_instruction(make_op("softmax", axis=3), [x])
    x = body.add_instruction(make_op("dot"), [x, p[2]])
    body.add_return([body.add_instruction(make_op("transpose", permutation=[0, 2, 1, 3]), [x])])
    attrs = {"scale": 0.25, "mask": "bias", "head_dim": c.d, "value_dim": c.d, "out_perm": [0, 2, 1, 3]}
    y = b.m.add_instruction(make_op("fused_attention", **attrs), [q, kt, v, bias], [body])
    return b.ret(b("reshape", y, dims=[c.b, c.s, c.h * c.d]))


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_bert_chain_becomes_one_instruction_owning_it(dtype) -> None:
    c = Chain(dtype=dtype)
    m = check_pass(PASSES, lambda: chain(c), lambda: expected_bert(c))
    (f,) = fused(m)
    assert f.shape.standard() and f.shape.lens == (c.b, c.s, c.h, c.d)
    assert kernel_supported(f) is None


@pytest.mark.parametrize(
    "c,attrs",
    [
        (Chain(scale="div"), {"divisor": 4.0, "scale": 1.0}),
        (Chain(scale="q"), {"q_scale": 0.25, "scale": 1.0}),
        (Chain(scale="qk", dtype=np.float16), {"q_scale": 0.5, "k_scale": 0.5}),
        (Chain(scale="none", mask="none"), {"scale": 1.0, "mask": "none"}),
        (Chain(mask="none", s=17, d=8), {"mask": "none", "head_dim": 8}),  # ViT: 17 tokens, no mask
        (Chain(mask="causal"), {"causal": True, "mask": "none"}),
        (Chain(mask="causal_lowest", dtype=np.float16, s=9, l=12), {"causal": True, "mask": "none"}),
        (Chain(mask="causal_lowest", dtype=ml_dtypes.bfloat16), {"causal": True}),
        (Chain(mask="constant"), {"causal": False, "mask": "bias"}),
        (Chain(softmax_f32=True, dtype=np.float16), {"mask": "bias"}),
        (Chain(dv=24, l=20), {"head_dim": 16, "value_dim": 24}),
        (Chain(merge=False), {"out_perm": ()}),
        (Chain(qkv=True, mask="causal"), {"causal": True}),  # GPT-2: heads split off one projection
        (Chain(qkv=True, dtype=np.float16), {"mask": "bias"}),
    ],
    ids=lambda x: (
        ",".join(f"{k}={v}" for k, v in vars(x).items() if v != getattr(Chain(), k))
        if isinstance(x, Chain)
        else ""
    ),
)
def test_chain_variants_fuse_with_their_attributes(c: Chain, attrs: dict) -> None:
    m = fuse(c)
    (f,) = fused(m)
    for k, v in attrs.items():
        assert getattr(f.op, k) == v, (k, f.op)
    assert [i.name for i in m.instructions if i.name in ("dot", "softmax", "mul", "div", "convert")] == []
    assert len(f.inputs) == (4 if f.op.mask == "bias" else 3)
    assert kernel_supported(f) is None


def test_fused_qkv_split_reads_the_slices() -> None:
    m = fuse(Chain(qkv=True))
    (f,) = fused(m)
    assert [i.name for i in f.inputs[:3]] == ["slice"] * 3  # the head split moved into the body
    assert not [i for i in m.instructions if i.name == "reshape" and not i.inputs[0].shape.standard()]
    body = f.module_args[0]
    assert [i.name for i in body.instructions].count("reshape") == 3


def test_transpose_read_by_return_fuses_the_product_only() -> None:
    def build() -> Module:
        m = chain(Chain(merge=False))
        ret = m.get_return()
        y = m.insert_instruction(ret, make_op("transpose", permutation=[0, 2, 1, 3]), [ret.inputs[0]])
        m.add_return([y])
        return m

    m = check_pass(PASSES, build)
    (f,) = fused(m)
    assert f.op.out_perm == () and m.get_return().inputs[0].name == "transpose"


@pytest.mark.parametrize(
    "c,kw,why",
    [
        (Chain(), {"probs_out": True}, "probabilities are an output too"),
        (Chain(), {"softmax_axis": 2}, "softmax over queries"),
        (Chain(d=264, h=1), {}, "head dim past 256"),
        (Chain(dtype=np.float64), {}, "double"),
        (Chain(mask="causal", s=12, l=8), {}, "causal with fewer keys than queries: kept as the plain bias"),
    ],
    ids=lambda x: x if isinstance(x, str) else "",
)
def test_what_the_kernel_cannot_do_stays_unfused(c: Chain, kw: dict, why: str) -> None:
    m = fuse(c, **kw)
    if "plain bias" in why:  # fused, but the mask is read as a bias (no key skipping)
        (f,) = fused(m)
        assert not f.op.causal and f.op.mask == "bias"
        return
    assert not fused(m), why
    assert [i.name for i in m.instructions].count("dot") == 2


def test_a_score_read_twice_stays_unfused() -> None:
    def build() -> Module:
        m = chain(Chain(mask="none", merge=False))
        dot = next(i for i in m.instructions if i.name == "dot")
        m.add_return([*m.get_return().inputs, dot])
        return m

    assert not fused(check_pass(PASSES, build))


def test_softmax_in_float_without_the_convert_back_stays_unfused() -> None:
    def build() -> Module:  # convert -> softmax (float) -> dot with V converted to float -> convert
        m = chain(Chain(softmax_f32=True, dtype=np.float16, merge=False))
        down = [i for i in m.instructions if i.name == "convert"][-1]
        pv = down.outputs[0]
        f32, f16 = DType.float_type, DType.half_type
        v = m.insert_instruction(pv, make_op("convert", target_type=f32), [pv.inputs[1]])
        y = m.insert_instruction(pv, make_op("dot"), [down.inputs[0], v])
        m.replace_all_uses(pv, m.insert_instruction(pv, make_op("convert", target_type=f16), [y]))
        return m

    assert not fused(check_pass(PASSES, build))


# -- the exported models ----------------------------------------------------------------------------------
def _model(name: str):
    g = model_to_dict(onnx.load(MODELS / name))
    if name.startswith("vit"):
        return parse_graph(g, resolve_dim=fixed_dims(2)).program
    shapes = {n: Shape(from_onnx(g["values"][n]["dtype"]), (2, 16)) for n in g["inputs"]}
    return parse_graph(g, shapes, specialize=True).program


def _lowered(name: str, monkeypatch, fuse_on: bool):
    if not fuse_on:
        monkeypatch.setenv("MIGRAPHX_EP_DISABLE_PASSES", "fuse_attention")
    prog = _model(name)
    m = prog.get_main_module()
    run_passes(m, gpu_pipeline())
    monkeypatch.delenv("MIGRAPHX_EP_DISABLE_PASSES", raising=False)
    return prog, m, lower(m, use_blas=True, use_dnn=True)


def _counts(low) -> tuple[int, int, int]:
    kernels = sum(isinstance(s, KernelStep) for s in low.steps)
    return kernels, len(low.steps), sum(s.label.startswith("gemm") for s in low.steps)


# (model, kernels saved, steps saved) per two-layer model: each attention was 2 GEMMs, the scale+mask
# kernel, softmax and the head-merge copy. (GPT-2's head splits of its strided QKV slices are views of
# them fused or not: the lowering reshapes a strided buffer without a copy where numpy would.)
SAVED = {"bert": (10, 14), "gpt2": (10, 14), "vit": (10, 14)}


@pytest.mark.parametrize("name", [f"{m}{s}.onnx" for m in ("bert", "gpt2", "vit") for s in ("", "_fp16")]
                         + ["bert_opset14.onnx"])  # fmt: skip
def test_models_fuse_every_attention_and_simulate_like_ref(name: str, monkeypatch) -> None:
    ref = _model(name)
    ref.compile(get_target("ref"))
    _, m, low = _lowered(name, monkeypatch, fuse_on=True)
    names = collections.Counter(i.name for i in m.instructions)
    assert names["fused_attention"] == 2 and names["softmax"] == 0
    assert [s.label for s in low.steps].count("attention") == 2
    rng = np.random.default_rng(0)
    params = {}
    for n, s in m.get_parameter_shapes().items():
        params[n] = rng.integers(0, 2, s.lens).astype(s.dtype) if s.dtype.kind in "iu" else (
            rng.standard_normal(s.lens).astype(s.dtype))  # fmt: skip
    tol = 2e-2 if "fp16" in name else 1e-5
    for got, want in zip(run_steps(low, params), ref.run_numpy(params), strict=True):
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=tol, atol=tol)


@pytest.mark.parametrize("model", sorted(SAVED))
def test_kernel_and_step_counts_before_and_after(model: str, monkeypatch) -> None:
    before = _counts(_lowered(f"{model}.onnx", monkeypatch, fuse_on=False)[2])
    after = _counts(_lowered(f"{model}.onnx", monkeypatch, fuse_on=True)[2])
    assert (before[0] - after[0], before[1] - after[1]) == SAVED[model], (before, after)
    assert before[2] - after[2] == 4  # two GEMMs per layer


@pytest.mark.parametrize("name", ["bert_fp16.onnx", "gpt2.onnx", "vit.onnx"])
def test_fused_models_run_bit_identical_to_unfused(name: str, monkeypatch) -> None:
    """The fused op's meaning is its body: on the ref interpreter the fused module and the unfused one
    give the same bits."""
    on = _model(name).get_main_module()
    run_passes(on, gpu_pipeline())
    monkeypatch.setenv("MIGRAPHX_EP_DISABLE_PASSES", "fuse_attention")
    off = _model(name).get_main_module()
    run_passes(off, gpu_pipeline())
    assert len(fused(on)) == 2 and not fused(off)
    rng = np.random.default_rng(0)
    params = {}
    for n, s in on.get_parameter_shapes().items():
        params[n] = rng.integers(0, 2, s.lens).astype(s.dtype) if s.dtype.kind in "iu" else (
            rng.standard_normal(s.lens).astype(s.dtype))  # fmt: skip
    for a, b in zip(run_module(on, params), run_module(off, params), strict=True):
        assert same_bits(a, b)


def test_disable_switch_and_program_adoption(monkeypatch) -> None:
    prog = _model("bert.onnx")
    monkeypatch.setenv("MIGRAPHX_EP_DISABLE_PASSES", "fuse_attention")
    run_passes(prog.get_main_module(), gpu_pipeline())
    assert not fused(prog.get_main_module())
    monkeypatch.delenv("MIGRAPHX_EP_DISABLE_PASSES")
    prog = _model("bert.onnx")
    run_passes(prog.get_main_module(), gpu_pipeline())
    adopt_submodules(prog)
    bodies = [n for n in prog.modules if "fused_attention" in n]
    assert len(bodies) == 2 and len(set(bodies)) == 2
    copy = prog.clone()  # cloning (verify, caches) finds the bodies by name
    assert copy == prog
    feeds_ = {n: np.ones(s.lens, s.dtype) for n, s in prog.get_parameter_shapes().items()}
    for a, b in zip(run_module(copy.get_main_module(), feeds_), run_module(prog.get_main_module(), feeds_),
                    strict=True):  # fmt: skip
        assert same_bits(a, b)


def test_saved_program_loads_back_with_its_bodies(tmp_path) -> None:
    from migraphx_ep.mxr import load, save

    prog = _model("gpt2.onnx")
    run_passes(prog.get_main_module(), gpu_pipeline())
    adopt_submodules(prog)
    path = tmp_path / "gpt2.mxr"
    save(prog, str(path))
    back = load(str(path))
    assert back == prog and len(fused(back.get_main_module())) == 2


def test_driver_verify_compiles_through_the_pass() -> None:
    """``driver verify`` compiles a copy for the target and compares with the ref interpretation: with the
    gpu pipeline (here on the ref interpreter, no GPU) the copy holds the fused ops and still agrees."""
    from migraphx_ep.driver.verify import run_target, verify_program
    from migraphx_ep.targets.ref import RefTarget

    class GpuPassesOnRef(RefTarget):
        def get_passes(self, options):  # noqa: ANN001, ANN201
            return gpu_pipeline()

    prog = _model("gpt2.onnx")
    params = {n: np.ones(s.lens, s.dtype) for n, s in prog.get_parameter_shapes().items()}
    assert verify_program(prog, GpuPassesOnRef(), params, rtol=1e-6, atol=1e-6) == []
    assert not fused(prog.get_main_module())  # verify compiled a copy
    copy = prog.clone()
    copy.compile(GpuPassesOnRef())
    assert len(fused(copy.get_main_module())) == 2
    assert all(same_bits(a, b) for a, b in zip(run_target(copy, None, params), run_module(
        prog.get_main_module(), params), strict=True))  # fmt: skip


def test_too_few_blocks_stay_unfused(monkeypatch) -> None:
    # The tiny BERT (batch 2, 2 heads, 16 rows) would run 4 blocks: on a real GPU the unfused GEMMs win
    # (kernels/attention.py MIN_BLOCKS, measured on an H100), so by default the chain stays as it is.
    monkeypatch.delenv("MIGRAPHX_EP_ATTENTION_MIN_BLOCKS")
    _, m, _ = _lowered("bert.onnx", monkeypatch, fuse_on=True)
    names = collections.Counter(i.name for i in m.instructions)
    assert names["fused_attention"] == 0 and names["softmax"] == 2
    monkeypatch.setenv("MIGRAPHX_EP_ATTENTION_MIN_BLOCKS", "4")  # 4 blocks: just enough
    _, m, _ = _lowered("bert.onnx", monkeypatch, fuse_on=True)
    assert collections.Counter(i.name for i in m.instructions)["fused_attention"] == 2


def test_half_attention_fuses_however_few_blocks(monkeypatch) -> None:
    # The tensor-core kernel splits the keys among its warps when blocks are few and beats the unfused
    # chain at every size measured (kernels/attention.py MIN_BLOCKS): the gate is the SIMT schedule's.
    monkeypatch.delenv("MIGRAPHX_EP_ATTENTION_MIN_BLOCKS")
    for dtype, fuses in ((np.float16, True), (ml_dtypes.bfloat16, True), (np.float32, False)):
        m = chain(Chain(b=1, h=2, s=16, dtype=dtype))
        run_passes(m, [FUSE_ATTENTION, DEAD_CODE_ELIMINATION])
        assert bool(fused(m)) == fuses, dtype
    monkeypatch.setenv("MIGRAPHX_EP_ATTENTION_MMA", "0")  # half on the SIMT schedule: gated again
    m = chain(Chain(b=1, h=2, s=16, dtype=np.float16))
    run_passes(m, [FUSE_ATTENTION, DEAD_CODE_ELIMINATION])
    assert not fused(m)


@pytest.mark.parametrize("bad", ["many", "-1", "1.5"])
def test_a_bad_block_threshold_is_an_error_naming_it(monkeypatch, bad) -> None:
    monkeypatch.setenv("MIGRAPHX_EP_ATTENTION_MIN_BLOCKS", bad)
    with pytest.raises(
        ValueError, match=f"MIGRAPHX_EP_ATTENTION_MIN_BLOCKS='{bad}': expected an integer >= 0"
    ):
        _lowered("bert.onnx", monkeypatch, fuse_on=True)

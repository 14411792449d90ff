"""The fused attention kernel on a GPU: chains built in the IR, compiled for the gpu target (the
fuse_attention pass makes them one kernel: asserted) against the ref interpretation of the same chain,
over batch, heads, odd sequence lengths (1, 7, 129, 257), head dims (both schedules), masks with fully
hidden rows (NaN, as the IR softmax gives), causal masks, GPT-2's split QKV, half, bfloat16 and float;
then the exported BERT, GPT-2 and ViT through ONNX Runtime against ORT's CPU EP."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from migraphx_ep.ir.evaluate import run_module
from migraphx_ep.ir.program import Program

from .attentioncheck import Chain, chain, feeds, fused
from .gpucheck import Tol, assert_matches

pytestmark = pytest.mark.gpu

BF16 = ml_dtypes.bfloat16
TOL = {np.dtype(np.float16): Tol(2e-2, 2e-2, scaled=True), np.dtype(BF16): Tol(4e-2, 4e-2, scaled=True),
       np.dtype(np.float32): Tol(2e-5, 2e-5, scaled=True)}  # fmt: skip


def run_chain(c: Chain, target, seed: int = 0) -> None:
    prog = Program()
    prog.modules["main"] = chain(c)
    ref = chain(c)
    prog.compile(target)
    assert len(fused(prog.get_main_module())) == 1, "the chain did not fuse: the kernel was not tested"
    for s in (seed, seed + 1):  # two runs: nothing of the first may leak into the second
        params = feeds(ref, seed=s)
        got = prog.run_numpy(params)[0]
        want = run_module(ref, params)[0]
        assert_matches(got, want, TOL[np.dtype(c.dtype)], str(c))


SHAPES = [  # (b, h, s, l, d): l 0 = self-attention
    (1, 1, 1, 0, 64),
    (2, 3, 7, 0, 64),
    (1, 2, 129, 0, 64),
    (2, 2, 257, 0, 128),
    (1, 2, 64, 300, 64),
    (2, 1, 1, 257, 128),
    (3, 2, 33, 0, 16),
    (1, 2, 65, 0, 72),  # padded to 80 on the tensor-core schedule
    (2, 2, 40, 0, 40),
]


@pytest.mark.parametrize("dtype", [np.float16, BF16, np.float32], ids=["f16", "bf16", "f32"])
@pytest.mark.parametrize("b,h,s,lk,d", SHAPES)
def test_fused_attention_matches_ref(gpu, dtype, b, h, s, lk, d) -> None:
    run_chain(Chain(b=b, h=h, s=s, l=lk, d=d, dtype=dtype), gpu)


@pytest.mark.parametrize("dtype", [np.float16, np.float32], ids=["f16", "f32"])
@pytest.mark.parametrize("d,dv", [(256, 256), (160, 96), (8, 8), (24, 40)])
def test_wide_and_narrow_heads(gpu, dtype, d, dv) -> None:
    run_chain(Chain(b=2, h=2, s=45, l=70, d=d, dv=dv, dtype=dtype, merge=dv == d), gpu)


@pytest.mark.parametrize("dtype", [np.float16, BF16, np.float32], ids=["f16", "bf16", "f32"])
@pytest.mark.parametrize(
    "c",
    [
        Chain(mask="none"),
        Chain(mask="causal", s=129),
        Chain(mask="causal_lowest", s=70, l=100),
        Chain(mask="constant", s=20, l=31),
        Chain(scale="div"),
        Chain(scale="qk", s=9),
        Chain(softmax_f32=True, s=33),
        Chain(qkv=True, s=129, mask="causal", d=64),
        Chain(qkv=True, s=7),
        Chain(merge=False, s=66, l=130),
    ],
    ids=str,
)
def test_chain_variants(gpu, dtype, c: Chain) -> None:
    run_chain(Chain(**{**vars(c), "dtype": dtype}), gpu)


def test_simt_schedule_for_half(gpu, monkeypatch) -> None:
    monkeypatch.setenv("MIGRAPHX_EP_ATTENTION_MMA", "0")  # read when the kernel is generated
    for c in (Chain(dtype=np.float16, s=129, d=64), Chain(dtype=BF16, s=7, d=128, mask="causal")):
        run_chain(c, gpu)


def test_long_sequence(gpu) -> None:
    run_chain(Chain(b=1, h=2, s=2048, d=64, dtype=np.float16), gpu)


# -- exported models through ONNX Runtime ----------------------------------------------------------------
@pytest.mark.parametrize("name,seqs", [("bert", (1, 7, 33, 64)), ("gpt2", (1, 7, 32)), ("vit", (17,))])
@pytest.mark.parametrize("fp16", [False, True], ids=["fp32", "fp16"])
def test_models_through_ort_match_cpu(name: str, seqs: tuple, fp16: bool) -> None:
    from test_models_ep import feeds_for

    from .test_gpu_models import GPU, TF32_OFF, load, run_on_gpu

    model = load(f"{name}_fp16" if fp16 else name)
    for seq in seqs:
        for batch in (1, 3):
            feeds_ = feeds_for(model, batch=batch, seq=seq, seed=seq)
            if fp16:
                run_on_gpu(model, feeds_, GPU, rtol=2e-2, atol=2e-2)
            else:
                run_on_gpu(model, feeds_, TF32_OFF, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("name", ["bert", "gpt2_fp16", "vit"])
def test_models_compile_with_fused_attention(gpu, name: str) -> None:
    """The programs ORT runs above: every attention is one fused instruction."""
    import onnx

    from migraphx_ep.frontend import model_to_dict, parse_graph
    from migraphx_ep.frontend.probe import fixed_dims

    from .test_gpu_models import MODELS

    g = model_to_dict(onnx.load(f"{MODELS}/{name}.onnx"))
    prog = parse_graph(g, resolve_dim=fixed_dims(9)).program
    prog.compile(gpu)
    main = prog.get_main_module()
    assert len(fused(main)) == 2 and not [i for i in main.instructions if i.name == "softmax"]

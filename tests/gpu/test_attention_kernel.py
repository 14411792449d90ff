"""The fused attention kernel without a GPU: NVRTC compiles it for every schedule and configuration (and
for sm_75, where the tensor-core schedule falls back to shared-memory MMAs); run-time sizes keep one
source across sequence lengths and batches; and the generated source runs on the host (``blockhost``:
every CUDA thread an OS thread, the MMA fallback doing what ``mma.sync`` does) against the fused op's own
meaning, its body on the ref interpreter: tails, padding, masks, NaN rows, causal, GPT-2's split."""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest

from migraphx_ep.ir.dtypes import DType
from migraphx_ep.ir.evaluate import run_module
from migraphx_ep.ir.instruction import Instruction
from migraphx_ep.ir.shape import Shape
from migraphx_ep.passes import DEAD_CODE_ELIMINATION, run_passes
from migraphx_ep.targets.gpu import nvrtc
from migraphx_ep.targets.gpu.fuse import FUSE_ATTENTION
from migraphx_ep.targets.gpu.kernels.attention import attention_kernel, operand_shapes
from migraphx_ep.targets.gpu.kernels.headers import included
from migraphx_ep.targets.gpu.kernels.spec import KernelSpec
from migraphx_ep.targets.gpu.views import strided_reshape

from .attentioncheck import Chain, chain, fused
from .blockhost import HAVE_GXX, launch
from .gpucheck import FP16, Tol, assert_matches

BF16_CHAIN = Tol(3e-2, 3e-2, scaled=True)  # bf16 probabilities (8-bit mantissa) times V
FP32_CHAIN = Tol(1e-5, 1e-5, scaled=True)


def fused_op(c: Chain) -> Instruction:
    m = chain(c)
    run_passes(m, [FUSE_ATTENTION, DEAD_CODE_ELIMINATION])
    (f,) = fused(m)
    return f


def spec_of(f: Instruction, name: str = "k_attention") -> KernelSpec:
    return attention_kernel(name, f.op, [a.shape for a in f.inputs], f.shape, f.module_args[0])


def schedule(spec: KernelSpec) -> str:
    return "mma" if "mx_attention_mma.cuh" in included(spec.source) else "simt"


# -- NVRTC ------------------------------------------------------------------------------------------------
needs_nvrtc = pytest.mark.skipif(nvrtc.nvrtc_available() is not None, reason=str(nvrtc.nvrtc_available()))

CONFIGS = [
    (Chain(dtype=np.float16, d=64), "mma"),
    (Chain(dtype=np.float16, d=128, mask="none", merge=False), "mma"),
    (Chain(dtype=np.float16, d=72, dv=40, l=20), "mma"),  # padded to 80 and 48
    (Chain(dtype=np.float16, d=256, h=1), "simt"),
    (Chain(dtype=np.float16, d=136, h=1, mask="causal"), "simt"),
    (Chain(dtype=np.float16, qkv=True, mask="causal", d=64), "mma"),
    (Chain(dtype=np.float16, scale="qk", softmax_f32=True), "mma"),
    (Chain(dtype=np.float32, d=64), "simt"),
    (Chain(dtype=np.float32, d=200, h=1, scale="div"), "simt"),
    (Chain(dtype=np.float32, d=8, mask="causal"), "simt"),
]
BF16_CONFIGS = [
    (Chain(dtype=ml_dtypes.bfloat16, d=64), "mma"),
    (Chain(dtype=ml_dtypes.bfloat16, d=32, mask="none", qkv=True), "mma"),
]


@needs_nvrtc
@pytest.mark.parametrize("c,sched", CONFIGS + BF16_CONFIGS, ids=str)
def test_kernel_compiles(c: Chain, sched: str) -> None:
    spec = spec_of(fused_op(c))
    assert schedule(spec) == sched and included(spec.source)[:2] == ["mx_prelude.cuh", "mx_attention.cuh"]
    assert spec.block == (128, 1, 1) and spec.grid[0] >= 1 and spec.shared_bytes <= 227 * 1024
    assert nvrtc.compile_source(spec.source, "sm_90", spec.name)


@needs_nvrtc
@pytest.mark.parametrize("dtype", [np.float16, "bf16"])
def test_mma_schedule_compiles_for_older_gpus(dtype) -> None:
    """Before sm_80 there is no m16n8k16: the same source takes the shared-memory fallback (bfloat16
    needs sm_80 anyway: the prelude's conversions)."""
    spec = spec_of(fused_op(Chain(dtype=ml_dtypes.bfloat16 if dtype == "bf16" else dtype, d=64)))
    assert schedule(spec) == "mma"
    for arch in ("sm_80",) if dtype == "bf16" else ("sm_75", "sm_80"):
        assert nvrtc.compile_source(spec.source, arch, spec.name)


def test_new_sequence_lengths_and_batches_compile_nothing(monkeypatch) -> None:
    """S, L, heads, batch and strides are launch arguments: one source for every size of a model."""
    for c in (
        Chain(dtype=np.float16, d=64),
        Chain(dtype=np.float32, d=32),
        Chain(dtype=np.float16, qkv=True),
    ):
        specs = [
            spec_of(fused_op(Chain(**{**vars(c), "b": b, "s": s}))) for b, s in ((2, 16), (3, 129), (1, 7))
        ]
        assert len({sp.source for sp in specs}) == 1 and len({sp.args for sp in specs}) == 3
    monkeypatch.setenv("MIGRAPHX_EP_RUNTIME_SIZES", "0")
    baked = [spec_of(fused_op(Chain(s=s))) for s in (16, 17)]
    assert baked[0].source != baked[1].source and not baked[0].args


def test_switch_keeps_half_on_the_simt_schedule(monkeypatch) -> None:
    monkeypatch.setenv("MIGRAPHX_EP_ATTENTION_MMA", "0")
    assert schedule(spec_of(fused_op(Chain(dtype=np.float16, d=64)))) == "simt"


def test_strided_reshape_splits_heads_off_a_slice() -> None:
    qkv_slice = Shape(DType.float_type, (2, 16, 32), (1536, 96, 1))
    assert strided_reshape(qkv_slice, (2, 16, 2, 16)).strides == (1536, 96, 16, 1)  # type: ignore[union-attr]
    assert strided_reshape(Shape(DType.float_type, (4, 6), (1, 4)), (24,)) is None
    f = fused_op(Chain(qkv=True))
    q, kt, v = operand_shapes(f.module_args[0], [a.shape for a in f.inputs])[:3]  # type: ignore[misc]
    assert q.strides == (1536, 16, 96, 1) and kt.strides == (1536, 16, 1, 96) and v.strides == q.strides


# -- on the host --------------------------------------------------------------------------------------------
def run_on_host(f: Instruction, tmp, seed: int = 0) -> tuple[np.ndarray, np.ndarray, KernelSpec]:
    """(kernel's output, the op's meaning, spec) on random inputs laid out as the op's input views."""
    rng = np.random.default_rng(seed)
    flats, views = [], []
    for k, a in enumerate(f.inputs):
        s = a.shape
        flat = rng.standard_normal(max(s.element_space(), 1)).astype(np.float32).astype(s.dtype)
        if f.op.mask == "bias" and k == 3:  # [B, 1, 1, L] broadcast: batch 0 hides 2 keys, the last all
            sb, sj, n = s.strides[0], s.strides[-1], s.lens[-1]
            flat[:] = 0
            flat[[(n - 1 - j) * sj for j in range(2)]] = ml_dtypes.finfo(s.dtype).min
            if s.lens[0] > 1:
                flat[[(s.lens[0] - 1) * sb + j * sj for j in range(n)]] = -np.inf
        flats.append(flat)
        views.append(np.lib.stride_tricks.as_strided(flat, s.lens, [x * flat.itemsize for x in s.strides]))
    want = f.op.compute_with_modules(f.shape, views, f.module_args, run_module)
    spec = spec_of(f)
    got = np.full(f.shape.lens, 7, f.shape.dtype)
    launch(spec, tmp, flats, got)
    return got, want, spec


HOST = [
    (Chain(dtype=np.float16, s=7), "mma", FP16),  # one query tile, mostly empty; NaN rows (last batch)
    (Chain(dtype=np.float16, s=70, l=129, d=64, h=1), "mma", FP16),  # 2 query tiles, 3 key tiles, tails
    (Chain(dtype=np.float16, s=65, d=32, h=1, qkv=True, mask="causal"), "mma", FP16),  # skipped tiles
    (Chain(dtype=np.float16, s=1, l=33, b=1), "mma", FP16),
    (Chain(dtype=np.float16, s=30, d=20, h=1, mask="none"), "mma", FP16),  # element loads (20 % 8 != 0)
    (Chain(dtype=np.float16, s=9, d=160, h=1, scale="qk", softmax_f32=True), "simt", FP16),
    (Chain(dtype=np.float32, s=33, d=24, dv=40, l=40, scale="div", h=1), "simt", FP32_CHAIN),
    (Chain(dtype=np.float32, s=5, l=40, d=8, mask="causal_lowest", merge=False), "simt", FP32_CHAIN),
    (Chain(dtype=ml_dtypes.bfloat16, s=20, d=72, dv=40, l=70, h=1, merge=False), "mma", BF16_CHAIN),
]


@pytest.mark.skipif(not HAVE_GXX, reason="no g++ to build kernels for the host")
@pytest.mark.parametrize("c,sched,tol", HOST, ids=str)
def test_kernel_on_the_host_matches_the_fused_ops_meaning(c: Chain, sched: str, tol: Tol, tmp_path) -> None:
    got, want, spec = run_on_host(fused_op(c), tmp_path)
    assert schedule(spec) == sched
    assert_matches(got, want, tol, f"{sched} {c}")
    if c.mask == "bias" and c.b > 1:
        assert np.isnan(got[-1]).all() and not np.isnan(got[0]).any()  # fully hidden rows: NaN, as the ref


# -- the key split of the tensor-core schedule ------------------------------------------------------------
@pytest.mark.parametrize(
    "b,s,split,grid",
    [(1, 128, 4, 12 * 8), (1, 384, 2, 12 * 12), (8, 128, 2, 8 * 12 * 4), (32, 128, 1, 32 * 12 * 2)],
)
def test_few_blocks_split_the_keys_among_the_warps(b: int, s: int, split: int, grid: int) -> None:
    """Batch 1 at seq 128 has 24 (batch, head, 64-row) tiles for 132 SMs: 4 warps split each key tile,
    each block takes 16 rows, and the grid grows 4x; batch 32 keeps one warp per 16 rows of 64."""
    spec = spec_of(fused_op(Chain(dtype=np.float16, b=b, h=12, s=s, d=64)))
    assert schedule(spec) == "mma" and spec.grid == (grid, 1, 1)
    assert ("Os = reinterpret_cast<float*>(Ks)" in spec.source) == (split > 1)  # the partials' merge


@pytest.mark.parametrize(
    "bad,says", [("3", "=3: 1, 2 or 4"), ("abc", "='abc': expected an integer"), ("-1", "='-1': expected")]
)
def test_a_bad_key_split_is_an_error_naming_it(monkeypatch, bad: str, says: str) -> None:
    monkeypatch.setenv("MIGRAPHX_EP_ATTENTION_KEY_WARPS", bad)
    with pytest.raises(ValueError, match="MIGRAPHX_EP_ATTENTION_KEY_WARPS" + re.escape(says)):
        spec_of(fused_op(Chain(dtype=np.float16)))


SPLIT_HOST = [  # NaN rows (batch 1 of 2), key tails, causal tiles skipped, one query row
    Chain(dtype=np.float16, s=70, l=129, d=64, h=1),
    Chain(dtype=np.float16, s=17, b=2, h=1, d=32),
    Chain(dtype=np.float16, s=65, d=32, h=1, qkv=True, mask="causal"),
    Chain(dtype=ml_dtypes.bfloat16, s=1, l=33, b=1, d=72, dv=40),
]


@pytest.mark.skipif(not HAVE_GXX, reason="no g++ to build kernels for the host")
@pytest.mark.parametrize("split", ["1", "2", "4"])
@pytest.mark.parametrize("c", SPLIT_HOST, ids=str)
def test_every_key_split_matches_the_fused_ops_meaning(c: Chain, split: str, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("MIGRAPHX_EP_ATTENTION_KEY_WARPS", split)
    got, want, spec = run_on_host(fused_op(c), tmp_path)
    assert schedule(spec) == "mma"
    assert_matches(got, want, BF16_CHAIN if c.dtype is ml_dtypes.bfloat16 else FP16, f"split {split} {c}")
    if c.mask == "bias" and c.b > 1:
        assert np.isnan(got[-1]).all() and not np.isnan(got[0]).any()

"""Attention chains as PyTorch's eager exports leave them after our passes, built directly in the IR, for
the fuse_attention pass, its kernel (host and NVRTC) and the gpu tests.

``chain(...)`` spells one chain: hidden states [B, S, H*D] split into heads (reshape + transpose views),
K^T by a second transpose, scores * scale (or / divisor, or Q and K scaled), + a [B, 1, 1, L] mask (or a
constant causal one), softmax over the keys, times V, heads merged back. ``qkv=True`` slices Q, K and V
off one [B, S, 3*H*D] projection (GPT-2), so the head split reads a strided slice.
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

from migraphx_ep.ir.dtypes import DType
from migraphx_ep.ir.instruction import Instruction
from migraphx_ep.ir.module import Module
from passes.passcheck import Build  # tests/ is on the path (tests/gpu is a package below it)


@dataclass(frozen=True)
class Chain:
    b: int = 2
    h: int = 2
    s: int = 16
    l: int = 0  # noqa: E741 - keys; 0: self-attention (L = S)
    d: int = 16
    dv: int = 0  # 0: D
    dtype: type = np.float32
    scale: str = "scores"  # scores | div | q | qk | none
    mask: str = "bias"  # bias | none | causal | causal_lowest | constant
    qkv: bool = False
    merge: bool = True  # transpose + reshape back to [B, S, H*Dv]
    softmax_f32: bool = False

    @property
    def keys(self) -> int:
        return self.l or self.s

    @property
    def vdim(self) -> int:
        return self.dv or self.d


def chain(c: Chain, probs_out: bool = False, softmax_axis: int = 3) -> Module:
    """The module; ``probs_out`` also returns the probabilities (which must keep it unfused)."""
    b = Build()
    t, lk, dv = c.dtype, c.keys, c.vdim
    if c.qkv:
        assert c.l == 0 and c.dv == 0
        x = b.param("qkv", [c.b, c.s, 3 * c.h * c.d], t)
        qs, ks, vs = (
            b("slice", x, axes=[2], starts=[k * c.h * c.d], ends=[(k + 1) * c.h * c.d]) for k in range(3)
        )
    else:
        qs, ks = b.param("q", [c.b, c.s, c.h * c.d], t), b.param("k", [c.b, lk, c.h * c.d], t)
        vs = b.param("v", [c.b, lk, c.h * dv], t)
    q = b("transpose", b("reshape", qs, dims=[c.b, c.s, c.h, c.d]), permutation=[0, 2, 1, 3])
    kt = b("transpose", b("reshape", ks, dims=[c.b, lk, c.h, c.d]), permutation=[0, 2, 3, 1])
    v = b("transpose", b("reshape", vs, dims=[c.b, lk, c.h, dv]), permutation=[0, 2, 1, 3])
    lens = [c.b, c.h, c.s, lk]
    factor = 1 / np.sqrt(c.d)
    if c.scale == "q":
        q = b("mul", q, splat(b, factor, q, t))
    if c.scale == "qk":
        q = b("mul", splat(b, np.sqrt(factor), q, t), q)
        kt = b("mul", kt, splat(b, np.sqrt(factor), kt, t))
    x = b("dot", q, kt)
    if c.scale == "scores":
        x = b("mul", x, splat(b, factor, x, t))
    if c.scale == "div":
        x = b("div", x, splat(b, np.sqrt(c.d), x, t))
    if c.mask == "bias":
        m = b.param("mask", [c.b, 1, 1, lk], t)
        x = b("add", b("multibroadcast", m, out_lens=lens), x)
    elif c.mask != "none":
        x = b("add", x, b("multibroadcast", b.lit(mask_value(c), t), out_lens=lens))
    if c.softmax_f32:
        x = b("convert", x, target_type=DType.float_type)
    p = b("softmax", x, axis=softmax_axis)
    if c.softmax_f32:
        p = b("convert", p, target_type=q.shape.type)
    y = b("dot", p, v)
    if c.merge:
        y = b("reshape", b("transpose", y, permutation=[0, 2, 1, 3]), dims=[c.b, c.s, c.h * dv])
    return b.ret(y, p) if probs_out else b.ret(y)


def splat(b: Build, value: float, like: Instruction, t: type) -> Instruction:
    return b("multibroadcast", b.lit(value, t), out_lens=list(like.shape.lens))


def mask_value(c: Chain) -> np.ndarray:
    """A constant [1, 1, S, L] mask: causal with -inf (or the type's lowest), or arbitrary values."""
    lk = c.keys
    shown = np.arange(lk)[None, :] <= np.arange(c.s)[:, None] + (lk - c.s)
    if c.mask == "constant":
        return np.random.default_rng(5).standard_normal((1, 1, c.s, lk)).astype(c.dtype)
    hidden = -np.inf if c.mask == "causal" else ml_dtypes.finfo(c.dtype).min
    return np.where(shown, 0, hidden).astype(c.dtype).reshape(1, 1, c.s, lk)


def fused(m: Module) -> list[Instruction]:
    return [i for i in m.instructions if i.name == "fused_attention"]


def feeds(m: Module, seed: int = 0, masked_rows: bool = True) -> dict[str, np.ndarray]:
    """Normal values; a [B, 1, 1, L] mask hides batch 0's last two keys (the type's lowest value) and,
    with ``masked_rows``, every key of the last batch (-inf: its rows are NaN, the IR softmax's answer)."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, s in m.get_parameter_shapes().items():
        if name == "mask":
            v = np.zeros(s.lens, np.float32)
            v[0, ..., -2:] = float(ml_dtypes.finfo(s.dtype).min) if s.dtype != np.float64 else -1e300
            if masked_rows and s.lens[0] > 1:
                v[-1] = -np.inf
            out[name] = v.astype(s.dtype)
        else:
            out[name] = rng.standard_normal(s.lens).astype(np.float32).astype(s.dtype)
    return out

"""fuse_attention: the attention chain exporters emit becomes one ``fused_attention`` instruction that owns
the matched subgraph (STYLE §6), lowered to one flash-attention kernel (``kernels/attention.py``).

Matched from the root toward the inputs (PyTorch's eager attention in BERT, GPT-2 and ViT after parsing
and simplification; ``tests/gpu/test_fuse_attention.py`` shows the IR before and after)::

    [transpose] dot([convert] softmax[last axis]([convert] [add(bias)] [mul|div(c)] dot(Q', K'^T)), V)

with Q' = Q or Q * c, K'^T likewise, c a one-element constant, and every value inside read only by the
next op of the chain. The fused op reads Q, K^T, V and the bias where the chain read them (transposed
views stay views: the kernel takes their strides), and writes the output standard in the root's dims, so
a trailing transpose costs nothing and the head merge after it is a view. A constant causal bias (0 where
key j <= i + L - S, -inf or the type's lowest elsewhere) becomes ``causal``: the kernel skips those keys.
Softmax in float32 between converts (T -> float -> T) is matched too: the kernel computes it in float.

What does not match stays as it was (GEMMs, pointwise and softmax kernels): another rank, a value inside
read elsewhere (e.g. the probabilities as an output), a type or head dim the kernel does not take.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from ....ir.dtypes import DType, to_numpy
from ....ir.instruction import Instruction
from ....ir.module import Module
from ....ir.operation import ModuleOp, Op
from ....ir.program import Program
from ....ir.shape import ShapeError
from ....ops.fused_attention import FusedAttention
from ....passes.manager import Pass
from ....passes.rewrite import (
    AnyOf,
    Builder,
    Rule,
    any_of,
    apply_rules,
    compact_value,
    literal_source,
    once,
    op,
    var,
)
from ..kernels.attention import attention_supported, attention_worthwhile
from ..views import strided_reshape
from .body import body_name, copy_chain, is_body

_TYPES = frozenset({DType.half_type, DType.bf16_type, DType.float_type})


def scalar(ins: Instruction) -> bool:
    """A one-element constant, seen through broadcasts and other views."""
    lit = literal_source(ins)
    return lit is not None and lit.op.value.size == 1  # type: ignore[attr-defined]


def scalar_of(ins: Instruction | None) -> float:
    return 1.0 if ins is None else float(literal_source(ins).op.value.reshape(()))  # type: ignore[union-attr]


def split_copy(ins: Instruction) -> bool:
    """A reshape the lowering would copy (its input is strided) that is a view all the same: heads split
    off a slice of a fused QKV projection. Fused, the kernel reads the slice through its strides."""
    return (
        once(ins)
        and not ins.inputs[0].shape.standard()
        and strided_reshape(ins.inputs[0].shape, ins.shape.lens) is not None
    )


def _operand(name: str, factor: str, bind: str) -> AnyOf:
    """``name`` (an input of the fused op), seen through a head split, times a one-element constant
    (bound as ``factor``); each part optional."""
    split = op("reshape", var(name), bind=f"{name}_split", when=split_copy)
    value = any_of(op("transpose", split, bind=f"{name}_heads", when=once), var(name))
    return any_of(op("mul", value, var(factor, scalar), bind=bind, when=once), value)


_QK = op("dot", _operand("q", "qc", "qmul"), _operand("kt", "kc", "kmul"), bind="qk", when=once)
_SCORES = any_of(
    op("mul", _QK, var("sc", scalar), bind="smul", when=once),
    op("div", _QK, var("sd", scalar), bind="sdiv", when=once),
    _QK,
)
_LOGITS = any_of(op("add", _SCORES, var("bias"), bind="badd", when=once), _SCORES)
_SOFTMAX = op("softmax", any_of(op("convert", _LOGITS, bind="up", when=once), _LOGITS), bind="sm", when=once)
_PROBS = any_of(op("convert", _SOFTMAX, bind="down", when=once), _SOFTMAX)
_V = any_of(
    op("transpose", op("reshape", var("v"), bind="v_split", when=split_copy), bind="v_heads", when=once),
    var("v"),
)
PATTERN = any_of(
    op("transpose", op("dot", _PROBS, _V, bind="pv", when=once), bind="tr"),
    op("dot", _PROBS, _V, bind="pv"),
)
# The chain's instructions (bound names) in an order where inputs come first.
CHAIN = (
    *(f"{x}_{part}" for x in ("q", "kt", "v") for part in ("split", "heads")),
    *("qmul", "kmul", "qk", "smul", "sdiv", "badd", "up", "sm", "down", "pv", "tr"),
)


def _bound(r: Builder, name: str) -> Instruction | None:
    return r.get(name)


def _causal(bias: Instruction, s: int, lk: int) -> bool:
    """``bias`` is a constant hiding key j from query i exactly when j > i + L - S, with -inf or the
    type's lowest value (what exporters use; its exp underflows to 0 like -inf's whenever a row has a
    visible key, and every row has one when L >= S)."""
    value = compact_value(bias)
    if value is None or value.ndim < 2 or any(n != 1 for n in value.shape[:-2]) or lk < s or s < 2:
        return False
    full = np.broadcast_to(value.reshape(value.shape[-2:]), (s, lk)).astype(np.float64)
    shown = np.arange(lk)[None, :] <= np.arange(s)[:, None] + (lk - s)
    hidden = full[~shown]
    lowest = float(ml_dtypes.finfo(to_numpy(bias.shape.type)).min) if bias.shape.type in _TYPES else -np.inf
    return bool((full[shown] == 0).all() and hidden.size and (np.isin(hidden, [-np.inf, lowest])).all())


def _attributes(r: Builder) -> dict:
    bias = _bound(r, "bias")
    causal = bias is not None and _causal(bias, r.qk.shape.lens[-2], r.qk.shape.lens[-1])
    return {
        "scale": scalar_of(_bound(r, "sc")),
        "divisor": scalar_of(_bound(r, "sd")),
        "q_scale": scalar_of(_bound(r, "qc")),
        "k_scale": scalar_of(_bound(r, "kc")),
        "mask": "bias" if bias is not None and not causal else "none",
        "causal": causal,
        "head_dim": (_bound(r, "q_heads") or r.q).shape.lens[-1],
        "value_dim": r.pv.shape.lens[-1],
        "out_perm": list(r.tr.op.permutation) if _bound(r, "tr") is not None else [],  # type: ignore[attr-defined]
    }


def _inputs(r: Builder, attrs: dict) -> list[Instruction]:
    return [r.q, r.kt, r.v] + ([r.bias] if attrs["mask"] == "bias" else [])


def _standard_ok(tr: Instruction) -> bool:
    """Every reader of ``tr`` computes the same shape from a standard value of its dims (a head merge
    does; ``@return`` does not: a module's output layout is its interface)."""
    std = tr.shape.as_standard()

    def same(u: Instruction) -> bool:
        if u.is_return() or isinstance(u.op, ModuleOp):
            return False
        try:
            return u.op.compute_shape([std if a is tr else a.shape for a in u.inputs]) == u.shape
        except (ShapeError, ValueError, TypeError, IndexError):
            return False

    return all(same(u) for u in tr.outputs)


def _check(r: Builder) -> str | None:
    tr = _bound(r, "tr")
    if tr is None and once(r.pv) and r.pv.outputs[0].name == "transpose" and _standard_ok(r.pv.outputs[0]):
        return "the transpose reading it is the root"  # matched there, with the output laid out for it
    if tr is not None and not _standard_ok(tr):
        return "a reader of the transposed output needs its strides"
    if r.sm.op.axis % r.sm.shape.ndim() != r.sm.shape.ndim() - 1:  # type: ignore[attr-defined]
        return "softmax not over the keys"
    t = r.qk.shape.type
    up, down = _bound(r, "up"), _bound(r, "down")
    if (up is None) != (down is None):
        return "one convert around the softmax"
    if up is not None and (up.shape.type != DType.float_type or down.shape.type != t):  # type: ignore[union-attr]
        return "softmax converts other than to float and back"
    if t not in _TYPES or r.pv.shape.type != t:
        return f"attention in {t.name}"
    attrs = _attributes(r)
    inputs = _inputs(r, attrs)
    body = _body("check", r, inputs)
    why = attention_supported(
        FusedAttention(**attrs), [x.shape for x in inputs], r.root.shape.as_standard(), body
    )
    q = r.qk.inputs[0].shape
    return why or attention_worthwhile(q, q.lens[-1], r.pv.shape.lens[-1])


def _body(name: str, r: Builder, inputs: list[Instruction]) -> Module:
    """The matched chain, copied: parameters for the fused op's inputs, constants rebuilt inside."""
    chain = (_bound(r, n) for n in CHAIN)
    return copy_chain(name, zip(("q", "kt", "v", "bias"), inputs, strict=False), chain)


def _rewrite(r: Builder) -> Instruction:
    attrs = _attributes(r)
    inputs = _inputs(r, attrs)
    m = r.root.module
    assert m is not None
    fused_op: Op = FusedAttention(**attrs)
    body = _body(body_name(m, FusedAttention.name), r, inputs)
    fused = m.insert_instruction(r.root, fused_op, inputs, [body])
    r.created.append(fused)  # removed again if the replacement is refused
    return fused


RULES = [Rule(PATTERN, _rewrite, _check, "fuse_attention")]


def fuse_attention(m: Module) -> bool:
    if is_body(m):
        return False  # a fused op's own body: it is the chain, not a use of it
    return apply_rules(m, RULES)


def adopt_submodules(prog: Program) -> None:
    """List the bodies fusions created in ``prog`` (saving and cloning a program find modules there)."""
    for m in list(prog.modules.values()):
        for ins in m.instructions:
            for sub in ins.module_args:
                prog.modules.setdefault(sub.name, sub)


FUSE_ATTENTION = Pass("fuse_attention", fuse_attention)

__all__ = ["FUSE_ATTENTION", "PATTERN", "adopt_submodules", "fuse_attention"]

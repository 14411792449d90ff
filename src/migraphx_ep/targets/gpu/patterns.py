"""Fusion patterns found in the IR before lowering: each one turns several instructions into one step.

* layernorm: the decomposed LayerNormalization the frontend emits (mean, centre, square, mean, +eps,
  sqrt, recip or div, scale, shift) becomes one row kernel.
* gemm epilogue: ``dot`` + bias row vector (+ a residual of the output's dims) becomes one cuBLASLt call.
* conv epilogue: ``convolution`` + per-channel bias (+ residual) (+ relu) becomes one cuDNN call.

Every matcher checks that each inner value has no user outside the group, so fusing never drops a value
something else still reads. The group's step runs at the position of its last instruction.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...ir.dtypes import DType
from ...ir.instruction import Instruction

VIEW_OPS = frozenset(
    {
        "transpose",
        "reshape",
        "squeeze",
        "unsqueeze",
        "flatten",
        "slice",
        "step",
        "broadcast",
        "multibroadcast",
    }
)


def is_view(ins: Instruction) -> bool:
    return ins.name in VIEW_OPS and ins.op.output_alias([a.shape for a in ins.inputs]) == 0


def only_user(ins: Instruction) -> Instruction | None:
    """The single instruction reading ``ins`` (it may read it twice), or None."""
    users = {id(u): u for u in ins.outputs}
    return next(iter(users.values())) if len(users) == 1 else None


def strip_views(ins: Instruction) -> Instruction:
    while is_view(ins):
        ins = ins.inputs[0]
    return ins


def scalar_value(ins: Instruction) -> float | None:
    """The value of a one-element literal seen through views (a broadcast constant), else None."""
    base = strip_views(ins)
    if base.is_literal():
        v = base.op.value  # type: ignore[attr-defined]
        if v.size == 1:
            return v.reshape(()).item()
    return None


def _other(ins: Instruction, one: Instruction) -> Instruction | None:
    a, b = ins.inputs
    if a is one:
        return b
    if b is one:
        return a
    return None


def _view_of(ins: Instruction, target: Instruction) -> bool:
    return strip_views(ins) is target


@dataclass
class Group:
    kind: str  # 'layernorm' | 'gemm' | 'conv'
    root: Instruction  # the last instruction: the group's value
    covered: list[Instruction] = field(default_factory=list)  # instructions folded in (root included)
    args: dict = field(default_factory=dict)


_LN_TYPES = frozenset({DType.float_type, DType.half_type, DType.bf16_type, DType.double_type})


# -- layernorm -------------------------------------------------------------------------------------------
def _trailing(axes: tuple[int, ...], rank: int) -> int | None:
    norm = sorted(a % rank for a in axes)
    if norm and norm == list(range(norm[0], rank)):
        return norm[0]
    return None


def match_layernorm(mean: Instruction) -> Group | None:
    if mean.name != "reduce_mean":
        return None
    x = mean.inputs[0]
    axis = _trailing(tuple(mean.op.axes), x.shape.ndim())  # type: ignore[attr-defined]
    if axis is None or x.shape.type not in _LN_TYPES:
        return None
    covered = [mean]
    # centred = x - broadcast(mean)
    bmean = only_user(mean)
    if bmean is None or bmean.name != "multibroadcast":
        return None
    centred = only_user(bmean)
    if (
        centred is None
        or centred.name != "sub"
        or centred.inputs[0] is not x
        or centred.inputs[1] is not bmean
    ):
        return None
    covered += [bmean, centred]
    users = {id(u): u for u in centred.outputs}
    sq = next((u for u in users.values() if u.name in ("mul", "pow")), None)
    if sq is None or len(users) != 2:
        return None
    if sq.name == "mul" and not (sq.inputs[0] is centred and sq.inputs[1] is centred):
        return None
    if sq.name == "pow" and (sq.inputs[0] is not centred or scalar_value(sq.inputs[1]) != 2):
        return None
    norm = next(u for u in users.values() if u is not sq)
    var = only_user(sq)
    if var is None or var.name != "reduce_mean" or tuple(var.op.axes) != tuple(mean.op.axes):  # type: ignore
        return None
    covered += [sq, var]
    add_eps = only_user(var)
    if add_eps is None or add_eps.name != "add":
        return None
    eps = scalar_value(_other(add_eps, var)) if _other(add_eps, var) is not None else None
    if eps is None:
        return None
    covered.append(add_eps)
    step = only_user(add_eps)
    if step is None:
        return None
    # Three spellings of (x - mean) / sqrt(var + eps).
    if step.name == "rsqrt":
        covered.append(step)
        scale_b = only_user(step)
        op_needed = "mul"
    elif step.name == "sqrt":
        covered.append(step)
        nxt = only_user(step)
        if nxt is not None and nxt.name == "recip":
            covered.append(nxt)
            scale_b = only_user(nxt)
            op_needed = "mul"
        else:
            scale_b = nxt
            op_needed = "div"
    else:
        return None
    if scale_b is None or scale_b.name != "multibroadcast":
        return None
    covered.append(scale_b)
    if norm.name != op_needed or norm.inputs[0] is not centred or norm.inputs[1] is not scale_b:
        return None
    if only_user(scale_b) is not norm:
        return None
    covered.append(norm)
    root, gamma, beta = norm, None, None
    nxt = only_user(root)
    if nxt is not None and nxt.name == "mul" and not root.is_return():
        g = _other(nxt, root)
        if g is not None and _row_vector(g, x, axis):
            gamma, root = g, nxt
            covered.append(nxt)
            nxt = only_user(root)
    if nxt is not None and nxt.name == "add":
        b = _other(nxt, root)
        if b is not None and _row_vector(b, x, axis):
            beta, root = b, nxt
            covered.append(nxt)
    return Group("layernorm", root, covered, {"x": x, "scale": gamma, "bias": beta, "axis": axis, "eps": eps})


def _row_vector(v: Instruction, x: Instruction, axis: int) -> bool:
    """``v`` has x's dims and varies only along the normalised axes (a broadcast gamma/beta)."""
    if v.shape.lens != x.shape.lens or v.shape.type != x.shape.type:
        return False
    return all(s == 0 for s in v.shape.strides[:axis])


# -- gemm and conv epilogues -------------------------------------------------------------------------------
def _bias_along(v: Instruction, axis: int, out: Instruction) -> bool:
    """``v`` broadcasts a contiguous vector along ``axis`` of ``out``'s dims."""
    s = v.shape
    if s.lens != out.shape.lens or s.type != out.shape.type:
        return False
    return all((st == 0) if i != axis else (st == 1 or s.lens[i] == 1) for i, st in enumerate(s.strides))


def _residual(v: Instruction, out: Instruction) -> bool:
    return v.shape.lens == out.shape.lens and v.shape.type == out.shape.type and v.shape.standard()


def _epilogue(g: Group, axis: int, relu: bool) -> Group | None:
    """Extend ``g`` (a product) with ``+ bias`` broadcast along ``axis``, then ``+ residual``, then
    (where the library has it) relu: each only if it is the sole reader of the value before it."""
    head = g.root
    u = only_user(head)
    if u is not None and u.name == "add" and u.inputs[0] is not u.inputs[1]:
        b = _other(u, head)
        if b is not None and _bias_along(b, axis, head):
            g.args["bias"], g.root = b, u
            g.covered.append(u)
            u = only_user(u)
    if u is not None and u.name == "add" and u.inputs[0] is not u.inputs[1]:
        r = _other(u, g.root)
        if r is not None and _residual(r, head):
            g.args["residual"], g.root = r, u
            g.covered.append(u)
            u = only_user(u)
    if relu and u is not None and u.name == "relu":
        g.args["relu"], g.root = True, u
        g.covered.append(u)
    return g if len(g.covered) > 1 else None


def match_gemm(dot: Instruction) -> Group | None:
    g = Group("gemm", dot, [dot], {"bias": None, "residual": None, "relu": False})
    return _epilogue(g, dot.shape.ndim() - 1, relu=False)


def match_conv(conv: Instruction) -> Group | None:
    g = Group("conv", conv, [conv], {"bias": None, "residual": None, "relu": False})
    return _epilogue(g, 1, relu=True)

"""Run a lowered program's steps with numpy over a simulated arena: no GPU needed.

Every decision the lowering makes that is not inside a kernel's source — fusion groups, views and
their byte offsets, strides (NHWC included), GEMM layouts and batch folding, epilogues, and the
memory plan's reuse of arena bytes — shows up here exactly as it would on the device. Tests compare
the result with the ref target, so those decisions are checked in CI on machines without a GPU.

An input the ref rejects (an index out of range, an integer zero divisor) raises what the executable
raises when the step's kernel reports it through its error slot (``errors.py``); a kernel without the
matching check lets the ref's own error through, which tests tell apart.
"""

from __future__ import annotations

import numpy as np

from ...ir.dtypes import strided_view, to_numpy
from ...ir.evaluate import run_module
from ...ir.operation import ModuleOp
from ...ir.shape import Shape
from ...ops.nn import matmul
from ...ops.quant import QuantDot
from .errors import device_error
from .kernels.spec import KernelSpec, PwConst, PwExpr, PwInput, PwOp
from .memory import align, check_plan
from .steps import Buf, ConvStep, GemmStep, KernelStep, Lowered, Step, plan_lowered


class Memory:
    def __init__(self, lowered: Lowered) -> None:
        self.arena = np.zeros(max(plan_lowered(lowered), 1), np.uint8)
        check_plan([s for s in lowered.storages])
        total = 0
        for w in lowered.weights:
            w.offset = total
            total += align(max(w.nbytes, 1))
        self.weights = np.zeros(max(total, 1), np.uint8)
        for w in lowered.weights:
            raw = np.asarray(w.value).reshape(-1).view(np.uint8)
            self.weights[w.offset : w.offset + raw.size] = raw

    def view(self, b: Buf) -> np.ndarray:
        base = self.weights if b.storage.kind == "weight" else self.arena
        dt = to_numpy(b.shape.type)
        start = b.storage.offset + b.offset
        flat = base[start:]
        flat = flat[: flat.size // dt.itemsize * dt.itemsize]
        return strided_view(flat.view(dt), b.shape.lens, [s * dt.itemsize for s in b.shape.strides])


def _eval(expr: PwExpr, args: list[np.ndarray], lens: tuple[int, ...]) -> np.ndarray:
    if isinstance(expr, PwInput):
        return args[expr.index]
    if isinstance(expr, PwConst):
        return np.full(lens, expr.value, to_numpy(expr.type))
    assert isinstance(expr, PwOp)
    vals = [_eval(a, args, lens) for a in expr.args]
    out_shape = _shape(expr, lens)
    return np.asarray(expr.op.compute(out_shape, vals))


def _shape(expr: PwOp, lens: tuple[int, ...]):
    from ...ir.shape import Shape

    return Shape(expr.type, lens)


def _layernorm(x: np.ndarray, scale, bias, axis: int, eps: float, dt) -> np.ndarray:
    xf = x.astype(np.float64 if dt == np.float64 else np.float32)
    axes = tuple(range(axis, x.ndim))
    mean = xf.mean(axis=axes, keepdims=True)
    var = ((xf - mean) ** 2).mean(axis=axes, keepdims=True)
    y = (xf - mean) / np.sqrt(var + eps)
    if scale is not None:
        y = y * scale
    if bias is not None:
        y = y + bias
    return y.astype(dt)


def run_steps(lowered: Lowered, params: dict[str, np.ndarray]) -> list[np.ndarray]:
    mem = Memory(lowered)
    for name, b in lowered.inputs.items():
        mem.view(b)[...] = params[name]
    for s in lowered.steps:
        try:
            _step(s, mem)
        except Exception as e:  # what the ref raises; a kernel that checks for it reports it instead
            code = _code(s.spec, e) if isinstance(s, KernelStep) else 0
            if not code:
                raise
            raise device_error(s.spec, code) from e
    outs = []
    for o in lowered.outputs:
        outs.append(o.copy() if isinstance(o, np.ndarray) else np.array(mem.view(o)))
    return outs


def _code(spec: KernelSpec, e: Exception) -> int:
    """The code of ``spec``'s check for the ref's error ``e``: one saying the same, else one whose message
    starts the ref's (the ref adds the values), else the first of its kind (index messages differ: the
    ref names the index); 0 when the kernel makes no such check."""
    hits = [k + 1 for k, c in enumerate(spec.checks) if c.error == type(e).__name__]
    same = [k for k in hits if spec.checks[k - 1].message == str(e)]
    starts = [k for k in hits if str(e).startswith(spec.checks[k - 1].message)]
    return (same or starts or hits or [0])[0]


def _step(s: Step, mem: Memory) -> None:
    args = [np.array(mem.view(b)) for b in s.reads]
    out = s.writes[0]
    dt = to_numpy(out.shape.type)
    if isinstance(s, KernelStep) and s.expr is not None:
        res = _eval(s.expr, args, out.shape.lens)
    elif isinstance(s, KernelStep) and s.args.get("axis") is not None and s.label == "layernorm":
        it = iter(args[1:])
        scale = next(it) if s.args["scale"] else None
        bias = next(it) if s.args["bias"] else None
        res = _layernorm(args[0], scale, bias, s.args["axis"], s.args["eps"], dt)
    elif isinstance(s, KernelStep) and isinstance(s.op, ModuleOp):  # a fusion: its body is its meaning
        res = s.op.compute_with_modules(out.shape.as_standard(), args, s.args["modules"], run_module)
    elif isinstance(s, KernelStep):
        res = s.op.compute(out.shape.as_standard(), args)  # type: ignore[union-attr]
        if len(s.writes) > 1:  # one result per output buffer (group_query_attention's update)
            for b, r in zip(s.writes, res, strict=True):
                mem.view(b)[...] = np.asarray(r).reshape(b.shape.lens)
            return
    elif isinstance(s, GemmStep):
        _gemm(s, mem, args)
        return
    elif isinstance(s, ConvStep):
        res = s.op.compute(out.shape.as_standard(), args[:2])
        rest = args[2:]
        acc = res.astype(np.float32) if res.dtype != np.float64 else res
        if s.has_bias:
            b = rest.pop(0)
            acc = acc + b
        if s.has_residual:
            acc = acc + rest.pop(0)
        if s.relu:
            acc = np.maximum(acc, 0)
        res = acc.astype(dt)
    else:  # pragma: no cover
        raise TypeError(s)
    mem.view(out)[...] = np.asarray(res).reshape(out.shape.lens)


def _gemm(s: GemmStep, mem: Memory, args: list[np.ndarray]) -> np.ndarray | None:
    """Read A, B (and C) and write D through the step's own (row, col, batch) layouts, as cuBLASLt
    does; the bias is a contiguous row vector at its buffer's address. Returns None (D is written).
    A quantised GEMM (int8 or fp8 operands, ``s.dtype``) writes D in its accumulator type: int32 exactly
    (numpy's wrapping int32 matmul, as the ref's quant_dot), float32 for fp8."""
    (ra, ca, ba), (rb, cb, bb), (rc, cc, bc) = s.layouts
    dt = to_numpy(s.writes[0].shape.type)  # D's type (also A's and B's unless quantised)

    def mats(buf: Buf, rows: int, cols: int, r: int, c: int, bstride: int) -> np.ndarray:
        t = to_numpy(buf.shape.type)
        base = mem.view(Buf(buf.storage, buf.offset, buf.shape.as_standard().with_lens([1])))
        return strided_view(base, (s.batch, rows, cols), [x * t.itemsize for x in (bstride, r, c)])

    a = np.array(mats(s.reads[0], s.m, s.k, ra, ca, ba))
    b = np.array(mats(s.reads[1], s.k, s.n, rb, cb, bb))
    if s.dtype != s.writes[0].shape.type:  # quant_dot: the op's own meaning
        acc = QuantDot().compute(Shape(s.writes[0].shape.type, (s.batch, s.m, s.n)), [a, b])
    else:
        acc = matmul(a, b, np.float64 if dt == np.float64 else np.float32)
    rest = list(s.reads[2:])
    if s.has_bias:
        acc = acc + np.array(mats(rest.pop(0), 1, s.n, 0, 1, 0))
    if s.has_residual:
        acc = acc + np.array(mats(rest.pop(0), s.m, s.n, rc, cc, bc))
    if s.relu:
        acc = np.maximum(acc, 0)
    d = mats(s.writes[0], s.m, s.n, rc, cc, bc)
    d[...] = acc.astype(dt)
    return None

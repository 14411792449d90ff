"""Pooling: global pools as parallel reductions, other pools one thread per output walking its window.

A pool whose window covers every spatial axis whole (GlobalAveragePool, GlobalMaxPool, GlobalLpPool, or
a pool whose window is the input's spatial size) is a reduction over the spatial axes: it runs on
``reduction_kernel``'s schedules (in NCHW a warp or block per output, 16-byte loads along the row; in
NHWC a block per group of neighbouring channels striding the positions, one vector load each) with the
spatial size a run-time argument, so it compiles once for every input size. As a thread per output
walking a baked window it took 268 us for a 96-channel pool of the PP-OCR detector at 640x448 (H100).

Other pools keep window lengths, pads, strides and dilations (attributes) in the source; N, C and the
spatial sizes are run-time arguments, except an axis a window spans whole: its size and stride stay in
the source, because as run-time values the bounds check and the multiply stay inside the window loop
(12x slower on an H100 for long windows). Such a pool's window follows the input only when it is
global, which takes the reduction path; the rest see a whole axis at one input size only.
"""

from __future__ import annotations

import numpy as np

from ....ir.dtypes import DType, is_float
from ....ir.operation import Op
from ....ir.shape import Shape
from .data import index_kernel, params_for
from .prelude import c_literal, c_type, compute_type, offset
from .reduce import extreme, reduction_kernel
from .spec import KernelSpec


def _pool_math(op: Op, t: DType) -> tuple[str, str, str, str]:
    """(accumulator type, initial value, what element ``{v}`` (storage) adds, result of ``{acc}`` over
    ``{count}`` elements). NaN is skipped by max as in the ref: floats start from NaN, which
    ``mx_fmax`` ignores; pads add nothing to an average or lp norm."""
    out_c = c_type(t)
    if op.mode == "max":  # type: ignore[attr-defined]
        init = c_literal(float("nan"), t) if is_float(t) else extreme(t, high=False)
        return compute_type(t), init, "mx_ld({v})", f"mx_cvt<{out_c}>({{acc}})"
    a = "double" if t == DType.double_type else "float"
    q = op.lp_order  # type: ignore[attr-defined]
    if op.mode == "average" or q == 1:
        term = f"fabs(({a})mx_ld({{v}}))" if op.mode == "lpnorm" else f"({a})mx_ld({{v}})"  # type: ignore[attr-defined]
    elif q == 2:
        term = f"(({a})mx_ld({{v}}) * ({a})mx_ld({{v}}))"
    else:
        term = f"({a})pow((double)fabs(({a})mx_ld({{v}})), {float(q)!r})"
    if op.mode == "average":  # type: ignore[attr-defined]
        finish = f"mx_cvt<{out_c}>({{acc}} / {{count}})"
    elif q == 1:
        finish = f"mx_cvt<{out_c}>({{acc}})"
    elif q == 2:
        finish = f"mx_cvt<{out_c}>(sqrt({{acc}}))"
    else:  # numpy raises a float32 total to the float32 exponent 1/p
        expo = float(np.asarray(1.0 / q).astype(np.float32 if a == "float" else np.float64))
        finish = f"mx_cvt<{out_c}>(({a})pow((double){{acc}}, {expo!r}))"
    return a, f"(({a})0)", term, finish


def is_global_pool(op: Op, x: Shape, out: Shape) -> bool:
    """The window covers every spatial axis whole (no pads, no dilation): one output per (n, c)."""
    k = x.ndim() - 2
    p, _, dil = op.attrs(k)  # type: ignore[attr-defined]
    lens = op.lengths  # type: ignore[attr-defined]
    whole = all(lens[i] == x.lens[2 + i] for i in range(k))
    return whole and not any(p) and all(d == 1 for d in dil) and all(n == 1 for n in out.lens[2:])


def pooling_kernel(name: str, op: Op, x: Shape, out: Shape) -> KernelSpec:
    """N-d max / average / lp pooling: global pools reduce, others walk each output's window."""
    if is_global_pool(op, x, out):
        return _global_pool(name, op, x, out)
    return _window_pool(name, op, x, out)


def _global_pool(name: str, op: Op, x: Shape, out: Shape) -> KernelSpec:
    a, init, term, finish = _pool_math(op, x.type)
    fn = "mx_fmax_f" if op.mode == "max" else "mx_sum_f"  # type: ignore[attr-defined]

    def functor(r: int, rc: str) -> tuple[str, str, str, str, str]:
        # the count is exact in float: a spatial size below 2**24
        return a, init, term.format(v="x"), fn, finish.format(acc="s", count=f"(({a}){rc})")

    return reduction_kernel(name, x, out, tuple(range(2, x.ndim())), functor)


def _window_pool(name: str, op: Op, x: Shape, out: Shape) -> KernelSpec:
    k = x.ndim() - 2
    p, st, dil = op.attrs(k)  # type: ignore[attr-defined]
    lens, mode, t = op.lengths, op.mode, x.type  # type: ignore[attr-defined]
    rp = params_for(out, x)  # window, pads, strides, dilations are attributes; sizes are run-time
    wlen = [str(n) for n in lens]
    whole = [lens[i] == x.lens[2 + i] for i in range(k)]  # see the module doc

    def axis_len(i: int, extra: int = 0) -> str:
        return f"{x.lens[2 + i] + extra}ll" if whole[i] else rp.i64(x.lens[2 + i] + extra)

    xstrides = [rp.stride(s) for s in x.strides[:2]] + [
        x.strides[2 + i] if whole[i] else rp.stride(x.strides[2 + i]) for i in range(k)
    ]
    a, init, term, finish = _pool_math(op, t)
    body = [f"const i64 c{i}0 = (i64)o{2 + i} * {st[i]}ll - {p[i]}ll;" for i in range(k)]
    body.append(f"{a} acc = {init};")
    step = f"acc = mx_fmax(acc, {term.format(v='v')});" if mode == "max" else f"acc += {term.format(v='v')};"
    if mode == "average":
        body.append(f"{a} count = 1;")
        include = op.count_include_pad  # type: ignore[attr-defined]
        for i in range(k):  # explicit pads count when asked; the ceil_mode overhang never does
            lo, hi = (f"{-p[i]}ll", axis_len(i, p[i + k])) if include else ("0", axis_len(i))
            cc = f"c{i}0 + w * {dil[i]}ll"
            body.append(
                f"{{ i64 n = 0; for (int w = 0; w < {wlen[i]}; ++w) n += {cc} >= {lo} && {cc} < {hi};"
            )
            body.append(f"  count *= ({a})n; }}")
    loop_lines = []
    for i in range(k):
        loop_lines.append(f"{'  ' * i}for (int w{i} = 0; w{i} < {wlen[i]}; ++w{i}) {{")
        loop_lines.append(f"{'  ' * (i + 1)}const i64 c{i} = c{i}0 + w{i} * {dil[i]}ll;")
        loop_lines.append(f"{'  ' * (i + 1)}if (c{i} < 0 || c{i} >= {axis_len(i)}) continue;")
    src = offset(["o0", "o1"] + [f"(IDX)c{i}" for i in range(k)], xstrides, "IDX")
    loop_lines.append(f"{'  ' * k}const {c_type(t)} v = in0[{src}]; {step}")
    loop_lines += [f"{'  ' * (k - 1 - i)}}}" for i in range(k)]
    body += loop_lines + [f"out0[oo] = {finish.format(acc='acc', count='count')};"]
    return index_kernel(name, [x], [c_type(t)], out, c_type(t), body, p=rp)


def pooling_indices_kernel(name: str, op: Op, x: Shape, out: Shape) -> KernelSpec:
    """MaxPool's Indices (``ops/sampling.py``): one thread per output walks its window in row-major
    order and keeps the first strict maximum, as the ref's argmax over the padded window does: a NaN
    (the ref's -inf) never wins, and a window with no value above -inf keeps its first element, a pad's
    -1 included. Spatial positions flatten row-major, or column-major for ``storage_order`` 1."""
    k = x.ndim() - 2
    p, st, dil = op.pooling().attrs(k)  # type: ignore[attr-defined]
    lens, order = op.lengths, op.storage_order  # type: ignore[attr-defined]
    rp = params_for(out, x)
    size = [rp.i64(x.lens[2 + i]) for i in range(k)]
    plane = rp.i64(int(np.prod(x.lens[2:], dtype=np.int64)))
    xstrides = [rp.stride(s) for s in x.strides]
    a = "double" if x.type == DType.double_type else "float"  # exact for every input type

    def flat(c: list[str]) -> str:
        """The spatial position of coordinates ``c`` in the ref's flattening (Horner's scheme)."""
        axes = list(range(k)) if order == 0 else list(range(k))[::-1]
        pos = c[axes[0]]
        for i in axes[1:]:
            pos = f"({pos}) * {size[i]} + {c[i]}"
        return pos

    body = [f"const i64 c{i}0 = (i64)o{2 + i} * {st[i]}ll - {p[i]}ll;" for i in range(k)]
    body.append(f"const i64 base = ((i64)o0 * {rp.i64(x.lens[1])} + (i64)o1) * {plane};")
    first = " && ".join(f"c{i}0 >= 0 && c{i}0 < {size[i]}" for i in range(k))
    body.append(f"i64 arg = ({first}) ? base + {flat([f'c{i}0' for i in range(k)])} : -1ll;")
    wide = DType.double_type if a == "double" else DType.float_type
    body.append(f"{a} best = {c_literal(float('-inf'), wide)};")
    for i in range(k):
        ind = "  " * i
        body.append(f"{ind}for (int w{i} = 0; w{i} < {lens[i]}; ++w{i}) {{")
        body.append(f"{ind}  const i64 c{i} = c{i}0 + w{i} * {dil[i]}ll;")
        body.append(f"{ind}  if (c{i} < 0 || c{i} >= {size[i]}) continue;")
    src = offset(["o0", "o1"] + [f"(IDX)c{i}" for i in range(k)], xstrides, "IDX")
    ind = "  " * k
    body.append(f"{ind}const {a} v = ({a})mx_ld(in0[{src}]);")
    body.append(f"{ind}if (v > best) {{ best = v; arg = base + {flat([f'c{i}' for i in range(k)])}; }}")
    body += [f"{'  ' * (k - 1 - i)}}}" for i in range(k)]
    body.append("out0[oo] = arg;")
    return index_kernel(name, [x], [c_type(x.type)], out, "i64", body, p=rp)

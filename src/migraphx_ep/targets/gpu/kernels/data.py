"""Data movement kernels: concat, pad, onehot, trilu, reverse, prefix_scan_sum (pooling and resize, which
build on ``index_kernel``, are in ``pooling.py`` and ``resize.py``).

Each thread computes output elements (walked in the output's memory order, so stores coalesce) from the
output's logical index. Pure copies move raw bits (``raw_type``), so they work for every element type,
float8 included. The gathers, which read indices, are in ``gather.py``.
"""

from __future__ import annotations

import numpy as np

from ....ir.dtypes import DType, to_numpy
from ....ir.operation import Op
from ....ir.shape import Shape
from .params import Params
from .prelude import (
    BLOCK,
    PRELUDE,
    c_type,
    check_strides,
    compute_type,
    decompose,
    grid_for,
    index_type,
    offset,
    signature,
    span,
    walk,
)
from .reduce import acc_type
from .spec import Check, KernelSpec, Unsupported

_RAW = {1: "u8", 2: "u16", 4: "u32", 8: "u64"}
INDEX_TYPES = frozenset({DType.int32_type, DType.int64_type})


def raw_type(t: DType) -> str:
    """An unsigned type of ``t``'s size: copies move bits, whatever the element type."""
    if DType(t) == DType.tuple_type:
        raise Unsupported("tuple values have no elements")
    return _RAW[to_numpy(t).itemsize]


def raw_literal(value: float, t: DType) -> str:
    """``value`` as ``t`` (numpy astype), spelled as the bits of ``raw_type(t)``."""
    with np.errstate(all="ignore"):
        bits = np.asarray(value).astype(to_numpy(t)).reshape(1).view(f"u{to_numpy(t).itemsize}")[0]
    return f"(({raw_type(t)}){int(bits)}ull)"


def out_digits(out: Shape, var: str, idx: str, p: Params | None = None) -> tuple[list[str], list[str]]:
    """C lines giving each logical output dim a digit ``o0..`` from ``var``, which walks ``out`` in
    memory order; lens are run-time arguments when ``p`` is given (and its sizes are), and then a dim
    of length 1 is walked like any other: a batch of 1 and a batch of 7 take one source (BERT's
    embedding gathers compiled again at the first batch above 1). With sizes in the source, dims of
    length 1 get the digit 0."""
    ones = p is not None and p.runtime
    order = sorted((d for d in range(out.ndim()) if ones or out.lens[d] != 1), key=lambda d: -out.strides[d])
    lens = [out.lens[d] if p is None else p(out.lens[d]) for d in order]
    lines = decompose(var, lens, "q", idx)
    digits = [f"(({idx})0)"] * out.ndim()
    for k, d in enumerate(order):
        digits[d] = f"q{k}"
    return lines, digits


def index_kernel(
    name: str,
    ins: list[Shape],
    in_c: list[str],
    out: Shape,
    out_c: str,
    body: list[str],
    checks: tuple[Check, ...] = (),
    p: Params | None = None,
) -> KernelSpec:
    """The grid-stride loop over ``out``'s elements; ``body`` sees ``o0..`` (the output's logical
    index as ``{idx}``), ``oo`` (the output offset), ``IDX`` and ``err`` when ``checks`` are given
    (``continue`` skips an element), and stores ``out0[oo]``. With ``p`` (``params_for``: the body's
    own run-time sizes come first) the loop's sizes are run-time arguments too."""
    check_strides(out, *ins)
    idx = index_type(span(out, *ins))
    n = out.elements()
    if n == 0:
        sig = signature(name, in_c, [out_c], checked=bool(checks))
        return KernelSpec(name, PRELUDE + sig + " {}\n", (1, 1, 1), (BLOCK, 1, 1), 0, len(ins), checks=checks)
    lines, digits = out_digits(out, "i", idx, p)
    count = f"{n}u" if p is None else p(n)
    strides = out.strides if p is None else [p.stride(s) for s in out.strides]
    step = f"gridDim.x * {BLOCK}u"
    src = [f"  for ({idx} i = blockIdx.x * {BLOCK}u + threadIdx.x; i < {count}; i += {step}) {{"]
    src += [f"    {x}" for x in lines]
    src += [f"    const {idx} o{d} = {g};" for d, g in enumerate(digits)]
    src.append(f"    const {idx} oo = {offset([f'o{d}' for d in range(out.ndim())], strides, idx)};")
    src += [f"    {x}" for x in body] + ["  }"]
    sig = signature(name, in_c, [out_c], checked=bool(checks), scalars=p.decls() if p else ())
    text = PRELUDE + f"typedef {idx} IDX;\n" + sig + " {\n" + "\n".join(src) + "\n}\n"
    args, bits = (tuple(p.values), 64 if idx == "u64" else 32) if p else ((), 32)
    return KernelSpec(name, text, grid_for(n), (BLOCK, 1, 1), 0, len(ins), 1, checks, args, bits)


def params_for(out: Shape, *ins: Shape) -> Params:
    """Run-time sizes for an ``index_kernel`` over ``out`` reading ``ins`` (its index type)."""
    return Params(index_type(span(out, *ins)))


def concat_kernel(name: str, op: Op, inputs: list[Shape], out: Shape) -> KernelSpec:
    r = out.ndim()
    a = op.axis % r  # type: ignore[attr-defined]
    o = [f"o{d}" for d in range(r)]
    p = params_for(out, *inputs)
    body, start = [], 0
    for k, s in enumerate(inputs):
        n = s.lens[a]
        if n == 0:
            continue
        src = o[:a] + [f"(o{a} - {p(start)})"] + o[a + 1 :]
        cond = "" if start + n == out.lens[a] else f"if (o{a} < {p(start + n)}) "
        load = offset(src, [p.stride(x) for x in s.strides], "IDX")
        body.append(f"{'' if not body else 'else '}{cond}out0[oo] = in{k}[{load}];")
        start += n
    raw = raw_type(out.type)
    return index_kernel(name, inputs, [raw] * len(inputs), out, raw, body, p=p)


def pad_kernel(name: str, op: Op, x: Shape, out: Shape) -> KernelSpec:
    r = x.ndim()
    pads, mode = op.pads, op.mode  # type: ignore[attr-defined]
    p = params_for(out, x)
    body, src, inside = [], [], []
    for d in range(r):
        lo, n = pads[d], x.lens[d]
        body.append(f"i64 i{d} = (i64)o{d} - {lo}ll;")  # pads are attributes: the same for every shape
        if mode == "constant":
            if lo > 0 or pads[d + r] > 0:
                inside.append(f"i{d} >= 0 && i{d} < {p.i64(n)}")
        elif mode == "reflect":
            body.append(f"i{d} = i{d} < 0 ? -i{d} : (i{d} >= {p.i64(n)} ? {p.i64(2 * n - 2)} - i{d} : i{d});")
        elif mode == "edge":
            body.append(f"i{d} = i{d} < 0 ? 0 : (i{d} >= {p.i64(n)} ? {p.i64(n - 1)} : i{d});")
        else:  # wrap: pads are at most one period
            nn = p.i64(n)
            body.append(f"i{d} = i{d} < 0 ? i{d} + {nn} : (i{d} >= {nn} ? i{d} - {nn} : i{d});")
        src.append(f"(IDX)i{d}")
    load = f"in0[{offset(src, [p.stride(s) for s in x.strides], 'IDX')}]"
    if inside:
        load = f"({' && '.join(inside)}) ? {load} : {raw_literal(op.value, x.type)}"  # type: ignore[attr-defined]
    body.append(f"out0[oo] = {load};")
    raw = raw_type(x.type)
    return index_kernel(name, [x], [raw], out, raw, body, p=p)


def onehot_kernel(name: str, op: Op, indices: Shape, values: Shape, out: Shape) -> KernelSpec:
    """out[..., d, ...] = values[1] where int64(indices[...]) (wrapped once) == d, else values[0]."""
    depth = op.depth  # type: ignore[attr-defined]
    a = op.axis % out.ndim()  # type: ignore[attr-defined]
    o = [f"o{d}" for d in range(out.ndim())]
    flat = [np.unravel_index(k, values.lens) for k in range(2)]
    off, on = (sum(int(i) * s for i, s in zip(f, values.strides, strict=True)) for f in flat)
    ct = compute_type(indices.type)
    conv = "(i64)x" if ct not in ("float", "double") else "mx_cvtt64(x)"
    body = [
        f"const {ct} x = mx_ld(in0[{offset(o[:a] + o[a + 1 :], indices.strides, 'IDX')}]);",
        f"i64 j = {conv};",
        f"if (j < 0) j += {depth}ll;",
        f"out0[oo] = j == (i64)o{a} ? in1[{on}] : in1[{off}];",
    ]
    raw = raw_type(values.type)
    return index_kernel(name, [indices, values], [c_type(indices.type), raw], out, raw, body)


def trilu_kernel(name: str, op: Op, x: Shape, out: Shape) -> KernelSpec:
    r = x.ndim()
    k = op.k  # type: ignore[attr-defined]
    cmp = ">=" if op.upper else "<="  # type: ignore[attr-defined]
    o = [f"o{d}" for d in range(r)]
    keep = f"(i64)o{r - 1} - (i64)o{r - 2} {cmp} {k}ll"
    body = [f"out0[oo] = ({keep}) ? in0[{offset(o, x.strides, 'IDX')}] : ({raw_type(x.type)})0;"]
    raw = raw_type(x.type)
    return index_kernel(name, [x], [raw], out, raw, body)


def reverse_kernel(name: str, op: Op, x: Shape, out: Shape) -> KernelSpec:
    r = x.ndim()
    axes = {a % r for a in op.axes}  # type: ignore[attr-defined]
    src = [f"({x.lens[d] - 1}u - o{d})" if d in axes else f"o{d}" for d in range(r)]
    raw = raw_type(x.type)
    return index_kernel(name, [x], [raw], out, raw, [f"out0[oo] = in0[{offset(src, x.strides, 'IDX')}];"])


def scan_kernel(name: str, op: Op, x: Shape, out: Shape) -> KernelSpec:
    """Cumulative sum along ``op.axis``: a thread walks one row in order (numpy's cumsum is serial)."""
    r = x.ndim()
    a = op.axis % r  # type: ignore[attr-defined]
    t = x.type
    check_strides(x, out)
    rows = walk([x, out], [d for d in range(r) if d != a], x.strides)
    m, n, idx = rows.size(), x.lens[a], index_type(span(x, out))
    acc = acc_type(t)
    sig = signature(name, [c_type(t)], [c_type(out.type)])
    if m == 0 or n == 0:
        return KernelSpec(name, PRELUDE + sig + " {}\n", (1, 1, 1), (BLOCK, 1, 1))
    lines, (bx, bo) = rows.offsets("row", "q", idx)
    step_x, step_o = x.strides[a], out.strides[a]
    e = f"({n - 1}u - k)" if op.reverse else "k"  # type: ignore[attr-defined]
    add = f"s = mx_add(s, ({acc})mx_ld(in0[bx + {e} * {step_x}u]));"
    store = f"out0[bo + {e} * {step_o}u] = mx_cvt<{c_type(out.type)}>(s);"
    loop = f"{store} {add}" if op.exclusive else f"{add} {store}"  # type: ignore[attr-defined]
    src = [
        f"  for ({idx} row = blockIdx.x * {BLOCK}u + threadIdx.x; row < {m}u; row += gridDim.x * {BLOCK}u) {{"
    ]
    src += [f"    {x_}" for x_ in lines]
    src += [f"    const {idx} bx = {bx}, bo = {bo};", f"    {acc} s = 0;"]
    src += [f"    for ({idx} k = 0; k < {n}u; ++k) {{ {loop} }}", "  }"]
    return KernelSpec(name, PRELUDE + sig + " {\n" + "\n".join(src) + "\n}\n", grid_for(m), (BLOCK, 1, 1))

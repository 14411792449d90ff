"""Data movement kernels: concat, pad, onehot, trilu, reverse, prefix_scan_sum, pooling, resize.

Each thread computes output elements (walked in the output's memory order, so stores coalesce) from the
output's logical index. Pure copies move raw bits (``raw_type``), so they work for every element type,
float8 included. The gathers, which read indices, are in ``gather.py``.
"""

from __future__ import annotations

import numpy as np

from ....ir.dtypes import DType, is_float, to_numpy
from ....ir.operation import Op
from ....ir.shape import Shape
from .params import Params
from .prelude import (
    BLOCK,
    PRELUDE,
    c_literal,
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
from .reduce import acc_type, extreme
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
    memory order (dims of length 1 get the digit 0); lens are run-time arguments when ``p`` is given."""
    order = sorted((d for d in range(out.ndim()) if out.lens[d] != 1), key=lambda d: -out.strides[d])
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


def pooling_kernel(name: str, op: Op, x: Shape, out: Shape) -> KernelSpec:
    """N-d max / average / lp pooling: each output walks its window, skipping positions off the input."""
    k = x.ndim() - 2
    p, st, dil = op.attrs(k)  # type: ignore[attr-defined]
    lens, mode, t = op.lengths, op.mode, x.type  # type: ignore[attr-defined]
    rp = params_for(out, x)  # window, pads, strides, dilations are attributes; sizes are run-time
    # Window lengths stay in the source. An axis the window spans whole (global pooling) follows the input,
    # so its size and stride are baked too: as run-time values its bounds check and stride stay inside
    # the window loop, 12x slower on an H100 (PP-OCR detector, 160x112 windows). N and C stay run-time.
    wlen = [str(n) for n in lens]
    whole = [lens[i] == x.lens[2 + i] for i in range(k)]

    def axis_len(i: int, extra: int = 0) -> str:
        return f"{x.lens[2 + i] + extra}ll" if whole[i] else rp.i64(x.lens[2 + i] + extra)

    xstrides = [rp.stride(s) for s in x.strides[:2]] + [
        x.strides[2 + i] if whole[i] else rp.stride(x.strides[2 + i]) for i in range(k)
    ]
    c = compute_type(t)
    a = "double" if t == DType.double_type else "float"
    body = []
    for i in range(k):
        body.append(f"const i64 c{i}0 = (i64)o{2 + i} * {st[i]}ll - {p[i]}ll;")
    if mode == "max":  # NaN is skipped as in the ref: floats start from NaN, what mx_fmax ignores
        body.append(f"{c} acc = {c_literal(float('nan'), t) if is_float(t) else extreme(t, high=False)};")
        step = "acc = mx_fmax(acc, mx_ld(v));"
        finish = f"mx_cvt<{c_type(t)}>(acc)"
    else:
        body.append(f"{a} acc = 0;")
        q = op.lp_order  # type: ignore[attr-defined]
        if mode == "average" or q == 1:
            term = f"fabs(({a})mx_ld(v))" if mode == "lpnorm" else f"({a})mx_ld(v)"
        elif q == 2:
            term = f"(({a})mx_ld(v) * ({a})mx_ld(v))"
        else:
            term = f"({a})pow((double)fabs(({a})mx_ld(v)), {float(q)!r})"
        step = f"acc += {term};"
        if mode == "average":
            body.append(f"{a} count = 1;")
            include = op.count_include_pad  # type: ignore[attr-defined]
            for i in range(k):  # explicit pads count when asked; the ceil_mode overhang never does
                if include:
                    lo, hi = f"{-p[i]}ll", axis_len(i, p[i + k])
                else:
                    lo, hi = "0", axis_len(i)
                cc = f"c{i}0 + w * {dil[i]}ll"
                count_n = f"n += {cc} >= {lo} && {cc} < {hi};"
                body.append(f"{{ i64 n = 0; for (int w = 0; w < {wlen[i]}; ++w) {count_n}")
                body.append(f"  count *= ({a})n; }}")
            finish = f"mx_cvt<{c_type(t)}>(acc / count)"
        elif q == 1:
            finish = f"mx_cvt<{c_type(t)}>(acc)"
        elif q == 2:
            finish = f"mx_cvt<{c_type(t)}>(sqrt(acc))"
        else:  # numpy raises a float32 total to the float32 exponent 1/p
            expo = float(np.asarray(1.0 / q).astype(np.float32 if a == "float" else np.float64))
            finish = f"mx_cvt<{c_type(t)}>(({a})pow((double)acc, {expo!r}))"
    loop_lines = []
    for i in range(k):
        loop_lines.append(f"{'  ' * i}for (int w{i} = 0; w{i} < {wlen[i]}; ++w{i}) {{")
        loop_lines.append(f"{'  ' * (i + 1)}const i64 c{i} = c{i}0 + w{i} * {dil[i]}ll;")
        loop_lines.append(f"{'  ' * (i + 1)}if (c{i} < 0 || c{i} >= {axis_len(i)}) continue;")
    src = offset(["o0", "o1"] + [f"(IDX)c{i}" for i in range(k)], xstrides, "IDX")
    loop_lines.append(f"{'  ' * k}const {c_type(t)} v = in0[{src}]; {step}")
    loop_lines += [f"{'  ' * (k - 1 - i)}}}" for i in range(k)]
    body += loop_lines + [f"out0[oo] = {finish};"]
    return index_kernel(name, [x], [c_type(t)], out, c_type(t), body, p=rp)


# -- resize ------------------------------------------------------------------------------------------------
_MAX_TABLE = 16384  # output positions per resized axis baked into the source


def resize_tables(op: Op, in_lens: tuple[int, ...]) -> list[tuple[np.ndarray, np.ndarray, np.ndarray] | None]:
    """Per axis, None when the ref skips it, else (neighbours [n_out, taps], weights float64 [n_out,
    taps], outside [n_out]): the per-axis steps of ``Resize.compute`` (nearest keeps one tap)."""
    r = len(in_lens)
    tables: list[tuple[np.ndarray, np.ndarray, np.ndarray] | None] = []
    for axis in range(r):
        n_in, n_out, scale = in_lens[axis], op.out_lens[axis], float(op.scales[axis])  # type: ignore[attr-defined]
        roi = (op.roi[axis], op.roi[axis + r]) if op.roi else (0.0, 1.0)  # type: ignore[attr-defined]
        trivial = roi == (0.0, 1.0) or (
            np.isclose(roi[0], 0.0, rtol=1e-9, atol=0) and np.isclose(roi[1], 1.0)
        )
        if np.isclose(scale, 1.0, rtol=1e-9, atol=0) and n_out == n_in and trivial or n_out == 0:
            tables.append(None)
            continue
        ctm = op.coordinate_transformation_mode  # type: ignore[attr-defined]
        x_ori, nbr, w = op.axis_taps(n_in, axis, r)  # type: ignore[attr-defined]
        if op.mode == "nearest":  # type: ignore[attr-defined]
            nbr = nbr[np.arange(n_out), np.argmax(w, axis=1)][:, None]
            w = np.ones_like(nbr, np.float64)
        outside = np.zeros(n_out, bool)
        if ctm == "tf_crop_and_resize":
            outside = (x_ori < 0) | (x_ori > n_in - 1)
        tables.append((nbr, w, outside))
    return tables


def resize_supported(op: Op, x: Shape) -> str | None:
    if op.mode not in ("nearest", "linear") or (op.mode == "linear" and op.antialias):  # type: ignore[attr-defined]
        return f"resize mode {op.mode} (antialias={op.antialias}) has no kernel"  # type: ignore[attr-defined]
    if any(n > _MAX_TABLE for n in op.out_lens):  # type: ignore[attr-defined]
        return f"resize to {list(op.out_lens)}: tables too large"  # type: ignore[attr-defined]
    if op.mode == "linear" and x.type not in (
        DType.half_type,
        DType.bf16_type,
        DType.float_type,
        DType.double_type,
    ):  # type: ignore[attr-defined]
        return f"linear resize of {x.type.name}"
    return None


def _array(ctype: str, name: str, values: np.ndarray) -> str:
    if ctype == "double":
        items = ", ".join(float(v).hex() for v in values.ravel())
    elif ctype == "bool":
        items = ", ".join("1" if v else "0" for v in values.ravel())
    else:
        items = ", ".join(str(int(v)) for v in values.ravel())
    return f"__device__ const {ctype} {name}[{max(values.size, 1)}] = {{{items or '0'}}};\n"


def resize_kernel(name: str, op: Op, x: Shape, out: Shape) -> KernelSpec:
    """Nearest (a copy of raw bits) or linear (float64 weights, summed axis by axis like the ref)."""
    why = resize_supported(op, x)
    if why:
        raise Unsupported(why)
    tables = resize_tables(op, x.lens) if out.elements() else [None] * x.ndim()
    axes = [a for a, tb in enumerate(tables) if tb is not None]
    tf = op.coordinate_transformation_mode == "tf_crop_and_resize"  # type: ignore[attr-defined]
    arrays = ""
    for a in axes:
        nbr, w, outside = tables[a]  # type: ignore[misc]
        arrays += (
            _array("i32", f"nb{a}", nbr) + _array("double", f"w{a}", w) + _array("bool", f"ob{a}", outside)
        )
    tf = op.coordinate_transformation_mode == "tf_crop_and_resize"  # type: ignore[attr-defined]
    o = [f"o{d}" for d in range(x.ndim())]
    if op.mode == "nearest":  # type: ignore[attr-defined]
        src = [f"(IDX)nb{d}[o{d}]" if d in axes else o[d] for d in range(x.ndim())]
        load = f"in0[{offset(src, x.strides, 'IDX')}]"
        if tf and axes:
            extrap = raw_literal(op.extrapolation_value, x.type)  # type: ignore[attr-defined]
            load = f"({' || '.join(f'ob{a}[o{a}]' for a in axes)}) ? {extrap} : {load}"
        body = [f"out0[oo] = {load};"]
        raw = raw_type(x.type)
        spec = index_kernel(name, [x], [raw], out, raw, body)
    else:
        extrap = float(op.extrapolation_value).hex()  # type: ignore[attr-defined]

        def value(k: int, src: list[str]) -> str:
            """Axis ``axes[k]``'s result (the ref resizes axes in order: the last one is outermost)."""
            if k < 0:
                return f"(double)mx_ld(in0[{offset(src, x.strides, 'IDX')}])"
            a = axes[k]
            taps = []
            for j in range(2):
                s2 = list(src)
                s2[a] = f"(IDX)nb{a}[o{a} * 2 + {j}]"
                taps.append(f"__dmul_rn({value(k - 1, s2)}, w{a}[o{a} * 2 + {j}])")
            e = f"__dadd_rn({taps[0]}, {taps[1]})"
            return f"(ob{a}[o{a}] ? {extrap} : {e})" if tf else e

        info = np.finfo(to_numpy(out.type))
        lo, hi = float(info.min).hex(), float(info.max).hex()
        body = [
            f"const double v = {value(len(axes) - 1, o)};",
            f"out0[oo] = mx_cvt<{c_type(out.type)}>(mx_min(mx_max(v, {lo}), {hi}));",
        ]
        spec = index_kernel(name, [x], [c_type(x.type)], out, c_type(out.type), body)
    head = len(PRELUDE)
    return KernelSpec(spec.name, spec.source[:head] + arrays + spec.source[head:], spec.grid, spec.block)

"""Reductions, softmax and layer norm.

Reductions pick one of four schedules from where the reduced elements sit in memory: a warp (or a
block, for long rows and few outputs) per output when they are the fast-moving dims; a thread per output
(coalesced across neighbouring outputs) when the kept dims are; 32 outputs x 8 slices per block when the
kept dims are fast but there are too few outputs to fill the GPU; a plain thread loop for tiny rows.

Softmax and layer norm read each row once into registers (rows up to 8192 elements), reduce across the
threads of the row with shuffles, and write it once; groups of 1..32 lanes share a row when rows are
short. Longer rows, and softmax along a dim that is not the fastest in memory, re-read global memory.
"""

from __future__ import annotations

import numpy as np

from ....ir.dtypes import SIGNED_INT_TYPES, DType, is_float, to_numpy
from ....ir.operation import Op
from ....ir.shape import Shape
from .prelude import (
    BLOCK,
    NARROW,
    PRELUDE,
    Walk,
    c_literal,
    c_type,
    check_strides,
    compute_type,
    grid_for,
    index_type,
    signature,
    span,
    vector_width,
    walk,
)
from .spec import KernelSpec, Unsupported

REDUCE_OPS = frozenset(
    {"reduce_sum", "reduce_mean", "reduce_prod", "reduce_max", "reduce_min", "argmax", "argmin"}
)
SOFTMAX_OPS = frozenset({"softmax", "logsoftmax"})
_SPLIT = 8  # r-slices per block in the split schedule (32 outputs x 8 warps)


def acc_type(t: DType) -> str:
    """What sums accumulate in: float for <=32-bit floats, double for double, integers in their own type."""
    if t in NARROW or t == DType.float_type:
        return "float"
    return c_type(t)


def _axes(op: Op, rank: int) -> tuple[int, ...]:
    if op.name in ("argmax", "argmin"):
        return (op.axis % rank,)  # type: ignore[attr-defined]
    return tuple(sorted({a % rank for a in op.axes}))  # type: ignore[attr-defined]


def _functor(op: Op, t: DType, r: int) -> tuple[str, str, str, str, str]:
    """(state type, initial state, element -> state, combine functor, state -> output element)."""
    name, out_c, c = op.name, c_type(t), compute_type(t)
    if name in ("argmax", "argmin"):
        last = "true" if op.select_last_index else "false"  # type: ignore[attr-defined]
        s = f"mx_arg<{c}>"
        f = f"mx_arg_f<{c}, {'true' if name == 'argmax' else 'false'}, {last}>"
        return s, f"{s}{{({c})0, -1}}", f"{s}{{mx_ld(x), (i64)r}}", f, "s.i"
    if name in ("reduce_max", "reduce_min"):  # NaN is skipped as in the ref: floats start from NaN
        init = c_literal(float("nan"), t) if is_float(t) and r else extreme(t, high=name == "reduce_min")
        return c, init, "mx_ld(x)", f"mx_f{name[7:]}_f", f"mx_cvt<{out_c}>(s)"
    a = acc_type(t)
    init = f"(({a}){1 if name == 'reduce_prod' else 0})"
    fn = "mx_prod_f" if name == "reduce_prod" else "mx_sum_f"
    finish = f"mx_cvt<{out_c}>(s)"
    if name == "reduce_mean":
        if a in ("float", "double"):
            finish = f"mx_cvt<{out_c}>(s / ({a}){r})"
        elif r == 0:
            finish = f"({out_c})0"
        else:  # truncating division of the wrapped sum, as the ref computes it
            wide = "i64" if t in SIGNED_INT_TYPES else "u64"
            finish = f"({out_c})(({wide})s / ({wide}){r})"
    return a, init, f"({a})mx_ld(x)", fn, finish


def extreme(t: DType, high: bool) -> str:
    """The identity of max (lowest value) or min (highest): -inf/+inf, integer limits, false/true."""
    if t == DType.bool_type:
        return "true" if high else "false"
    if is_float(t):
        return c_literal(float("inf") if high else -float("inf"), t)
    info = np.iinfo(to_numpy(t))
    return c_literal(int(info.max if high else info.min), t)


def _fastest(s: Shape, dims: list[int]) -> int | None:
    """The smallest stride among ``dims`` of ``s`` that are longer than 1 (None: there are none)."""
    st = [s.strides[d] for d in dims if s.lens[d] > 1]
    return min(st) if st else None


def reduce_supported(op: Op, inputs: list[Shape], out: Shape) -> str | None:
    if op.name not in REDUCE_OPS:
        return f"{op.name} is not a reduction"
    try:
        c_type(inputs[0].type)
        check_strides(inputs[0], out)
    except Unsupported as e:
        return str(e)
    return None


def reduce_kernel(name: str, op: Op, input: Shape, out: Shape) -> KernelSpec:  # noqa: A002
    """``op`` (reduce_* or argmax/argmin) of ``input`` into ``out`` (reduced dims kept as 1)."""
    why = reduce_supported(op, [input], out)
    if why:
        raise Unsupported(why)
    rank = input.ndim()
    axes = _axes(op, rank)
    kept = [d for d in range(rank) if d not in axes]
    kw = walk([input, out], kept, out.strides)
    rw = walk([input], axes, input.strides)
    m, r = kw.size(), rw.size()
    sig = signature(name, [c_type(input.type)], [c_type(out.type)])
    if m == 0:
        return KernelSpec(name, PRELUDE + sig + " {}\n", (1, 1, 1), (BLOCK, 1, 1))
    idx = index_type(span(input, out))
    s, init, elem, fn, finish = _functor(op, input.type, r)
    r_lines, (r_off,) = rw.offsets("r", "e", idx)
    head = PRELUDE + f"typedef {s} mx_s;\n"
    head += f"MX_DEV mx_s mx_elem(const {c_type(input.type)}* __restrict__ in0, {idx} base, {idx} r) {{\n"
    head += (
        "".join(f"  {x}\n" for x in r_lines)
        + f"  const auto x = in0[base + {r_off}];\n  return {elem};\n}}\n"
    )
    head += f"MX_DEV {c_type(out.type)} mx_finish(mx_s s) {{ return {finish}; }}\n"

    red_inner, kept_inner = _fastest(input, list(axes)), _fastest(input, kept)
    if r <= 16:
        body, grid = _thread(kw, idx, m, r, init, fn), grid_for(m)
    elif kept_inner is None or (red_inner is not None and red_inner < kept_inner):
        tpr = BLOCK if (r > 4096 and m < 1024) else 32
        body, grid = _row(kw, idx, m, r, init, fn, tpr), grid_for(m, BLOCK // tpr)
    elif m < 65536:
        body, grid = _split(kw, idx, m, r, init, fn), grid_for(m, 32)
    else:
        body, grid = _thread(kw, idx, m, r, init, fn), grid_for(m)
    return KernelSpec(name, head + sig + " {\n" + body + "}\n", grid, (BLOCK, 1, 1))


def _bases(kw: Walk, var: str, idx: str, pad: str) -> list[str]:
    lines, (base, oo) = kw.offsets(var, "k", idx)
    return [pad + x for x in lines] + [f"{pad}const {idx} base = {base}, oo = {oo};"]


def _thread(kw: Walk, idx: str, m: int, r: int, init: str, fn: str) -> str:
    """A thread per output, starting from the first element (so a 1-element reduce is a copy)."""
    lines = [f"  for ({idx} o = blockIdx.x * {BLOCK}u + threadIdx.x; o < {m}u; o += gridDim.x * {BLOCK}u) {{"]
    lines += _bases(kw, "o", idx, "    ")
    lines.append(f"    mx_s acc = {'mx_elem(in0, base, 0)' if r else init};")
    lines.append(f"    for ({idx} r = 1; r < {r}u; ++r) acc = {fn}()(acc, mx_elem(in0, base, r));")
    lines += ["    out0[oo] = mx_finish(acc);", "  }"]
    return "\n".join(lines) + "\n"


def _row(kw: Walk, idx: str, m: int, r: int, init: str, fn: str, tpr: int) -> str:
    """A warp (tpr 32) or the block (tpr 256) per output; lanes stride the reduced elements."""
    if tpr == BLOCK:
        loop, t, red = (
            f"{idx} o = blockIdx.x; o < {m}u; o += gridDim.x",
            "threadIdx.x",
            f"mx_block_reduce<{BLOCK}>",
        )
    else:
        first = f"(blockIdx.x * {BLOCK}u + threadIdx.x) / 32u"
        loop = f"{idx} o = {first}; o < {m}u; o += gridDim.x * {BLOCK // 32}u"
        t, red = "threadIdx.x % 32u", "mx_warp_reduce<32>"
    lines = [f"  for ({loop}) {{"] + _bases(kw, "o", idx, "    ")
    lines.append(f"    mx_s acc = {init};")
    lines.append(f"    for ({idx} r = {t}; r < {r}u; r += {tpr}u) acc = {fn}()(acc, mx_elem(in0, base, r));")
    lines.append(f"    acc = {red}(acc, {fn}());")
    lines += [f"    if ({t} == 0) out0[oo] = mx_finish(acc);", "  }"]
    return "\n".join(lines) + "\n"


def _split(kw: Walk, idx: str, m: int, r: int, init: str, fn: str) -> str:
    """32 neighbouring outputs per block, their reduced elements split over 8 warps, then combined."""
    lines = [
        f"  __shared__ mx_s part[{_SPLIT}][32];",
        "  const u32 lane = threadIdx.x % 32u, slice = threadIdx.x / 32u;",
        f"  for ({idx} ob = blockIdx.x * 32u; ob < {m}u; ob += gridDim.x * 32u) {{",
        f"    const {idx} o = ob + lane;",
        f"    mx_s acc = {init};",
        f"    if (o < {m}u) {{",
        *_bases(kw, "o", idx, "      "),
        f"      for ({idx} r = slice; r < {r}u; r += {_SPLIT}u) acc = {fn}()(acc, mx_elem(in0, base, r));",
        "    }",
        "    part[slice][lane] = acc;",
        "    __syncthreads();",
        f"    if (slice == 0 && o < {m}u) {{",
        *_bases(kw, "o", idx, "      "),
        f"      for (int k = 1; k < {_SPLIT}; ++k) acc = {fn}()(acc, part[k][lane]);",
        "      out0[oo] = mx_finish(acc);",
        "    }",
        "    __syncthreads();",
        "  }",
    ]
    return "\n".join(lines) + "\n"


# -- rows: softmax and layer norm ------------------------------------------------------------------------
def _row_shape(n: int) -> tuple[int, bool]:
    """(threads per row, whether the row is cached in registers; else global memory is re-read)."""
    if n <= 1024:
        tpr = 1
        while tpr < 32 and tpr * 8 < n:
            tpr *= 2
        return tpr, True
    return BLOCK, n <= 32 * BLOCK


class _Rows:
    """Source pieces shared by the row kernels: the rows loop, per-element offsets, chunk loops.

    A row body is ``template <int V> mx_row(...)``: thread ``t`` of the row owns chunks ``c = j * TPR + t``
    of ``V`` consecutive elements (``V`` > 1 only when every tensor is contiguous along the row and the
    pointers are aligned; the kernel checks the pointers and otherwise runs ``mx_row<1>``).
    """

    def __init__(self, shapes: list[Shape], rows: Walk, elems: Walk, n: int) -> None:
        self.shapes, self.rows, self.elems, self.n = shapes, rows, elems, n
        self.m, self.idx = rows.size(), index_type(span(*shapes))
        self.tpr, self.cached = _row_shape(n)
        v = vector_width(*(s.type for s in shapes))
        contiguous = elems.strides and all(st == [1] for st in elems.strides)
        aligned = all(x % v == 0 for st in rows.strides for x in st) and n % v == 0
        self.vec = v if self.cached and contiguous and aligned else 1

    def source(self, name: str, sig: str, body: list[str]) -> KernelSpec:
        idx, tensors = self.idx, len(self.shapes)
        head = ""
        for fn, w, var in (("mx_base", self.rows, "row"), ("mx_eoff", self.elems, "e")):
            lines, offs = w.offsets(var, "q", idx)
            cases = "".join(f"  if (k == {k}) return {o};\n" for k, o in enumerate(offs))
            head += f"MX_DEV {idx} {fn}({idx} {var}, int k) {{\n" + "".join(f"  {x}\n" for x in lines)
            head += f"{cases}  return 0;\n}}\n"
        params = sig[sig.index(f" {name}(") + len(name) + 2 : sig.rindex(")")]
        args = ", ".join([f"in{k}" for k in range(tensors - 1)] + ["out0"])
        bases = ", ".join(f"b{k} = mx_base(row, {k})" for k in range(tensors))
        per = f"({self.n} + {self.tpr} * V - 1) / ({self.tpr} * V)" if self.cached else "0"
        head += f"template <int V> MX_DEV void mx_row({params}, {idx} row, bool ok, u32 t) {{\n"
        head += f"  constexpr int PER = {per};\n  const {idx} {bases};\n" + "\n".join(body) + "\n}\n"
        if self.tpr == BLOCK:
            loop = [f"  for ({idx} row = blockIdx.x; row < {self.m}u; row += gridDim.x) {{",
                    "    const bool ok = true; const u32 t = threadIdx.x;"]  # fmt: skip
        else:  # uniform across the warp, so every lane reaches the shuffles
            first = f"(blockIdx.x * {BLOCK}u + threadIdx.x) / 32u * {32 // self.tpr}u"
            step = f"gridDim.x * {BLOCK // self.tpr}u"
            loop = [f"  for ({idx} r0 = {first}; r0 < {self.m}u; r0 += {step}) {{",
                    f"    const {idx} row = r0 + threadIdx.x % 32u / {self.tpr}u;",
                    f"    const bool ok = row < {self.m}u;",
                    f"    const u32 t = threadIdx.x % {self.tpr}u;"]  # fmt: skip
        if self.vec > 1:
            v = self.vec
            ptrs = [f"in{k}" for k in range(tensors - 1)] + ["out0"]
            check = " | ".join(
                f"(u64){p} % {v * s.type_size()}" for p, s in zip(ptrs, self.shapes, strict=True)
            )
            loop = [f"  const bool vec = ({check}) == 0;", *loop]
            call = f"    if (vec) mx_row<{v}>({args}, row, ok, t); else mx_row<1>({args}, row, ok, t);"
        else:
            call = f"    mx_row<1>({args}, row, ok, t);"
        src = PRELUDE + head + sig + " {\n" + "\n".join([*loop, call, "  }"]) + "\n}\n"
        grid = grid_for(self.m, BLOCK // self.tpr if self.tpr < BLOCK else 1)
        return KernelSpec(name, src, grid, (BLOCK, 1, 1), 0, tensors - 1)

    def reduce(self, var: str, fn: str) -> str:
        red = f"mx_block_reduce<{BLOCK}>" if self.tpr == BLOCK else f"mx_warp_reduce<{self.tpr}>"
        return f"  {var} = {red}({var}, {fn}());"

    def chunks(self, body: str) -> list[str]:
        """``body`` per chunk ``c`` (slot ``j``) this thread owns, or per element ``e`` when uncached."""
        if self.cached:
            return ["#pragma unroll", "  for (int j = 0; j < PER; ++j) {",
                    f"    const {self.idx} c = j * {self.tpr}u + t;",
                    f"    if (ok && c * V < {self.n}u) {{ {body} }}", "  }"]  # fmt: skip
        return [f"  for ({self.idx} e = t; ok && e < {self.n}u; e += {self.tpr}u) {{ {body} }}"]

    def each(self, body: str) -> list[str]:
        """``body`` per cached element ``v[s]`` (``s = j * V + q``) or per element ``e``."""
        if self.cached:
            return self.chunks(f"MX_UNROLL for (int q = 0; q < V; ++q) {{ const int s = j * V + q; {body} }}")
        return self.chunks(body)


def _load(k: int, dst: str) -> str:
    """Chunk ``c`` of tensor ``k`` into ``dst[0..V)`` (compute values)."""
    return f"mx_ldv<V>(in{k} + b{k} + mx_eoff(c * V, {k}), {dst});"


def _elem(k: int) -> str:
    return f"mx_ld(in{k}[b{k} + mx_eoff(e, {k})])"


def softmax_supported(op: Op, inputs: list[Shape], out: Shape) -> str | None:
    if op.name not in SOFTMAX_OPS:
        return f"{op.name} is not softmax"
    if inputs[0].type not in (DType.half_type, DType.bf16_type, DType.float_type, DType.double_type):
        return f"softmax of {inputs[0].type.name} has no kernel"
    try:
        check_strides(inputs[0], out)
    except Unsupported as e:
        return str(e)
    return None


def softmax_kernel(name: str, op: Op, input: Shape, out: Shape) -> KernelSpec:  # noqa: A002
    """softmax / logsoftmax along ``op.axis``: max-subtracted, half/bf16 rounded per step like the ref."""
    why = softmax_supported(op, [input], out)
    if why:
        raise Unsupported(why)
    t, rank = input.type, input.ndim()
    axis = op.axis % rank  # type: ignore[attr-defined]
    others = [d for d in range(rank) if d != axis]
    n = input.lens[axis]
    sig = signature(name, [c_type(t)], [c_type(t)])
    if input.elements() == 0:
        return KernelSpec(name, PRELUDE + sig + " {}\n", (1, 1, 1), (BLOCK, 1, 1))
    R = _Rows(
        [input, out], walk([input, out], others, input.strides), walk([input, out], [axis], input.strides), n
    )
    fastest = _fastest(input, others)
    if fastest is not None and input.strides[axis] >= fastest:  # a column: a thread per row, coalesced
        R.tpr, R.cached, R.vec = 1, False, 1
    c, a, rnd = compute_type(t), acc_type(t), f"mx_round<{c_type(t)}>"
    log = op.name == "logsoftmax"
    x = "v[s]" if R.cached else _elem(0)
    lines = [f"  {c} v[PER * V];", *R.chunks(_load(0, "v + j * V"))] if R.cached else []
    lines += [
        f"  {c} mx = {c_literal(-float('inf'), t)};",
        *R.each(f"mx = mx_max(mx, {x});"),
        R.reduce("mx", "mx_max_f"),
    ]
    keep = ("v[s] = d;" if log else "v[s] = p;") if R.cached else ""
    lines += [
        f"  {a} sum = 0;",
        *R.each(f"const {c} d = {rnd}({x} - mx), p = {rnd}(exp(d)); sum += p; {keep}"),
    ]
    lines += [R.reduce("sum", "mx_sum_f"), f"  const {c} total = {rnd}(sum), ls = {rnd}(log(total));"]
    if R.cached:
        y = "v[j * V + q] - ls" if log else "v[j * V + q] / total"
        store = "mx_stv<V>(out0 + b1 + mx_eoff(c * V, 1), y);"
        lines += R.chunks(f"{c} y[V]; MX_UNROLL for (int q = 0; q < V; ++q) y[q] = {y}; {store}")
    else:
        y = "d - ls" if log else f"{rnd}(exp(d)) / total"
        lines += R.each(
            f"const {c} d = {rnd}({x} - mx); out0[b1 + mx_eoff(e, 1)] = mx_cvt<{c_type(t)}>({y});"
        )
    return R.source(name, sig, lines)


def layernorm_kernel(
    name: str, x: Shape, scale: Shape | None, bias: Shape | None, out: Shape, axis: int, eps: float
) -> KernelSpec:
    """(x - mean) / sqrt(var + eps) * scale + bias over dims ``axis..``; mean and biased variance in
    float (double for double), one rounding at the end."""
    t, rank = x.type, x.ndim()
    if t not in (DType.half_type, DType.bf16_type, DType.float_type, DType.double_type):
        raise Unsupported(f"layernorm of {t.name} has no kernel")
    axis %= max(rank, 1)
    extra = [s for s in (scale, bias) if s is not None]
    shapes = [x, *extra, out]
    for s in extra:
        if s.lens != x.lens:
            raise Unsupported(f"layernorm scale/bias {s} not broadcast to {list(x.lens)}")
    check_strides(*shapes)
    sig = signature(name, [c_type(s.type) for s in (x, *extra)], [c_type(out.type)])
    if x.elements() == 0:
        return KernelSpec(name, PRELUDE + sig + " {}\n", (1, 1, 1), (BLOCK, 1, 1), 0, 1 + len(extra))
    rows, elems = walk(shapes, list(range(axis)), x.strides), walk(shapes, list(range(axis, rank)), x.strides)
    R = _Rows(shapes, rows, elems, elems.size())
    n, a, o = R.n, ("double" if t == DType.double_type else "float"), 1 + len(extra)
    xv = "v[s]" if R.cached else f"({a}){_elem(0)}"
    lines = [f"  {a} v[PER * V];", *R.chunks(_load(0, "v + j * V"))] if R.cached else []
    lines += [f"  {a} sum = 0;", *R.each(f"sum += {xv};"), R.reduce("sum", "mx_sum_f")]
    lines += [f"  const {a} mean = sum / ({a}){n};", f"  {a} sq = 0;"]
    lines += [*R.each(f"const {a} d = {xv} - mean; sq += d * d;"), R.reduce("sq", "mx_sum_f")]
    eps_c = c_literal(eps, DType.double_type if a == "double" else DType.float_type)
    lines.append(f"  const {a} inv = ({a})1 / sqrt(sq / ({a}){n} + {eps_c});")
    ops = ["*" if k == 1 and scale is not None else "+" for k in range(1, o)]
    if R.cached:
        loads = "".join(f"{a} p{k}[V]; {_load(k, f'p{k}')} " for k in range(1, o))
        y = "(v[j * V + q] - mean) * inv" + "".join(
            f" {op} p{k}[q]" for k, op in zip(range(1, o), ops, strict=True)
        )
        store = f"mx_stv<V>(out0 + b{o} + mx_eoff(c * V, {o}), y);"
        lines += R.chunks(f"{loads}{a} y[V]; MX_UNROLL for (int q = 0; q < V; ++q) y[q] = {y}; {store}")
    else:
        y = f"({xv} - mean) * inv" + "".join(
            f" {op} ({a}){_elem(k)}" for k, op in zip(range(1, o), ops, strict=True)
        )
        lines += R.each(f"out0[b{o} + mx_eoff(e, {o})] = mx_cvt<{c_type(out.type)}>({y});")
    return R.source(name, sig, lines)

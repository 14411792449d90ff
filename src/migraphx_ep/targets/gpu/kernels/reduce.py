"""Reductions (reduce_*, argmax/argmin), and the schedules global pooling shares (``reduction_kernel``).

The output count ``M``, the reduced count ``R`` and every len and stride other than 0 and 1 are
run-time arguments (``Params``), so a new shape of the same structure reuses the compiled kernel. The
schedule follows where the reduced elements sit in memory and the size class of ``R`` and ``M``:

* thread: a thread per output, for rows of at most 16 elements, and for 65536+ outputs whose kept dims
  are the fast ones (coalesced across neighbouring outputs);
* row: the reduced elements are the fast-moving dims (NCHW pooling): a warp per output, or the block
  for long rows (> 4096) and few outputs (< 1024); a row that is one contiguous run moves vectors
  when the run-time flag (kept strides are multiples of ``V``) and the pointer's alignment allow;
* wide: the kept dims are fast (NHWC pooling: channels) and rows long (>= 128): a block per group of
  ``V`` neighbouring outputs, its threads (1024 for rows of 8192+) striding the reduced elements with
  one vector load per position when the group is contiguous and aligned, then one block reduction;
* split: kept dims fast and rows short: 32 neighbouring outputs x 8 slices per block, then combined.

Softmax and layer norm rows are in ``rows.py``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from ....ir.dtypes import SIGNED_INT_TYPES, DType, is_float, to_numpy
from ....ir.operation import Op
from ....ir.shape import Shape
from .params import Params
from .prelude import (
    BLOCK,
    NARROW,
    PRELUDE,
    Walk,
    batch_of_one,
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
from .spec import KERNEL_SYMBOL, KernelSpec, Unsupported

REDUCE_OPS = frozenset(
    {"reduce_sum", "reduce_mean", "reduce_prod", "reduce_max", "reduce_min", "argmax", "argmin"}
)
SOFTMAX_OPS = frozenset({"softmax", "logsoftmax"})
_SPLIT = 8  # r-slices per block in the split schedule (32 outputs x 8 warps)
_WIDE = 8192  # rows at least this long get 1024 threads per block in the wide schedule

# (state type, initial state, state of element ``x`` at reduced index ``r``, combine functor, output
# element of state ``s``); built from (R, the C name of the reduced count).
Functor = tuple[str, str, str, str, str]
MakeFunctor = Callable[[int, str], Functor]


def acc_type(t: DType) -> str:
    """What sums accumulate in: float for <=32-bit floats, double for double, integers in their own type."""
    if t in NARROW or t == DType.float_type:
        return "float"
    return c_type(t)


def _axes(op: Op, rank: int) -> tuple[int, ...]:
    if op.name in ("argmax", "argmin"):
        return (op.axis % rank,)  # type: ignore[attr-defined]
    return tuple(sorted({a % rank for a in op.axes}))  # type: ignore[attr-defined]


def _functor(op: Op, t: DType, r: int, rc: str) -> Functor:
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
            finish = f"mx_cvt<{out_c}>(s / ({a}){rc})"
        elif r == 0:
            finish = f"({out_c})0"
        else:  # truncating division of the wrapped sum, as the ref computes it
            wide = "i64" if t in SIGNED_INT_TYPES else "u64"
            finish = f"({out_c})(({wide})s / ({wide}){rc})"
    return a, init, f"({a})mx_ld(x)", fn, finish


def extreme(t: DType, high: bool) -> str:
    """The identity of max (lowest value) or min (highest): -inf/+inf, integer limits, false/true."""
    if t == DType.bool_type:
        return "true" if high else "false"
    if is_float(t):
        return c_literal(float("inf") if high else -float("inf"), t)
    info = np.iinfo(to_numpy(t))
    return c_literal(int(info.max if high else info.min), t)


def fastest(s: Shape, dims: list[int]) -> int | None:
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
    axes = _axes(op, input.ndim())
    return reduction_kernel(name, input, out, axes, lambda r, rc: _functor(op, input.type, r, rc))


def reduction_kernel(
    name: str, x: Shape, out: Shape, axes: tuple[int, ...], functor: MakeFunctor, schedule: str = ""
) -> KernelSpec:
    """``out`` (``x`` with ``axes`` reduced to 1) from ``functor``'s state, combine and finish.

    Where the reduced elements sit picks the family (row, or kept-fast); the sizes pick the schedule in
    it (module doc; ``schedule``: forced). The family's other schedules are the kernel's ``others``,
    compiled beside it, so a shape of another size class (a global pool of another image size) finds
    its kernel compiled."""
    rank = x.ndim()
    kept = [d for d in range(rank) if d not in axes]
    kw, rw = walk([x, out], kept, out.strides), walk([x], list(axes), x.strides)
    m, r = kw.size(), rw.size()
    in_c, out_c = c_type(x.type), c_type(out.type)
    if m == 0:
        return KernelSpec(
            name, PRELUDE + signature(name, [in_c], [out_c]) + " {}\n", (1, 1, 1), (BLOCK, 1, 1)
        )
    idx = index_type(span(x, out))
    p = Params(idx)
    M, R = p(m), p(r)
    s, init, elem, fn, finish = functor(r, R)
    r_lines, (r_off,) = rw.offsets("r", "e", idx, p)
    k_lines, (k_base, k_out) = kw.offsets("o", "k", idx, p)
    lam = [
        f"  auto mx_val = [&](const {in_c} x, {idx} r) -> mx_s {{ return {elem}; }};",
        f"  auto mx_roff = [&]({idx} r) -> {idx} {{ " + " ".join(r_lines) + f" return {r_off}; }};",
        f"  auto mx_elem = [&]({idx} base, {idx} r) -> mx_s {{ return mx_val(in0[base + mx_roff(r)], r); }};",
        f"  auto mx_kept = [&]({idx} o, {idx}& base, {idx}& oo) {{ "
        + " ".join(k_lines)
        + f" base = {k_base}; oo = {k_out}; }};",
        f"  auto mx_finish = [&](mx_s s) -> {out_c} {{ return {finish}; }};",
    ]
    sched = _Schedule(idx, in_c, init, fn, vector_width(x.type), M, R)
    red_inner, kept_inner = fastest(x, list(axes)), fastest(x, kept)
    rows = kept_inner is None or (red_inner is not None and red_inner < kept_inner)
    chosen = schedule or _schedule(rows, r, m)
    block = BLOCK
    if chosen == "thread":
        body, grid = sched.thread(r), grid_for(m)
    elif chosen.startswith("row"):
        tpr = int(chosen[3:])
        aligned = all(st % sched.v == 0 for st in kw.strides[0])
        contiguous = len(rw.lens) == 1 and rw.strides[0] == [1] and (aligned or p.runtime)
        vok = p(int(aligned)) if contiguous else None
        body, grid = sched.row(tpr, vok), grid_for(m, BLOCK // tpr)
    elif chosen.startswith("wide"):
        block = int(chosen[4:])
        vok = p(int(_groups_contiguous(kw, rw, sched.v)))
        body, grid = sched.wide(block, vok), grid_for(-(-m // sched.v), 1)
    else:
        body, grid = sched.split(), grid_for(m, 32)
    sig = signature(name, [in_c], [out_c], threads=block, scalars=p.decls())
    src = PRELUDE + f"typedef {s} mx_s;\n" + sig + " {\n" + "\n".join(lam) + "\n" + body + "}\n"
    bits = 64 if idx == "u64" else 32
    spec = KernelSpec(name, src, grid, (block, 1, 1), 0, 1, 1, (), tuple(p.values), bits)
    if schedule or r == 0:
        return spec
    family = ("thread", "row32", f"row{BLOCK}") if rows else ("thread", f"wide{BLOCK}", "wide1024", "split")
    rest = [f for f in family if f != chosen]

    def others() -> list[KernelSpec]:
        specs = [reduction_kernel(KERNEL_SYMBOL, x, out, axes, functor, f) for f in rest]
        if x.ndim() >= 2 and x.lens[0] > 1:  # and at batch 1, where the batch dim drops out
            one = reduction_kernel(KERNEL_SYMBOL, batch_of_one(x), batch_of_one(out), axes, functor)
            specs += [one, *(one.others() if one.others is not None else [])]
        return specs

    return dataclasses.replace(spec, others=others)


def _schedule(rows: bool, r: int, m: int) -> str:
    """The schedule for ``r`` reduced elements per output and ``m`` outputs (module doc)."""
    if r <= 16:
        return "thread"
    if rows:
        return f"row{BLOCK}" if (r > 4096 and m < 1024) else "row32"
    if r >= 128:
        return "wide1024" if r >= _WIDE else f"wide{BLOCK}"
    return "split" if m < 65536 else "thread"


def _groups_contiguous(kw: Walk, rw: Walk, v: int) -> bool:
    """Whether each group of ``v`` neighbouring outputs reads ``v`` adjacent, vector-aligned elements:
    the fastest kept dim is unit-stride with a multiple of ``v`` elements, other strides multiples of v."""
    kept, red = kw.strides[0], rw.strides[0]
    return kept[-1] == 1 and kw.lens[-1] % v == 0 and all(st % v == 0 for st in kept[:-1] + red)


class _Schedule:
    """Kernel bodies over the lambdas ``reduction_kernel`` defines (``mx_val``, ``mx_roff``, ``mx_elem``,
    ``mx_kept``, ``mx_finish``); ``M`` and ``R`` are the C names of the output and reduced counts."""

    def __init__(self, idx: str, in_c: str, init: str, fn: str, v: int, M: str, R: str) -> None:
        self.idx, self.in_c, self.init, self.fn, self.v, self.M, self.R = idx, in_c, init, fn, v, M, R
        self.vt = f"mx_vec<{in_c}, {v}>"

    def _vec(self, flag: str) -> str:
        return f"  const bool vec = {flag} != 0 && (u64)in0 % sizeof({self.vt}) == 0;"

    def thread(self, r: int) -> str:
        """A thread per output, starting from the first element (so a 1-element reduce is a copy)."""
        idx, fn, M = self.idx, self.fn, self.M
        return "\n".join([
            f"  for ({idx} o = blockIdx.x * {BLOCK}u + threadIdx.x; o < {M}; o += gridDim.x * {BLOCK}u) {{",
            f"    {idx} base, oo; mx_kept(o, base, oo);",
            f"    mx_s acc = {'mx_elem(base, 0)' if r else self.init};",
            f"    for ({idx} r = 1; r < {self.R}; ++r) acc = {fn}()(acc, mx_elem(base, r));",
            "    out0[oo] = mx_finish(acc);",
            "  }",
        ]) + "\n"  # fmt: skip

    def row(self, tpr: int, vok: str | None) -> str:
        """A warp (tpr 32) or the block (tpr 256) per output; lanes stride the reduced elements, in
        vectors of ``v`` when the row is one contiguous run (``vok``) and aligned."""
        idx, fn, M, R, v = self.idx, self.fn, self.M, self.R, self.v
        if tpr == BLOCK:
            loop, t, red = (
                f"{idx} o = blockIdx.x; o < {M}; o += gridDim.x",
                "threadIdx.x",
                f"mx_block_reduce<{BLOCK}>",
            )
        else:
            first = f"(blockIdx.x * {BLOCK}u + threadIdx.x) / 32u"
            loop = f"{idx} o = {first}; o < {M}; o += gridDim.x * {BLOCK // 32}u"
            t, red = "threadIdx.x % 32u", "mx_warp_reduce<32>"
        lines = [self._vec(vok)] if vok is not None else []
        lines += [f"  for ({loop}) {{", f"    {idx} base, oo; mx_kept(o, base, oo);",
                  f"    mx_s acc = {self.init};", f"    {idx} r0 = 0;"]  # fmt: skip
        if vok is not None:  # whole vectors first, then the tail (and everything when unaligned)
            lines += [
                "    if (vec) {",
                f"      const {idx} nv = {R} / {v}u;",
                "#pragma unroll 4",
                f"      for ({idx} c = {t}; c < nv; c += {tpr}u) {{",
                f"        const {self.vt} w = *reinterpret_cast<const {self.vt}*>(in0 + base + c * {v}u);",
                f"        MX_UNROLL for (int q = 0; q < {v}; ++q)",
                f"          acc = {fn}()(acc, mx_val(w.v[q], c * {v}u + q));",
                "      }",
                f"      r0 = nv * {v}u;",
                "    }",
            ]
        lines += [
            "#pragma unroll 4",
            f"    for ({idx} r = r0 + {t}; r < {R}; r += {tpr}u) acc = {fn}()(acc, mx_elem(base, r));",
            f"    acc = {red}(acc, {fn}());",
            f"    if ({t} == 0) out0[oo] = mx_finish(acc);",
            "  }",
        ]
        return "\n".join(lines) + "\n"

    def wide(self, nt: int, vok: str) -> str:
        """A block of ``nt`` threads per group of ``v`` neighbouring outputs: every thread strides the
        reduced elements for all of them (one vector load per position when the group is contiguous
        and aligned), then a warp reduction, one shared-memory pass, and thread q finishes output q."""
        idx, fn, M, R, g = self.idx, self.fn, self.M, self.R, self.v
        live = f"g * {g}u + q < {M}"
        lines = [
            f"  __shared__ mx_s part[{g}][{nt // 32}];",
            self._vec(vok),
            f"  for ({idx} g = blockIdx.x; g * {g}u < {M}; g += gridDim.x) {{",
            f"    {idx} base[{g}], oo;",
            f"    mx_s acc[{g}];",
            f"    MX_UNROLL for (int q = 0; q < {g}; ++q) {{ base[q] = 0; acc[q] = {self.init}; "
            f"if ({live}) mx_kept(g * {g}u + q, base[q], oo); }}",
            "    if (vec) {",
            "#pragma unroll 4",
            f"      for ({idx} r = threadIdx.x; r < {R}; r += {nt}u) {{",
            f"        const {self.vt} w = *reinterpret_cast<const {self.vt}*>(in0 + base[0] + mx_roff(r));",
            f"        MX_UNROLL for (int q = 0; q < {g}; ++q) acc[q] = {fn}()(acc[q], mx_val(w.v[q], r));",
            "      }",
            "    } else {",
            "#pragma unroll 2",
            f"      for ({idx} r = threadIdx.x; r < {R}; r += {nt}u) {{",
            f"        const {idx} e = mx_roff(r);",
            f"        MX_UNROLL for (int q = 0; q < {g}; ++q)",
            f"          if ({live}) acc[q] = {fn}()(acc[q], mx_val(in0[base[q] + e], r));",
            "      }",
            "    }",
            f"    MX_UNROLL for (int q = 0; q < {g}; ++q) acc[q] = mx_warp_reduce<32>(acc[q], {fn}());",
            "    if (threadIdx.x % 32u == 0)",
            f"      MX_UNROLL for (int q = 0; q < {g}; ++q) part[q][threadIdx.x / 32u] = acc[q];",
            "    __syncthreads();",
            f"    if (threadIdx.x < {g}u && g * {g}u + threadIdx.x < {M}) {{",
            "      mx_s s = part[threadIdx.x][0];",
            f"      for (int w = 1; w < {nt // 32}; ++w) s = {fn}()(s, part[threadIdx.x][w]);",
            f"      {idx} b; mx_kept(g * {g}u + threadIdx.x, b, oo);",
            "      out0[oo] = mx_finish(s);",
            "    }",
            "    __syncthreads();  // part is rewritten by the next group",
            "  }",
        ]
        return "\n".join(lines) + "\n"

    def split(self) -> str:
        """32 neighbouring outputs per block, their reduced elements split over 8 warps, then combined."""
        idx, fn, M, R = self.idx, self.fn, self.M, self.R
        lines = [
            f"  __shared__ mx_s part[{_SPLIT}][32];",
            "  const u32 lane = threadIdx.x % 32u, slice = threadIdx.x / 32u;",
            f"  for ({idx} ob = blockIdx.x * 32u; ob < {M}; ob += gridDim.x * 32u) {{",
            f"    const {idx} o = ob + lane;",
            f"    {idx} base = 0, oo = 0;",
            f"    mx_s acc = {self.init};",
            f"    if (o < {M}) {{",
            "      mx_kept(o, base, oo);",
            f"      for ({idx} r = slice; r < {R}; r += {_SPLIT}u) acc = {fn}()(acc, mx_elem(base, r));",
            "    }",
            "    part[slice][lane] = acc;",
            "    __syncthreads();",
            f"    if (slice == 0 && o < {M}) {{",
            f"      for (int k = 1; k < {_SPLIT}; ++k) acc = {fn}()(acc, part[k][lane]);",
            "      out0[oo] = mx_finish(acc);",
            "    }",
            "    __syncthreads();",
            "  }",
        ]
        return "\n".join(lines) + "\n"

"""Softmax and layer norm: rows read once into registers, reduced with shuffles, written once.

Row length, row count and every len and stride other than 0 and 1 are run-time arguments (``Params``),
so one compiled kernel serves every shape in a size class. The class fixes what shapes the loops:
threads per row and how many elements each thread may hold in registers (``PER``, unrolled):

* short rows (n <= 256): 1..32 lanes per row, the smallest power of two giving at most 8 elements a
  lane; the lane count is a run-time argument (its log2), so BERT's softmax over 16 or 24 keys is one
  kernel;
* warp rows (n <= 512, <= 1024) and block rows (n <= 2048, 4096, 8192): a warp or the block per row,
  registers for the class's longest row (at most 2x the elements a row needs: the rest are predicated
  off);
* longer rows, and softmax along a dim that is not the fastest in memory (a thread per row, coalesced
  across rows), re-read global memory instead.

Rows contiguous in every tensor move ``V``-element vectors when the run-time flag (the row length and
row strides are multiples of ``V``) and the pointers' alignment allow it, else the scalar row body.
"""

from __future__ import annotations

from ....ir.dtypes import DType
from ....ir.operation import Op
from ....ir.shape import Shape
from .params import Params
from .prelude import (
    BLOCK,
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
from .reduce import SOFTMAX_OPS, acc_type, fastest
from .spec import KernelSpec, Unsupported

_SHORT = 256  # rows up to this long share a warp: lanes per row chosen at run time, 8 elements a lane


def row_class(n: int) -> tuple[int, int]:
    """(threads per row, 0 for the run-time lanes of short rows; elements per thread held in
    registers, 0 when rows re-read global memory) of rows of ``n`` elements."""
    if n <= _SHORT:
        return 0, 8
    if n <= 1024:
        return 32, (512 if n <= 512 else 1024) // 32
    if n <= 32 * BLOCK:
        return BLOCK, (1 << (n - 1).bit_length()) // BLOCK
    return BLOCK, 0


def short_lanes(n: int) -> int:
    """Lanes per short row: the fewest (a power of two) holding at most 8 elements each."""
    lanes = 1
    while lanes < 32 and lanes * 8 < n:
        lanes *= 2
    return lanes


class _Rows:
    """Source pieces shared by the row kernels: the rows loop, per-element offsets, chunk loops.

    A row body is ``template <int V> mx_row(...)``: thread ``t`` of the row's ``tpr`` owns chunks
    ``c = j * tpr + t`` of ``V`` consecutive elements (``V`` > 1 only when every tensor is contiguous
    along the row; the kernel checks the run-time flag and the pointers, and otherwise runs
    ``mx_row<1>``). ``N`` and ``M`` name the row length and the row count in the source.
    """

    def __init__(self, shapes: list[Shape], rows: Walk, elems: Walk, column: bool = False) -> None:
        self.shapes, self.rows, self.elems = shapes, rows, elems
        self.m, n = rows.size(), elems.size()
        self.idx = index_type(span(*shapes))
        self.p = p = Params(self.idx)
        self.N, self.M = p(n), p(self.m)
        self.tpr, self.per = (1, 0) if column else row_class(n)
        if self.tpr == 0:  # short rows: log2 of the lanes per row is an argument
            lanes = short_lanes(n)
            self.lanes, self.lg = lanes, p(lanes.bit_length() - 1)
        else:
            self.lanes, self.lg = self.tpr, f"{max(self.tpr.bit_length() - 1, 0)}u"
        self.cached = self.per > 0
        v = vector_width(*(s.type for s in shapes))
        contiguous = bool(elems.strides) and all(st == [1] for st in elems.strides)
        aligned = n % v == 0 and all(x % v == 0 for st in rows.strides for x in st)
        # With baked sizes (MIGRAPHX_EP_RUNTIME_SIZES=0) a row body this shape never takes is left out.
        self.vec = v if self.cached and contiguous and v > 1 and (aligned or p.runtime) else 1
        if self.vec > 1:
            self.vec_ok = p(int(aligned))

    def source(self, name: str, in_types: list[str], out_type: str, body: list[str]) -> KernelSpec:
        idx, p, tensors = self.idx, self.p, len(self.shapes)
        lambdas = ""
        for fn, w, var in (("mx_base", self.rows, "row"), ("mx_eoff", self.elems, "e")):
            lines, offs = w.offsets(var, "q", idx, p)
            cases = "".join(f"    if (k == {k}) return {o};\n" for k, o in enumerate(offs))
            lambdas += f"  auto {fn} = [&]({idx} {var}, int k) -> {idx} {{\n"
            lambdas += "".join(f"    {x}\n" for x in lines) + cases + "    return 0;\n  };\n"
        sig = signature(name, in_types, [out_type], scalars=p.decls())
        params = sig[sig.index(f" {name}(") + len(name) + 2 : sig.rindex(")")]
        ptrs = [f"in{k}" for k in range(tensors - 1)] + ["out0"]
        args = ", ".join(ptrs + [f"p{k}" for k in range(len(p.values))])
        bases = ", ".join(f"b{k} = mx_base(row, {k})" for k in range(tensors))
        head = f"template <int V> MX_DEV void mx_row({params}, {idx} row, bool ok, u32 t, u32 tpr) {{\n"
        head += f"  constexpr int PER = {self.per} / V;\n" + lambdas
        head += f"  const {idx} {bases};\n" + "\n".join(body) + "\n}\n"
        if self.tpr == BLOCK:
            loop = [f"  for ({idx} row = blockIdx.x; row < {self.M}; row += gridDim.x) {{",
                    f"    const bool ok = true; const u32 t = threadIdx.x, tpr = {BLOCK}u;"]  # fmt: skip
        else:  # rows of one warp: uniform across it, so every lane reaches the shuffles
            rows = f"(32u >> {self.lg})"
            loop = [f"  for ({idx} r0 = (blockIdx.x * {BLOCK}u + threadIdx.x) / 32u * {rows}; r0 < {self.M};"
                    f" r0 += gridDim.x * {BLOCK // 32}u * {rows}) {{",
                    f"    const {idx} row = r0 + ((threadIdx.x % 32u) >> {self.lg});",
                    f"    const bool ok = row < {self.M};",
                    f"    const u32 tpr = 1u << {self.lg}, t = threadIdx.x % 32u & (tpr - 1u);"]  # fmt: skip
        call = "mx_row<{v}>(" + args + ", row, ok, t, tpr);"
        if self.vec > 1:
            check = " | ".join(
                f"(u64){ptr} % {self.vec * s.type_size()}" for ptr, s in zip(ptrs, self.shapes, strict=True)
            )
            loop = [f"  const bool vec = {self.vec_ok} != 0 && ({check}) == 0;", *loop]
            call = f"    if (vec) {call.format(v=self.vec)} else {call.format(v=1)}"
        else:
            call = "    " + call.format(v=1)
        src = PRELUDE + head + sig + " {\n" + "\n".join([*loop, call, "  }"]) + "\n}\n"
        grid = grid_for(self.m, BLOCK // self.lanes if self.lanes < BLOCK else 1)
        bits = 64 if idx == "u64" else 32
        return KernelSpec(name, src, grid, (BLOCK, 1, 1), 0, tensors - 1, 1, (), tuple(p.values), bits)

    def reduce(self, var: str, fn: str) -> str:
        if self.tpr == BLOCK:
            return f"  {var} = mx_block_reduce<{BLOCK}>({var}, {fn}());"
        if self.tpr == 0:
            return f"  {var} = mx_group_reduce({var}, {fn}(), tpr);"
        return f"  {var} = mx_warp_reduce<{self.tpr}>({var}, {fn}());"

    def chunks(self, body: str) -> list[str]:
        """``body`` per chunk ``c`` (slot ``j``) this thread owns, or per element ``e`` when uncached."""
        if self.cached:
            return ["#pragma unroll", "  for (int j = 0; j < PER; ++j) {",
                    f"    const {self.idx} c = j * tpr + t;",
                    f"    if (ok && c * V < {self.N}) {{ {body} }}", "  }"]  # fmt: skip
        return [f"  for ({self.idx} e = t; ok && e < {self.N}; e += tpr) {{ {body} }}"]

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
    if input.elements() == 0:
        sig = signature(name, [c_type(t)], [c_type(t)])
        return KernelSpec(name, PRELUDE + sig + " {}\n", (1, 1, 1), (BLOCK, 1, 1))
    fast = fastest(input, others)
    column = fast is not None and input.strides[axis] >= fast  # a thread per row, coalesced across rows
    shapes = [input, out]
    R = _Rows(shapes, walk(shapes, others, input.strides), walk(shapes, [axis], input.strides), column)
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
    return R.source(name, [c_type(t)], c_type(t), lines)


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
    in_types = [c_type(s.type) for s in (x, *extra)]
    if x.elements() == 0:
        sig = signature(name, in_types, [c_type(out.type)])
        return KernelSpec(name, PRELUDE + sig + " {}\n", (1, 1, 1), (BLOCK, 1, 1), 0, 1 + len(extra))
    rows, elems = walk(shapes, list(range(axis)), x.strides), walk(shapes, list(range(axis, rank)), x.strides)
    R = _Rows(shapes, rows, elems)
    n, a, o = R.N, ("double" if t == DType.double_type else "float"), 1 + len(extra)
    xv = "v[s]" if R.cached else f"({a}){_elem(0)}"
    # Scale and bias load with x, before the reductions: one trip to memory rather than two. A row
    # of BERT's 768 a warp, 128 rows: the kernel is two memory latencies and the shuffles.
    held = "".join(f" {_load(k, f'ab{k} + j * V')}" for k in range(1, 1 + len(extra)))
    lines = (
        [f"  {a} v[PER * V]" + "".join(f", ab{k}[PER * V]" for k in range(1, 1 + len(extra))) + ";",
         *R.chunks(_load(0, "v + j * V") + held)]
        if R.cached else []
    )  # fmt: skip
    lines += [f"  {a} sum = 0;", *R.each(f"sum += {xv};"), R.reduce("sum", "mx_sum_f")]
    lines += [f"  const {a} mean = sum / ({a}){n};", f"  {a} sq = 0;"]
    lines += [*R.each(f"const {a} d = {xv} - mean; sq += d * d;"), R.reduce("sq", "mx_sum_f")]
    eps_c = c_literal(eps, DType.double_type if a == "double" else DType.float_type)
    lines.append(f"  const {a} inv = ({a})1 / sqrt(sq / ({a}){n} + {eps_c});")
    ops = ["*" if k == 1 and scale is not None else "+" for k in range(1, o)]
    if R.cached:
        # (ab{k}, not p{k}: those name the run-time sizes)
        y = "(v[j * V + q] - mean) * inv" + "".join(
            f" {op} ab{k}[j * V + q]" for k, op in zip(range(1, o), ops, strict=True)
        )
        store = f"mx_stv<V>(out0 + b{o} + mx_eoff(c * V, {o}), y);"
        lines += R.chunks(f"{a} y[V]; MX_UNROLL for (int q = 0; q < V; ++q) y[q] = {y}; {store}")
    else:
        y = f"({xv} - mean) * inv" + "".join(
            f" {op} ({a}){_elem(k)}" for k, op in zip(range(1, o), ops, strict=True)
        )
        lines += R.each(f"out0[b{o} + mx_eoff(e, {o})] = mx_cvt<{c_type(out.type)}>({y});")
    return R.source(name, in_types, c_type(out.type), lines)

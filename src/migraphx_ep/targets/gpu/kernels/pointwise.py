"""Fused elementwise kernels from ``PwExpr`` trees.

Each IR op's C expression on compute types is the op's own ``cpp`` (its one device meaning, see
ops/base.py), written with the prelude's ``mx_*`` helpers where C's meaning differs from numpy's (NaN
in max/relu, integer overflow and division, sign of zero, erf/pow precision). Every op's result is rounded
to its IR type (``mx_round``), so a fused chain of half ops rounds where the ref's chain of ops does.

Iteration follows the output's memory order (coalesced stores); dims that are contiguous in every
operand are merged. When every operand is contiguous or a broadcast scalar the loop is flat and moves
16-byte vectors whenever the pointers allow it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable

import numpy as np

from .... import ops as _ops  # noqa: F401 - every op class registered before POINTWISE_OPS is read
from ....ir.dtypes import FLOAT_TYPES, INT_TYPES, DType, as_dtype, to_numpy
from ....ir.operation import OPS, Op, field_names
from ....ir.shape import Shape, standard_strides
from ....ops.pointwise import zero_divisor_message
from .params import Params
from .prelude import (
    BLOCK,
    FP8,
    NARROW,
    PRELUDE,
    batch_of_one,
    c_literal,
    check_strides,
    collapse,
    compute_type,
    decompose,
    elem_type,
    grid_for,
    index_type,
    offset,
    signature,
    span,
    vector_width,
)
from .spec import KERNEL_SYMBOL, Check, KernelSpec, PwConst, PwExpr, PwInput, PwOp, Unsupported
from .transpose import n_tiles, tiled_body, transposed_dim

_ATTR_OPS = frozenset(
    {"leaky_relu", "elu", "selu", "celu", "thresholded_relu", "hard_sigmoid", "shrink", "quick_gelu"}
)
# Every op with a device expression (its ``cpp``: the op owns its meaning, see ops/base.py). "contiguous"
# has one (a copy) but is left to the lowering, which wants its result standard.
POINTWISE_OPS: frozenset[str] = frozenset(n for n, c in OPS.items() if getattr(c, "cpp", "")) - {"contiguous"}


# What pointwise kernels do with float8 values: convert them (to and from float compute values, the
# prelude's codecs) and copy them. Arithmetic on them would need every op's ref checked against
# ml_dtypes' float8 ufuncs first; refused, those stay on ORT's CPU EP.
_FP8_OPS = frozenset({"convert", "identity"})


def pointwise_supported(op: Op, in_types: list[DType]) -> str | None:
    """None when ``op`` on elements of ``in_types`` has a kernel expression, else why not."""
    if op.name not in POINTWISE_OPS:
        return f"{op.name} is not a pointwise op the gpu kernels know"
    types = [*in_types, op.target_type] if op.name == "convert" else in_types  # type: ignore[attr-defined]
    try:
        for t in types:
            elem_type(t)
    except Unsupported as e:
        return str(e)
    fp8 = [DType(t) for t in types if t in FP8]
    if fp8 and op.name not in _FP8_OPS:
        return f"{op.name} on {fp8[0].name}: the gpu kernels only convert and copy float8 values"
    return None


def _attrs(op: Op, t: DType) -> dict[str, str]:
    """The op's float attributes as literals of the type the ref computes in (float for half)."""
    if op.name not in _ATTR_OPS:
        return {}
    lit_t = DType.float_type if t in NARROW else t
    if t not in FLOAT_TYPES:
        lit_t = DType.double_type  # integer shrink compares and shifts in double
    vals = {k: v for k, v in op.attributes().items() if isinstance(v, int | float)}
    if op.name == "shrink":
        vals["neg_lambd"] = -vals["lambd"]
    return {k: c_literal(v, lit_t) for k, v in vals.items()}


def _expr(op: Op, args: list[str], types: list[DType]) -> str:
    """The C expression of ``op`` on compute values ``args`` (before rounding to its result type)."""
    name = op.name
    template = getattr(op, "cpp", "")
    if not template:
        raise Unsupported(f"{name} has no device expression")
    t = types[-1] if name in ("where", "clip") else types[0]
    if name == "convert" and t in NARROW and op.target_type == DType.uint32_type:  # type: ignore[attr-defined]
        return f"mx_cvtt64({args[0]})"  # numpy and ml_dtypes go through int64 here (unlike float)
    if name == "convert" and t in FP8 and op.target_type in INT_TYPES:  # type: ignore[attr-defined]
        return f"mx_f8_to_int<{elem_type(op.target_type)}>({args[0]})"  # ml_dtypes: NaN 0, inf saturates
    c = compute_type(t)
    if name == "shrink" and t not in FLOAT_TYPES:
        args = [f"(double){a}" for a in args]
        c = "double"
    return template.format(*args, C=c, **_attrs(op, t))


class _Emitter:
    """Statements computing an expression tree, one variable per distinct node; ``checks`` are the run-time
    checks they make (an integer divisor that is not a nonzero constant must not be 0: the ref raises)."""

    def __init__(self, in_types: list[DType]) -> None:
        self.in_types = in_types
        self.lines: list[str] = []
        self.memo: dict[object, tuple[str, DType]] = {}
        self.checks: list[Check] = []

    def value(self, e: PwExpr) -> tuple[str, DType]:
        if isinstance(e, PwInput):
            return f"x{e.index}", self.in_types[e.index]
        if isinstance(e, PwConst):
            return c_literal(e.value, e.type), as_dtype(e.type)
        key = e if _hashable(e) else id(e)
        if key in self.memo:
            return self.memo[key]
        vals = [self.value(a) for a in e.args]
        args = [v for v, _ in vals]
        if e.op.name in ("div", "mod", "fmod") and vals[0][1] not in FLOAT_TYPES and not _nonzero(e.args[1]):
            check = Check("ZeroDivisionError", zero_divisor_message(e.op.name))
            if check not in self.checks:
                self.checks.append(check)
            args[1] = f"mx_nz({args[1]}, err, {self.checks.index(check) + 1})"
        raw = _expr(e.op, args, [t for _, t in vals])
        var = f"v{len(self.memo)}"
        t = as_dtype(e.type)
        self.lines.append(f"const {compute_type(t)} {var} = mx_round<{elem_type(t)}>({raw});")
        self.memo[key] = (var, t)
        return var, t


def _nonzero(e: PwExpr) -> bool:
    return isinstance(e, PwConst) and bool(np.asarray(e.value).astype(to_numpy(e.type)) != 0)


def _hashable(e: PwExpr) -> bool:
    try:
        hash(e)
    except TypeError:
        return False
    return e == e  # NaN constants never equal themselves: leave them out of the memo


# element_function's results by ``_exact_key``: an expression does not depend on the shapes, so every
# compile of a model (and every layer of the same op chain) asks for the same few dozen. Bounded: when
# full it starts afresh. Entries are immutable; a race only computes one twice.
_ELEMENT_FUNCTIONS: dict[Hashable, tuple[str, tuple[Check, ...]]] = {}
MAX_ELEMENT_FUNCTIONS = 4096


def _exact_key(e: PwExpr) -> Hashable | None:
    """Equal only for expressions ``element_function`` emits alike (None: no such key). Not the
    dataclass equality: that equates the constants 0.0 and -0.0 (or 1 and True) and attributes so;
    their reprs differ. A scalar's repr is exact; an array's (numpy print precision) is not."""
    if isinstance(e, PwInput):
        return e.index
    if isinstance(e, PwConst):
        exact = isinstance(e.value, int | float | np.generic)
        return (type(e.value), repr(e.value), as_dtype(e.type)) if exact else None
    args = tuple(_exact_key(a) for a in e.args)
    attrs = repr(e.op) if field_names(type(e.op)) else ""
    return None if None in args else (type(e.op), attrs, as_dtype(e.type), args)


def exact_key(e: PwExpr) -> Hashable | None:
    """A key equal only for expressions every kernel generator emits alike (None: unhashable nodes,
    which the emitter tells apart by identity, and inexact constants)."""
    return _exact_key(e) if _hashable(e) else None


def element_function(expr: PwExpr, in_types: list[DType], out_type: DType) -> tuple[str, tuple[Check, ...]]:
    """``mx_elem(x0, x1, ...)``: the output element (storage type) from input compute values, and the
    checks it makes. A checking one is a lambda for the kernel's body, where it sees the error slot."""
    exact = exact_key(expr)  # None: not memoised
    if exact is None:
        return _element_function(expr, in_types, out_type)
    key = (exact, tuple(as_dtype(t) for t in in_types), as_dtype(out_type))
    found = _ELEMENT_FUNCTIONS.get(key)
    if found is None:
        found = _element_function(expr, in_types, out_type)
        if len(_ELEMENT_FUNCTIONS) >= MAX_ELEMENT_FUNCTIONS:
            _ELEMENT_FUNCTIONS.clear()
        _ELEMENT_FUNCTIONS[key] = found
    return found


def _element_function(expr: PwExpr, in_types: list[DType], out_type: DType) -> tuple[str, tuple[Check, ...]]:
    em = _Emitter(in_types)
    var, _ = em.value(expr)
    params = ", ".join(f"const {compute_type(t)} x{i}" for i, t in enumerate(in_types))
    body = "".join(f"  {line}\n" for line in em.lines)
    out_c = elem_type(out_type)
    ret = f"  return mx_cvt<{out_c}>({var});\n"
    if em.checks:
        return f"  auto mx_elem = [=]({params}) -> {out_c} {{\n{body}{ret}  }};\n", tuple(em.checks)
    return f"MX_DEV {out_c} mx_elem({params}) {{\n{body}{ret}}}\n", ()


def pointwise_kernel(name: str, expr: PwExpr, inputs: list[Shape], out: Shape) -> KernelSpec:
    """One kernel computing ``expr`` for every element of ``out`` (inputs already at out's lens).

    Sizes are run-time arguments, so one source serves every batch but batch 1: there the batch dim
    drops out of the index math (and the loop may turn flat). A kernel of batch > 1 therefore carries
    its batch-1 twin as ``others`` (compiled beside it), so a batch-1 shape finds it compiled."""
    spec = _pointwise_kernel(name, expr, inputs, out)
    if len(out.lens) < 2 or out.lens[0] <= 1:
        return spec

    def others() -> list[KernelSpec]:
        return [_pointwise_kernel(KERNEL_SYMBOL, expr, [batch_of_one(s) for s in inputs], batch_of_one(out))]

    return dataclasses.replace(spec, others=others)


def _pointwise_kernel(name: str, expr: PwExpr, inputs: list[Shape], out: Shape) -> KernelSpec:
    for s in inputs:
        if s.lens != out.lens:
            raise Unsupported(f"pointwise input {s} does not match output lens {list(out.lens)}")
    check_strides(out, *inputs)
    if _is_copy(expr, inputs, out):  # move bits: any element type, float8 included
        raw = _RAW_TYPES[to_numpy(out.type).itemsize]
        inputs, out = [Shape(raw, inputs[0].lens, inputs[0].strides)], Shape(raw, out.lens, out.strides)
        expr = PwInput(0)
    in_types = [s.type for s in inputs]
    in_c = [elem_type(t) for t in in_types]
    out_c = elem_type(out.type)
    elem, checks = element_function(expr, in_types, out.type)
    head, local = (PRELUDE, elem) if checks else (PRELUDE + elem, "")
    n = out.elements()
    if n == 0:
        sig = signature(name, in_c, [out_c], checked=bool(checks))
        return KernelSpec(name, head + sig + " {}\n", (1, 1, 1), (BLOCK, 1, 1), 0, len(inputs), 1, checks)
    idx = index_type(span(out, *inputs))
    p = Params(idx)
    # Walk the output in memory order: sort dims by its strides (stable, so ties keep logical order).
    perm = sorted(range(len(out.lens)), key=lambda d: -out.strides[d])
    lens = [out.lens[d] for d in perm]
    strides = [[s.strides[d] for d in perm] for s in (out, *inputs)]
    lens, strides = collapse(lens, strides)
    flat = len(lens) <= 1 and strides[0] in ([], [1]) and all(st in ([], [0], [1]) for st in strides[1:])
    tdim = transposed_dim(lens, strides)
    if flat:
        body, work = _flat_body(n, idx, in_types, out.type, [st in ([], [0]) for st in strides[1:]], p)
    elif tdim is not None:
        body, work = tiled_body(idx, lens, strides, tdim, in_c[0], p), 0
    else:
        rowvec = _rowvec_body(n, idx, lens, strides, [out.type, *in_types], p)
        body, work = _strided_body(n, idx, lens, strides, len(inputs), p), n
        if rowvec is not None:  # vectors along the innermost dim, the scalar loop if misaligned
            body, work = rowvec[0] + body + "  }\n", rowvec[1]
    sig = signature(name, in_c, [out_c], checked=bool(checks), scalars=p.decls())
    source = head + sig + " {\n" + local + body + "}\n"
    grid = grid_for(work) if tdim is None or flat else grid_for(n_tiles(lens, tdim), 1)
    bits = 64 if idx == "u64" else 32
    return KernelSpec(name, source, grid, (BLOCK, 1, 1), 0, len(inputs), 1, checks, tuple(p.values), bits)


_RAW_TYPES = {1: DType.uint8_type, 2: DType.uint16_type, 4: DType.uint32_type, 8: DType.uint64_type}


def _is_copy(expr: PwExpr, inputs: list[Shape], out: Shape) -> bool:
    """``expr`` moves input 0 unchanged (identity, contiguous, convert to its own type)."""
    while isinstance(expr, PwOp) and len(expr.args) == 1 and expr.type == out.type:
        if expr.op.name not in ("identity", "contiguous", "convert"):
            return False
        expr = expr.args[0]
    return isinstance(expr, PwInput) and len(inputs) == 1 and inputs[0].type == out.type


def _flat_body(
    n: int, idx: str, in_types: list[DType], out_type: DType, scalar: list[bool], p: Params
) -> tuple[str, int]:
    """Contiguous operands (or broadcast scalars): flat loop, 16-byte vectors when aligned. The element
    count is a run-time argument (``p``)."""
    if n == 1:
        scalar = [True] * len(scalar)
    count = p(n)
    lines = [f"  const {idx} tid = blockIdx.x * {BLOCK}u + threadIdx.x, step = gridDim.x * {BLOCK}u;"]
    for i, sc in enumerate(scalar):
        if sc:
            lines.append(f"  const {compute_type(in_types[i])} s{i} = mx_ld(in{i}[0]);")
    scalar_args = ", ".join(f"s{i}" if sc else f"mx_ld(in{i}[i])" for i, sc in enumerate(scalar))
    scalar_loop = f"for ({idx} i = {{start}}; i < {count}; i += step) out0[i] = mx_elem({scalar_args});"
    vec_types = [t for t, sc in zip(in_types, scalar, strict=True) if not sc] + [out_type]
    v = vector_width(*vec_types)
    nv = n // v
    if v == 1 or nv == 0:
        lines.append("  " + scalar_loop.format(start="tid"))
        return "\n".join(lines) + "\n", n
    ptrs = [f"in{i}" for i, sc in enumerate(scalar) if not sc] + ["out0"]
    aligned = " | ".join(
        f"((u64){ptr} % sizeof(mx_vec<{elem_type(t)}, {v}>))" for ptr, t in zip(ptrs, vec_types, strict=True)
    )
    vec_args = ", ".join(f"s{i}" if sc else f"mx_ld(a{i}.v[j])" for i, sc in enumerate(scalar))
    out_c = elem_type(out_type)
    lines.append(f"  const {idx} nv = {count} / {v}u;")
    lines.append(f"  if (({aligned}) == 0) {{")
    lines.append(f"    for ({idx} q = tid; q < nv; q += step) {{")
    for i, sc in enumerate(scalar):
        if not sc:
            ct = elem_type(in_types[i])
            lines.append(
                f"      const mx_vec<{ct}, {v}> a{i} = reinterpret_cast<const mx_vec<{ct}, {v}>*>(in{i})[q];"
            )
    lines.append(f"      mx_vec<{out_c}, {v}> r;")
    lines.append("#pragma unroll")
    lines.append(f"      for (int j = 0; j < {v}; ++j) r.v[j] = mx_elem({vec_args});")
    lines.append(f"      reinterpret_cast<mx_vec<{out_c}, {v}>*>(out0)[q] = r;")
    lines.append("    }")
    lines.append("    " + scalar_loop.format(start=f"nv * {v}u + tid"))  # the tail (none when v divides n)
    lines.append("  } else {")
    lines.append("    " + scalar_loop.format(start="tid"))
    lines.append("  }")
    return "\n".join(lines) + "\n", nv


def _rowvec_body(
    n: int, idx: str, lens: list[int], strides: list[list[int]], types: list[DType], p: Params
) -> tuple[str, int] | None:
    """Views whose innermost dim is contiguous (or broadcast) in every operand, e.g. a per-channel
    scale over NCHW: the loop moves 16-byte vectors along that dim. Returns the vector loop and an
    ``else {`` that the caller closes around the scalar loop, or None. Whether the innermost dim and
    the strides are multiples of the vector is a run-time flag (with the pointers' alignment), so
    image sizes that are and are not share the kernel."""
    unit = [st[-1] == 1 for st in strides]
    if len(lens) < 2 or not unit[0] or any(st[-1] not in (0, 1) for st in strides):
        return None
    v = vector_width(*(t for t, u in zip(types, unit, strict=True) if u))
    fits = not lens[-1] % v and not any(
        x % v for st, u in zip(strides, unit, strict=True) if u for x in st[:-1]
    )
    if v == 1 or not (fits or p.runtime):  # baked sizes: no vector loop that this shape never takes
        return None
    flag = p(int(fits))
    vlens = [p(x) for x in [*lens[:-1], lens[-1] // v]]
    digits = [f"d{k}" for k in range(len(lens))]
    ct = [elem_type(t) for t in types]
    vstrides = [[p.stride(x) for x in st[:-1]] for st in strides]

    def off(k: int) -> str:
        return offset(digits, [*vstrides[k], v if unit[k] else 0], idx)

    ptrs = ["out0"] + [f"in{k}" for k in range(len(strides) - 1)]
    check = " | ".join(
        f"((u64){p} % {v * to_numpy(t).itemsize})" for p, t, u in zip(ptrs, types, unit, strict=True) if u
    )
    lines = [f"  if ({flag} != 0 && ({check}) == 0) {{"]
    nv, step = p(n // v), f"gridDim.x * {BLOCK}u"
    lines.append(f"  for ({idx} q = blockIdx.x * {BLOCK}u + threadIdx.x; q < {nv}; q += {step}) {{")
    lines += ["    " + x for x in decompose("q", vlens, "d", idx)]
    args = []
    for k in range(1, len(strides)):
        if unit[k]:
            vt = f"mx_vec<{ct[k]}, {v}>"
            lines.append(f"    const {vt} a{k} = *reinterpret_cast<const {vt}*>(in{k - 1} + {off(k)});")
            args.append(f"mx_ld(a{k}.v[j])")
        else:
            lines.append(f"    const auto a{k} = mx_ld(in{k - 1}[{off(k)}]);")
            args.append(f"a{k}")
    lines += [
        f"    mx_vec<{ct[0]}, {v}> r;",
        "#pragma unroll",
        f"    for (int j = 0; j < {v}; ++j) r.v[j] = mx_elem({', '.join(args)});",
    ]
    lines += [f"    *reinterpret_cast<mx_vec<{ct[0]}, {v}>*>(out0 + {off(0)}) = r;", "  }", "  } else {"]
    return "\n".join(lines) + "\n", n // v if fits else n


def _strided_body(n: int, idx: str, lens: list[int], strides: list[list[int]], n_in: int, p: Params) -> str:
    """General views: split the flat output-order index into digits, one offset per operand. Lens and
    strides other than 0 and 1 are run-time arguments (``p``)."""
    digits = [f"d{k}" for k in range(len(lens))]
    std = list(standard_strides(lens))
    plain = {k for k, st in enumerate(strides) if st == std}  # standard layout: the flat index itself
    runtime = [[] if k in plain else [p.stride(x) for x in st] for k, st in enumerate(strides)]

    def off(k: int) -> str:
        return "i" if k in plain else offset(digits, runtime[k], idx)

    count, step = p(n), f"gridDim.x * {BLOCK}u"
    lines = [f"  for ({idx} i = blockIdx.x * {BLOCK}u + threadIdx.x; i < {count}; i += {step}) {{"]
    lines += ["    " + x for x in decompose("i", [p(x) for x in lens], "d", idx)]
    args = ", ".join(f"mx_ld(in{k}[{off(k + 1)}])" for k in range(n_in))
    lines.append(f"    out0[{off(0)}] = mx_elem({args});")
    lines.append("  }")
    return "\n".join(lines) + "\n"

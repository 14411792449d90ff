"""det: one thread per matrix, LU with partial pivoting in double (``ops/linalg.py`` is the meaning).

The ref is numpy's ``det``, which factors every real matrix in float64 whatever its type (``_commonType``
picks double to compute, the input's type for the result): LAPACK ``getrf`` (OpenBLAS here), then the
sign of the row swaps times the diagonal's product; an exactly zero pivot (``getrf``'s info > 0) makes
the determinant 0. This kernel takes the same steps in double and rounds once: the pivot is the first
largest magnitude in its column, the multipliers are the column times the pivot's reciprocal, the
trailing rows are updated left to right. A closed form for small matrices (``ad - bc``) is not taken:
it rounds differently from the factorisation wherever the terms cancel, and the ref is the
factorisation. The blocked BLAS behind ``getrf`` may group its updates differently, so float64 results
agree to rounding, not bit for bit; rounded to float32 or narrower they nearly always agree exactly.
NaN and infinity follow IEEE through the factorisation; OpenBLAS's pivot search treats them its own way.

The matrix lives in the thread's registers (local memory as it grows), so its order is bounded.
"""

from __future__ import annotations

from ....ir.operation import Op
from ....ir.shape import Shape
from .data import index_kernel, params_for
from .prelude import c_type, offset
from .spec import KernelSpec, Unsupported

MAX_ORDER = 32  # 1,024 values per thread: beyond that a thread per matrix spills too far to be useful


def det_supported(x: Shape) -> str | None:
    n = x.lens[-1]
    return None if n <= MAX_ORDER else f"det of {n}x{n} matrices (one thread each: at most {MAX_ORDER})"


def det_kernel(name: str, op: Op, x: Shape, out: Shape) -> KernelSpec:
    why = det_supported(x)
    if why:
        raise Unsupported(why)
    n, r = x.lens[-1], out.ndim()
    a = "double"  # as numpy: float32 factored in float32 misses the ref by ulps where terms cancel
    rp = params_for(out, x)
    base = offset([f"o{d}" for d in range(r)], [rp.stride(s) for s in x.strides[:r]], "IDX")
    rs, cs = (rp.stride(s) for s in x.strides[r:])
    load = offset(["(IDX)i", "(IDX)j"], [rs, cs], "IDX")
    store = f"out0[oo] = mx_cvt<{c_type(out.type)}>(det);"
    if n == 0:
        return index_kernel(
            name, [x], [c_type(x.type)], out, c_type(out.type), [f"const {a} det = 1;", store], p=rp
        )
    body = [
        f"const IDX base = {base};",
        f"{a} m[{n * n}];",
        f"for (int i = 0; i < {n}; ++i)",
        f"  for (int j = 0; j < {n}; ++j) m[i * {n} + j] = ({a})mx_ld(in0[base + {load}]);",
        f"{a} det = 1;",
        "bool singular = false;",
        f"for (int k = 0; k < {n}; ++k) {{",
        "  int piv = k;",
        f"  {a} big = fabs(m[k * {n} + k]);",
        f"  for (int i = k + 1; i < {n}; ++i)",
        f"    if (fabs(m[i * {n} + k]) > big) {{ big = fabs(m[i * {n} + k]); piv = i; }}",
        f"  if (m[piv * {n} + k] == 0) {{ singular = true; continue; }}  // getrf: info > 0, no update",
        "  if (piv != k) {",
        f"    for (int j = 0; j < {n}; ++j) {{",
        f"      const {a} t = m[k * {n} + j]; m[k * {n} + j] = m[piv * {n} + j]; m[piv * {n} + j] = t;",
        "    }",
        "    det = -det;",
        "  }",
        f"  const {a} inv = ({a})1 / m[k * {n} + k];",
        f"  for (int i = k + 1; i < {n}; ++i) {{",
        f"    const {a} l = m[i * {n} + k] * inv;",
        f"    for (int j = k + 1; j < {n}; ++j) m[i * {n} + j] -= l * m[k * {n} + j];",
        "  }",
        "}",
        f"for (int k = 0; k < {n}; ++k) det *= m[k * {n} + k];",
        "if (singular) det = 0;",
        store,
    ]
    return index_kernel(name, [x], [c_type(x.type)], out, c_type(out.type), body, p=rp)

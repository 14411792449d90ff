"""Kernels that read indices: gather (embedding lookups too), gather_elements, gathernd.

An index in [-n, n) counts from the end when negative, as ONNX and the ref say. Any other index fails
the Run in the ref and in ORT; a kernel cannot raise, so it stores a ``Check``'s code in its error slot
and skips the element (never reading outside the tensor), and the executable raises after the Run.
"""

from __future__ import annotations

from ....ir.operation import Op
from ....ir.shape import Shape
from .data import INDEX_TYPES, index_kernel, params_for, raw_type
from .params import Params
from .prelude import c_type, offset
from .spec import Check, KernelSpec, Unsupported


def range_check(op: str, n: int, what: str) -> Check:
    return Check("IndexError", f"{op}: index out of range [-{n}, {n}) {what}")


def _index_value(ptr: str, off: str, n: str, code: int, j: str = "j") -> list[str]:
    """Read an index into ``j`` and wrap a negative one; one outside [-n, n) fails check ``code``
    (``n``: a run-time size, ``Params.i64``)."""
    return [
        f"i64 {j} = (i64){ptr}[{off}];",
        f"if ({j} < 0) {j} += {n};",
        f"if ({j} < 0 || {j} >= {n}) {{ mx_fail(err, {code}); continue; }}",
    ]


def _strides(p: Params, s: Shape) -> list:
    return [p.stride(x) for x in s.strides]


def _index_kernel(
    name: str, data: Shape, indices: Shape, out: Shape, body: list[str], checks: list[Check], p: Params
) -> KernelSpec:
    raw = raw_type(data.type)
    ins, in_c = [data, indices], [raw, c_type(indices.type)]
    return index_kernel(name, ins, in_c, out, raw, body, tuple(checks), p=p)


def gather_kernel(name: str, op: Op, data: Shape, indices: Shape, out: Shape) -> KernelSpec:
    r = data.ndim()
    a = op.axis % r  # type: ignore[attr-defined]
    q = indices.ndim()
    if indices.type not in INDEX_TYPES:
        raise Unsupported(f"gather indices of type {indices.type.name}")
    o = [f"o{d}" for d in range(out.ndim())]
    p = params_for(out, data, indices)
    ioff = offset(o[a : a + q], _strides(p, indices), "IDX")
    src = o[:a] + ["(IDX)j"] + o[a + q :]
    body = _index_value("in1", ioff, p.i64(data.lens[a]), 1)
    body.append(f"out0[oo] = in0[{offset(src, _strides(p, data), 'IDX')}];")
    check = range_check("gather", data.lens[a], f"on axis {a}")
    return _index_kernel(name, data, indices, out, body, [check], p)


def gather_elements_kernel(name: str, op: Op, data: Shape, indices: Shape, out: Shape) -> KernelSpec:
    r = data.ndim()
    a = op.axis % r  # type: ignore[attr-defined]
    if indices.type not in INDEX_TYPES:
        raise Unsupported(f"gather_elements indices of type {indices.type.name}")
    o = [f"o{d}" for d in range(r)]
    p = params_for(out, data, indices)
    body = _index_value("in1", offset(o, _strides(p, indices), "IDX"), p.i64(data.lens[a]), 1)
    src = o[:a] + ["(IDX)j"] + o[a + 1 :]
    body.append(f"out0[oo] = in0[{offset(src, _strides(p, data), 'IDX')}];")
    check = range_check("gather_elements", data.lens[a], f"on axis {a}")
    return _index_kernel(name, data, indices, out, body, [check], p)


def gathernd_kernel(name: str, op: Op, data: Shape, indices: Shape, out: Shape) -> KernelSpec:
    """ONNX GatherND: the last index dim holds ``k`` coordinates into data dims ``batch_dims..``."""
    if indices.type not in INDEX_TYPES:
        raise Unsupported(f"gathernd indices of type {indices.type.name}")
    b, q = op.batch_dims, indices.ndim()  # type: ignore[attr-defined]
    k = indices.lens[-1]
    o = [f"o{d}" for d in range(out.ndim())]
    p = params_for(out, data, indices)
    istrides = _strides(p, indices)
    body, src, checks = [], o[:b], []
    for j in range(k):
        ioff = offset([*o[: q - 1], f"{j}u"], istrides, "IDX")
        body += _index_value("in1", ioff, p.i64(data.lens[b + j]), j + 1, f"j{j}")
        checks.append(range_check("gathernd", data.lens[b + j], f"for data dim {b + j}"))
        src.append(f"(IDX)j{j}")
    src += o[q - 1 :]
    body.append(f"out0[oo] = in0[{offset(src, _strides(p, data), 'IDX')}];")
    return _index_kernel(name, data, indices, out, body, checks, p)

"""GridSample and RoiAlign: one thread per output element over ``mx_sampling.cuh``.

Both follow the ref (``ops/sampling.py``) step for step in its work type: float for half, bfloat16 and
float inputs (rounded to the output type once, at the store), double for double. The header keeps
numpy's order of roundings (no fma), so the kernels agree with the ref bit for bit; what each thread
computes (its taps, its samples) is the ref's own arithmetic for that element.

Modes, padding and align_corners shape the code and stay in the source; input sizes and strides are
run-time arguments, so a new input size compiles nothing. Every pixel index is clipped into the input
before a read. RoiAlign's data checks (a batch index outside [0, N), a roi that is not finite) are the
ref's errors, reported through the kernel's error slot with the element skipped (``errors.py``).
"""

from __future__ import annotations

import dataclasses

from ....ir.dtypes import DType
from ....ir.operation import Op
from ....ir.shape import Shape
from .data import INDEX_TYPES, index_kernel, params_for
from .headers import include
from .params import Params
from .prelude import PRELUDE, c_literal, c_type, offset
from .spec import Check, KernelSpec, Unsupported

SAMPLING_OPS = frozenset({"grid_sample", "roi_align"})
_FLOATS = frozenset({DType.half_type, DType.bf16_type, DType.float_type, DType.double_type})
_MODES = {"nearest": 0, "linear": 1, "cubic": 2}
_PADS = {"zeros": 0, "border": 1, "reflection": 2}
_TAPS = {"nearest": 1, "linear": 2, "cubic": 4}
HEADER = include("mx_sampling.cuh")


def sampling_supported(op: Op, inputs: list[Shape], out: Shape) -> str | None:
    """Why ``op`` (grid_sample or roi_align) on ``inputs`` gets no kernel; None: it does."""
    x = inputs[0]
    if x.type not in _FLOATS:
        return f"{op.name} of {x.type.name}"
    if op.name == "grid_sample" and (op.mode not in _MODES or op.padding_mode not in _PADS):  # type: ignore[attr-defined]
        return f"grid_sample mode {op.mode} / padding {op.padding_mode}"  # type: ignore[attr-defined]
    if op.name == "roi_align" and inputs[2].type not in INDEX_TYPES:
        return f"roi_align with {inputs[2].type.name} batch indices"
    # the ref raises reading an empty axis; a clipped index would point before the tensor
    if out.elements() and 0 in x.lens[2:]:
        return f"{op.name} of an empty input {list(x.lens)}"
    return None


def _work(t: DType) -> str:
    return "double" if t == DType.double_type else "float"


def _with_header(spec: KernelSpec) -> KernelSpec:
    """``spec`` with ``mx_sampling.cuh`` included right after the prelude."""
    assert spec.source.startswith(PRELUDE)
    return dataclasses.replace(spec, source=spec.source.replace(PRELUDE, PRELUDE + HEADER, 1))


def _i64(p: Params, stride: int) -> str:
    """A stride as i64: 0 and 1 stay literals, others are run-time (``Params.stride``)."""
    v = p.stride(stride)
    return f"{v}ll" if isinstance(v, int) else f"(i64){v}"


def grid_sample_kernel(name: str, op: Op, x: Shape, grid: Shape, out: Shape) -> KernelSpec:
    """Output (N, C, *O) from X (N, C, *D) at grid (N, *O, k): per axis ``mx_grid_axis`` gives the taps,
    then the taps' products are summed in the ref's order (the first axis outermost)."""
    why = sampling_supported(op, [x, grid], out)
    if why:
        raise Unsupported(why)
    k, f = x.ndim() - 2, _work(x.type)
    mode, pad = op.mode, op.padding_mode  # type: ignore[attr-defined]
    align = "true" if op.align_corners else "false"  # type: ignore[attr-defined]
    taps = _TAPS[mode]
    p = params_for(out, x, grid)
    gs = [p.stride(s) for s in grid.strides]
    xs = [p.stride(s) for s in x.strides]
    body = [f"const IDX g = {offset(['o0', *[f'o{2 + i}' for i in range(k)]], gs[:-1], 'IDX')};"]
    for i in range(k):  # the grid's last axis lists the innermost dimension first
        comp = offset([f"(IDX){k - 1 - i}"], gs[-1:], "IDX")
        body += [
            f"i64 ix{i}[4]; {f} w{i}[4]; bool ok{i}[4];",
            f"mx_grid_axis<{f}, {_MODES[mode]}, {_PADS[pad]}, {align}>"
            f"(({f})mx_ld(in1[g + {comp}]), {p.i64(x.lens[2 + i])}, ix{i}, w{i}, ok{i});",
        ]
    body.append(f"const IDX xb = {offset(['o0', 'o1'], xs[:2], 'IDX')};")
    body.append(f"{f} acc = 0;")
    for i in range(k):
        body.append(f"{'  ' * i}for (int a{i} = 0; a{i} < {taps}; ++a{i}) {{")
    ind = "  " * k
    weight = "w0[a0]"
    for i in range(1, k):  # the ref multiplies the axes' weights in order
        weight = f"mx_mul_rn({weight}, w{i}[a{i}])"
    ok = " && ".join(f"ok{i}[a{i}]" for i in range(k))
    src = offset([f"(IDX)ix{i}[a{i}]" for i in range(k)], xs[2:], "IDX")
    body += [
        f"{ind}const {f} v = ({ok}) ? ({f})mx_ld(in0[xb + {src}]) : ({f})0;",
        f"{ind}acc = acc + mx_mul_rn(v, {weight});",
    ]
    body += [f"{'  ' * (k - 1 - i)}}}" for i in range(k)]
    body.append(f"out0[oo] = mx_cvt<{c_type(out.type)}>(acc);")
    in_c = [c_type(x.type), c_type(grid.type)]
    return _with_header(index_kernel(name, [x, grid], in_c, out, c_type(out.type), body, p=p))


def roi_align_checks(n: int) -> tuple[Check, Check]:
    return (
        Check("IndexError", f"roi_align: batch_indices value out of range [0, {n})"),
        Check("ValueError", "roi_align: rois must be finite (after spatial_scale)"),
    )


def roi_align_kernel(name: str, op: Op, x: Shape, rois: Shape, bi: Shape, out: Shape) -> KernelSpec:
    """Output (R, C, PH, PW): each thread checks its roi and batch index, then ``mx_roi_bin`` samples its
    bin of that image's channel."""
    why = sampling_supported(op, [x, rois, bi], out)
    if why:
        raise Unsupported(why)
    f = _work(x.type)
    wt = DType.double_type if f == "double" else DType.float_type
    ph_n, pw_n, ratio = op.output_height, op.output_width, op.sampling_ratio  # type: ignore[attr-defined]
    scale = c_literal(op.spatial_scale, wt)  # type: ignore[attr-defined]
    off = c_literal(0.5 if op.half_pixel else 0.0, wt)  # type: ignore[attr-defined]
    p = params_for(out, x, rois, bi)
    rs = [p.stride(s) for s in rois.strides]
    coords = ("x1", "y1", "x2", "y2")
    body = [
        f"const i64 b = (i64)in2[{offset(['o0'], [p.stride(bi.strides[0])], 'IDX')}];",
        f"if (b < 0 || b >= {p.i64(x.lens[0])}) {{ mx_fail(err, 1); continue; }}",
    ]
    for j, v in enumerate(coords):  # rois are [x1, y1, x2, y2]
        at = offset(["o0", f"(IDX){j}"], rs, "IDX")
        body.append(f"const {f} {v} = mx_mul_rn(({f})mx_ld(in1[{at}]), {scale}) - {off};")
    body.append(f"{f} rw = x2 - x1, rh = y2 - y1;")
    finite = " && ".join(f"mx_finite({v})" for v in (*coords, "rw", "rh"))
    body.append(f"if (!({finite})) {{ mx_fail(err, 2); continue; }}")
    if not op.half_pixel:  # type: ignore[attr-defined]
        body.append(f"rw = ({f})1 > rw ? ({f})1 : rw; rh = ({f})1 > rh ? ({f})1 : rh;")
    body.append(f"const {f} bh = rh / ({f}){ph_n}, bw = rw / ({f}){pw_n};")
    if ratio > 0:
        body.append(f"const i64 gh = {ratio}ll, gw = {ratio}ll;")
    else:  # adaptive: as many samples as the bin is pixels tall and wide, rounded up
        body.append("const i64 gh = mx_cvtt64(mx_ceil(bh)), gw = mx_cvtt64(mx_ceil(bw));")
    img = offset(["(IDX)b", "o1"], [p.stride(s) for s in x.strides[:2]], "IDX")
    h, w = p.i64(x.lens[2]), p.i64(x.lens[3])
    sy, sx = _i64(p, x.strides[2]), _i64(p, x.strides[3])
    mx = "true" if op.mode == "max" else "false"  # type: ignore[attr-defined]
    body += [
        f"const {f} v = mx_roi_bin<{f}, {mx}>(in0 + {img}, {sy}, {sx}, {h}, {w}, y1, x1, bh, bw, "
        "(i64)o2, (i64)o3, gh, gw);",
        f"out0[oo] = mx_cvt<{c_type(out.type)}>(v);",
    ]
    in_c = [c_type(x.type), c_type(rois.type), c_type(bi.type)]
    checks = roi_align_checks(x.lens[0])
    spec = index_kernel(name, [x, rois, bi], in_c, out, c_type(out.type), body, checks, p=p)
    return _with_header(spec)

"""Generated kernels compile with NVRTC for sm_90 (no GPU needed), and the generators' contracts hold.

Numbers are checked elsewhere (tests/gpu/test_gpu_ops*.py on a GPU); here every generator and schedule
is compiled once for a representative set of ops, types and layouts (transposed, broadcast, permuted
outputs, 64-bit indices, empty tensors), so a codegen bug fails CI rather than the GPU run.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from migraphx_ep.ir.dtypes import DType
from migraphx_ep.ir.operation import OPS, make_op
from migraphx_ep.ir.shape import Shape
from migraphx_ep.ops.base import BinaryOp
from migraphx_ep.targets.gpu import kernels as K
from migraphx_ep.targets.gpu import nvrtc
from migraphx_ep.targets.gpu.kernels.headers import HEADERS, included
from migraphx_ep.targets.gpu.kernels.resize import resize_tables
from migraphx_ep.targets.gpu.kernels.spec import PwConst, PwInput, PwOp

pytestmark = pytest.mark.skipif(nvrtc.nvrtc_available() is not None, reason=str(nvrtc.nvrtc_available()))

F, H, B, D = DType.float_type, DType.half_type, DType.bf16_type, DType.double_type
I8, U8, I32, I64, U64, BOOL = (
    DType.int8_type,
    DType.uint8_type,
    DType.int32_type,
    DType.int64_type,
    DType.uint64_type,
    DType.bool_type,
)
ARCH = "sm_90"


def compile_spec(spec: K.KernelSpec) -> None:
    assert (
        spec.source.count(f'extern "C" __global__ void __launch_bounds__({spec.block[0]}) {spec.name}(') == 1
    )
    includes = included(spec.source)  # package headers only (NVRTC gets no toolkit headers)
    assert includes[0] == "mx_prelude.cuh" and set(includes) <= set(HEADERS.texts)
    assert spec.block[0] * spec.block[1] * spec.block[2] <= 1024 and 1 <= spec.grid[0] < 2**31
    assert spec.grid[1] <= 65535 and spec.grid[2] <= 65535
    assert nvrtc.compile_source(spec.source, ARCH, spec.name)


def vector_flag(spec: K.KernelSpec) -> bool | None:
    """The run-time flag that lets ``spec`` move vectors for its sizes (with aligned pointers): on, off,
    or None when its source has no such flag."""
    m = re.search(r"(?:const bool vec = |  if \()(p\d+|\d+u) != 0", spec.source)
    if m is None:
        return None
    v = m.group(1)
    return bool(spec.args[int(v[1:])] if v.startswith("p") else int(v[:-1]))


def op_kernel(op, ins: list[Shape], out: Shape | None = None) -> K.KernelSpec:
    out = out or op.compute_shape([Shape(s.type, s.lens) for s in ins])
    assert K.supported(op, ins, out) is None
    return K.kernel_for("k_test", op, ins, out)


# -- pointwise ---------------------------------------------------------------------------------------------
def _type_for(op_cls) -> DType:
    types = getattr(op_cls, "types", None)
    for t in (H, F, I32, BOOL):
        if types is None or t in types:
            return t
    return next(iter(types))


@pytest.mark.parametrize("name", sorted(K.POINTWISE_OPS - {"convert"}))
def test_every_pointwise_op_compiles(name: str) -> None:
    op = OPS[name]()
    t = _type_for(type(op))
    arity = 3 if name in ("where", "clip") else (2 if isinstance(op, BinaryOp) else 1)
    types = [BOOL, t, t] if name == "where" else [t] * arity
    out = op.compute_shape([Shape(x, (3, 70)) for x in types])
    expr = PwOp(op, tuple(PwInput(i) for i in range(arity)), out.type)
    compile_spec(K.pointwise_kernel("k_test", expr, [Shape(x, (3, 70)) for x in types], out))


@pytest.mark.parametrize("src", [H, B, F, D, I8, U64, BOOL])
def test_convert_compiles(src: DType) -> None:
    # one kernel converting to every type through a chain of converts, from each source type
    expr = PwInput(0)
    for dst in (F, U8, H, I64, B, D, DType.uint32_type, BOOL, I8):
        expr = PwOp(make_op("convert", target_type=dst), (expr,), dst)
    compile_spec(K.pointwise_kernel("k_test", expr, [Shape(src, (5, 7))], Shape(I8, (5, 7))))


@pytest.mark.parametrize(
    "name,attrs", [("leaky_relu", {"alpha": 0.2}), ("elu", {"alpha": 0.5}), ("celu", {"alpha": 2.0}),
                   ("hard_sigmoid", {"alpha": 0.1, "beta": 0.6}), ("shrink", {"lambd": 1.0, "bias": 0.5}),
                   ("thresholded_relu", {"alpha": float("inf")}), ("selu", {}), ("quick_gelu", {})],
)  # fmt: skip
@pytest.mark.parametrize("t", [B, D])
def test_activation_attributes(name: str, attrs: dict, t: DType) -> None:
    op = make_op(name, **attrs)
    compile_spec(
        K.pointwise_kernel("k_test", PwOp(op, (PwInput(0),), t), [Shape(t, (4, 9))], Shape(t, (4, 9)))
    )


LAYOUTS = {
    "contiguous": ([(60, 10, 1), (60, 10, 1)], (60, 10, 1)),
    "scalar": ([(60, 10, 1), (0, 0, 0)], (60, 10, 1)),
    "row broadcast": ([(60, 10, 1), (0, 0, 1)], (60, 10, 1)),
    "transposed": ([(1, 4, 24), (60, 10, 1)], (60, 10, 1)),
    "nhwc out": ([(60, 10, 1), (0, 1, 0)], (60, 1, 6)),
    "sliced": ([(120, 20, 2), (60, 10, 1)], (60, 10, 1)),
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_pointwise_layouts(layout: str) -> None:
    ins, out = LAYOUTS[layout]
    x = PwInput(0)
    expr = PwOp(make_op("mul"), (PwOp(make_op("add"), (x, PwInput(1)), H), PwConst(0.5, H)), H)
    spec = K.pointwise_kernel(
        "k_test", expr, [Shape(H, (4, 6, 10), s) for s in ins], Shape(H, (4, 6, 10), out)
    )
    compile_spec(spec)
    moves = "mx_vec" in spec.source.split("extern")[-1] and vector_flag(spec) is not False
    assert moves == (layout in ("contiguous", "scalar"))


def test_channel_broadcast_moves_vectors() -> None:
    x = Shape(H, (2, 32, 8, 8))
    scale = Shape(H, x.lens, (0, 1, 0, 0))
    spec = K.pointwise_kernel("k_test", PwOp(make_op("mul"), (PwInput(0), PwInput(1)), H), [x, scale], x)
    assert "mx_vec<mx_f16, 8>" in spec.source.split("extern")[-1]
    compile_spec(spec)


@pytest.mark.parametrize("t", [H, DType.fp8e4m3fn_type])
def test_transposing_copy_uses_tiles(t: DType) -> None:
    nchw = Shape(t, (2, 32, 20, 20))
    nhwc = Shape(t, nchw.lens, (12800, 1, 640, 32))
    expr = PwOp(make_op("identity"), (PwInput(0),), t)
    for src, dst in ((nchw, nhwc), (nhwc, nchw)):
        spec = K.pointwise_kernel("k_test", expr, [src], dst)
        assert "tile[" in spec.source
        compile_spec(spec)


def test_pointwise_64bit_index_and_empty() -> None:
    big = Shape(F, (3, 2**30), (1, 3))  # transposed, 3 * 2**30 elements: 64-bit index math
    spec = K.pointwise_kernel("k_test", PwOp(make_op("exp"), (PwInput(0),), F), [big], Shape(F, big.lens))
    assert "u64 i =" in spec.source
    compile_spec(spec)
    empty = Shape(F, (0, 5))
    spec = K.pointwise_kernel("k_test", PwOp(make_op("exp"), (PwInput(0),), F), [empty], empty)
    compile_spec(spec)
    assert spec.source.rstrip().endswith("{}")


def test_copy_moves_bits_of_any_type() -> None:
    t = DType.fp8e4m3fn_type
    expr = PwOp(make_op("identity"), (PwInput(0),), t)
    spec = K.pointwise_kernel("k_test", expr, [Shape(t, (4, 6), (1, 4))], Shape(t, (4, 6)))
    compile_spec(spec)
    assert K.pointwise_supported(make_op("exp"), [t]) is not None  # but no arithmetic on float8


def test_source_is_deterministic() -> None:
    def make() -> str:
        expr = PwOp(make_op("add"), (PwInput(0), PwConst(1.5, F)), F)
        return K.pointwise_kernel("k_test", expr, [Shape(F, (8, 8), (1, 8))], Shape(F, (8, 8))).source

    assert make() == make()


# -- reductions, softmax, layernorm ------------------------------------------------------------------------
REDUCE_CASES = [  # (lens, axes) chosen to hit every schedule: thread, warp row, block row, wide, split
    ((6, 8), (1,)),
    ((64, 300), (1,)),
    ((2, 10000), (1,)),
    ((300, 40), (0,)),
    ((9000, 12), (0,)),
    ((100, 40), (0,)),
    ((20, 70000), (0,)),
    ((3, 5, 7), (0, 2)),
    ((4, 0), (1,)),
]


@pytest.mark.parametrize("lens,axes", REDUCE_CASES)
@pytest.mark.parametrize(
    "name,t", [("reduce_sum", H), ("reduce_mean", I32), ("reduce_max", B), ("reduce_min", F)]
)
def test_reduce(lens, axes, name: str, t: DType) -> None:
    compile_spec(op_kernel(make_op(name, axes=axes), [Shape(t, lens)]))


@pytest.mark.parametrize("name,t", [("argmax", F), ("argmin", H), ("reduce_prod", U64), ("reduce_min", BOOL)])
def test_reduce_types(name: str, t: DType) -> None:
    attrs = {"axis": 1, "select_last_index": True} if name.startswith("arg") else {"axes": (1,)}
    compile_spec(op_kernel(make_op(name, **attrs), [Shape(t, (40, 300), (1, 40))]))


@pytest.mark.parametrize(
    "lens,axis",
    [((8, 10), 1), ((3, 300), 1), ((8, 1000), 1), ((4, 4096), 1), ((2, 20000), 1), ((2, 64, 9), 1)],
)
@pytest.mark.parametrize("name,t", [("softmax", H), ("logsoftmax", F)])
@pytest.mark.parametrize("runtime", ["1", "0"], ids=["runtime", "baked"])
def test_softmax(monkeypatch, lens, axis: int, name: str, t: DType, runtime: str) -> None:
    monkeypatch.setenv("MIGRAPHX_EP_RUNTIME_SIZES", runtime)
    spec = op_kernel(make_op(name, axis=axis), [Shape(t, lens)])
    compile_spec(spec)
    assert bool(spec.args) == (runtime == "1")


def test_reduce_with_64bit_sizes() -> None:
    big = Shape(H, (4, 2**29 + 3))  # 2**31+ elements: sizes and strides are u64 arguments
    spec = op_kernel(make_op("reduce_sum", axes=(1,)), [big])
    assert spec.arg_bits == 64 and "const u64 p0" in spec.source
    compile_spec(spec)


@pytest.mark.parametrize("mode", ["average", "max", "lpnorm"])
@pytest.mark.parametrize("t", [H, F, D])
@pytest.mark.parametrize("hw", [(3, 7), (40, 28), (160, 112)], ids=str)
@pytest.mark.parametrize("runtime", ["1", "0"], ids=["runtime", "baked"])
def test_global_pool(monkeypatch, mode: str, t: DType, hw, runtime: str) -> None:
    """Global pools are reductions (NCHW: a warp or block per output; NHWC: a block per 2..8 channels)."""
    monkeypatch.setenv("MIGRAPHX_EP_RUNTIME_SIZES", runtime)
    op = make_op("pooling", mode=mode, lengths=hw, lp_order=3)
    h, w = hw
    for x, out in (
        (Shape(t, (2, 96, h, w)), Shape(t, (2, 96, 1, 1))),
        (Shape(t, (2, 96, h, w), (h * w * 96, 1, w * 96, 96)), Shape(t, (2, 96, 1, 1), (96, 1, 96, 96))),
    ):
        spec = op_kernel(op, [x], out)
        assert "mx_kept" in spec.source and "for (int w0" not in spec.source
        compile_spec(spec)


@pytest.mark.parametrize(
    "lens,axis", [((16, 64), 1), ((8, 768), 1), ((2, 4096), 1), ((2, 16384), 1), ((2, 3, 5, 7), 2)]
)
@pytest.mark.parametrize("t,affine", [(H, True), (F, False), (B, True)])
def test_layernorm(lens, axis: int, t: DType, affine: bool) -> None:
    x = Shape(t, lens)
    row = Shape(t, lens, (0,) * axis + Shape(t, lens[axis:]).strides)
    spec = K.layernorm_kernel("k_test", x, row if affine else None, row if affine else None, x, axis, 1e-5)
    compile_spec(spec)
    assert spec.n_inputs == (3 if affine else 1)
    assert ("mx_row<1>" in spec.source) and (bool(vector_flag(spec)) == (lens[-1] in (64, 768, 4096)))


# -- data movement, pooling, resize ------------------------------------------------------------------------
X = Shape(H, (4, 5, 6), (1, 4, 20))
POOL = {"lengths": (3, 3), "stride": (2, 2), "padding": (1, 1, 1, 1)}
UP = {"out_lens": (1, 3, 8, 9), "scales": (1, 1, 2, 1.5)}
ROI = (0, 0, 0.1, 0.2, 1, 1, 0.9, 0.8)
DATA_CASES = {
    "gather": (make_op("gather", axis=1), [X, Shape(I64, (2, 3))]),
    "gather scalar": (make_op("gather", axis=0), [Shape(F, (9, 4)), Shape(I32, ())]),
    "gather_elements": (make_op("gather_elements", axis=2), [X, Shape(I32, (4, 5, 2))]),
    "gathernd": (make_op("gathernd", batch_dims=1), [X, Shape(I64, (4, 3, 1))]),
    "concat": (make_op("concat", axis=1), [X, Shape(H, (4, 2, 6)), Shape(H, (4, 0, 6))]),
    "pad constant": (make_op("pad", pads=(0, 1, -1, 2, 0, 3), value=-1.0), [X]),
    "pad reflect": (make_op("pad", pads=(1, 1, 2, 1, 2, 3), mode="reflect"), [X]),
    "pad edge": (make_op("pad", pads=(1, 0, 2, 1, 2, 3), mode="edge"), [Shape(I64, (4, 5, 6))]),
    "pad wrap": (make_op("pad", pads=(1, 0, 2, 1, 2, 3), mode="wrap"), [X]),
    "trilu": (make_op("trilu", upper=False, k=1), [X]),
    "reverse": (make_op("reverse", axes=(0, 2)), [X]),
    "onehot": (make_op("onehot", depth=7, axis=1), [Shape(F, (3, 4)), Shape(I64, (2,))]),
    "prefix_scan_sum": (make_op("prefix_scan_sum", axis=1, exclusive=True, reverse=True), [X]),
    "max pool": (make_op("pooling", mode="max", ceil_mode=True, **POOL), [Shape(I8, (2, 3, 9, 9))]),
    "max pool half": (make_op("pooling", mode="max", **POOL), [Shape(H, (2, 3, 9, 9))]),
    "avg pool": (make_op("pooling", count_include_pad=True, **POOL), [Shape(F, (1, 2, 9, 9))]),
    "avg pool 3d": (
        make_op("pooling", lengths=(2, 2, 2), stride=(2, 2, 2), padding=(0, 0, 0, 1, 1, 1)),
        [Shape(F, (1, 2, 5, 5, 5))],
    ),
    "lp pool": (
        make_op("pooling", mode="lpnorm", lp_order=3, lengths=(3,), dilations=(2,)),
        [Shape(D, (2, 3, 9))],
    ),
    "resize nearest": (
        make_op("resize", nearest_mode="ceil", coordinate_transformation_mode="asymmetric", **UP),
        [Shape(U8, (1, 3, 4, 6))],
    ),
    "resize linear": (make_op("resize", mode="linear", **UP), [Shape(H, (1, 3, 4, 6))]),
    "resize tf_crop": (
        make_op("resize", mode="linear", coordinate_transformation_mode="tf_crop_and_resize", roi=ROI, **UP),
        [Shape(F, (1, 3, 4, 6))],
    ),
    "resize nearest tf_crop": (
        make_op("resize", coordinate_transformation_mode="tf_crop_and_resize", roi=ROI, **UP),
        [Shape(H, (1, 3, 4, 6), (72, 1, 18, 3))],
    ),
    "dot": (make_op("dot"), [Shape(H, (2, 70, 33)), Shape(H, (2, 33, 65), (0, 1, 33))]),
    "dot int": (make_op("dot"), [Shape(I8, (7, 5)), Shape(I8, (5, 3))]),
    "conv": (
        make_op("convolution", group=2, padding=(1, 1, 1, 1), stride=(2, 2)),
        [Shape(F, (2, 4, 9, 9)), Shape(F, (6, 2, 3, 3))],
    ),
    "conv 1d int": (
        make_op("convolution", padding=(1, 2), dilation=(2,)),
        [Shape(I32, (2, 4, 9)), Shape(I32, (6, 4, 3))],
    ),
}


@pytest.mark.parametrize("case", sorted(DATA_CASES))
def test_data_nn_ops(case: str) -> None:
    op, ins = DATA_CASES[case]
    compile_spec(op_kernel(op, ins))


def test_pooling_nhwc_output() -> None:
    op = make_op("pooling", mode="average", lengths=(3, 3), stride=(2, 2), padding=(1, 1, 1, 1))
    x = Shape(H, (2, 8, 9, 9), (648, 1, 72, 8))
    out = op.compute_shape([Shape(H, x.lens)])
    n, c, h, w = out.lens
    compile_spec(op_kernel(op, [x], Shape(H, out.lens, (h * w * c, 1, w * c, c))))


def test_float8_data_movement() -> None:
    t = DType.fp8e5m2_type
    compile_spec(op_kernel(make_op("gather", axis=0), [Shape(t, (5, 3)), Shape(I64, (4,))]))
    compile_spec(op_kernel(make_op("pad", pads=(1, 0, 0, 1), value=2.0), [Shape(t, (5, 3))]))


# -- run-time checks (error slots) and NaN rules ---------------------------------------------------------
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("name", ["div", "mod", "fmod"])
def test_checked_integer_division_compiles_in_every_layout(layout: str, name: str) -> None:
    ins, out = LAYOUTS[layout]
    expr = PwOp(make_op(name), (PwInput(0), PwInput(1)), I32)
    lens = (4, 6, 10)
    spec = K.pointwise_kernel("k_test", expr, [Shape(I32, lens, s) for s in ins], Shape(I32, lens, out))
    compile_spec(spec)
    assert len(spec.checks) == 1 and len(re.findall(r"i32\* __restrict__ err[,)]", spec.source)) == 1


def test_checked_transposing_kernel_compiles() -> None:
    # A zero constant divisor is checked too; one transposed input takes the tiled path.
    expr = PwOp(make_op("div"), (PwInput(0), PwConst(0, I64)), I64)
    spec = K.pointwise_kernel("k_test", expr, [Shape(I64, (64, 48), (1, 64))], Shape(I64, (64, 48)))
    compile_spec(spec)
    assert spec.checks and "tile[" in spec.source


@pytest.mark.parametrize("case", ["gather", "gather scalar", "gather_elements", "gathernd"])
def test_gathers_check_instead_of_clamping(case: str) -> None:
    op, ins = DATA_CASES[case]
    spec = op_kernel(op, ins)
    assert spec.checks and all(c.error == "IndexError" for c in spec.checks)
    assert "mx_fail(err, 1); continue;" in spec.source


def test_nan_skipping_kernels() -> None:
    red = op_kernel(make_op("reduce_max", axes=(1,)), [Shape(F, (64, 300))])
    nan = "__longlong_as_double(0x7ff8000000000000ll)"
    assert "mx_fmax_f" in red.source and f"mx_s acc = ((float){nan})" in red.source
    empty = op_kernel(make_op("reduce_min", axes=(1,)), [Shape(F, (4, 0))])
    assert nan not in empty.source.split("extern")[-1]  # an empty reduction gives +inf, not NaN
    pool = op_kernel(make_op("pooling", mode="max", **POOL), [Shape(F, (1, 2, 9, 9))])
    assert "mx_fmax(acc" in pool.source


# -- what has no kernel ------------------------------------------------------------------------------------
def test_supported_reasons() -> None:
    assert K.supported(make_op("topk", k=2), [Shape(F, (4, 5))], Shape(F, (4, 2))) is not None
    cubic = make_op("resize", out_lens=(1, 1, 8, 8), scales=(1, 1, 2, 2), mode="cubic")
    assert "cubic" in K.supported(cubic, [Shape(F, (1, 1, 4, 4))], Shape(F, (1, 1, 8, 8)))
    assert K.supported(make_op("exp"), [Shape(DType.fp8e4m3fn_type, (3,))], Shape(DType.fp8e4m3fn_type, (3,)))
    assert K.supported(make_op("add"), [Shape(F, (3,))] * 2, Shape(F, (3,))) is None
    with pytest.raises(K.Unsupported):
        K.kernel_for("k", cubic, [Shape(F, (1, 1, 4, 4))], Shape(F, (1, 1, 8, 8)))


# -- resize tables reproduce the ref (numpy only) ----------------------------------------------------------
def _apply_tables(op, x: np.ndarray) -> np.ndarray:
    """The kernel's arithmetic in numpy: per resized axis, taps and weights from the baked tables."""
    res = x if op.mode == "nearest" else x.astype(np.float64)
    for axis, tb in enumerate(resize_tables(op, x.shape)):
        if tb is None:
            continue
        nbr, w, outside = tb
        g = np.take(res, nbr, axis=axis)
        shape = (1,) * axis + w.shape + (1,) * (x.ndim - axis - 1)
        res = (
            g[(slice(None),) * axis + (slice(None), 0)]
            if op.mode == "nearest"
            else (g * w.reshape(shape)).sum(axis + 1)
        )
        mask = outside.reshape((1,) * axis + (-1,) + (1,) * (x.ndim - axis - 1))
        res = np.where(mask, np.asarray(op.extrapolation_value, res.dtype), res)
    return res


@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize(
    "ctm",
    [
        "half_pixel",
        "pytorch_half_pixel",
        "align_corners",
        "asymmetric",
        "tf_crop_and_resize",
        "half_pixel_symmetric",
    ],
)
def test_resize_tables_match_ref(mode: str, ctm: str) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 5, 7)).astype(np.float32)
    for out_lens, scales in (((2, 9, 12), (1.0, 1.8, 1.7)), ((2, 3, 4), (1.0, 0.6, 0.57))):
        for exclude in (False, True):
            op = make_op(
                "resize", out_lens=out_lens, scales=scales, mode=mode, coordinate_transformation_mode=ctm,
                exclude_outside=exclude, extrapolation_value=-3.0,
                roi=(0, 0.1, 0.2, 1, 0.9, 0.8) if ctm == "tf_crop_and_resize" else (),
            )  # fmt: skip
            want = op.compute(Shape(F, out_lens), [x])
            got = _apply_tables(op, x)
            if mode == "linear":
                got = got.astype(np.float32)
            np.testing.assert_array_equal(got, want)


def test_signed_zero_constants_stay_apart() -> None:
    """x * 0.0 and x * -0.0 differ (the sign of a zero product; 1 / it is +inf or -inf): the generator
    shares equal subexpressions, and must not take one for the other."""
    x = PwInput(0)
    pos, neg = (PwOp(make_op("mul"), (x, PwConst(z, F)), F) for z in (0.0, -0.0))
    assert PwConst(0.0, F) != PwConst(-0.0, F) and PwConst(1, F) != PwConst(True, F)
    assert PwConst(0.5, F) == PwConst(0.5, F) and hash(PwConst(0.5, F)) == hash(PwConst(0.5, F))
    expr = PwOp(make_op("sub"), (PwOp(make_op("div"), (PwConst(1.0, F), pos), F),
                                 PwOp(make_op("div"), (PwConst(1.0, F), neg), F)), F)  # fmt: skip
    spec = K.pointwise_kernel("k_zeros", expr, [Shape(F, (8,))], Shape(F, (8,)))
    body = spec.source[spec.source.index("mx_elem(") :]
    assert body.count("mx_mul(") == 2, body[:600]


def test_a_batch_of_one_and_of_seven_gather_with_one_source(monkeypatch) -> None:
    """BERT's embedding gathers compiled again at the first batch above 1: a dim of length 1 had become
    the digit 0 in the source. With run-time sizes it is walked like any other; with sizes baked into the
    source (MIGRAPHX_EP_RUNTIME_SIZES=0) each size is its own source anyway."""
    from migraphx_ep.targets.gpu.kernels.spec import canonical

    def spec(b: int, s: int) -> K.KernelSpec:
        data, ids = Shape(H, (30522, 768)), Shape(DType.int64_type, (b, s))
        out = Shape(H, (b, s, 768))
        return canonical(K.gather_kernel("k_gather", make_op("gather", axis=0), data, ids, out))

    one, seven = spec(1, 128), spec(7, 396)
    assert one.source == seven.source and one.args != seven.args
    compile_spec(one)
    monkeypatch.setenv("MIGRAPHX_EP_RUNTIME_SIZES", "0")
    assert spec(1, 128).source != spec(7, 396).source

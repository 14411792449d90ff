"""Row, reduction, global-pooling and resize kernels run on the host as one block of cooperating threads
(``hostblock.py``: fibers with real barriers and shuffles), compared with the ref at many sizes, and the
sizes of one class shown to share one source (what a new input shape reuses instead of compiling).

Every schedule is reached: short/warp/block/long softmax and layer-norm rows (vector and scalar bodies,
aligned and unaligned pointers), the thread/row/wide/split reductions, global pools in NCHW and NHWC.
"""

from __future__ import annotations

import numpy as np
import pytest

from migraphx_ep.ir.dtypes import DType, from_numpy
from migraphx_ep.ir.operation import make_op
from migraphx_ep.ir.shape import Shape
from migraphx_ep.targets.gpu import kernels as K

from .gpucheck import EXACT, F16, F32, FP32_SUM, Tol, assert_matches, sum_tol
from .hostblock import HAVE_GXX, run_block

pytestmark = pytest.mark.skipif(not HAVE_GXX, reason="no g++ to build kernels for the host")
H = DType.half_type


@pytest.fixture(scope="module")
def kdir(tmp_path_factory):
    """One build folder for the module: a kernel source is compiled once, whichever test meets it."""
    return tmp_path_factory.mktemp("kernels")


def laid_out(a: np.ndarray, order: tuple[int, ...] | None = None, pad: int = 0) -> tuple[np.ndarray, Shape]:
    """``a`` stored with its dims in memory ``order`` (outermost first) after ``pad`` elements (an odd
    ``pad`` misaligns the pointer): the buffer a kernel reads, and the kernel's view of it."""
    order = order if order is not None else tuple(range(a.ndim))
    mem = np.ascontiguousarray(a.transpose(order)).reshape(-1)
    buf = np.concatenate([np.zeros(pad, a.dtype), mem])[pad:]
    inner = Shape(from_numpy(a.dtype), [a.shape[d] for d in order]).strides
    strides = [0] * a.ndim
    for k, d in enumerate(order):
        strides[d] = inner[k]
    return buf, Shape(from_numpy(a.dtype), a.shape, strides)


def run(spec: K.KernelSpec, tmp, ins: list[np.ndarray], out: Shape, pad: int = 0) -> np.ndarray:
    """``spec`` on buffers ``ins``; the result read through ``out``'s strides (``pad``: as ``laid_out``)."""
    dt = np.dtype(out.dtype)
    buf = np.concatenate([np.zeros(pad, dt), np.full(max(out.element_space(), 1), 7, dt)])[pad:]
    run_block(spec, tmp, ins, [buf])
    return np.lib.stride_tricks.as_strided(buf, out.lens, [s * dt.itemsize for s in out.strides]).copy()


def data(rng, shape, dtype=F32, nan: bool = False) -> np.ndarray:
    x = rng.uniform(-4, 4, shape).astype(dtype)
    if nan and x.size:
        x.reshape(-1)[rng.choice(x.size, max(1, x.size // 7), replace=False)] = np.nan
        x.reshape(-1, shape[-1])[0] = np.nan  # a whole run of NaN
    return x


# -- softmax and layer norm rows ---------------------------------------------------------------------------
ROW_LENS = [1, 3, 7, 16, 24, 33, 256, 257, 700, 1000, 1500, 4097, 9000]


@pytest.mark.parametrize("n", ROW_LENS)
@pytest.mark.parametrize("dtype", [F32, F16], ids=["f32", "f16"])
@pytest.mark.parametrize("name", ["softmax", "logsoftmax"])
def test_softmax_rows(kdir, rng, n, dtype, name):
    x = data(rng, (5, n), dtype)
    op = make_op(name, axis=1)
    for pad in (0, 1):  # an unaligned pointer takes the scalar body
        buf, xs = laid_out(x, pad=pad)
        out = Shape(xs.type, x.shape)
        got = run(K.kernel_for("k", op, [xs], out), kdir, [buf], out, pad)
        tol = Tol(1e-5, 1e-7) if dtype == F32 else Tol(1e-2, 1e-4)
        assert_matches(got, op.compute(out, [x]), tol, f"{name} n={n} pad={pad}")


@pytest.mark.parametrize(
    "lens,axis,order", [((3, 33, 5), 1, None), ((4, 9, 6), 2, (0, 2, 1)), ((7, 3), 0, None)]
)
def test_softmax_strided_axis(kdir, rng, lens, axis, order):
    x = data(rng, lens)
    buf, xs = laid_out(x, order)
    op = make_op("softmax", axis=axis)
    out = Shape(xs.type, lens)
    assert_matches(
        run(K.kernel_for("k", op, [xs], out), kdir, [buf], out), op.compute(out, [x]), Tol(1e-5, 1e-7)
    )


def _layernorm_ref(x, scale, bias, eps):
    xf = x.astype(np.float64)
    mean = xf.mean(-1, keepdims=True)
    y = (xf - mean) / np.sqrt(((xf - mean) ** 2).mean(-1, keepdims=True) + eps)
    if scale is not None:
        y = y * scale.astype(np.float64) + bias.astype(np.float64)
    return y.astype(x.dtype)


@pytest.mark.parametrize("n", [1, 3, 32, 33, 200, 768, 1000, 3000, 9000])
@pytest.mark.parametrize("dtype", [F32, F16], ids=["f32", "f16"])
@pytest.mark.parametrize("affine", [True, False])
def test_layernorm_rows(kdir, rng, n, dtype, affine):
    x = data(rng, (7, n), dtype) + dtype.type(1)
    scale, bias = (data(rng, (n,), dtype), data(rng, (n,), dtype)) if affine else (None, None)
    for pad in (0, 1):
        buf, xs = laid_out(x, pad=pad)
        row = Shape(xs.type, x.shape, (0, 1))
        extra = [row, row] if affine else [None, None]
        out = Shape(xs.type, x.shape)
        spec = K.layernorm_kernel("k", xs, *extra, out, 1, 1e-5)
        ins = [buf, scale, bias] if affine else [buf]
        got = run(spec, kdir, ins, out, pad)
        tol = Tol(1e-5, 1e-5, scaled=True) if dtype == F32 else Tol(2e-3, 2e-3, scaled=True)
        assert_matches(got, _layernorm_ref(x, scale, bias, 1e-5), tol, f"n={n} pad={pad}")


def test_row_kernels_share_one_source_per_size_class():
    """A new sequence length or batch reuses the kernel: sizes are arguments, the class is the source."""

    def softmax(rows: int, n: int) -> K.KernelSpec:
        s = Shape(H, (rows, 2, n, n))
        return K.kernel_for("k", make_op("softmax", axis=-1), [s], s)

    def layernorm(rows: int, n: int) -> K.KernelSpec:
        x = Shape(H, (rows, 5, n))
        row = Shape(H, x.lens, (0, 0, 1))
        return K.layernorm_kernel("k", x, row, row, x, 2, 1e-5)

    for make in (softmax, layernorm):
        classes = [[(2, 7), (3, 16), (5, 24), (1, 33), (4, 256)], [(2, 300), (3, 511)], [(2, 600), (1, 1024)],
                   [(2, 1025), (1, 2048)], [(2, 5000), (1, 8192)], [(1, 8193), (2, 20000)]]  # fmt: skip
        sources = [{make(*c).source for c in cls} for cls in classes]
        assert all(len(s) == 1 for s in sources), [len(s) for s in sources]
        assert len(set.union(*sources)) == len(classes)


# -- reductions: every schedule ----------------------------------------------------------------------------
REDUCE_CASES = {  # schedule -> (lens, axes)
    "thread": ((6, 8), (1,)),
    "row warp, vectors": ((40, 304), (1,)),
    "row warp, odd row": ((40, 301), (1,)),
    "row block": ((3, 10003), (1,)),
    "wide": ((300, 40), (0,)),
    "wide, odd columns": ((300, 41), (0,)),
    "wide 1024": ((9000, 12), (0,)),
    "split": ((100, 40), (0,)),
    "middle": ((5, 200, 9), (1,)),
    "outer+inner": ((40, 7, 33), (0, 2)),
}


@pytest.mark.parametrize("case", sorted(REDUCE_CASES))
@pytest.mark.parametrize("name", ["reduce_sum", "reduce_max", "argmax"])
def test_reduce_schedules(kdir, rng, case, name):
    lens, axes = REDUCE_CASES[case]
    arg = name.startswith("arg")
    op = make_op(name, axis=axes[0], select_last_index=True) if arg else make_op(name, axes=axes)
    for dtype in (F32, F16):
        x = data(rng, lens, dtype, nan=name != "reduce_sum")
        if arg:
            x = np.round(x)  # ties: the first/last index rule decides
        buf, xs = laid_out(x)
        out = op.compute_shape([xs])
        got = run(K.kernel_for("k", op, [xs], out), kdir, [buf], out)
        tol = EXACT if name != "reduce_sum" else sum_tol(dtype)
        assert_matches(got, op.compute(out, [x]), tol, f"{case} {dtype}")


@pytest.mark.parametrize("lens,axes", [((50, 300), (1,)), ((300, 41), (0,)), ((9, 5), (1,))], ids=str)
@pytest.mark.parametrize("name", ["reduce_sum", "reduce_mean"])
def test_integer_sum_and_mean_wrap_like_the_ref(kdir, rng, lens, axes, name):
    x = rng.integers(-(2**31), 2**31 - 1, lens, dtype=np.int64).astype(np.int32)  # sums wrap
    op = make_op(name, axes=axes)
    buf, xs = laid_out(x)
    out = op.compute_shape([xs])
    assert_matches(run(K.kernel_for("k", op, [xs], out), kdir, [buf], out), op.compute(out, [x]), EXACT)


# -- global pooling ----------------------------------------------------------------------------------------
POOL_SIZES = [(1, 1), (3, 7), (5, 5), (33, 33), (64, 70), (100, 91)]


@pytest.mark.parametrize("hw", POOL_SIZES, ids=str)
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("mode", ["average", "max", "lpnorm"])
def test_global_pool(kdir, rng, hw, layout, mode):
    op = make_op("pooling", mode=mode, lengths=hw, **({"lp_order": 2} if mode == "lpnorm" else {}))
    for dtype, c in ((F32, 16), (F16, 3), (F16, 24)):
        x = data(rng, (2, c, *hw), dtype, nan=mode == "max")
        order = (0, 2, 3, 1) if layout == "nhwc" else None
        buf, xs = laid_out(x, order)
        out = op.compute_shape([Shape(xs.type, x.shape)])
        if layout == "nhwc":  # the lowering keeps an NHWC input's layout for the output
            out = Shape(out.type, out.lens, (c, 1, c, c))
        spec = K.kernel_for("k", op, [xs], out)
        assert "mx_kept" in spec.source  # the reduction, not a thread walking a baked window
        tol = EXACT if mode == "max" else (FP32_SUM if dtype == F32 else sum_tol(dtype))
        assert_matches(run(spec, kdir, [buf], out), op.compute(out, [x]), tol, f"{dtype} c={c}")


def test_global_pool_source_is_the_same_for_every_size_of_a_class():
    def pool(n: int, c: int, h: int, w: int, nhwc: bool) -> str:
        x = Shape(H, (n, c, h, w), (h * w * c, 1, w * c, c) if nhwc else None)
        out = Shape(H, (n, c, 1, 1), (c, 1, c, c) if nhwc else None)
        return K.kernel_for("k", make_op("pooling", mode="average", lengths=(h, w)), [x], out).source

    sizes = [(2, 96, 20, 14), (3, 96, 40, 28), (2, 64, 17, 31), (4, 40, 12, 11)]
    assert len({pool(*s, nhwc=False) for s in sizes}) == 1  # a warp per (n, c)
    assert len({pool(*s, nhwc=True) for s in sizes}) == 1  # a block per 8 channels, 256 threads
    small = [(2, 96, 9, 9), (8, 40, 11, 11), (3, 7, 4, 5)]  # under 128 positions: 32 channels x 8 slices
    assert len({pool(*s, nhwc=True) for s in small}) == 1
    big = [(1, 96, 160, 112), (1, 96, 120, 112), (1, 24, 100, 100), (1, 3, 91, 100)]
    assert len({pool(*s, nhwc=True) for s in big}) == 1  # rows of 8192+: 1024 threads


# -- resize: coordinate tables as an input ----------------------------------------------------------------
RESIZE_CASES = [
    ("nearest", "asymmetric", "floor"),
    ("nearest", "half_pixel", "round_prefer_ceil"),
    ("linear", "half_pixel", "round_prefer_floor"),
    ("linear", "align_corners", "round_prefer_floor"),
    ("linear", "pytorch_half_pixel", "round_prefer_floor"),
    ("linear", "tf_crop_and_resize", "round_prefer_floor"),
]


@pytest.mark.parametrize("mode,ctm,nearest", RESIZE_CASES)
def test_resize_one_source_for_every_size(kdir, rng, mode, ctm, nearest):
    specs = []
    for hw, scales in (
        ((5, 7), (1.0, 1.0, 2.0, 1.5)),
        ((9, 4), (1.0, 1.0, 2.0, 1.5)),
        ((3, 3), (1.0, 1.0, 0.7, 2.9)),
    ):
        x = data(rng, (2, 3, *hw), F16)
        out_lens = (2, 3, *(int(n * s) for n, s in zip(hw, scales[2:], strict=True)))
        roi = (0, 0, 0.1, 0.2, 1, 1, 0.9, 0.8) if ctm == "tf_crop_and_resize" else ()
        attrs = {"coordinate_transformation_mode": ctm, "nearest_mode": nearest, "roi": roi}
        op = make_op("resize", out_lens=out_lens, scales=scales, mode=mode, extrapolation_value=-2.0, **attrs)
        for order in (None, (0, 2, 3, 1)):  # NCHW, and an NHWC input (after a channels-last conv)
            buf, xs = laid_out(x, order)
            out = Shape(xs.type, out_lens)
            spec = K.kernel_for("k", op, [xs], out)
            table = K.resize_table(op, xs)
            assert spec.n_inputs == 2 and table.dtype == np.uint8
            assert_matches(run(spec, kdir, [buf, table], out), op.compute(out, [x]), EXACT, f"{hw} {order}")
            specs.append((order, spec.source))
    assert len({s for o, s in specs if o is None}) == 1 and len({s for o, s in specs if o is not None}) == 1

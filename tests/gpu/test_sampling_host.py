"""GridSample and RoiAlign kernels (``kernels/sampling.py``) run on the host with g++, bit for bit
against the ref's ``compute``: every mode, padding and align_corners combination, 3-, 4- and 5-D
inputs, the float types, strided layouts, and the inputs the ref rejects (error slots).

The kernels are written to repeat the ref's roundings exactly (no fma, see ``mx_sampling.cuh``), so
the comparison is of bits, not within a tolerance: NaN where the ref has NaN, the same sign of zero.
"""

from __future__ import annotations

import ctypes
import itertools
import re
import shutil

import ml_dtypes
import numpy as np
import pytest

from migraphx_ep.ir.dtypes import DType
from migraphx_ep.ir.operation import make_op
from migraphx_ep.ir.shape import Shape
from migraphx_ep.targets.gpu import kernels as K
from migraphx_ep.targets.gpu.errors import device_error
from migraphx_ep.targets.gpu.kernels.prelude import BLOCK
from migraphx_ep.targets.gpu.kernels.spec import KernelSpec

from .hostcc import host_library
from .test_kernel_host import SHIM, shape

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="no g++ to build kernels for the host")

BF16 = np.dtype(ml_dtypes.bfloat16)
# The shim's narrow conversions, by g++'s IEEE half and bfloat16's round to nearest even (the PTX
# instructions' rounding), so half and bfloat16 kernels run here too.
CONVERSIONS = r"""
static unsigned short mx_half_bits(_Float16 f) { unsigned short h; std::memcpy(&h, &f, 2); return h; }
float mx_h2f(unsigned short h) { _Float16 f; std::memcpy(&f, &h, 2); return (float)f; }
unsigned short mx_f2h(float x) { return mx_half_bits((_Float16)x); }
unsigned short mx_d2h(double x) { return mx_half_bits((_Float16)x); }
unsigned short mx_f2bf(float x) {
  unsigned b; std::memcpy(&b, &x, 4);
  if ((b & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  return (unsigned short)((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
}
"""
MODES = ["nearest", "linear", "cubic"]
PADS = ["zeros", "border", "reflection"]


def assert_same_bits(got: np.ndarray, want: np.ndarray) -> None:
    """Equal bit patterns, except that any NaN matches any NaN (payloads are not the ref's concern)."""
    assert got.dtype == want.dtype and got.shape == want.shape
    g, w = got.astype(np.float64), want.astype(np.float64)
    both_nan = np.isnan(g) & np.isnan(w)
    bits = got.view(f"u{got.dtype.itemsize}") == want.view(f"u{want.dtype.itemsize}")
    bad = ~(bits | both_nan)
    assert not bad.any(), (
        f"{bad.sum()} differ, first at {np.argwhere(bad)[0]}: {got[bad][:4]} vs {want[bad][:4]}"
    )


def launch(spec: KernelSpec, tmp_path, ins: list[np.ndarray], out: np.ndarray) -> int:
    """``test_kernel_host.launch`` with the narrow conversions defined: every thread of one block."""
    lib = host_library(SHIM + CONVERSIONS + spec.source, tmp_path)
    err = np.zeros(1, np.int32)
    ptrs = [a.ctypes.data for a in (*ins, out)] + ([err.ctypes.data] if spec.checks else [])
    fn = lib[spec.name]
    scalar = ctypes.c_uint64 if spec.arg_bits == 64 else ctypes.c_uint32
    fn.argtypes = [ctypes.c_void_p] * len(ptrs) + [scalar] * len(spec.args)
    for t in range(BLOCK):
        lib.mx_set_thread(t)
        fn(*ptrs, *spec.args)
    return int(err[0])


def run_op(tmp_path, op, args: list[np.ndarray], views: list[Shape] | None = None):
    """The kernel's output and error code for ``op`` on ``args`` (laid out as ``views`` when given),
    and the ref's result on the logical values."""
    ins = views or [shape(a) for a in args]
    out_shape = op.compute_shape([Shape(s.type, s.lens) for s in ins])
    assert K.supported(op, ins, out_shape) is None
    spec = K.kernel_for("k_sampling", op, ins, out_shape)
    out = np.full(out_shape.lens, 7, out_shape.dtype)  # a sentinel: skipped elements keep it
    code = launch(spec, tmp_path, args, out)
    return out, code, spec


def ref(op, args: list[np.ndarray]) -> np.ndarray:
    """The ref's result (numpy's warnings about the special values silenced: they are the point)."""
    with np.errstate(all="ignore"):
        return op.compute(op.compute_shape([shape(a) for a in args]), args)


def grid_values(rng: np.random.Generator, lens: tuple[int, ...], dtype) -> np.ndarray:
    """Coordinates in and out of [-1, 1], with the values that take every branch: exact corners and
    edges, -0, NaN, +-inf and magnitudes past int64 (numpy's conversion gives INT64_MIN for those)."""
    g = rng.uniform(-1.6, 1.6, lens).astype(np.float32)
    flat = g.reshape(-1)
    special = [-1, 1, 0, -0.0, 1.0 / 3, np.nan, np.inf, -np.inf, 1e30, -1e30, 3.0, -5.25, 1.5]
    n = min(len(special), flat.size // 2)
    flat[:n] = special[:n]
    flat[-n:] = special[::-1][:n]
    with np.errstate(over="ignore"):  # 1e30 is inf in half: another special value
        return g.astype(dtype)


@pytest.mark.parametrize("align", [False, True], ids=["half_pixel", "align"])
@pytest.mark.parametrize("pad", PADS)
@pytest.mark.parametrize("mode", MODES)
def test_grid_sample_4d_every_mode(tmp_path, mode, pad, align):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    g = grid_values(rng, (2, 3, 6, 2), np.float32)
    op = make_op("grid_sample", mode=mode, padding_mode=pad, align_corners=align)
    out, code, _ = run_op(tmp_path, op, [x, g])
    want = ref(op, [x, g])
    assert code == 0
    assert_same_bits(out, want)


@pytest.mark.parametrize(
    "x_lens,g_lens,align",
    [((1, 2, 7), (1, 30, 1), False), ((2, 2, 3, 4, 5), (2, 2, 3, 4, 3), False),
     ((1, 1, 1, 3, 2), (1, 4, 2, 2, 3), True)],
    ids=["1d", "3d", "3d_unit_depth"],
)  # fmt: skip
@pytest.mark.parametrize("pad", PADS)
@pytest.mark.parametrize("mode", MODES)
def test_grid_sample_other_ranks(tmp_path, mode, pad, x_lens, g_lens, align):
    """The ref samples any rank (the parser lets ORT's 5-D linear and nearest through); a size-1 axis
    with align_corners makes the reflection range empty."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal(x_lens).astype(np.float32)
    g = grid_values(rng, g_lens, np.float32)
    op = make_op("grid_sample", mode=mode, padding_mode=pad, align_corners=align)
    out, code, _ = run_op(tmp_path, op, [x, g])
    want = ref(op, [x, g])
    assert code == 0
    assert_same_bits(out, want)


@pytest.mark.parametrize("dtype", [np.float16, BF16, np.float64], ids=["f16", "bf16", "f64"])
@pytest.mark.parametrize("mode,pad", [("linear", "reflection"), ("cubic", "zeros"), ("nearest", "border")])
def test_grid_sample_types(tmp_path, dtype, mode, pad):
    """Half and bfloat16 work in float and round once at the store; double works in double."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((1, 2, 5, 4)).astype(dtype)
    g = grid_values(rng, (1, 3, 4, 2), dtype)
    op = make_op("grid_sample", mode=mode, padding_mode=pad)
    out, code, spec = run_op(tmp_path, op, [x, g])
    want = ref(op, [x, g])
    assert ("mx_grid_axis<double" in spec.source) == (dtype == np.float64)
    assert code == 0
    assert_same_bits(out, want)


def test_grid_sample_strided_views_and_one_source_for_two_sizes(tmp_path, monkeypatch):
    """An NHWC input and a grid stored (N, k, H, W) read through run-time strides; another input size
    gives the same source (sizes are arguments)."""
    monkeypatch.setenv("MIGRAPHX_EP_RUNTIME_SIZES", "1")
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    g = grid_values(rng, (2, 3, 6, 2), np.float32)
    xm = np.ascontiguousarray(x.transpose(0, 2, 3, 1))  # memory N, H, W, C
    gm = np.ascontiguousarray(g.transpose(0, 3, 1, 2))  # memory N, k, H, W
    f = DType.float_type
    views = [Shape(f, x.shape, (60, 1, 15, 3)), Shape(f, g.shape, (36, 6, 1, 18))]
    op = make_op("grid_sample", mode="cubic", padding_mode="reflection")
    out, code, spec = run_op(tmp_path, op, [xm, gm], views)
    want = ref(op, [x, g])
    assert code == 0
    assert_same_bits(out, want)
    big = [Shape(f, (2, 3, 9, 11), (297, 1, 33, 3)), Shape(f, (2, 5, 7, 2), (70, 35, 1, 7))]
    other = K.kernel_for("k_sampling", op, big, op.compute_shape([Shape(f, s.lens) for s in big]))
    assert other.source == spec.source and other.args != spec.args


# -- RoiAlign ------------------------------------------------------------------------------------------
ROIS = np.array(
    [
        [0.5, 0.3, 4.2, 5.1],  # inside
        [-2.0, -1.5, 9.0, 8.0],  # over every edge: samples outside give zero taps
        [3.0, 3.0, 1.0, 2.0],  # reversed: an empty sampling grid with half_pixel
        [1.0, 1.0, 1.2, 1.1],  # smaller than a pixel
        [5.9, 6.5, 7.0, 8.0],  # past the last row and column
        [0.0, 0.0, 0.0, 0.0],
    ],
    np.float32,
)
BATCH = np.array([0, 1, 1, 0, 1, 0], np.int64)


@pytest.mark.parametrize("scale", [1.0, 0.7])
@pytest.mark.parametrize("ratio", [0, 2])
@pytest.mark.parametrize("half_pixel", [True, False], ids=["half_pixel", "output_half_pixel"])
@pytest.mark.parametrize("mode", ["avg", "max"])
def test_roi_align_every_mode(tmp_path, mode, half_pixel, ratio, scale):
    x = np.random.default_rng(4).standard_normal((2, 3, 6, 7)).astype(np.float32)
    op = make_op("roi_align", mode=mode, half_pixel=half_pixel, sampling_ratio=ratio, spatial_scale=scale,
                 output_height=3, output_width=2)  # fmt: skip
    out, code, _ = run_op(tmp_path, op, [x, ROIS, BATCH])
    assert code == 0
    assert_same_bits(out, ref(op, [x, ROIS, BATCH]))


@pytest.mark.parametrize("mode", ["avg", "max"])
def test_roi_align_nan_inf_and_signed_zero_pixels(tmp_path, mode):
    """A NaN pixel wins a max and spoils a sum (np.maximum), an inf one times a zero weight is NaN,
    and a bin of -0 pixels stays -0 (the first sample starts the sum, not 0)."""
    x = np.random.default_rng(6).standard_normal((1, 2, 6, 7)).astype(np.float32)
    x[0, 0, 2, 3], x[0, 0, 4, 1], x[0, 1, :3, :3] = np.nan, np.inf, -0.0
    rois = np.concatenate([ROIS, [[0.0, 0.0, 1.5, 1.5]]]).astype(np.float32)
    bi = np.zeros(len(rois), np.int64)
    op = make_op("roi_align", mode=mode, sampling_ratio=2, output_height=3, output_width=3)
    out, code, _ = run_op(tmp_path, op, [x, rois, bi])
    assert code == 0
    want = ref(op, [x, rois, bi])
    assert np.isnan(want).any() and np.signbit(want[want == 0]).any()  # the cases are there
    assert_same_bits(out, want)


@pytest.mark.parametrize("dtype", [np.float16, BF16, np.float64], ids=["f16", "bf16", "f64"])
@pytest.mark.parametrize("index_type", [np.int64, np.int32])
def test_roi_align_types(tmp_path, dtype, index_type):
    x = np.random.default_rng(5).standard_normal((2, 2, 5, 6)).astype(dtype)
    rois, bi = ROIS.astype(dtype), BATCH.astype(index_type)
    for mode in ("avg", "max"):
        op = make_op(
            "roi_align", mode=mode, sampling_ratio=0, spatial_scale=0.9, output_height=2, output_width=4
        )
        out, code, _ = run_op(tmp_path, op, [x, rois, bi])
        assert code == 0
        assert_same_bits(out, ref(op, [x, rois, bi]))


@pytest.mark.parametrize(
    "index,roi,scale,code,error",
    [(-1, [0, 0, 3, 3], 1.0, 1, IndexError), (2, [0, 0, 3, 3], 1.0, 1, IndexError),
     (0, [np.nan, 0, 3, 3], 1.0, 2, ValueError), (1, [0, 0, np.inf, 3], 1.0, 2, ValueError),
     (1, [-3e38, 0, 3e38, 3], 1.0, 2, ValueError), (0, [0, 0, 2e38, 3], 2.0, 2, ValueError)],
    ids=["negative", "past_n", "nan", "inf", "width_overflows", "scale_overflows"],
)  # fmt: skip
def test_roi_align_bad_inputs_set_the_slot_and_skip(tmp_path, index, roi, scale, code, error):
    """The ref's errors: the bad roi's outputs are skipped (never read out of bounds), the others are
    right, and the slot's code raises what the ref raises."""
    x = np.arange(2 * 2 * 4 * 4, dtype=np.float32).reshape(2, 2, 4, 4)
    rois = np.array([[0.5, 0.5, 2.5, 3.0], roi], np.float32)
    bi = np.array([1, index], np.int64)
    op = make_op("roi_align", spatial_scale=scale, output_height=2, output_width=2)
    out, got, spec = run_op(tmp_path, op, [x, rois, bi])
    assert got == code
    with pytest.raises(error, match=re.escape(spec.checks[code - 1].message)):
        ref(op, [x, rois, bi])
    assert isinstance(device_error(spec, code), error)
    assert (out[1] == 7).all()  # skipped
    good = ref(op, [x, rois[:1], bi[:1]])
    assert_same_bits(out[:1], good)


def test_empty_inputs_are_refused_not_clipped():
    """An empty spatial axis has no pixel to clip an index to (the ref raises reading it)."""
    f, i64 = DType.float_type, DType.int64_type
    gs = make_op("grid_sample")
    x, g = Shape(f, (1, 2, 0, 3)), Shape(f, (1, 2, 2, 2))
    assert "empty input" in K.supported(gs, [x, g], gs.compute_shape([x, g]))
    ra = make_op("roi_align")
    ins = [Shape(f, (1, 2, 4, 0)), Shape(f, (3, 4)), Shape(i64, (3,))]
    assert "empty input" in K.supported(ra, ins, ra.compute_shape(ins))
    ins[1:] = [Shape(f, (3, 4)), Shape(DType.float_type, (3,))]
    assert K.supported(ra, [Shape(f, (1, 2, 4, 4)), *ins[1:]], Shape(f, (3, 2, 1, 1))) is not None


def test_every_combination_is_claimed():
    """What tools/gpu_refusals.py counts: no mode, padding or rank the ref computes is refused."""
    f = DType.float_type
    for mode, pad, align, k in itertools.product(MODES, PADS, (False, True), (1, 2, 3)):
        op = make_op("grid_sample", mode=mode, padding_mode=pad, align_corners=align)
        ins = [Shape(f, (1, 2, *[3] * k)), Shape(f, (1, *[2] * k, k))]
        assert K.supported(op, ins, op.compute_shape(ins)) is None

"""Generated kernels run on the host: the same source, compiled by g++ with a small shim for CUDA's
built-ins, called once per thread of one block (grid-stride loops cover every element).

Only kernels whose threads never talk to each other run this way (index kernels, pointwise, reductions
on the thread-per-output schedule), but those are where the run-time checks (error slots) and the NaN
rules live, so both are checked here on real generated code without a GPU.
"""

from __future__ import annotations

import ctypes
import shutil
from pathlib import Path

import numpy as np
import pytest

from migraphx_ep.ir.dtypes import DType, from_numpy
from migraphx_ep.ir.operation import make_op
from migraphx_ep.ir.shape import Shape
from migraphx_ep.ops.pointwise import zero_divisor_message
from migraphx_ep.targets.gpu import kernels as K
from migraphx_ep.targets.gpu.errors import device_error
from migraphx_ep.targets.gpu.kernels.prelude import BLOCK
from migraphx_ep.targets.gpu.kernels.spec import KernelSpec, PwConst, PwInput, PwOp

from .hostcc import host_library

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="no g++ to build kernels for the host")

SHIM = r"""
#include <cmath>
#include <cstring>
using std::isinf;
struct mx_dim3 { unsigned x, y, z; };
static mx_dim3 threadIdx = {0, 0, 0}, blockIdx = {0, 0, 0}, gridDim = {1, 1, 1}, blockDim = {256, 1, 1};
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(n)
#define __shared__ static
static inline void __syncthreads() {}
static inline unsigned __shfl_xor_sync(unsigned, unsigned v, int) { return v; }
float mx_h2f(unsigned short); unsigned short mx_f2h(float); unsigned short mx_d2h(double);
unsigned short mx_f2bf(float);
static inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
static inline double __longlong_as_double(long long i) { double d; std::memcpy(&d, &i, 8); return d; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline double __dmul_rn(double a, double b) { return a * b; }
static inline double __dadd_rn(double a, double b) { return a + b; }
extern "C" void mx_set_thread(unsigned t) { threadIdx.x = t; }
"""


def build(spec: KernelSpec, tmp: Path) -> ctypes.CDLL:
    return host_library(SHIM + spec.source, tmp)


def launch(spec: KernelSpec, tmp: Path, ins: list[np.ndarray], out: np.ndarray) -> int:
    """Run ``spec`` over ``ins`` into ``out`` (in place); returns what it left in its error slot."""
    lib = build(spec, tmp)
    err = np.zeros(1, np.int32)
    ptrs = [a.ctypes.data for a in (*ins, out)] + ([err.ctypes.data] if spec.checks else [])
    fn = lib[spec.name]
    scalar = ctypes.c_uint64 if spec.arg_bits == 64 else ctypes.c_uint32
    fn.argtypes = [ctypes.c_void_p] * len(ptrs) + [scalar] * len(spec.args)  # run-time sizes last
    for t in range(BLOCK):
        lib.mx_set_thread(t)
        fn(*ptrs, *spec.args)
    return int(err[0])


def shape(a: np.ndarray) -> Shape:
    return Shape(from_numpy(a.dtype), a.shape)


# -- error slots ------------------------------------------------------------------------------------------
def test_gather_flags_an_out_of_range_index_and_skips_it(tmp_path):
    data = np.arange(15, dtype=np.float32).reshape(3, 5)
    op = make_op("gather", axis=1)
    for idx, code in ((np.array([4, -5, 0], np.int64), 0), (np.array([1, 5, -6], np.int64), 1)):
        out = np.full((3, 3), -1, np.float32)
        spec = K.kernel_for("k_gather", op, [shape(data), shape(idx)], shape(out))
        assert launch(spec, tmp_path, [data, idx], out) == code
        good = (idx >= -5) & (idx < 5)
        np.testing.assert_array_equal(out[:, good], data[:, idx[good]])
        assert (out[:, ~good] == -1).all()  # the bad element is skipped, never read
    err = device_error(spec, 1)
    assert isinstance(err, IndexError) and str(err).startswith("gather: index out of range [-5, 5) on axis 1")


@pytest.mark.parametrize("name,attrs", [("gather_elements", {"axis": 0}), ("gathernd", {"batch_dims": 0})])
def test_other_gathers_flag_out_of_range(tmp_path, name, attrs):
    data = np.arange(12, dtype=np.int32).reshape(4, 3)
    idx = np.array([[1, 0], [3, 7]], np.int64) if name == "gathernd" else np.array([[0, 3, -4], [4, 1, 2]])
    op = make_op(name, **attrs)
    out_shape = op.compute_shape([shape(data), shape(idx)])
    out = np.zeros(out_shape.lens, np.int32)
    spec = K.kernel_for("k_g", op, [shape(data), shape(idx)], out_shape)
    code = launch(spec, tmp_path, [data, idx], out)
    assert code > 0 and isinstance(device_error(spec, code), IndexError)
    assert f"{name}: index out of range [-{3 if name == 'gathernd' else 4}" in str(device_error(spec, code))


@pytest.mark.parametrize("dt", [np.int32, np.uint8, np.int64])
@pytest.mark.parametrize("name", ["div", "mod", "fmod"])
def test_integer_division_by_zero_sets_the_slot(tmp_path, name, dt):
    a, b = np.array([7, 9, 5, 6], dt), np.array([2, 0, 5, 4], dt)
    t = from_numpy(np.dtype(dt))
    spec = K.pointwise_kernel(
        "k_div", PwOp(make_op(name), (PwInput(0), PwInput(1)), t), [shape(a)] * 2, shape(a)
    )
    out = np.zeros_like(a)
    assert launch(spec, tmp_path, [a, b], out) == 1
    assert str(device_error(spec, 1)).startswith(zero_divisor_message(name))
    ok = b != 0
    np.testing.assert_array_equal(out[ok], make_op(name).compute(shape(a), [a[ok], b[ok]]))
    assert launch(spec, tmp_path, [a, np.where(ok, b, 3).astype(dt)], out) == 0


def test_fused_divisions_get_one_code_each_and_constants_none(tmp_path):
    i32 = DType.int32_type
    x, y = PwInput(0), PwInput(1)
    div = PwOp(make_op("div"), (x, y), i32)
    by_three = PwOp(make_op("mod"), (x, PwConst(3, i32)), i32)  # a nonzero constant needs no check
    expr = PwOp(make_op("add"), (PwOp(make_op("mod"), (div, y), i32), by_three), i32)
    s = Shape(i32, (70,))
    spec = K.pointwise_kernel("k_fused", expr, [s, s], s)
    assert [c.message for c in spec.checks] == [zero_divisor_message("div"), zero_divisor_message("mod")]
    f = DType.float_type
    assert not K.pointwise_kernel(
        "k_f", PwOp(make_op("div"), (x, y), f), [Shape(f, (4,))] * 2, Shape(f, (4,))
    ).checks


# -- NaN rules ---------------------------------------------------------------------------------------------
NAN_ROWS = np.array(
    [[np.nan, 1, 3, 3, 2], [np.nan] * 5, [1, np.nan, -1, np.nan, 0], [-np.inf, np.nan, np.nan, 2, 2]],
    np.float32,
)


@pytest.mark.parametrize("name,attrs", [("reduce_max", {"axes": [1]}), ("reduce_min", {"axes": [1]}),
                                        ("argmax", {"axis": 1}), ("argmin", {"axis": 1}),
                                        ("argmax", {"axis": 1, "select_last_index": True}),
                                        ("argmin", {"axis": 1, "select_last_index": True})])  # fmt: skip
def test_reductions_skip_nan_like_the_ref(tmp_path, name, attrs):
    op = make_op(name, **attrs)
    out_shape = op.compute_shape([shape(NAN_ROWS)])
    spec = K.kernel_for("k_red", op, [shape(NAN_ROWS)], out_shape)
    assert "mx_warp_reduce<32>(acc" not in spec.source  # rows of 5: one thread each, runnable here
    out = np.zeros(out_shape.lens, out_shape.dtype)
    launch(spec, tmp_path, [NAN_ROWS], out)
    np.testing.assert_array_equal(out, op.compute(out_shape, [NAN_ROWS]))


def test_max_pool_skips_nan_like_the_ref(tmp_path):
    x = np.array([1, np.nan, 3, 2, np.nan, np.nan, 0], np.float32).reshape(1, 1, 1, 7)
    op = make_op("pooling", mode="max", padding=[0, 1, 0, 1], lengths=[1, 2])
    out_shape = op.compute_shape([shape(x)])
    out = np.zeros(out_shape.lens, np.float32)
    launch(K.kernel_for("k_pool", op, [shape(x)], out_shape), tmp_path, [x], out)
    np.testing.assert_array_equal(out, op.compute(out_shape, [x]))


# -- run-time sizes ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "a_shape,b_shape",
    [((3, 5, 7), (1, 5, 1)), ((2, 4, 6), (1, 4, 1))],  # one source, two shapes: sizes come as arguments
)
def test_one_source_serves_two_shapes(tmp_path, monkeypatch, a_shape, b_shape):
    monkeypatch.setenv("MIGRAPHX_EP_RUNTIME_SIZES", "1")
    rng = np.random.default_rng(0)
    a = rng.standard_normal(a_shape).astype(np.float32)
    b = rng.standard_normal(b_shape).astype(np.float32)
    bb = Shape(
        DType.float_type,
        a_shape,
        [0 if n == 1 else s for n, s in zip(b_shape, (b_shape[1] * b_shape[2], b_shape[2], 1), strict=True)],
    )
    expr = PwOp(make_op("add"), (PwInput(0), PwInput(1)), DType.float_type)
    spec = K.pointwise_kernel("k_bcast_add", expr, [shape(a), bb], shape(np.empty(a_shape, np.float32)))
    other = K.pointwise_kernel(
        "k_bcast_add",
        expr,
        [Shape(DType.float_type, (3, 5, 7)), Shape(DType.float_type, (3, 5, 7), (0, 1, 0))],
        Shape(DType.float_type, (3, 5, 7)),
    )
    assert spec.source == other.source and spec.args  # the second shape needs no compile
    out = np.zeros(a_shape, np.float32)
    assert launch(spec, tmp_path, [a, b], out) == 0
    np.testing.assert_allclose(out, a + b, rtol=1e-6)

"""cuBLASLt GEMM and cuDNN convolution plans (targets/gpu/blas.py, dnn.py, libs.py) against numpy.

Tests marked ``gpu`` run real plans on the GPU and skip where there is none, or where the library does
not load. The others run anywhere: the library search's error, the row-major -> column-major GEMM
mapping (checked by emulating cuBLASLt's column-major semantics in numpy), the cuDNN layout helpers.
"""

from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import pytest
from numpy.lib.stride_tricks import as_strided

from migraphx_ep.ir.dtypes import DType, to_numpy
from migraphx_ep.ir.shape import Shape
from migraphx_ep.ops.nn import conv_forward
from migraphx_ep.targets.gpu import blas, conv_search, dnn, gemm_search, libs
from migraphx_ep.targets.gpu.kernels.spec import Unsupported

gpu = pytest.mark.gpu
F32, F16, BF16, F64 = DType.float_type, DType.half_type, DType.bf16_type, DType.double_type


# -- library search (no GPU needed) ------------------------------------------------------------------------
@pytest.mark.parametrize("loader,env", [(libs.cublaslt, libs.CUBLASLT_ENV), (libs.cudnn, libs.CUDNN_ENV)])
def test_missing_library_names_what_was_searched(monkeypatch, tmp_path, loader, env):
    missing = tmp_path / "nowhere" / "libvendor.so"
    monkeypatch.setenv(env, str(missing))
    libs.reset_cache()
    try:
        with pytest.raises(libs.LibraryUnavailable) as e:
            loader()
        assert str(missing) in str(e.value) and "no such file" in str(e.value) and env in str(e.value)
        with pytest.raises(libs.LibraryUnavailable):  # the failure is cached, not retried
            loader()
    finally:
        libs.reset_cache()


def test_a_copy_already_in_the_process_is_shared_not_loaded_twice(monkeypatch):
    # ORT's CUDA EP loaded cuDNN from another folder first: that copy comes before ours in the search.
    maps = (
        "7f00-7f01 r-xp 00000000 08:01 1 /opt/ort/nvidia/cudnn/lib/libcudnn.so.9\n"
        "7f01-7f02 r--p 00001000 08:01 1 /opt/ort/nvidia/cudnn/lib/libcudnn.so.9\n"
        "7f02-7f03 r-xp 00000000 08:01 2 /usr/lib/libcudnn_graph.so.9\n"
        "7f02-7f03 r-xp 00000000 08:01 2 /usr/lib/x86_64-linux-gnu/libcublasLt.so.13.1.0.3\n"
        "7f03-7f04 rw-p 00000000 00:00 0 \n"
        "7f04-7f05 r-xp 00000000 08:01 3 /lib/x86_64-linux-gnu/libc.so.6\n"
    )
    assert libs.already_loaded(libs.CUDNN_NAMES, maps) == ["/opt/ort/nvidia/cudnn/lib/libcudnn.so.9"]
    # The file of a soname is often its full version (the system's cuBLASLt here).
    want = ["/usr/lib/x86_64-linux-gnu/libcublasLt.so.13.1.0.3"]
    assert libs.already_loaded(libs.CUBLASLT_NAMES, maps) == want
    assert libs.already_loaded(("libcudnn.so.9",), "1-2 r-xp 0 0:0 1 /x/libcudnn.so.90\n") == []
    monkeypatch.delenv(libs.CUDNN_ENV, raising=False)
    monkeypatch.setattr(libs, "already_loaded", lambda names, maps=None: ["/opt/ort/libcudnn.so.9"])
    assert libs.candidates(libs.CUDNN_ENV, libs.CUDNN_NAMES)[0] == "/opt/ort/libcudnn.so.9"
    # The real process map parses (this interpreter has libc mapped under some path).
    assert all(p.startswith("/") for p in libs.already_loaded(("libc.so.6",)))


# -- GEMM mapping, emulated (no GPU needed) ----------------------------------------------------------------
def layout(kind: str, rows: int, cols: int, batch_shared: bool = False) -> blas.MatLayout:
    """'rm'/'cm': packed row-/column-major; '+pad': 3 spare elements per leading dimension."""
    pad = 3 if kind.endswith("+pad") else 0
    if kind.startswith("rm"):
        rs, cs, size = cols + pad, 1, rows * (cols + pad)
    else:
        rs, cs, size = 1, rows + pad, cols * (rows + pad)
    return blas.MatLayout(rs, cs, 0 if batch_shared else size + 5)


def place(values: np.ndarray, lay: blas.MatLayout, fill: float = np.nan) -> np.ndarray:
    """A flat buffer holding (batch, rows, cols) ``values`` at ``lay``; unused elements are ``fill``."""
    batch, rows, cols = values.shape
    flat = np.full(blas.span(lay, rows, cols, batch), fill, values.dtype)
    isz = flat.itemsize
    if lay.batch_stride == 0:
        values = values[:1]
    view = as_strided(
        flat, values.shape, (lay.batch_stride * isz, lay.row_stride * isz, lay.col_stride * isz)
    )
    view[...] = values
    return flat


def read(flat: np.ndarray, lay: blas.MatLayout, batch: int, rows: int, cols: int) -> np.ndarray:
    isz = flat.itemsize
    return as_strided(
        flat, (batch, rows, cols), (lay.batch_stride * isz, lay.row_stride * isz, lay.col_stride * isz)
    ).copy()


def emulate_cublaslt(swap, p, q, d, batch, a_buf, b_buf, c_buf, alpha, beta, bias):
    """cuBLASLt's column-major ``D' = relu?(alpha * op(P) @ op(Q) + beta * C' + bias per row)``."""
    p_buf, q_buf = (b_buf, a_buf) if swap else (a_buf, b_buf)
    out = c_buf.copy()
    isz = out.itemsize

    def colmajor(buf: np.ndarray, st: blas.Stored, i: int) -> np.ndarray:
        assert st.ld >= st.rows, "cuBLASLt needs ld >= rows"
        assert i * st.batch_stride + (st.rows - 1) + (st.cols - 1) * st.ld < buf.size, "reads past the buffer"
        return as_strided(buf[i * st.batch_stride :], (st.rows, st.cols), (isz, st.ld * isz))

    for i in range(batch):
        op_p = colmajor(p_buf, p, i) if p.op == blas.CUBLAS_OP_N else colmajor(p_buf, p, i).T
        op_q = colmajor(q_buf, q, i) if q.op == blas.CUBLAS_OP_N else colmajor(q_buf, q, i).T
        res = alpha * (op_p @ op_q) + beta * colmajor(c_buf, d, i)
        if bias is not None:
            res = res + bias[:, None]
        colmajor(out, d, i)[...] = res  # a view into ``out``
    return out


KINDS = ["rm", "cm", "rm+pad", "cm+pad"]


@pytest.mark.parametrize("ka,kb,kc", list(itertools.product(KINDS, KINDS, ["rm", "cm", "rm+pad"])))
@pytest.mark.parametrize(
    "batch,m,n,k,shared_b",
    [(1, 5, 4, 3, False), (3, 4, 6, 5, False), (2, 3, 5, 4, True), (1, 1, 4, 3, False), (2, 4, 1, 1, False)],
)
def test_gemm_mapping_matches_row_major_semantics(ka, kb, kc, batch, m, n, k, shared_b):
    rng = np.random.default_rng(0)
    la, lb, lc = layout(ka, m, k), layout(kb, k, n, shared_b), layout(kc, m, n)
    with_bias = kc.startswith("rm")
    a = rng.standard_normal((batch, m, k))
    b = rng.standard_normal((1 if shared_b else batch, k, n))
    c = rng.standard_normal((batch, m, n))
    bias = rng.standard_normal(n) if with_bias else None
    swap, p, q, d = blas.map_gemm(batch, m, n, k, la, lb, lc, with_bias)
    a_buf, b_buf, c_buf = place(a, la), place(b, lb), place(c, lc, 0.0)
    out = emulate_cublaslt(swap, p, q, d, batch, a_buf, b_buf, c_buf, 0.5, 2.0, bias)
    want = 0.5 * (a @ np.broadcast_to(b, (batch, k, n))) + 2.0 * c + (0 if bias is None else bias)
    np.testing.assert_allclose(read(out, lc, batch, m, n), want, rtol=1e-12, atol=1e-12)


def test_gemm_mapping_rejects_what_cublaslt_cannot_read():
    with pytest.raises(Unsupported, match="no unit stride"):
        blas.map_gemm(1, 4, 4, 4, blas.MatLayout(8, 2), layout("rm", 4, 4), layout("rm", 4, 4), False)
    with pytest.raises(Unsupported, match="row-major output"):
        blas.map_gemm(1, 4, 4, 4, layout("rm", 4, 4), layout("rm", 4, 4), layout("cm", 4, 4), True)
    with pytest.raises(Unsupported, match="overlap"):
        blas.map_gemm(2, 4, 4, 4, layout("rm", 4, 4), layout("rm", 4, 4), blas.MatLayout(4, 1, 8), False)


# -- cuDNN layout helpers (no GPU needed) ------------------------------------------------------------------
def channels_last(lens: tuple[int, ...]) -> tuple[int, ...]:
    order = [0, *range(2, len(lens)), 1]
    strides, acc = [0] * len(lens), 1
    for axis in reversed(order):
        strides[axis], acc = acc, acc * lens[axis]
    return tuple(strides)


def test_cudnn_layout_helpers():
    w = (8, 4, 3, 3)
    assert dnn.filter_format(Shape(F32, w)) == dnn.CUDNN_TENSOR_NCHW
    assert dnn.filter_format(Shape(F32, w, channels_last(w))) == dnn.CUDNN_TENSOR_NHWC
    with pytest.raises(Unsupported, match="packed"):
        dnn.filter_format(Shape(F32, w, (1, 8, 96, 32)))
    with pytest.raises(Unsupported, match="broadcast"):
        dnn.tensor_strides(Shape(F32, (2, 4, 5, 5), (0, 25, 5, 1)))
    assert dnn.tensor_strides(Shape(F32, (1, 4, 5, 5), (0, 25, 5, 1))) == (100, 25, 5, 1)
    x = Shape(F32, (2, 4, 10), channels_last((2, 4, 10)))
    assert dnn.expand_1d(x) == Shape(F32, (2, 4, 10, 1), channels_last((2, 4, 10, 1)))
    stem = dnn.output_lens(Shape(F32, (1, 3, 224, 224)), Shape(F32, (64, 3, 7, 7)), (3, 3), (2, 2), (1, 1))
    assert stem == (1, 64, 112, 112)


def test_a_handle_serves_one_caller_at_a_time():
    # cuDNN keeps a stream in its handle: a Run's convolution and a background search each borrow their
    # own (libs.HandlePool), made as needed per device and handed back for the next caller.
    import threading

    made = itertools.count(1)
    device = {"id": 0}
    pool = libs.HandlePool(lambda: next(made), lambda: device["id"])
    with pool.borrow() as a, pool.borrow() as b:
        assert a != b  # two callers at once: two handles
    with pool.borrow() as c:
        assert c in (a, b)  # handed back, lent again
    device["id"] = 1
    with pool.borrow() as d:
        assert d not in (a, b)  # another device: its own handles
    device["id"] = 0
    held, inside = [], threading.Barrier(4)

    def caller() -> None:
        with pool.borrow() as h:
            held.append(h)
            inside.wait(timeout=10)  # all four hold one at once

    threads = [threading.Thread(target=caller) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(held)) == 4


def test_plan_conv_rejects_before_touching_a_gpu():
    x, w, y = Shape(F32, (1, 4, 8, 8)), Shape(F32, (4, 4, 3, 3)), Shape(F32, (1, 4, 8, 8))
    args = dict(bias=False, relu=False, residual=False, allow_tf32=False)
    with pytest.raises(Unsupported, match="asymmetric"):
        dnn.plan_conv(F32, x, w, y, (1, 1), (1, 2), (1, 1), (1, 1), 1, **args)
    with pytest.raises(Unsupported, match="int32|float types"):
        dnn.plan_conv(DType.int32_type, x, w, y, (1, 1), (1, 1), (1, 1), (1, 1), 1, **args)
    with pytest.raises(ValueError, match="do not fit"):
        dnn.plan_conv(F32, x, w, Shape(F32, (1, 4, 7, 8)), (1, 1), (1, 1), (1, 1), (1, 1), 1, **args)


# -- on the GPU --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cublaslt(cuda):
    try:
        libs.cublaslt()
    except libs.LibraryUnavailable as e:
        pytest.skip(str(e))
    return cuda


@pytest.fixture(scope="module")
def cudnn(cuda):
    try:
        libs.cudnn()
    except libs.LibraryUnavailable as e:
        pytest.skip(str(e))
    return cuda


class Device:
    """Uploads host buffers, runs, downloads; keeps every buffer alive until the stream is synced."""

    def __init__(self, cuda) -> None:
        self.cuda, self.stream, self.keep = cuda, cuda.Stream(), []

    def put(self, flat: np.ndarray) -> int:
        buf = self.cuda.alloc(max(flat.nbytes, 1))
        self.cuda.memcpy_htod(buf.ptr, np.ascontiguousarray(flat), self.stream)
        self.keep += [buf, flat]
        return buf.ptr

    def get(self, ptr: int, like: np.ndarray) -> np.ndarray:
        out = np.empty_like(like)
        self.cuda.memcpy_dtoh(out, ptr, self.stream)
        self.stream.sync()
        return out

    def scratch(self, nbytes: int) -> int:
        if not nbytes:
            return 0
        self.keep.append(self.cuda.alloc(nbytes))
        return self.keep[-1].ptr


def host_type(t: DType) -> np.dtype:
    return np.dtype(ml_dtypes.bfloat16) if t == BF16 else to_numpy(t)


GEMM_TOL = {  # (dtype, tf32): (rtol, atol) for inputs in [-1, 1] and k <= 64
    (F32, False): (1e-5, 2e-5),
    (F32, True): (1e-2, 2e-2),
    (F16, False): (1e-2, 1e-2),
    (BF16, False): (2e-2, 3e-2),
    (F64, False): (1e-12, 1e-12),
}


def run_gemm(cuda, dtype, dims, kinds, *, shared_b=False, in_place=False, tf32=False, **opts):
    """Plan (``opts``: bias, relu, beta, tune, tuned), run and check one GEMM; returns the plan."""
    batch, m, n, k = dims
    bias, relu, beta = opts.get("bias", False), opts.get("relu", False), opts.get("beta", 0.0)
    rng = np.random.default_rng(1)
    ht = host_type(dtype)
    la, lb, lc = layout(kinds[0], m, k), layout(kinds[1], k, n, shared_b), layout(kinds[2], m, n)
    a = rng.uniform(-1, 1, (batch, m, k)).astype(ht)
    b = rng.uniform(-1, 1, (1 if shared_b else batch, k, n)).astype(ht)
    c = rng.uniform(-1, 1, (batch, m, n)).astype(ht)
    bv = rng.uniform(-1, 1, n).astype(ht)
    plan = gemm_search.plan_gemm(dtype, batch, m, n, k, la, lb, lc, allow_tf32=tf32, **opts)
    dev = Device(cuda)
    a_p, b_p = dev.put(place(a, la, 0)), dev.put(place(b, lb, 0))
    c_flat = place(c, lc, 0)
    d_p = dev.put(c_flat if in_place else np.zeros_like(c_flat))
    c_p = d_p if in_place else dev.put(c_flat)
    plan.run(
        dev.stream.handle, a_p, b_p, c_p, d_p, dev.put(bv) if bias else 0, dev.scratch(plan.workspace_size)
    )
    got = read(dev.get(d_p, c_flat), lc, batch, m, n).astype(np.float64)
    f = [t.astype(np.float64) for t in (a, b, c, bv)]
    want = f[0] @ np.broadcast_to(f[1], (batch, k, n)) + beta * f[2] + (f[3] if bias else 0)
    want = np.maximum(want, 0) if relu else want
    rtol, atol = GEMM_TOL[dtype, tf32]
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=plan.describe())
    return plan


@gpu
@pytest.mark.parametrize("dtype,tf32", list(GEMM_TOL))
@pytest.mark.parametrize(
    "kinds",
    [
        ("rm", "rm", "rm"),
        ("cm", "rm", "rm"),
        ("rm", "cm", "rm"),
        ("cm+pad", "rm+pad", "rm+pad"),
        ("rm", "rm", "cm"),
    ],
)
def test_gemm_layouts_and_types(cublaslt, dtype, tf32, kinds):
    run_gemm(cublaslt, dtype, (1, 33, 40, 64), kinds, tf32=tf32)


@gpu
@pytest.mark.parametrize("dtype", [F32, F16, BF16])
@pytest.mark.parametrize(
    "bias,relu,beta,in_place",
    [
        (True, False, 0.0, False),
        (False, True, 0.0, False),
        (True, True, 0.0, False),
        (True, True, 1.0, True),
        (False, False, 1.0, False),
    ],
)
def test_gemm_epilogues_and_residual(cublaslt, dtype, bias, relu, beta, in_place):
    run_gemm(
        cublaslt,
        dtype,
        (1, 48, 24, 32),
        ("rm", "cm", "rm"),
        bias=bias,
        relu=relu,
        beta=beta,
        in_place=in_place,
    )


@gpu
@pytest.mark.parametrize("shared_b", [False, True])
def test_gemm_batched(cublaslt, shared_b):
    run_gemm(cublaslt, F32, (4, 17, 9, 12), ("rm+pad", "cm", "rm"), shared_b=shared_b, bias=True, relu=True)


@gpu
def test_gemm_tuned_plan_reloads_its_algorithm(cublaslt, monkeypatch):
    plan = run_gemm(cublaslt, F16, (2, 64, 64, 64), ("rm", "rm", "rm"), bias=True, tune=True)
    saved = plan.to_dict()
    with monkeypatch.context() as m:  # a reload must not search again
        m.setattr(blas.GemmPlan, "heuristics", lambda *a, **k: pytest.fail("heuristics ran on reload"))
        again = run_gemm(cublaslt, F16, (2, 64, 64, 64), ("rm", "rm", "rm"), bias=True, tuned=saved)
    assert bytes(again.algo) == bytes(plan.algo) and again.to_dict()["key"] == saved["key"]
    stale = dict(saved, key="another GEMM")
    run_gemm(cublaslt, F16, (2, 64, 64, 64), ("rm", "rm", "rm"), bias=True, tuned=stale)  # heuristics again


@gpu
def test_gemm_without_tf32_is_full_float32(cublaslt):
    """1 + 2^-12 survives float32 but not TF32's 10-bit mantissa: the sum shows which one ran."""
    k, val = 32, np.float32(1 + 2**-12)
    la, lb, lc = layout("rm", 8, k), layout("rm", k, 8), layout("rm", 8, 8)
    plan = gemm_search.plan_gemm(F32, 1, 8, 8, k, la, lb, lc, allow_tf32=False)
    dev = Device(cublaslt)
    d = np.zeros(64, np.float32)
    d_p = dev.put(d)
    plan.run(
        dev.stream.handle,
        dev.put(np.full(8 * k, val)),
        dev.put(np.ones(8 * k, np.float32)),
        d_p,
        d_p,
        0,
        dev.scratch(plan.workspace_size),
    )
    np.testing.assert_allclose(dev.get(d_p, d), k * np.float64(val), rtol=1e-7)


@gpu
def test_gemm_errors_are_clear(cublaslt):
    plan = gemm_search.plan_gemm(F32, 1, 8, 8, 8, *(layout("rm", 8, 8),) * 3, bias=True, allow_tf32=False)
    with pytest.raises(blas.BlasError, match="null or not 256-byte aligned.*GEMM float_type"):
        plan.run(0, 256, 512, 768, 768, 0, 1024)


# -- convolution -------------------------------------------------------------------------------------------
CONV_TOL = {
    (F32, False): (2e-5, 2e-4),
    (F32, True): (1e-2, 3e-2),
    (F16, False): (1e-2, 2e-2),
    (BF16, False): (2e-2, 8e-2),
}

CONV_CASES = {  # name: (x lens, w lens, pads, strides, dilations, groups)
    "3x3": ((2, 8, 12, 12), (16, 8, 3, 3), (1, 1), (1, 1), (1, 1), 1),
    "stride2": ((2, 8, 13, 11), (8, 8, 3, 3), (1, 1), (2, 2), (1, 1), 1),
    "dilated-groups": ((1, 8, 14, 14), (12, 4, 3, 3), (2, 2), (1, 1), (2, 2), 2),
    "depthwise": ((2, 16, 9, 9), (16, 1, 3, 3), (1, 1), (1, 1), (1, 1), 16),
    "1x1": ((2, 32, 7, 7), (16, 32, 1, 1), (0, 0), (1, 1), (1, 1), 1),
    "1d": ((2, 8, 20), (8, 8, 5), (2,), (2,), (1,), 1),
    "3d": ((1, 4, 6, 6, 6), (8, 4, 3, 3, 3), (1, 1, 1), (1, 1, 1), (1, 1, 1), 1),
}


def conv_shapes(dtype, case, nhwc):
    xl, wl, pads, strides, dils, groups = CONV_CASES[case]
    yl = dnn.output_lens(Shape(dtype, xl), Shape(dtype, wl), pads, strides, dils)
    mk = (lambda lens: Shape(dtype, lens, channels_last(lens))) if nhwc else (lambda lens: Shape(dtype, lens))
    return mk(xl), mk(wl), mk(yl), pads, strides, dils, groups


def to_layout(arr: np.ndarray, s: Shape) -> np.ndarray:
    flat = np.zeros(s.element_space(), arr.dtype)
    as_strided(flat, arr.shape, [st * arr.itemsize for st in s.strides])[...] = arr
    return flat


def from_layout(flat: np.ndarray, s: Shape) -> np.ndarray:
    return as_strided(flat, s.lens, [st * flat.itemsize for st in s.strides]).copy()


def run_conv(cuda, dtype, case, *, nhwc=False, in_place=False, tf32=False, **opts):
    """Plan (``opts``: bias, relu, residual, tuned, exhaustive), run and check one convolution."""
    bias, relu, residual = (opts.setdefault(k, False) for k in ("bias", "relu", "residual"))
    rng = np.random.default_rng(2)
    x, w, y, pads, strides, dils, groups = conv_shapes(dtype, case, nhwc)
    ht = host_type(dtype)
    xv, wv = rng.uniform(-1, 1, x.lens).astype(ht), rng.uniform(-1, 1, w.lens).astype(ht)
    zv, bv = rng.uniform(-1, 1, y.lens).astype(ht), rng.uniform(-1, 1, y.lens[1]).astype(ht)
    plan = dnn.plan_conv(dtype, x, w, y, pads, pads, strides, dils, groups, allow_tf32=tf32, **opts)
    dev = Device(cuda)
    y_init = to_layout(zv, y) if in_place else np.zeros(y.element_space(), ht)
    y_p = dev.put(y_init)
    z_p = (y_p if in_place else dev.put(to_layout(zv, y))) if residual else 0
    plan.run(
        dev.stream.handle,
        dev.put(to_layout(xv, x)),
        dev.put(to_layout(wv, w)),
        y_p,
        dev.put(bv) if bias else 0,
        z_p,
        dev.scratch(plan.workspace_size),
    )
    got = from_layout(dev.get(y_p, y_init), y).astype(np.float64)
    f = [t.astype(np.float64) for t in (xv, wv, zv, bv)]
    want = conv_forward(f[0], f[1], pads + pads, strides, dils, groups, y.lens, np.dtype(np.float64))
    want = want + (f[2] if residual else 0) + (f[3].reshape(1, -1, *([1] * (y.ndim() - 2))) if bias else 0)
    want = np.maximum(want, 0) if relu else want
    rtol, atol = CONV_TOL[dtype, tf32]
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=f"{plan.describe()} {plan.to_dict()}")
    return plan


@gpu
@pytest.mark.parametrize("case", list(CONV_CASES))
@pytest.mark.parametrize("nhwc", [False, True])
def test_conv_geometry_and_layouts(cudnn, case, nhwc):
    run_conv(cudnn, F32, case, nhwc=nhwc)


@gpu
@pytest.mark.parametrize("dtype,tf32", list(CONV_TOL))
@pytest.mark.parametrize(
    "case,nhwc", [("3x3", False), ("stride2", True), ("depthwise", False), ("1x1", True)]
)
def test_conv_types(cudnn, dtype, tf32, case, nhwc):
    run_conv(cudnn, dtype, case, nhwc=nhwc, tf32=tf32)


@gpu
@pytest.mark.parametrize("dtype", [F32, F16])
@pytest.mark.parametrize("nhwc", [False, True])
@pytest.mark.parametrize(
    "bias,relu,residual,in_place",
    [
        (True, True, False, False),
        (True, False, False, False),
        (False, True, False, False),
        (True, True, True, False),
        (True, True, True, True),
        (False, False, True, True),
        (False, True, True, False),
    ],
)
def test_conv_fused_epilogues(cudnn, dtype, nhwc, bias, relu, residual, in_place):
    run_conv(
        cudnn, dtype, "dilated-groups", nhwc=nhwc, bias=bias, relu=relu, residual=residual, in_place=in_place
    )


@gpu
@pytest.mark.parametrize("case", ["1d", "3d"])
def test_conv_other_ranks_with_epilogue(cudnn, case):
    run_conv(cudnn, F32, case, bias=True, relu=True, residual=True)


@gpu
def test_conv_reload_and_heuristic_only(cudnn, monkeypatch):
    plan = run_conv(cudnn, F16, "3x3", nhwc=True, bias=True, relu=True)
    saved = plan.to_dict()
    with monkeypatch.context() as m:  # a reload must not search again
        m.setattr(conv_search, "search", lambda *a, **k: pytest.fail("searched on reload"))
        again = run_conv(cudnn, F16, "3x3", nhwc=True, bias=True, relu=True, tuned=saved)
    assert again.to_dict() == saved and again.workspace_size == plan.workspace_size
    # Heuristic only (a quick pick): no trial of the fused call on scratch memory, so bias and relu
    # run as calls of their own -- with the same answers (run_conv checks them).
    quick = run_conv(cudnn, F16, "3x3", nhwc=True, bias=True, relu=True, exhaustive=False)
    assert not quick.fused
    run_conv(cudnn, F16, "3x3", nhwc=True, bias=True, relu=True, tuned=dict(saved, key="other"))


@gpu
def test_conv_without_tf32_is_full_float32(cudnn):
    """A sum of 1 + 2^-12 terms is exact in float32 and off by 2^-12 relative under TF32."""
    x, w = Shape(F32, (1, 16, 4, 4)), Shape(F32, (4, 16, 1, 1))
    y = Shape(F32, (1, 4, 4, 4))
    args = dict(bias=False, relu=False, residual=False, allow_tf32=False)
    plan = dnn.plan_conv(F32, x, w, y, (0, 0), (0, 0), (1, 1), (1, 1), 1, **args)
    dev = Device(cudnn)
    out = np.zeros(64, np.float32)
    y_p = dev.put(out)
    xv = np.full(256, 1 + 2**-12, np.float32)
    plan.run(
        dev.stream.handle,
        dev.put(xv),
        dev.put(np.ones(64, np.float32)),
        y_p,
        0,
        0,
        dev.scratch(plan.workspace_size),
    )
    np.testing.assert_allclose(dev.get(y_p, out), 16 * (1 + 2**-12), rtol=1e-5)


@gpu
def test_the_same_gemm_is_timed_once_per_process(cublaslt, monkeypatch):
    from migraphx_ep.targets.gpu.tuning import PICKS

    PICKS.clear()
    shape, kinds = (2, 64, 48, 32), ("rm", "cm", "rm")
    first = run_gemm(cublaslt, F16, shape, kinds, bias=True, tune=True)
    with monkeypatch.context() as m:  # another layer's identical GEMM: no heuristics, no timing
        m.setattr(blas.GemmPlan, "heuristics", lambda *a, **k: pytest.fail("heuristics ran for a known GEMM"))
        again = run_gemm(cublaslt, F16, shape, kinds, bias=True, tune=True)
    assert bytes(again.algo) == bytes(first.algo) and PICKS.hits == 1
    searched = []
    real = blas.GemmPlan.heuristics
    monkeypatch.setattr(blas.GemmPlan, "heuristics", lambda *a, **k: searched.append(1) or real(*a, **k))
    run_gemm(cublaslt, F16, (2, 65, 48, 32), kinds, bias=True, tune=True)  # another M: a new problem
    run_gemm(cublaslt, F16, shape, kinds, bias=False, tune=True)  # another epilogue: a new problem
    assert len(searched) == 2


@gpu
def test_the_same_convolution_is_searched_once_per_process(cudnn, monkeypatch):
    from migraphx_ep.targets.gpu.tuning import PICKS

    PICKS.clear()
    first = run_conv(cudnn, F16, "3x3", nhwc=True, bias=True, relu=True)
    with monkeypatch.context() as m:
        m.setattr(conv_search, "search", lambda *a, **k: pytest.fail("searched for a known convolution"))
        again = run_conv(cudnn, F16, "3x3", nhwc=True, bias=True, relu=True)
    assert again.to_dict() == first.to_dict() and PICKS.hits == 1

"""int8 / fp8 on a real GPU: quant_dot (cuBLASLt IMMA / FP8, and the generated fallback),
quant_convolution (im2col + GEMM, the generated kernel), quantizelinear into fp8 — each against the ref
target; QDQ models from ``quantize_static`` through ORT against ORT's CPU EP; ``migraphx_int8_enable`` /
``migraphx_fp8_enable`` with a calibration table on gpu against ref. Marked gpu: skipped without one.

int8 results are compared exactly (int32 sums); fp8 ones within float summation order (E4M3 products
are exact in float). Where cuBLASLt loads, the tests also assert it planned the GEMMs (the executable's
plans), so a layout the library refuses shows up as a failure, not as a silent fallback.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnxruntime as ort
import pytest

from migraphx_ep.ir.operation import make_op
from migraphx_ep.ir.program import Program
from migraphx_ep.ir.shape import Shape
from migraphx_ep.targets import get_target
from migraphx_ep.targets.gpu.steps import GemmStep

from .quantcheck import QDQ_STYLES, conv_mlp, inputs, matmul_only, qdq_model, write_table

pytestmark = pytest.mark.gpu
EP = "MIGraphXExecutionProvider"
FP8 = np.dtype(ml_dtypes.float8_e4m3fn)
FNUZ = np.dtype(ml_dtypes.float8_e4m3fnuz)


@pytest.fixture(scope="module")
def cc() -> tuple[int, int]:
    from migraphx_ep.targets.gpu.cuda import Device

    return Device.get(0).cc


@pytest.fixture
def fp8_gpu(cc) -> None:  # noqa: ANN001
    if cc < (8, 9):
        pytest.skip(f"fp8 needs compute capability 8.9+, this GPU is {cc}")


def has_cublaslt() -> bool:
    from migraphx_ep.targets.gpu import _libraries

    return _libraries()[0]


def quantised(rng: np.random.Generator, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    if np.dtype(dtype) == np.int8:
        return rng.integers(-128, 128, shape).astype(np.int8)
    return (rng.standard_normal(shape) * 4).astype(dtype)


def program(
    op: str, a: np.ndarray, b: np.ndarray, const_b: bool, transpose_b: bool = False, **attrs
) -> Program:  # noqa: ANN003
    """``op(a, b)``; with ``transpose_b`` b's memory is [.., N, K] and the op reads its transpose."""
    p = Program()
    m = p.get_main_module()
    pa = m.add_parameter("a", Shape.of(a))
    src = np.ascontiguousarray(np.swapaxes(b, -1, -2)) if transpose_b else b
    pb = m.add_literal(src) if const_b else m.add_parameter("b", Shape.of(src))
    if transpose_b:
        perm = [*range(b.ndim - 2), b.ndim - 1, b.ndim - 2]
        pb = m.add_instruction(make_op("transpose", permutation=perm), [pb])
    m.add_return([m.add_instruction(make_op(op, **attrs), [pa, pb])])
    return p


def run_both(make, feeds: dict[str, np.ndarray], gpu) -> tuple[np.ndarray, np.ndarray, Program]:  # noqa: ANN001
    ref, dev = make(), make()
    ref.compile(get_target("ref"))
    dev.compile(gpu)
    return dev.run_numpy(feeds)[0], ref.run_numpy(feeds)[0], dev


# Hopper's FP8 tensor cores add products with fewer mantissa bits than float32 inside each MMA (cuBLASLt
# promotes the partial sums to float32 between them): measured on an H100, the fp8 quant_dot results are
# within 4e-4 of the largest magnitude of the float32 sum the ref computes. The products themselves are
# exact (E4M3 x E4M3 fits float32), so this is the accumulation's error alone; 2e-3 states it.
FP8_SUM_TOL = 2e-3


def assert_quant_close(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    if want.dtype == np.int32:
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, rtol=0, atol=FP8_SUM_TOL * max(1.0, float(np.abs(want).max())))


def planned_gemms(prog: Program) -> tuple[int, int]:
    """(GEMM steps, those cuBLASLt planned) of a compiled gpu program."""
    exe = prog._exe
    steps = [i for i, s in enumerate(exe.lowered.steps) if isinstance(s, GemmStep)]  # type: ignore[union-attr]
    return len(steps), sum(f"gemm{i}" in exe._plans for i in steps)  # type: ignore[union-attr]


DOT_CASES = {  # name: (A lens, B lens, B stored transposed)
    "fits": ((64, 128), (128, 96), False),
    "odd": ((5, 7), (7, 5), False),
    "odd-large": ((33, 67), (67, 45), False),
    "row-vector": ((1, 48), (48, 20), False),
    "batched": ((3, 17, 40), (3, 40, 24), False),
    "k-major-b": ((16, 64), (64, 32), True),
}


@pytest.mark.parametrize("const_b", [False, True], ids=["b-input", "b-weight"])
@pytest.mark.parametrize("case", list(DOT_CASES))
def test_quant_dot_int8_is_exact(gpu, rng, case, const_b) -> None:  # noqa: ANN001
    la, lb, tb = DOT_CASES[case]
    a, b = quantised(rng, la, np.int8), quantised(rng, lb, np.int8)
    feeds = {"a": a} if const_b else {"a": a, "b": np.ascontiguousarray(np.swapaxes(b, -1, -2)) if tb else b}
    got, want, dev = run_both(lambda: program("quant_dot", a, b, const_b, tb), feeds, gpu)
    assert_quant_close(got, want)
    if has_cublaslt():
        n, planned = planned_gemms(dev)
        assert n == 1 and planned == 1, "cuBLASLt refused the int8 GEMM (IMMA TN layout)"


def test_quant_dot_int8_extremes_are_exact(gpu) -> None:  # noqa: ANN001
    """-128 * -128 summed over K = 4096: 2^26, far past float's exact integers, exact in int32."""
    a = np.full((8, 4096), -128, np.int8)
    b = np.full((4096, 8), -128, np.int8)
    got, want, _ = run_both(lambda: program("quant_dot", a, b, True), {"a": a}, gpu)
    np.testing.assert_array_equal(got, want)
    assert int(got[0, 0]) == 4096 * 16384


def test_quant_dot_broadcast_weight(gpu, rng) -> None:  # noqa: ANN001
    a, b = quantised(rng, (4, 9, 32), np.int8), quantised(rng, (32, 16), np.int8)

    def make() -> Program:
        p = Program()
        m = p.get_main_module()
        wb = m.add_instruction(make_op("multibroadcast", out_lens=[4, 32, 16]), [m.add_literal(b)])
        m.add_return([m.add_instruction(make_op("quant_dot"), [m.add_parameter("a", Shape.of(a)), wb])])
        return p

    got, want, _ = run_both(make, {"a": a}, gpu)
    assert_quant_close(got, want)


@pytest.mark.parametrize("dtype", [np.int8, FP8, FNUZ], ids=["int8", "fp8", "fp8-fnuz"])
def test_quant_dot_generated_kernel_without_cublaslt(gpu, rng, monkeypatch, dtype) -> None:  # noqa: ANN001
    monkeypatch.setenv("MIGRAPHX_EP_DISABLE_CUBLASLT", "1")
    a, b = quantised(rng, (2, 33, 45), dtype), quantised(rng, (2, 45, 19), dtype)
    got, want, dev = run_both(lambda: program("quant_dot", a, b, False), {"a": a, "b": b}, gpu)
    assert_quant_close(got, want)
    assert planned_gemms(dev) == (0, 0)


@pytest.mark.parametrize("const_b", [False, True], ids=["b-input", "b-weight"])
@pytest.mark.parametrize("case", list(DOT_CASES))
def test_quant_dot_fp8(gpu, rng, fp8_gpu, case, const_b) -> None:  # noqa: ANN001
    la, lb, tb = DOT_CASES[case]
    a, b = quantised(rng, la, FP8), quantised(rng, lb, FP8)
    feeds = {"a": a} if const_b else {"a": a, "b": np.ascontiguousarray(np.swapaxes(b, -1, -2)) if tb else b}
    got, want, dev = run_both(lambda: program("quant_dot", a, b, const_b, tb), feeds, gpu)
    assert_quant_close(got, want)
    if has_cublaslt():
        assert planned_gemms(dev) == (1, 1), "cuBLASLt refused the fp8 GEMM (TN, K % 16)"


CONV_CASES = {  # name: (x lens, w lens, padding, stride, dilation, group)
    "3x3": ((2, 16, 14, 14), (32, 16, 3, 3), [1, 1, 1, 1], [1, 1], [1, 1], 1),
    "stem": ((1, 3, 32, 32), (16, 3, 7, 7), [3, 3, 3, 3], [2, 2], [1, 1], 1),
    "odd-asym": ((2, 5, 9, 8), (7, 5, 3, 2), [2, 0, 1, 1], [2, 1], [2, 1], 1),
    "1x1": ((2, 32, 7, 7), (20, 32, 1, 1), [0, 0, 0, 0], [1, 1], [1, 1], 1),
    "1d": ((2, 4, 20), (6, 4, 5), [2, 2], [2], [1], 1),
    "grouped": ((2, 8, 9, 9), (8, 2, 3, 3), [1, 1, 1, 1], [1, 1], [1, 1], 4),
}


@pytest.mark.parametrize("dtype", [np.int8, FP8], ids=["int8", "fp8"])
@pytest.mark.parametrize("case", list(CONV_CASES))
def test_quant_convolution(gpu, rng, cc, dtype, case) -> None:  # noqa: ANN001
    if dtype == FP8 and cc < (8, 9):
        pytest.skip("fp8 needs compute capability 8.9+")
    xl, wl, pad, stride, dil, group = CONV_CASES[case]
    x, w = quantised(rng, xl, dtype), quantised(rng, wl, dtype)
    attrs = dict(padding=pad, stride=stride, dilation=dil, group=group)
    got, want, dev = run_both(lambda: program("quant_convolution", x, w, True, **attrs), {"a": x}, gpu)
    assert_quant_close(got, want)
    if has_cublaslt() and group == 1:
        assert planned_gemms(dev) == (1, 1), "cuBLASLt refused the im2col GEMM"


@pytest.mark.parametrize("saturate", [True, False])
def test_quantizelinear_to_fp8_is_exact(gpu, rng, fp8_gpu, saturate) -> None:  # noqa: ANN001
    x = np.concatenate([rng.standard_normal(500) * 200, [np.nan, np.inf, -np.inf, 464, 465, -0.0]])
    x = x.astype(np.float32).reshape(2, 253)

    def make() -> Program:
        p = Program()
        m = p.get_main_module()
        s = m.add_instruction(make_op("multibroadcast", out_lens=[2, 253]), [m.add_literal(np.float32(0.75))])
        z = m.add_instruction(
            make_op("multibroadcast", out_lens=[2, 253]), [m.add_literal(np.zeros((), FP8))]
        )
        q = make_op("quantizelinear", saturate=saturate)
        m.add_return([m.add_instruction(q, [m.add_parameter("a", Shape.of(x)), s, z])])
        return p

    got, want, _ = run_both(make, {"a": x}, gpu)
    nan = np.isnan(want.astype(np.float32))
    np.testing.assert_array_equal(np.isnan(got.astype(np.float32)), nan)
    np.testing.assert_array_equal(got.view(np.uint8)[~nan], want.view(np.uint8)[~nan])


# -- through ORT -----------------------------------------------------------------------------------------
def sessions(model, options: dict[str, str]) -> tuple[ort.InferenceSession, ort.InferenceSession]:  # noqa: ANN001
    ours = ort.InferenceSession(model.SerializeToString(), providers=[(EP, options), "CPUExecutionProvider"])
    cpu = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return ours, cpu


def compiled_ops(backend) -> list[str]:  # noqa: ANN001
    progs = [p for c in backend.eps[-1].compiled for p in c.programs.values()]
    return [i.name for p in progs for i in p.get_main_module().instructions]


@pytest.mark.parametrize("style", QDQ_STYLES)
@pytest.mark.parametrize("model", [conv_mlp, matmul_only], ids=["conv_mlp", "matmul"])
def test_qdq_model_on_gpu_matches_ort_cpu(tmp_path, recording, model, style) -> None:  # noqa: ANN001
    qm = qdq_model(model(), tmp_path, style)
    ours, cpu = sessions(qm, {"migraphx_target": "gpu"})
    assert ours.get_providers()[0] == EP
    ops = compiled_ops(recording)
    assert "quant_dot" in ops and "dot" not in ops
    for x in inputs(3, seed=21):
        got, want = ours.run(None, {"x": x})[0], cpu.run(None, {"x": x})[0]
        # Requantised output: at most one quantisation step apart (ORT requantises in fixed point).
        levels = np.unique(want)
        step = float(np.min(np.diff(levels))) if levels.size > 1 else 1.0
        assert np.abs(got - want).max() <= step * 1.001


@pytest.mark.parametrize("mode", ["int8", "fp8"])
@pytest.mark.parametrize("model", [conv_mlp, matmul_only], ids=["conv_mlp", "matmul"])
def test_calibrated_quantisation_on_gpu_matches_ref(tmp_path, recording, cc, mode, model) -> None:  # noqa: ANN001
    if mode == "fp8" and cc < (8, 9):
        pytest.skip("fp8 needs compute capability 8.9+")
    m = model()
    table = write_table(m, tmp_path / "calibration.json")
    opts = {f"migraphx_{mode}_enable": "1", "migraphx_int8_calibration_table_name": str(table)}
    gpu_opts = {**opts, "migraphx_target": "gpu"}
    ours = ort.InferenceSession(m.SerializeToString(), providers=[(EP, gpu_opts), "CPUExecutionProvider"])
    ops = compiled_ops(recording)
    assert "quant_dot" in ops and "dot" not in ops and "convolution" not in ops
    ref_opts = {**opts, "migraphx_target": "ref"}
    ref = ort.InferenceSession(m.SerializeToString(), providers=[(EP, ref_opts), "CPUExecutionProvider"])
    for x in inputs(3, seed=31):
        got, want = ours.run(None, {"x": x})[0], ref.run(None, {"x": x})[0]
        if mode == "int8":  # int32 sums, then the same float ops
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6 * float(np.abs(want).max()))
        else:  # fp8: the tensor cores' accumulation (FP8_SUM_TOL)
            np.testing.assert_allclose(got, want, rtol=0, atol=FP8_SUM_TOL * float(np.abs(want).max()))


def test_fp8_option_on_a_gpu_without_fp8_is_an_error(cc, tmp_path) -> None:  # noqa: ANN001
    if cc >= (8, 9):
        pytest.skip("this GPU has fp8 (the error is for compute capability < 8.9)")
    table = write_table(matmul_only(), tmp_path / "calibration.json")
    opts = {
        "migraphx_fp8_enable": "1",
        "migraphx_int8_calibration_table_name": str(table),
        "migraphx_target": "gpu",
    }
    with pytest.raises(Exception, match="migraphx_fp8_enable=1 needs a GPU with fp8"):
        ort.InferenceSession(
            matmul_only().SerializeToString(), providers=[(EP, opts), "CPUExecutionProvider"]
        )


# -- cuBLASLt plans alone --------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.int8, FP8], ids=["int8", "fp8"])
@pytest.mark.parametrize("batch,m,n,k", [(1, 64, 32, 48), (3, 5, 16, 32), (1, 1, 16, 16)])
def test_cublaslt_tn_plan(cc, rng, dtype, batch, m, n, k) -> None:  # noqa: ANN001
    """A row-major, B column-major (both K-contiguous), D row-major int32 / float: the TN form."""
    from migraphx_ep.ir.dtypes import DType
    from migraphx_ep.targets.gpu import blas, cuda, gemm_search, libs

    if dtype == FP8 and cc < (8, 9):
        pytest.skip("fp8 needs compute capability 8.9+")
    try:
        libs.cublaslt()
    except libs.LibraryUnavailable as e:
        pytest.skip(str(e))
    t = DType.int8_type if dtype == np.int8 else DType.fp8e4m3fn_type
    la, lb, lc = blas.MatLayout(k, 1, m * k), blas.MatLayout(1, k, n * k), blas.MatLayout(n, 1, m * n)
    plan = gemm_search.plan_gemm(t, batch, m, n, k, la, lb, lc, allow_tf32=False, tune=True)
    a, bt = quantised(rng, (batch, m, k), dtype), quantised(rng, (batch, n, k), dtype)
    out_t = np.int32 if dtype == np.int8 else np.float32
    stream, keep = cuda.Stream(), []

    def put(arr: np.ndarray) -> int:
        keep.append(cuda.alloc(max(arr.nbytes, 1)))
        cuda.memcpy_htod(keep[-1].ptr, np.ascontiguousarray(arr), stream)
        return keep[-1].ptr

    d = np.zeros((batch, m, n), out_t)
    d_ptr, ws = put(d), put(np.zeros(max(plan.workspace_size, 1), np.uint8))
    plan.run(stream.handle, put(a), put(bt), d_ptr, d_ptr, 0, ws)
    cuda.memcpy_dtoh(d, d_ptr, stream)
    stream.sync()
    want = np.matmul(a.astype(out_t), np.swapaxes(bt, -1, -2).astype(out_t))
    assert_quant_close(d, want)

"""quant_dot / quant_convolution / quantizelinear-to-fp8 on the gpu target, checked without a GPU.

The lowering's layouts (TN operands, padded K and N, compile-time transposed weights, im2col, strided
results) run in the numpy step simulator against the ops' own ``compute``: int8 exactly, fp8 up to float
summation order. Every new kernel variant compiles with NVRTC; the ones whose threads never talk to each
other (im2col, fp8 quantize, the fp8 device header) also run on the host, exhaustively where they can.
The cuBLASLt conditions and the fp8 device/option refusals are checked without the library.
"""

from __future__ import annotations

import collections
import ctypes
import shutil
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from migraphx_ep.ir.dtypes import DType
from migraphx_ep.ir.module import Module
from migraphx_ep.ir.operation import make_op
from migraphx_ep.ir.shape import Shape
from migraphx_ep.ops.quant import Im2col
from migraphx_ep.targets.gpu import blas, gemm_search, nvrtc
from migraphx_ep.targets.gpu import kernels as K
from migraphx_ep.targets.gpu.kernels.prelude import PRELUDE
from migraphx_ep.targets.gpu.kernels.quant import FP8_HEADER, im2col_kernel, quantize_fp8_kernel
from migraphx_ep.targets.gpu.lowering import lower
from migraphx_ep.targets.gpu.simulate import run_steps
from migraphx_ep.targets.gpu.steps import GemmStep
from migraphx_ep.targets.gpu.support import instruction_supported

from . import hostcc
from .test_kernel_host import SHIM

I8, I32, F32, E4, E4U = (
    DType.int8_type,
    DType.int32_type,
    DType.float_type,
    DType.fp8e4m3fn_type,
    DType.fp8e4m3fnuz_type,
)
FP8 = np.dtype(ml_dtypes.float8_e4m3fn)
needs_nvrtc = pytest.mark.skipif(nvrtc.nvrtc_available() is not None, reason=str(nvrtc.nvrtc_available()))
needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="no g++ to build kernels for the host")


def quantised(rng: np.random.Generator, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    if np.dtype(dtype) == np.int8:
        return rng.integers(-128, 128, shape).astype(np.int8)  # -128 too: the full range
    return (rng.standard_normal(shape) * 4).astype(dtype)


def module(op: str, a: np.ndarray, b: np.ndarray, const_b: bool, **attrs) -> Module:  # noqa: ANN003
    m = Module("main")
    pa = m.add_parameter("a", Shape.of(a))
    pb = m.add_literal(b) if const_b else m.add_parameter("b", Shape.of(b))
    m.add_return([m.add_instruction(make_op(op, **attrs), [pa, pb])])
    return m


def simulate(m: Module, feeds: dict[str, np.ndarray], use_blas: bool = True) -> tuple[np.ndarray, list]:
    """The module's result as the lowered steps compute it, and those steps."""
    low = lower(m, use_blas=use_blas, use_dnn=True)
    return run_steps(low, feeds)[0], low.steps


def reference(m: Module, feeds: dict[str, np.ndarray]) -> np.ndarray:
    from migraphx_ep.ir.evaluate import run_module

    return run_module(m, feeds)[0]


def assert_quant_equal(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    if want.dtype == np.int32:
        np.testing.assert_array_equal(got, want)
    else:  # fp8 products are exact in float; only the order of the float sums may differ
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6 * max(1.0, float(np.abs(want).max())))


# -- quant_dot -------------------------------------------------------------------------------------------
DOT_CASES = {  # name: (A lens, B lens, B transposed in memory): K, N odd and even, batched, broadcast
    "fits": ((8, 32), (32, 16), False),
    "odd-k-n": ((5, 7), (7, 5), False),
    "row-vector": ((1, 48), (48, 20), False),
    "batched": ((3, 4, 20), (3, 20, 12), False),
    "b-k-major": ((6, 32), (32, 16), True),  # B = transpose of a [N, K] tensor: used as it is
    "b-k-major-odd": ((2, 3, 10), (2, 10, 6), True),
}


@pytest.mark.parametrize("dtype", [np.int8, FP8], ids=["int8", "fp8"])
@pytest.mark.parametrize("const_b", [False, True], ids=["b-input", "b-weight"])
@pytest.mark.parametrize("case", list(DOT_CASES))
def test_quant_dot_lowered_layouts_match_ref(rng, dtype, const_b, case) -> None:  # noqa: ANN001
    la, lb, k_major = DOT_CASES[case]
    a = quantised(rng, la, dtype)
    b = quantised(rng, lb, dtype)
    m = Module("main")
    pa = m.add_parameter("a", Shape.of(a))
    if k_major:  # B's memory is [.., N, K]; the dot reads its transpose
        bt = np.ascontiguousarray(np.swapaxes(b, -1, -2))
        src = m.add_literal(bt) if const_b else m.add_parameter("b", Shape.of(bt))
        perm = [*range(b.ndim - 2), b.ndim - 1, b.ndim - 2]
        pb = m.add_instruction(make_op("transpose", permutation=perm), [src])
        feeds = {"a": a} if const_b else {"a": a, "b": bt}
    else:
        pb = m.add_literal(b) if const_b else m.add_parameter("b", Shape.of(b))
        feeds = {"a": a} if const_b else {"a": a, "b": b}
    m.add_return([m.add_instruction(make_op("quant_dot"), [pa, pb])])
    got, steps = simulate(m, feeds)
    assert_quant_equal(got, reference(m, feeds))
    gemms = [s for s in steps if isinstance(s, GemmStep)]
    kq = 4 if dtype == np.int8 else 16
    assert len(gemms) == 1 and gemms[0].dtype == (I8 if kq == 4 else E4)
    assert gemms[0].k % kq == 0 and gemms[0].n % kq == 0  # what cuBLASLt's TN kernels take
    copies = [s.label for s in steps if s.label.startswith("pad")]
    if const_b:  # weights are laid out at compile time, never by a kernel
        assert not any("B^T" in c for c in copies)
    if case == "fits" and dtype == np.int8:
        assert copies == ([] if const_b else ["pad (quant_dot B^T)"])
    if k_major and la[-1] % kq == 0 and lb[-1] % kq == 0:
        assert not copies  # A and B already K-major and aligned: no copy at all


def test_shared_weight_folds_the_batch_into_one_gemm(rng) -> None:  # noqa: ANN001
    a, b = quantised(rng, (4, 5, 16), np.int8), quantised(rng, (16, 8), np.int8)
    m = Module("main")
    pa = m.add_parameter("a", Shape.of(a))
    pb = m.add_instruction(make_op("multibroadcast", out_lens=[4, 16, 8]), [m.add_literal(b)])
    m.add_return([m.add_instruction(make_op("quant_dot"), [pa, pb])])
    got, steps = simulate(m, {"a": a})
    assert_quant_equal(got, reference(m, {"a": a}))
    (gemm,) = [s for s in steps if isinstance(s, GemmStep)]
    assert (gemm.batch, gemm.m) == (1, 20) and [type(s) for s in steps] == [GemmStep]


@pytest.mark.parametrize("dtype", [np.int8, FP8, np.dtype(ml_dtypes.float8_e4m3fnuz)], ids=str)
def test_without_cublaslt_and_for_fnuz_a_generated_kernel_runs_it(rng, dtype) -> None:  # noqa: ANN001
    a, b = quantised(rng, (2, 5, 9), dtype), quantised(rng, (2, 9, 7), dtype)
    m = module("quant_dot", a, b, const_b=False)
    blas_ok = np.dtype(dtype) != np.dtype(ml_dtypes.float8_e4m3fnuz)
    for use_blas in (False, True):
        got, steps = simulate(m, {"a": a, "b": b}, use_blas)
        assert_quant_equal(got, reference(m, {"a": a, "b": b}))
        if not use_blas or not blas_ok:
            assert [s.label for s in steps] == ["quant_dot (generated)"]


# -- quant_convolution -----------------------------------------------------------------------------------
CONV_CASES = {  # name: (x lens, w lens, padding, stride, dilation, group)
    "3x3": ((2, 5, 7, 6), (6, 5, 3, 3), (1, 1, 1, 1), (1, 1), (1, 1), 1),
    "strided-dilated-asym": ((1, 4, 9, 8), (5, 4, 3, 2), (2, 0, 1, 1), (2, 1), (2, 1), 1),
    "1x1": ((2, 8, 4, 4), (4, 8, 1, 1), (0, 0, 0, 0), (1, 1), (1, 1), 1),
    "1d": ((2, 3, 11), (4, 3, 5), (2, 2), (2,), (1,), 1),
    "3d": ((1, 2, 4, 5, 3), (3, 2, 2, 3, 2), (0, 1, 0, 1, 0, 1), (1, 1, 1), (1, 1, 1), 1),
    "grouped": ((2, 6, 5, 5), (9, 2, 3, 3), (1, 1, 1, 1), (1, 1), (1, 1), 3),
}


@pytest.mark.parametrize("dtype", [np.int8, FP8], ids=["int8", "fp8"])
@pytest.mark.parametrize("case", list(CONV_CASES))
def test_quant_convolution_lowered_matches_ref(rng, dtype, case) -> None:  # noqa: ANN001
    xl, wl, pad, stride, dil, group = CONV_CASES[case]
    x, w = quantised(rng, xl, dtype), quantised(rng, wl, dtype)
    attrs = dict(padding=list(pad), stride=list(stride), dilation=list(dil), group=group)
    m = module("quant_convolution", x, w, const_b=True, **attrs)
    got, steps = simulate(m, {"a": x})
    assert_quant_equal(got, reference(m, {"a": x}))
    kinds = [type(s).__name__ + ":" + s.label.split()[0] for s in steps]
    if group == 1:  # im2col + one GEMM; the result is read through a strided view (copied only as output)
        assert kinds[:2] == ["KernelStep:im2col", "GemmStep:quant"] and len(kinds) <= 3
    else:
        assert kinds == ["KernelStep:quant_convolution"]


def test_a_channels_last_1x1_quant_convolution_reads_its_input_as_the_gemm_rows(rng) -> None:  # noqa: ANN001
    # conv 3x3 -> int8 -> conv 1x1: the first result is a channels-last view, the int8 kernel between
    # keeps that layout (quant convolutions make the module channels-last), and the 1x1 convolution's
    # GEMM reads it as it is: one im2col (the 3x3's), not two.
    x = quantised(rng, (2, 5, 6, 6), np.int8)
    m = Module("main")
    pa = m.add_parameter("a", Shape.of(x))
    w1 = m.add_literal(quantised(rng, (16, 5, 3, 3), np.int8))
    w2 = m.add_literal(quantised(rng, (8, 16, 1, 1), np.int8))
    c1 = m.add_instruction(make_op("quant_convolution", padding=[1, 1, 1, 1]), [pa, w1])
    q = m.add_instruction(make_op("convert", target_type=I8), [c1])
    m.add_return([m.add_instruction(make_op("quant_convolution"), [q, w2])])
    got, steps = simulate(m, {"a": x})
    assert_quant_equal(got, reference(m, {"a": x}))
    labels = [s.label for s in steps]
    assert sum(label.startswith("im2col") for label in labels) == 1, labels
    assert sum(label.startswith("quant conv as gemm") for label in labels) == 2, labels


def test_an_fp8_quantise_keeps_channels_last_so_the_next_1x1_needs_no_im2col(rng) -> None:  # noqa: ANN001
    # fp8 quantising is a kernel of its own (no fp8 pointwise type): it writes the layout it reads.
    x = quantised(rng, (2, 5, 6, 6), FP8)
    m = Module("main")
    pa = m.add_parameter("a", Shape.of(x))
    w1 = m.add_literal(quantised(rng, (16, 5, 3, 3), FP8))
    w2 = m.add_literal(quantised(rng, (8, 16, 1, 1), FP8))
    c1 = m.add_instruction(make_op("quant_convolution", padding=[1, 1, 1, 1]), [pa, w1])
    lens = list(c1.shape.lens)
    s = m.add_instruction(make_op("multibroadcast", out_lens=lens), [m.add_literal(np.float32(8.0))])
    z = m.add_instruction(make_op("multibroadcast", out_lens=lens), [m.add_literal(np.zeros((), FP8))])
    q = m.add_instruction(make_op("quantizelinear"), [c1, s, z])
    m.add_return([m.add_instruction(make_op("quant_convolution"), [q, w2])])
    got, steps = simulate(m, {"a": x})
    assert_quant_equal(got, reference(m, {"a": x}))
    labels = [st.label for st in steps]
    assert sum(label.startswith("im2col") for label in labels) == 1, labels


def test_quant_convolution_with_computed_weights_runs_the_generated_kernel(rng) -> None:  # noqa: ANN001
    x, w = quantised(rng, (1, 3, 5, 5), np.int8), quantised(rng, (4, 3, 3, 3), np.int8)
    m = module("quant_convolution", x, w, const_b=False, padding=[1, 1, 1, 1])
    got, steps = simulate(m, {"a": x, "b": w})
    assert_quant_equal(got, reference(m, {"a": x, "b": w}))
    assert [s.label for s in steps] == ["quant_convolution (generated)"]


def test_im2col_op_matches_the_convolution_it_serves(rng) -> None:  # noqa: ANN001
    x, w = quantised(rng, (2, 3, 6, 5), np.int8), quantised(rng, (4, 3, 2, 3), np.int8)
    op = Im2col(kernel=(2, 3), padding=(1, 0, 0, 1), stride=(2, 1), dilation=(1, 2), columns=20)
    cols = op.compute(op.compute_shape([Shape.of(x)]), [x])
    assert cols.shape == (2 * 3 * 2, 20) and not cols[:, 18:].any()  # 3 x 2 windows per image
    krsc = np.moveaxis(w, 1, -1).reshape(4, -1).astype(np.int32)
    conv = make_op("quant_convolution", padding=[1, 0, 0, 1], stride=[2, 1], dilation=[1, 2])
    want = conv.compute(conv.compute_shape([Shape.of(x), Shape.of(w)]), [x, w])
    got = (cols[:, :18].astype(np.int32) @ krsc.T).reshape(2, 3, 2, 4).transpose(0, 3, 1, 2)
    np.testing.assert_array_equal(got, want)


# -- the whole int8 chain: QDQ -> quant_dot -> one dequantise kernel --------------------------------------
def test_dequantise_chain_after_the_gemm_is_one_kernel(rng) -> None:  # noqa: ANN001
    from migraphx_ep.passes import run_passes
    from migraphx_ep.targets.gpu.decompose import gpu_pipeline

    x = rng.standard_normal((6, 32)).astype(np.float32)
    w = (rng.integers(-127, 128, (32, 12))).astype(np.int8)
    m = Module("main")
    px = m.add_parameter("x", Shape.of(x))

    def lit(v, lens) -> object:  # noqa: ANN001
        return m.add_instruction(
            make_op("multibroadcast", out_lens=list(lens)), [m.add_literal(np.asarray(v))]
        )

    q = m.add_instruction(
        make_op("quantizelinear"), [px, lit(np.float32(0.05), x.shape), lit(np.int8(0), x.shape)]
    )
    dx = m.add_instruction(
        make_op("dequantizelinear"), [q, lit(np.float32(0.05), x.shape), lit(np.int8(0), x.shape)]
    )
    dw = m.add_instruction(make_op("dequantizelinear"), [m.add_literal(w), lit(np.float32(0.01), w.shape)])
    y = m.add_instruction(make_op("dot"), [dx, dw])
    y = m.add_instruction(make_op("add"), [y, lit(np.float32(0.5), y.shape.lens)])
    m.add_return([m.add_instruction(make_op("relu"), [y])])
    want = reference(m, {"x": x})
    run_passes(m, gpu_pipeline())
    assert collections.Counter(i.name for i in m.instructions)["quant_dot"] == 1
    got, steps = simulate(m, {"x": x})
    # quant_dot's int32 sum scaled once is closer than the ref's float sums of dequantised values
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    kinds = [type(s).__name__ for s in steps]
    assert kinds == ["KernelStep", "GemmStep", "KernelStep"]  # quantise x, GEMM, dequantise+add+relu


# -- cuBLASLt's conditions, the fp8 device and option checks ---------------------------------------------
def test_quant_layout_reason_takes_only_the_tn_form() -> None:
    def mapped(la, lb, k=32, n=16) -> tuple:  # noqa: ANN001
        lc = blas.MatLayout(n, 1, 0)
        _, p, q, d = blas.map_gemm(1, 8, n, k, blas.MatLayout(*la), blas.MatLayout(*lb), lc, False)
        return p, q, d

    tn = mapped((32, 1, 0), (1, 32, 0))  # A row-major, B column-major: both K-contiguous
    assert blas.quant_layout_reason(I8, 1, *tn) is None and blas.quant_layout_reason(E4, 1, *tn) is None
    assert "TN form" in blas.quant_layout_reason(I8, 1, *mapped((32, 1, 0), (16, 1, 0)))
    assert "multiples of 16" in blas.quant_layout_reason(E4, 1, *mapped((36, 1, 0), (1, 36, 0), k=36))
    assert blas.quant_layout_reason(I8, 1, *mapped((36, 1, 0), (1, 36, 0), k=36)) is None
    assert "m=6" in blas.quant_layout_reason(I8, 1, *mapped((32, 1, 0), (1, 32, 0), n=6))


def test_plan_gemm_refuses_other_forms_before_touching_the_library() -> None:
    from migraphx_ep.targets.gpu.kernels.spec import Unsupported

    rm = [blas.MatLayout(32, 1), blas.MatLayout(16, 1), blas.MatLayout(16, 1)]  # B row-major: "NN"
    with pytest.raises(Unsupported, match="TN form"):
        gemm_search.plan_gemm(I8, 1, 8, 16, 32, *rm, allow_tf32=False)
    tn = [blas.MatLayout(32, 1), blas.MatLayout(1, 32), blas.MatLayout(16, 1)]
    with pytest.raises(Unsupported, match="no bias/relu epilogue"):
        gemm_search.plan_gemm(I8, 1, 8, 16, 32, *tn, bias=True, allow_tf32=False)


def test_fp8_needs_compute_capability_8_9() -> None:
    m = Module("main")
    a = m.add_parameter("a", Shape(E4, (4, 16)))
    ins = m.add_instruction(make_op("quant_dot"), [a, m.add_parameter("b", Shape(E4, (16, 8)))])
    assert instruction_supported(ins) is None and instruction_supported(ins, (9, 0)) is None
    why = instruction_supported(ins, (8, 0))
    assert "fp8" in why and "8.9 or newer" in why and "this one is 8.0" in why
    c, d = m.add_parameter("c", Shape(I8, (4, 16))), m.add_parameter("d", Shape(I8, (16, 8)))
    assert instruction_supported(m.add_instruction(make_op("quant_dot"), [c, d]), (7, 5)) is None


def test_fp8_option_on_an_older_gpu_is_an_error_naming_option_and_gpu(monkeypatch, tmp_path) -> None:  # noqa: ANN001
    from migraphx_ep.ep import provider
    from migraphx_ep.ep.options import OptionError
    from migraphx_ep.targets.gpu import cuda

    class A100:
        cc, name = (8, 0), "NVIDIA A100-SXM4-80GB"

    monkeypatch.setattr(provider, "resolve_target", lambda options: "gpu")
    monkeypatch.setattr(cuda.Device, "get", classmethod(lambda cls, i=0: A100()))
    monkeypatch.setattr(cuda, "compute_capability", lambda i=0: A100.cc)
    monkeypatch.setenv("MIGRAPHX_EP_PREWARM", "0")  # no thread readying the pretend device
    table = tmp_path / "cal.json"
    table.write_text('{"x": [0, 1]}')
    opts = {"migraphx_fp8_enable": "1", "migraphx_int8_calibration_table_name": str(table)}
    with pytest.raises(
        OptionError,
        match=r"migraphx_fp8_enable=1 .*device 0 \(NVIDIA A100-SXM4-80GB\) is compute capability 8\.0",
    ):
        provider.MIGraphXEp(opts)
    ep = provider.MIGraphXEp({**opts, "migraphx_fp8_enable": "0", "migraphx_int8_enable": "1"})
    assert ep.gpu_cc == (8, 0)  # int8 is fine there, and the partitioner learns the GPU's capability


# -- kernels: NVRTC, and on the host --------------------------------------------------------------------
def kernel_specs() -> dict[str, K.KernelSpec]:
    conv = make_op("quant_convolution", padding=[1, 1, 1, 1], stride=[1, 2], dilation=[1, 1], group=2)
    x, w = (2, 4, 7, 9), (6, 2, 3, 3)
    im = Im2col(kernel=(3, 3), padding=(1, 1, 1, 1), stride=(1, 2), dilation=(1, 1), columns=40)
    specs = {}
    for t, out in ((I8, I32), (E4, F32), (E4U, F32)):
        a, b = Shape(t, (2, 33, 20)), Shape(t, (2, 20, 17), (340, 1, 20))
        specs[f"gemm-{t.name}"] = K.gemm_kernel("k", a, b, Shape(out, (2, 33, 17)))
        cx, cw = Shape(t, x), Shape(t, w)
        specs[f"conv-{t.name}"] = K.conv_kernel("k", conv, cx, cw, conv.compute_shape([cx, cw]))
        specs[f"im2col-{t.name}"] = im2col_kernel("k", im, Shape(t, x), im.compute_shape([Shape(t, x)]))
    q = make_op("quantizelinear", out_type=E4)
    for xt, zp in ((F32, True), (DType.half_type, False)):
        ins = [Shape(xt, (3, 50)), Shape(F32, (3, 50), (0, 0))] + ([Shape(E4, (3, 50), (1, 0))] if zp else [])
        specs[f"quantize-{xt.name}-{zp}"] = quantize_fp8_kernel("k", q, ins, Shape(E4, (3, 50)))
    return specs


@needs_nvrtc
def test_new_kernel_variants_compile() -> None:
    for what, spec in kernel_specs().items():
        assert nvrtc.compile_source(spec.source, "sm_90", spec.name), what
    assert "(i32)acc" in kernel_specs()["gemm-int8_type"].source  # the whole int32 sum, not its low byte


HOST_SHIM = (
    SHIM
    + r"""
static inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
static inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
"""
)


def host_library(source: str, tmp: Path) -> ctypes.CDLL:
    return hostcc.host_library(HOST_SHIM + source, tmp)


def run_host(spec: K.KernelSpec, tmp: Path, ins: list[np.ndarray], out: np.ndarray) -> None:
    """One block's threads in turn (grid-stride loops cover every element); ``out`` is written."""
    lib = host_library(spec.source, tmp)
    fn = lib[spec.name]
    ptrs = [a.ctypes.data for a in (*ins, out)]
    fn.argtypes = [ctypes.c_void_p] * len(ptrs) + [ctypes.c_uint32] * len(spec.args)
    for t in range(spec.block[0]):
        lib.mx_set_thread(t)
        fn(*ptrs, *spec.args)


@needs_gxx
def test_fp8_device_header_matches_ml_dtypes_exhaustively(tmp_path) -> None:  # noqa: ANN001
    src = (
        PRELUDE
        + FP8_HEADER
        + r"""
extern "C" void dec(const u8* in, float* a, float* b) {
  for (int i = 0; i < 256; ++i) { a[i] = mx_e4m3fn(in[i]); b[i] = mx_e4m3fnuz(in[i]); }
}
extern "C" void enc(const float* in, u8* o, u8* sat, int n) {
  for (int i = 0; i < n; ++i) { o[i] = mx_to_e4m3fn(in[i], false); sat[i] = mx_to_e4m3fn(in[i], true); }
}
"""
    )
    lib = host_library(src, tmp_path)
    codes = np.arange(256, dtype=np.uint8)
    got = [np.zeros(256, np.float32), np.zeros(256, np.float32)]
    lib.dec(*(ctypes.c_void_p(a.ctypes.data) for a in (codes, *got)))
    for g, t in zip(got, (ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e4m3fnuz), strict=True):
        want = codes.view(t).astype(np.float32)
        np.testing.assert_array_equal(
            g.view(np.uint32)[~np.isnan(want)], want.view(np.uint32)[~np.isnan(want)]
        )
        np.testing.assert_array_equal(np.isnan(g), np.isnan(want))
    # every fp8 value, the midpoints between neighbours and their float32 neighbours, random floats
    vals = np.unique(codes.view(FP8).astype(np.float64))
    vals = vals[np.isfinite(vals)]
    mids = ((vals[1:] + vals[:-1]) / 2).astype(np.float32)
    rng = np.random.default_rng(0)
    x = np.concatenate([
        vals, mids, np.nextafter(mids, np.float32(np.inf)), np.nextafter(mids, np.float32(-np.inf)),
        rng.uniform(-600, 600, 50000), 2.0 ** rng.uniform(-22, 10, 50000) * rng.choice([-1, 1], 50000),
        [np.inf, -np.inf, np.nan, 448, 464, 464.00003, 480, 1e30, 2**-10, 3 * 2**-11, 1e-45, -0.0],
    ]).astype(np.float32)  # fmt: skip
    out, sat = np.zeros(x.size, np.uint8), np.zeros(x.size, np.uint8)
    lib.enc(*(ctypes.c_void_p(a.ctypes.data) for a in (x, out, sat)), x.size)
    for got8, saturate in ((out, False), (sat, True)):
        want = make_op("quantizelinear", out_type=E4, saturate=saturate)
        want = want.compute(Shape(E4, x.shape), [x, np.ones_like(x)]).view(np.uint8)
        nan = np.isnan(want.view(FP8).astype(np.float32))  # any NaN code will do
        assert np.all((got8 == want) | (nan & ((got8 & 0x7F) == 0x7F))), saturate


@needs_gxx
@pytest.mark.parametrize("dtype", [np.int8, FP8], ids=["int8", "fp8"])
def test_im2col_kernel_on_the_host(rng, tmp_path, dtype) -> None:  # noqa: ANN001
    x = quantised(rng, (2, 3, 5, 4), dtype)
    xs = np.transpose(x, (0, 2, 3, 1)).copy()  # NHWC memory, read as NCHW through strides
    shape = Shape(DType.int8_type if dtype == np.int8 else E4, x.shape, (60, 1, 12, 3))
    op = Im2col(kernel=(3, 2), padding=(1, 0, 1, 1), stride=(1, 2), dilation=(1, 1), columns=20)
    want = op.compute(op.compute_shape([Shape.of(x)]), [x])
    out = np.full(want.shape, 0x55, np.uint8)
    run_host(im2col_kernel("k_im2col", op, shape, Shape.of(want)), tmp_path, [xs.view(np.uint8)], out)
    np.testing.assert_array_equal(out, want.view(np.uint8))


@needs_gxx
def test_fp8_quantize_kernel_on_the_host(rng, tmp_path) -> None:  # noqa: ANN001
    x = np.concatenate([rng.standard_normal(300) * 100, [np.nan, np.inf, -np.inf, 1e6, -0.0, 0.3]]).astype(
        np.float32
    )
    x = x.reshape(6, 51)
    s = np.array([0.5, 2.0, 0.25, 1.0, 3.0, 0.125], np.float32)
    zp = np.zeros(6, FP8)
    for saturate in (True, False):
        op = make_op("quantizelinear", out_type=E4, saturate=saturate)
        ins = [Shape.of(x), Shape(F32, x.shape, (1, 0)), Shape(E4, x.shape, (1, 0))]
        bs, bz = np.broadcast_to(s[:, None], x.shape), np.broadcast_to(zp[:, None], x.shape)
        want = op.compute(Shape(E4, x.shape), [x, bs, bz]).view(np.uint8)
        out = np.zeros(x.shape, np.uint8)
        run_host(
            quantize_fp8_kernel("k_q", op, ins, Shape(E4, x.shape)), tmp_path, [x, s, zp.view(np.uint8)], out
        )
        nan = np.isnan(want.view(FP8).astype(np.float32))
        assert np.all((out == want) | (nan & ((out & 0x7F) == 0x7F))), saturate

"""Cast, CastLike, QuantizeLinear and DequantizeLinear with float8 types on the gpu target, without a GPU.

The partitioner claims every node; the lowered program runs with its generated kernels compiled for the
host (``test_lowering_host.host_kernels``: the real source and the prelude's codecs) and with the numpy
step simulator, and both match the ref byte for byte. The kernels compile with NVRTC, also for a GPU
without fp8 hardware (the conversions are software). Float8 arithmetic stays refused. ``gpu``-marked
tests run the same models on the device.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import helper

from migraphx_ep.frontend import model_to_dict, parse_graph
from migraphx_ep.ir.dtypes import DType, from_numpy
from migraphx_ep.ir.module import Module
from migraphx_ep.ir.operation import make_op
from migraphx_ep.ir.shape import Shape
from migraphx_ep.passes import run_passes
from migraphx_ep.targets.gpu import kernels as K
from migraphx_ep.targets.gpu import nvrtc
from migraphx_ep.targets.gpu.decompose import gpu_pipeline
from migraphx_ep.targets.gpu.kernels.spec import KernelSpec, canonical
from migraphx_ep.targets.gpu.lowering import lower
from migraphx_ep.targets.gpu.steps import KernelStep
from migraphx_ep.targets.gpu.support import instruction_supported

from .decomposecheck import check_decomposed
from .gpucheck import BF16, EXACT, F16, F32, F64, FP8_TYPES, check_model, make_model, node
from .test_lowering_host import host_kernels, kdir  # noqa: F401 - fixtures

FP8 = FP8_TYPES
E4, E4U, E5, E5U = FP8
CODES = np.arange(256, dtype=np.uint8)
needs_nvrtc = pytest.mark.skipif(nvrtc.nvrtc_available() is not None, reason=str(nvrtc.nvrtc_available()))


def onnx_type(dt: np.dtype) -> int:
    return helper.np_dtype_to_tensor_dtype(np.dtype(dt))


def values(src: np.dtype, dst: np.dtype) -> np.ndarray:
    """Inputs of ``src`` for a cast to the float8 ``dst``: every value of dst, the midpoints between
    neighbours and values just off them, past the largest finite value, tiny ones, infinities and NaN;
    an odd count, so vector loops leave a tail."""
    v = CODES.view(dst).astype(np.float64)
    v = np.unique(v[np.isfinite(v)])
    mids = (v[1:] + v[:-1]) / 2
    top = float(ml_dtypes.finfo(dst).max)
    x = np.concatenate([v, mids, mids * (1 + 2.0**-9), mids * (1 - 2.0**-9), [top * 1.0625, top * 1.07, 1e9]])
    x = np.concatenate([x, [np.inf, -np.inf, np.nan, 2.0**-30, -(2.0**-30), 0.0, -0.0]])
    with np.errstate(all="ignore"):
        return x.astype(src)


def cast_model(x: np.ndarray, to: np.dtype, saturate: int | None, like: bool = False) -> onnx.ModelProto:
    attrs = {} if saturate is None else {"saturate": saturate}
    if like:
        inits = {"t": np.zeros(1, to)}
        return make_model([node("CastLike", ["x", "t"], **attrs)], {"x": x}, inits=inits)
    return make_model([node("Cast", ["x"], to=onnx_type(to), **attrs)], {"x": x})


def kernel_specs(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[KernelSpec]:
    shapes = {k: Shape(from_numpy(v.dtype), v.shape) for k, v in feeds.items()}
    m = parse_graph(model_to_dict(model), shapes).program.get_main_module()
    run_passes(m, gpu_pipeline())
    return [s.spec for s in lower(m, use_blas=True, use_dnn=True).steps if isinstance(s, KernelStep)]


# -- what is claimed ---------------------------------------------------------------------------------------
def test_pointwise_kernels_only_convert_and_copy_float8() -> None:
    f8 = DType.fp8e5m2_type
    assert K.pointwise_supported(make_op("convert", target_type=f8), [DType.float_type]) is None
    assert K.pointwise_supported(make_op("convert", target_type=DType.int8_type), [f8]) is None
    assert K.pointwise_supported(make_op("identity"), [f8]) is None
    why = K.pointwise_supported(make_op("add"), [f8, f8])
    assert why == "add on fp8e5m2_type: the gpu kernels only convert and copy float8 values"
    # Generators that compute in the storage type keep refusing it.
    x = Shape(f8, (4, 6))
    assert K.supported(make_op("reduce_sum", axes=[1]), [x], Shape(f8, (4, 1))) is not None
    m = Module()
    p = m.add_parameter("x", x)
    assert instruction_supported(m.add_instruction(make_op("neg"), [p])) is not None


# -- generated kernels on the host, the simulator, vs the ref ----------------------------------------------
@pytest.mark.parametrize("saturate", [0, 1])
@pytest.mark.parametrize("dst", FP8, ids=str)
@pytest.mark.parametrize("src", [F32, F16, BF16, F64], ids=str)
def test_cast_to_float8(host_kernels, src, dst, saturate) -> None:  # noqa: ANN001, F811
    """saturate 1 is a clip to the finite range and the conversion: one fused kernel."""
    x = values(src, dst)
    low = check_decomposed(cast_model(x, dst, saturate), {"x": x}, [])
    assert sum(isinstance(s, KernelStep) for s in low.steps) == 1


def test_every_half_value_to_float8(host_kernels) -> None:  # noqa: ANN001, F811
    x = np.arange(1 << 16, dtype=np.uint16).view(F16).reshape(256, 256)
    for dst in (E4, E5U):
        check_decomposed(cast_model(x, dst, 0), {"x": x}, [])


WIDER = [F32, F16, BF16, F64, np.int8, np.uint8, np.int32, np.int64, np.bool_]


@pytest.mark.parametrize("dst", WIDER, ids=str)
@pytest.mark.parametrize("src", FP8, ids=str)
def test_cast_every_float8_code(host_kernels, src, dst) -> None:  # noqa: ANN001, F811
    """Every code of ``src``: NaN to an integer is 0 and an infinity the type's limit (ml_dtypes)."""
    x = CODES.view(src).reshape(16, 16)
    check_decomposed(cast_model(x, np.dtype(dst), None), {"x": x}, [])


@pytest.mark.parametrize("saturate", [0, 1])
@pytest.mark.parametrize("src,dst", [(E5, E4), (E4, E5U), (E5U, E4U), (E4U, E5)], ids=str)
def test_castlike_float8_to_float8(host_kernels, src, dst, saturate) -> None:  # noqa: ANN001, F811
    x = CODES.view(src).reshape(16, 16)
    check_decomposed(cast_model(x, dst, saturate, like=True), {"x": x}, [])


@pytest.mark.parametrize("zero_point", [False, True])
@pytest.mark.parametrize("scale", [F32, F16], ids=str)
@pytest.mark.parametrize("src", FP8, ids=str)
def test_dequantizelinear_float8(host_kernels, src, scale, zero_point) -> None:  # noqa: ANN001, F811
    x = CODES.view(src).reshape(16, 16)
    inits = {"s": np.array([0.5, 3.0, -0.25, 1e-3] * 4, scale)}
    if zero_point:
        inits["z"] = np.zeros(16, src)  # ONNX: a float8 zero point is 0
    ins = ["x", "s", "z"] if zero_point else ["x", "s"]
    model = make_model([node("DequantizeLinear", ins, axis=1)], {"x": x}, inits=inits)
    check_decomposed(model, {"x": x}, ["dequantizelinear"])


@pytest.mark.parametrize("saturate", [0, 1])
@pytest.mark.parametrize("dst,xt", [(E5, F32), (E4U, F16), (E5U, F32), (E4, F64)], ids=str)
def test_quantizelinear_to_float8_decomposed(host_kernels, dst, xt, saturate) -> None:  # noqa: ANN001, F811
    """Formats without a quantize kernel, and E4M3FN from double (the kernel computes in float32)."""
    x = values(xt, dst).reshape(-1)[: 7 * 11].reshape(7, 11)
    inits = {"s": np.array(0.75, xt), "z": np.zeros((), dst)}
    model = make_model([node("QuantizeLinear", ["x", "s", "z"], saturate=saturate)], {"x": x}, inits=inits)
    check_decomposed(model, {"x": x}, ["quantizelinear"])


# -- NVRTC -------------------------------------------------------------------------------------------------
@needs_nvrtc
@pytest.mark.parametrize("arch", ["sm_90", "sm_80"])
def test_float8_kernels_compile_without_fp8_hardware(arch) -> None:  # noqa: ANN001
    """The codecs are integer and float arithmetic: Ampere (fp8 instructions came with 8.9) compiles them
    too."""
    x = values(F32, E4).reshape(-1)[:64].reshape(8, 8)
    specs = kernel_specs(cast_model(x, E4, 1), {"x": x})
    codes = CODES.view(E5U).reshape(16, 16)
    specs += kernel_specs(cast_model(codes, np.dtype(np.int32), None), {"x": codes})
    specs += kernel_specs(cast_model(codes.T, BF16, None), {"x": codes.T})  # a strided view
    assert "mx_vec<mx_fp8e4m3fn, 4>" in specs[0].source  # float in, float8 out: 16-byte input vectors
    assert "mx_f8_to_int<i32>" in specs[1].source
    for spec in specs:
        spec = canonical(spec)
        assert nvrtc.compile_source(spec.source, arch, spec.name)


# -- on the device -----------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("saturate", [0, 1])
@pytest.mark.parametrize("dst", FP8, ids=str)
@pytest.mark.parametrize("src", [F32, F16, BF16, F64], ids=str)
def test_gpu_cast_to_float8(gpu, src, dst, saturate) -> None:  # noqa: ANN001
    x = values(src, dst)
    check_model(cast_model(x, dst, saturate), {"x": x}, gpu, EXACT)


@pytest.mark.gpu
@pytest.mark.parametrize("dst", [F32, F16, BF16, F64, np.int8, np.int64, np.bool_, E4, E5U], ids=str)
@pytest.mark.parametrize("src", FP8, ids=str)
def test_gpu_cast_every_float8_code(gpu, src, dst) -> None:  # noqa: ANN001
    x = CODES.view(src).reshape(16, 16)
    if np.dtype(dst) == src:
        pytest.skip("a copy")
    check_model(cast_model(x, np.dtype(dst), None), {"x": x}, gpu, EXACT)


@pytest.mark.gpu
@pytest.mark.parametrize("src", FP8, ids=str)
def test_gpu_dequantizelinear_float8(gpu, src) -> None:  # noqa: ANN001
    x = CODES.view(src).reshape(16, 16)
    inits = {"s": np.array([0.5, 3.0, -0.25, 1e-3] * 4, F32), "z": np.zeros(16, src)}
    model = make_model([node("DequantizeLinear", ["x", "s", "z"], axis=1)], {"x": x}, inits=inits)
    check_model(model, {"x": x}, gpu, EXACT)


@pytest.mark.gpu
@pytest.mark.parametrize("saturate", [0, 1])
@pytest.mark.parametrize("dst", [E5, E4U, E5U], ids=str)
def test_gpu_quantizelinear_to_float8(gpu, dst, saturate) -> None:  # noqa: ANN001
    x = values(F32, dst)
    inits = {"s": np.array(0.75, F32), "z": np.zeros((), dst)}
    model = make_model([node("QuantizeLinear", ["x", "s", "z"], saturate=saturate)], {"x": x}, inits=inits)
    check_model(model, {"x": x}, gpu, EXACT)

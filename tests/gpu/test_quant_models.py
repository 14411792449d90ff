"""Quantised models on the gpu target's lowering, without a GPU: QDQ models (``quantize_static``) and
the EP's int8/fp8 calibration-table quantisation go through the gpu pipeline (simplify_qdq into
quant_dot / quant_convolution, decompositions), are lowered, and their steps run in the numpy simulator
against the ref target and ORT's CPU EP."""

from __future__ import annotations

import collections

import numpy as np
import onnxruntime as ort
import pytest

from migraphx_ep.frontend import model_to_dict, parse_graph
from migraphx_ep.ir.dtypes import DType, from_numpy
from migraphx_ep.ir.shape import Shape
from migraphx_ep.passes import run_passes
from migraphx_ep.targets import get_target
from migraphx_ep.targets.gpu.decompose import gpu_pipeline
from migraphx_ep.targets.gpu.lowering import lower
from migraphx_ep.targets.gpu.simulate import run_steps
from migraphx_ep.targets.gpu.steps import GemmStep, KernelStep
from migraphx_ep.targets.gpu.support import unsupported

from .quantcheck import QDQ_STYLES, conv_mlp, ep_quantised, inputs, matmul_only, qdq_model, write_table

MODELS = {"conv_mlp": conv_mlp, "matmul": matmul_only}


def lowered(prog):  # noqa: ANN001, ANN201
    main = prog.get_main_module()
    run_passes(main, gpu_pipeline())
    assert unsupported(main) is None
    return main, lower(main, use_blas=True, use_dnn=True)


def ref_and_lowered(model):  # noqa: ANN001, ANN201
    """(x, the ref program, the gpu pipeline's main module, its lowering) of ``model`` for one input."""
    graph = model_to_dict(model)
    x = inputs(1, seed=9)[0]
    shapes = {"x": Shape(from_numpy(x.dtype), x.shape)}
    ref = parse_graph(graph, shapes).program
    ref.compile(get_target("ref"))
    return (x, ref, *lowered(parse_graph(graph, shapes).program))


def kinds(low) -> list[str]:  # noqa: ANN001
    return [("gemm" if isinstance(s, GemmStep) else s.label.split()[0]) for s in low.steps]


@pytest.mark.parametrize("style", QDQ_STYLES)
@pytest.mark.parametrize("name", list(MODELS))
def test_qdq_model_runs_quant_gemms_and_matches(tmp_path, name, style) -> None:  # noqa: ANN001
    model = qdq_model(MODELS[name](), tmp_path, style)
    x, ref, main, low = ref_and_lowered(model)
    ops = collections.Counter(i.name for i in main.instructions)
    assert ops["quant_dot"] == 1 and ops["quant_convolution"] == (name == "conv_mlp")
    assert ops["dot"] == ops["convolution"] == 0
    got = run_steps(low, {"x": x})[0]
    want = ref.run_numpy({"x": x})[0]
    cpu = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )[0]
    # The output is requantised (Q -> DQ): an int32 sum scaled once may land one step from the float sum.
    step = float(np.min(np.diff(np.unique(want)))) if np.unique(want).size > 1 else 1.0
    for other in (want, cpu):
        assert np.abs(got - other).max() <= step * 1.001
    # Each GEMM is followed by one kernel: dequantise, bias, relu, requantise and dequantise fused (the
    # next layer's quantise kernel is its own: a flatten view stands between the two chains). Quant
    # convolutions make activations channels-last, so flattening the convolution's result copies it
    # into NCHW order first, as for float convolutions in NHWC.
    assert (
        kinds(low)
        == {
            "conv_mlp": [
                "pointwise",
                "im2col",
                "gemm",
                "pointwise",
                "copy",
                "pointwise",
                "gemm",
                "pointwise",
            ],
            "matmul": ["pointwise", "pad", "gemm", "pointwise"],  # K = 6: A padded to 8 for cuBLASLt
        }[name]
    )


@pytest.mark.parametrize("style", ["symmetric", "default"])
def test_qdq_zero_points_stay_broadcast_constants(tmp_path, style) -> None:  # noqa: ANN001
    # A zero point is one number broadcast over the tensor: converting it to the kernels' compute type
    # must not fold into a full tensor that every quantise kernel then reads (ResNet-50 int8 bs8: a
    # 25 MB float and a 51 MB int64 tensor per layer).
    _, _, main, _ = ref_and_lowered(qdq_model(conv_mlp(), tmp_path, style))
    for ins in main.instructions:
        if ins.is_literal() and ins.shape.elements() > 1:
            v = np.asarray(ins.eval())
            assert not (v == v.flat[0]).all(), f"a uniform {ins.shape} literal: a folded broadcast"


@pytest.mark.parametrize("qtype", [DType.int8_type, DType.fp8e4m3fn_type], ids=["int8", "fp8"])
@pytest.mark.parametrize("name", list(MODELS))
def test_calibration_table_quantisation_lowers_whole_and_matches_ref(tmp_path, qtype, name) -> None:  # noqa: ANN001
    model = MODELS[name]()
    table = write_table(model, tmp_path / "calibration.json")
    ref = ep_quantised(model, table, qtype)
    ref.compile(get_target("ref"))
    main, low = lowered(ep_quantised(model, table, qtype))
    names = collections.Counter(i.name for i in main.instructions)
    assert names["quant_dot"] == 1 and "dot" not in names and "convolution" not in names
    if qtype == DType.fp8e4m3fn_type:  # activations quantised by the fp8 kernel, not decomposed
        assert any(s.label == "quantizelinear (fp8)" for s in low.steps if isinstance(s, KernelStep))
    for x in inputs(2, seed=11):
        got, want = run_steps(low, {"x": x})[0], ref.run_numpy({"x": x})[0]
        if qtype == DType.int8_type:  # int32 sums and the same pointwise ops: bit for bit
            np.testing.assert_array_equal(got, want)
        else:  # fp8 products are exact; float sums in another order
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))

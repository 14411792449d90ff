"""GridSample and RoiAlign on the gpu target without a GPU: ONNX's node cases (the ones
tools/gpu_refusals.py counted) are claimed by the partitioner, lowered and simulated against the ref;
each case's generated kernel runs on the host against ONNX's expected outputs and the ref's bits; the
lowered kernels compile with NVRTC where it is importable; a bad batch index or roi fails alike on the
ref, the decomposed module and the simulated lowering."""

from __future__ import annotations

import functools
import shutil

import numpy as np
import pytest
from onnx.backend.test.case.node import TestCase

from migraphx_ep.frontend import model_to_dict, parse_graph
from migraphx_ep.ir.dtypes import DType, from_numpy
from migraphx_ep.ir.operation import make_op
from migraphx_ep.ir.shape import Shape
from migraphx_ep.targets.gpu import kernels as K
from migraphx_ep.targets.gpu import nvrtc

from .decomposecheck import check_decomposed, compile_kernels, errors_alike, make_model, node
from .test_sampling_host import assert_same_bits, launch, ref

GRID_CASES = [
    "test_gridsample", "test_gridsample_zeros_padding", "test_gridsample_border_padding",
    "test_gridsample_reflection_padding", "test_gridsample_bilinear", "test_gridsample_aligncorners_true",
    "test_gridsample_nearest", "test_gridsample_bicubic",
    *[f"test_gridsample_{m}_align_corners_{a}_additional_1" for m in ("nearest", "bilinear", "bicubic")
      for a in (0, 1)],
    *[f"test_gridsample_volumetric_{m}_align_corners_{a}" for m in ("nearest", "bilinear") for a in (0, 1)],
]  # fmt: skip
ROI_CASES = ["test_roialign_aligned_false", "test_roialign_aligned_true", "test_roialign_mode_max"]


@functools.cache
def onnx_cases() -> dict[str, TestCase]:
    """ONNX's node cases by name (generating them all once costs ~9 s; one op type alone cannot be
    asked for twice: the generator's modules are imported only once)."""
    from onnx.backend.test.case.node import collect_testcases

    with np.errstate(all="ignore"):
        return {c.name: c for c in collect_testcases(None) if c.name in {*GRID_CASES, *ROI_CASES}}


def case_feeds(name: str) -> tuple[TestCase, dict[str, np.ndarray], list[np.ndarray]]:
    case = onnx_cases()[name]
    inputs, outputs = case.data_sets[0]
    names = [i.name for i in case.model.graph.input]
    feeds = {k: np.asarray(v) for k, v in zip(names, inputs, strict=True)}
    return case, feeds, [np.asarray(o) for o in outputs]


@pytest.mark.parametrize("name", GRID_CASES + ROI_CASES)
def test_onnx_case_claimed_lowered_and_simulated(name: str) -> None:
    case, feeds, outputs = case_feeds(name)
    low = check_decomposed(case.model, feeds, gone=())  # claimed whole; simulated steps match the ref
    assert [s.label for s in low.steps] == ["grid_sample" if "grid" in name else "roi_align"]
    if nvrtc.nvrtc_available() is None:
        assert compile_kernels(low) == 1


@pytest.mark.skipif(shutil.which("g++") is None, reason="no g++ to build kernels for the host")
@pytest.mark.parametrize("name", GRID_CASES + ROI_CASES)
def test_onnx_case_kernel_on_the_host(tmp_path, name: str) -> None:
    """The case's own kernel (the op as parsed) meets ONNX's expected output at the case's tolerance,
    and the ref's result bit for bit."""
    case, feeds, outputs = case_feeds(name)
    shapes = {k: Shape(from_numpy(v.dtype), v.shape) for k, v in feeds.items()}
    main = parse_graph(model_to_dict(case.model), shapes).program.get_main_module()
    (ins,) = [i for i in main.instructions if i.name in ("grid_sample", "roi_align")]
    assert all(a.is_param() for a in ins.inputs)
    args = [feeds[a.op.parameter] for a in ins.inputs]  # type: ignore[attr-defined]
    spec = K.kernel_for("k_case", ins.op, [Shape.of(a) for a in args], ins.shape)
    out = np.zeros(ins.shape.lens, ins.shape.dtype)
    assert launch(spec, tmp_path, args, out) == 0
    np.testing.assert_allclose(out, outputs[0], rtol=case.rtol, atol=case.atol)
    assert_same_bits(out, ref(ins.op, args))


def roi_feeds(index: int, roi: list[float]) -> dict[str, np.ndarray]:
    x = np.arange(2 * 3 * 5 * 5, dtype=np.float32).reshape(2, 3, 5, 5)
    rois = np.array([[0.5, 0.5, 3.0, 4.0], roi], np.float32)
    return {"x": x, "rois": rois, "b": np.array([0, index], np.int64)}


@pytest.mark.parametrize(
    "index,roi,error",
    [(2, [0, 0, 3, 3], IndexError), (-1, [0, 0, 3, 3], IndexError), (1, [0, np.nan, 3, 3], ValueError)],
)
def test_roi_align_bad_inputs_fail_alike(index: int, roi: list[float], error: type[Exception]) -> None:
    feeds = roi_feeds(index, roi)
    model = make_model([node("RoiAlign", list(feeds), mode="max", output_height=2, output_width=2)], feeds)
    errors_alike(model, feeds, error)
    check_decomposed(model, roi_feeds(1, [1.0, 0.5, 4.0, 4.5]), gone=())  # the same program, good data


@pytest.mark.parametrize("mode", ["linear", "nearest", "cubic"])
def test_grid_sample_graph_with_views(mode: str) -> None:
    """The grid comes through a transpose (a strided view the kernel reads in place) and the result
    feeds another op: the lowering's buffers and views around the kernel, simulated."""
    rng = np.random.default_rng(7)
    feeds = {
        "x": rng.standard_normal((2, 3, 5, 6)).astype(np.float32),
        "g": rng.uniform(-1.2, 1.2, (2, 2, 4, 3)).astype(np.float32),
    }
    nodes = [
        node("Transpose", ["g"], ["gt"], perm=[0, 2, 3, 1]),
        node("GridSample", ["x", "gt"], ["s"], mode=mode, padding_mode="reflection"),
        node("Relu", ["s"]),
    ]
    check_decomposed(make_model(nodes, feeds), feeds, gone=())


@pytest.mark.skipif(nvrtc.nvrtc_available() is not None, reason=str(nvrtc.nvrtc_available()))
@pytest.mark.parametrize("runtime", ["1", "0"], ids=["runtime_sizes", "baked_sizes"])
@pytest.mark.parametrize(
    "t", [DType.half_type, DType.bf16_type, DType.double_type], ids=["f16", "bf16", "f64"]
)
def test_kernels_of_every_type_compile(monkeypatch, t: DType, runtime: str) -> None:
    monkeypatch.setenv("MIGRAPHX_EP_RUNTIME_SIZES", runtime)
    i32, i64 = DType.int32_type, DType.int64_type
    nhwc = Shape(t, (2, 3, 5, 5), (75, 1, 15, 3))
    cases = [
        (make_op("grid_sample", mode="cubic", padding_mode="reflection"), [(1, 2, 5, 4), (1, 3, 3, 2)]),
        (make_op("grid_sample", mode="nearest", align_corners=True), [(1, 2, 3, 5, 4), (1, 2, 3, 3, 3)]),
        (make_op("roi_align", mode="max", sampling_ratio=2), [(2, 3, 5, 5), (4, 4), Shape(i32, (4,))]),
        (make_op("roi_align", half_pixel=False, spatial_scale=0.25), [nhwc, (4, 4), Shape(i64, (4,))]),
    ]
    for op, lens in cases:
        ins = [s if isinstance(s, Shape) else Shape(t, s) for s in lens]
        spec = K.kernel_for("k_sampling", op, ins, op.compute_shape([Shape(s.type, s.lens) for s in ins]))
        assert nvrtc.compile_source(spec.source, "sm_90", spec.name)

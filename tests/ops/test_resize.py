"""Resize/Upsample: against ORT's CPU EP, and every ONNX Resize node case with its scales/sizes made
constant (the cases feed them as graph inputs, which the frontend refuses)."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from migraphx_ep.frontend import ParseError, model_to_dict, parse_graph
from migraphx_ep.ir import Shape
from opcheck import assert_close, check_node, make_model, run_ours

RNG = np.random.default_rng(3)
X = RNG.standard_normal((1, 2, 4, 5)).astype(np.float32)
EMPTY = np.zeros(0, np.float32)


def resize(inputs: dict, inits: dict, rtol: float = 1e-5, atol: float = 1e-5, opset: int = 19, **attrs):
    names = ["x", "roi", "scales", "sizes"]
    node = helper.make_node("Resize", [n if n in inputs or n in inits else "" for n in names], ["y"], **attrs)
    return check_node(node, inputs, rtol=rtol, atol=atol, opset=opset, initializers=inits)


SCALES = {"roi": EMPTY, "scales": np.array([1, 1, 2.0, 1.5], np.float32)}
DOWN = {"roi": EMPTY, "scales": np.array([1, 1, 0.5, 0.6], np.float32)}
SIZES = {"roi": EMPTY, "sizes": np.array([1, 2, 3, 8], np.int64)}


@pytest.mark.parametrize(
    "coord", ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "half_pixel_symmetric"]
)
@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
def test_modes_vs_ort(mode, coord):
    for inits in (SCALES, DOWN, SIZES):
        if coord == "align_corners" and inits is not SIZES:
            continue  # 5 * 1.5 and 4 * 0.6 are not whole: refused (ORT and the reference disagree)
        resize({"x": X}, inits, mode=mode, coordinate_transformation_mode=coord)


@pytest.mark.parametrize("nearest_mode", ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"])
def test_nearest_modes_and_types(nearest_mode):
    for x in (
        X,
        RNG.integers(0, 255, X.shape).astype(np.uint8),
        RNG.integers(-99, 99, X.shape).astype(np.int32),
    ):
        resize({"x": x}, SIZES, mode="nearest", nearest_mode=nearest_mode)
    # ORT's CPU EP has no float16/int64 Resize: compare with ONNX's reference implementation instead.
    for x in (X.astype(np.float16), RNG.integers(-(2**40), 2**40, X.shape).astype(np.int64)):
        node = helper.make_node(
            "Resize", ["x", "", "", "sizes"], ["y"], mode="nearest", nearest_mode=nearest_mode
        )
        m = make_model(node, {"x": x}, opset=19, initializers={"sizes": SIZES["sizes"]})
        assert_close(run_ours(m, {"x": x})[0], ReferenceEvaluator(m).run(None, {"x": x})[0])


def test_cubic_exclude_outside_antialias_tf_crop():
    resize({"x": X}, DOWN, mode="cubic", cubic_coeff_a=-0.5, exclude_outside=1)
    for mode in ("linear", "cubic"):
        resize({"x": X}, DOWN, mode=mode, antialias=1)
    roi = np.array([0, 0, 0.2, -0.3, 1, 1, 0.9, 1.2], np.float32)
    resize(
        {"x": X},
        {"roi": roi, "sizes": np.array([1, 2, 3, 6], np.int64)},
        mode="linear",
        coordinate_transformation_mode="tf_crop_and_resize",
        extrapolation_value=-5.0,
    )


def test_axes_and_aspect_policy():
    for policy in ("stretch", "not_larger", "not_smaller"):
        resize(
            {"x": X},
            {"roi": EMPTY, "sizes": np.array([7, 3], np.int64)},
            mode="linear",
            axes=[3, 2],
            keep_aspect_ratio_policy=policy,
        )


def test_old_opsets_and_upsample():
    node = helper.make_node("Resize", ["x", "s"], ["y"], mode="linear")
    check_node(node, {"x": X}, opset=10, initializers={"s": np.array([1, 1, 2, 3], np.float32)})
    up = helper.make_node("Upsample", ["x", "s"], ["y"], mode="nearest")
    check_node(up, {"x": X}, opset=9, initializers={"s": np.array([1, 1, 2, 3], np.float32)})
    resize({"x": X}, {"roi": EMPTY, "scales": np.array([1, 1, 1.5, 2], np.float32)}, opset=11, mode="cubic")


def test_refusals():
    def refused(inits: dict, **attrs) -> str:
        node = helper.make_node("Resize", ["x", "roi", "scales", "sizes"][: 1 + len(inits)], ["y"], **attrs)
        d = model_to_dict(make_model(node, {"x": xi}, initializers=inits, opset=19))
        with pytest.raises(ParseError) as e:
            parse_graph(d, {"x": Shape.of(xi)})
        return str(e.value)

    xi = RNG.integers(0, 9, X.shape).astype(np.int32)
    assert "integer rounding" in refused(SCALES, mode="linear")
    roi = np.array([0, 0, 0.2, 0.2, 1, 1, 0.8, 0.8], np.float32)
    assert "ambiguous" in refused(
        {"roi": roi, "scales": SCALES["scales"]}, coordinate_transformation_mode="tf_crop_and_resize"
    )


def _constant_cases():
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = [
            c
            for c in collect_testcases(None)
            if c.kind == "node" and c.model.graph.node[0].op_type in ("Resize", "Upsample")
        ]
    return cases


# ORT and the reference disagree on align_corners when dim * scale is not whole: refused.
DISAGREE = {
    "test_resize_downsample_scales_linear_align_corners",
    "test_resize_downsample_scales_cubic_align_corners",
}


@pytest.mark.parametrize("case", _constant_cases(), ids=lambda c: c.name)
def test_onnx_node_cases_with_constant_scales(case):
    m = onnx.ModelProto()
    m.CopyFrom(case.model)
    inputs, outputs = case.data_sets[0]
    inputs = [numpy_helper.to_array(t) if isinstance(t, onnx.TensorProto) else np.asarray(t) for t in inputs]
    names = [i.name for i in m.graph.input][: len(inputs)]
    for n, v in list(zip(names, inputs, strict=True))[1:]:
        m.graph.initializer.append(numpy_helper.from_array(v, n))
    if case.name in DISAGREE:
        with pytest.raises(ParseError, match="align_corners"):
            run_ours(m, {names[0]: inputs[0]})
        return
    got = run_ours(m, {names[0]: inputs[0]})
    for g, w in zip(got, outputs, strict=True):
        w = numpy_helper.to_array(w) if isinstance(w, onnx.TensorProto) else np.asarray(w)
        assert_close(g, w, rtol=case.rtol, atol=max(case.atol, 1e-6))

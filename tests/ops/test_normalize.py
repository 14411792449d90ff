"""Softmax family, normalisations and ORT contrib norms/activations vs ORT's CPU EP."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper
from test_pointwise import refuses, run_op

from opcheck import check_node

RNG = np.random.default_rng(3)
X4 = RNG.standard_normal((2, 4, 3, 5)).astype(np.float32)
X3 = RNG.standard_normal((2, 3, 8)).astype(np.float32)
MS = {"com.microsoft": 1}
F16 = (2e-3, 2e-3)


def vec(n: int) -> np.ndarray:
    return RNG.standard_normal(n).astype(np.float32)


def test_softmax_ops_vs_numpy():
    x = X3 * 50  # large values: the max subtraction must keep this finite
    e = np.exp(x - x.max(1, keepdims=True))
    np.testing.assert_allclose(run_op("softmax", x, axis=1), e / e.sum(1, keepdims=True), rtol=1e-5)
    d = x - x.max(-1, keepdims=True)
    np.testing.assert_allclose(
        run_op("logsoftmax", x, axis=-1), d - np.log(np.exp(d).sum(-1, keepdims=True)), rtol=1e-5, atol=1e-5
    )
    assert run_op("softmax", X3.astype(np.float16), axis=2).dtype == np.float16


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax", "Hardmax"])
@pytest.mark.parametrize("opset", [11, 13])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_softmax_family_vs_ort(op, opset, axis):
    x = np.round(X4 * 2) if op == "Hardmax" else X4  # ties: the first maximum wins
    check_node(helper.make_node(op, ["x"], ["y"], axis=axis), {"x": x}, opset=opset)


def test_softmax_float16_steps_like_onnx_within_an_ulp_of_ort():
    # Narrow floats step in their own type like ONNX's definition (max, sub, exp, sum, div, each rounded),
    # which is bit-identical to ONNX's reference and within one fp16 ulp of ORT's CPU kernel.
    x = (RNG.standard_normal((16, 37)) * 3).astype(np.float16)
    want = x - x.max(axis=-1, keepdims=True)
    want = np.exp(want)
    want = want / want.sum(axis=-1, keepdims=True)
    got = check_node(helper.make_node("Softmax", ["x"], ["y"]), {"x": x}, rtol=0, atol=1e-3)[0]
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dt", [np.float32, np.float16])
def test_layer_norms_vs_ort(dt):
    tol = F16 if dt == np.float16 else (1e-5, 1e-5)
    x, g, b = X3.astype(dt), vec(8).astype(dt), vec(8).astype(dt)
    node = helper.make_node("LayerNormalization", ["x", "g", "b"], ["y", "m", "i"])
    check_node(node, {"x": x, "g": g, "b": b}, *tol)
    check_node(
        helper.make_node("LayerNormalization", ["x", "g"], ["y"], axis=1, epsilon=1e-3),
        {"x": x, "g": RNG.standard_normal((3, 8)).astype(dt)},
        *tol,
    )
    check_node(helper.make_node("RMSNormalization", ["x", "g"], ["y"]), {"x": x, "g": g}, *tol, opset=23)


@pytest.mark.parametrize("dt", [np.float32, np.float16])
def test_channel_norms_vs_ort(dt):
    tol = F16 if dt == np.float16 else (1e-5, 1e-5)
    x, c = X4.astype(dt), vec(4).astype(dt)
    cb = vec(4).astype(dt)
    node = helper.make_node("InstanceNormalization", ["x", "s", "b"], ["y"])
    check_node(node, {"x": x, "s": c, "b": cb}, *tol)
    check_node(
        helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], epsilon=1e-3),
        {"x": x, "s": c, "b": cb, "m": (c * 0.3).astype(dt), "v": np.abs(cb) + dt(0.1)},
        *tol,
    )
    check_node(
        helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=2),
        {"x": x, "s": c, "b": cb},
        *tol,
        opset=21,
    )
    check_node(
        helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=2),
        {"x": x, "s": c[:2], "b": cb[:2]},
        *tol,
        opset=18,
    )


def test_batch_norm_opset7_and_non_constant_params_vs_ort():
    c = vec(4)
    check_node(
        helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"]),
        {"x": X4, "s": c, "b": c[::-1].copy(), "m": c * 0.1, "v": np.abs(c)},
        opset=7,
    )


def test_lp_and_mvn_vs_ort():
    x = X4.copy()
    x[0, :, 0, 0] = 0  # a zero norm gives 0, not NaN
    for p in (1, 2):
        check_node(helper.make_node("LpNormalization", ["x"], ["y"], axis=1, p=p), {"x": x})
    check_node(helper.make_node("MeanVarianceNormalization", ["x"], ["y"]), {"x": X4}, rtol=1e-4, atol=1e-5)
    check_node(
        helper.make_node("MeanVarianceNormalization", ["x"], ["y"], axes=[1, 3]),
        {"x": X4},
        rtol=1e-4,
        atol=1e-5,
    )


@pytest.mark.parametrize("dt", [np.float32, np.float16])
def test_contrib_activations_vs_ort(dt):
    tol = F16 if dt == np.float16 else (1e-5, 1e-5)
    x, b = X3.astype(dt), vec(8).astype(dt)
    ms = {"domain_opsets": MS}
    for op, ins, attrs in (
        ("Gelu", ["x"], {}),
        ("FastGelu", ["x"], {}),
        ("FastGelu", ["x", "b"], {}),
        ("BiasGelu", ["x", "b"], {}),
        ("QuickGelu", ["x"], {"alpha": 1.3}),
    ):
        node = helper.make_node(op, ins, ["y"], domain="com.microsoft", **attrs)
        check_node(node, {"x": x, "b": b} if "b" in ins else {"x": x}, *tol, **ms)


@pytest.mark.parametrize("dt", [np.float32, np.float16])
def test_contrib_layer_norms_vs_ort(dt):
    tol = F16 if dt == np.float16 else (1e-5, 1e-5)
    x, s = X3.astype(dt), (X3[::-1] * 2).astype(dt)
    g, b, bias = vec(8).astype(dt), vec(8).astype(dt), vec(8).astype(dt)
    ms = {"domain_opsets": MS}
    node = helper.make_node(
        "SkipLayerNormalization",
        ["x", "s", "g", "b", "bias"],
        ["y", "m", "i", "sum"],
        domain="com.microsoft",
        epsilon=1e-4,
    )
    check_node(node, {"x": x, "s": s, "g": g, "b": b, "bias": bias}, *tol, **ms)
    node = helper.make_node("SkipLayerNormalization", ["x", "s", "g"], ["y"], domain="com.microsoft")
    check_node(node, {"x": x, "s": s, "g": g}, *tol, **ms)
    node = helper.make_node(
        "SkipSimplifiedLayerNormalization",
        ["x", "s", "g", "bias"],
        ["y", "", "i", "sum"],
        domain="com.microsoft",
    )
    check_node(node, {"x": x, "s": s, "g": g, "bias": bias}, *tol, **ms)
    node = helper.make_node("SimplifiedLayerNormalization", ["x", "g"], ["y", "i"], epsilon=1e-4)
    check_node(node, {"x": x, "g": g}, *tol, **ms)


def test_normalize_refusals():
    c = vec(4)
    inputs = {"x": X4, "s": c, "b": c, "m": c, "v": np.abs(c)}
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y", "r", "v"], training_mode=1)
    assert "training_mode" in refuses(node, inputs)
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y", "rm", "rv"])
    assert "training" in refuses(node, inputs)
    node = helper.make_node("LayerNormalization", ["x", "g"], ["y"], stash_type=11)
    assert "stash_type" in refuses(node, {"x": X3, "g": vec(8)})
    node = helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=3)
    assert "groups" in refuses(node, {"x": X4, "s": c, "b": c}, opset=21)
    node = helper.make_node(
        "SkipSimplifiedLayerNormalization", ["x", "s", "g"], ["y", "m"], domain="com.microsoft"
    )
    assert "mean" in refuses(node, {"x": X3, "s": X3, "g": vec(8)}, domain_opsets=MS)

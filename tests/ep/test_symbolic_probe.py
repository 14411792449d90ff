"""Symbolic dims in GetCapability: made-up probe sizes must not refuse what real inputs would accept."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper as oh
from onnx import numpy_helper as nh

import migraphx_ep  # noqa: F401 - registers the EP and routes its name
from conftest import node_providers, profiled_options
from migraphx_ep.frontend.probe import probe_dims

EP = "MIGraphXExecutionProvider"
RNG = np.random.default_rng(0)


def _weight(name: str, *shape: int) -> onnx.TensorProto:
    return nh.from_array((RNG.standard_normal(shape) * 0.2).astype(np.float32), name)


def _detector() -> bytes:
    """Three stride-2 convs, a 5x5 max pool, a 2x upsample, then concat/add with the stride-4 map: with
    small probe sizes (H=3: 2, 1, 1; up: 2 vs 1) the concat looked invalid and the pool window too big."""
    conv = {"pads": [1, 1, 1, 1], "kernel_shape": [3, 3], "strides": [2, 2]}
    nodes = [
        oh.make_node("Conv", ["x", "w1"], ["c1"], **conv),
        oh.make_node("Conv", ["c1", "w2"], ["c2"], **conv),
        oh.make_node("Conv", ["c2", "w3"], ["c3"], **conv),
        oh.make_node("MaxPool", ["c3"], ["p3"], kernel_shape=[5, 5], pads=[2, 2, 2, 2]),
        oh.make_node("Resize", ["p3", "", "scales"], ["u3"], mode="nearest"),
        oh.make_node("Concat", ["u3", "c2"], ["cat"], axis=1),
        oh.make_node("Add", ["u3", "c2"], ["sum"]),
        oh.make_node("Concat", ["cat", "sum"], ["y"], axis=1),
    ]
    inits = [
        _weight("w1", 4, 3, 3, 3),
        _weight("w2", 4, 4, 3, 3),
        _weight("w3", 4, 4, 3, 3),
        nh.from_array(np.array([1, 1, 2, 2], np.float32), "scales"),
    ]
    x = oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 3, "H", "W"])
    y = oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)
    model = oh.make_model(
        oh.make_graph(nodes, "detector", [x], [y], inits), opset_imports=[oh.make_opsetid("", 17)]
    )
    model.ir_version = 9
    return onnx.shape_inference.infer_shapes(model).SerializeToString()


def test_detector_with_symbolic_image_size_is_claimed_whole():
    model = _detector()
    sess = ort.InferenceSession(model, profiled_options(), providers=[EP, "CPUExecutionProvider"])
    cpu = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    for shape in [(1, 3, 64, 96), (2, 3, 32, 32)]:
        x = RNG.standard_normal(shape).astype(np.float32)
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], cpu.run(None, {"x": x})[0], atol=1e-5)
    assert set(node_providers(sess).values()) == {EP}


@pytest.mark.parametrize("large", [False, True])
def test_probe_sizes_are_consistent_per_name_and_distinct(large):
    resolve = probe_dims(large)
    a, b = resolve("x", 0, "N"), resolve("x", 2, "H")
    assert resolve("y", 0, "N") == a and a != b
    assert resolve("x", 1, None) == 1  # an unnamed unknown dim broadcasts
    if large:
        assert a % 32 == 0 and b % 32 == 0 and min(a, b) >= 64

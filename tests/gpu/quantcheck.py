"""Quantised models for the gpu target's int8/fp8 tests: QDQ models from onnxruntime.quantization's
``quantize_static`` with a fixed calibration reader, calibration tables for ``migraphx_int8_enable`` /
``migraphx_fp8_enable``, and the EP's own quantisation of a parsed program (what Compile does)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto as T
from onnx import helper as oh
from onnx import numpy_helper as nh

from migraphx_ep.frontend import model_to_dict, parse_graph
from migraphx_ep.ir.dtypes import DType, from_numpy
from migraphx_ep.ir.program import Program
from migraphx_ep.ir.shape import Shape

X_SHAPE = (2, 3, 6, 6)


def _model(nodes: list, inits: dict[str, np.ndarray], out_lens: list[int]) -> onnx.ModelProto:
    g = oh.make_graph(
        nodes,
        "g",
        [oh.make_tensor_value_info("x", T.FLOAT, list(X_SHAPE))],
        [oh.make_tensor_value_info("y", T.FLOAT, out_lens)],
        [nh.from_array(v, k) for k, v in inits.items()],
    )
    m = oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)])
    m.ir_version = 9
    return m


def conv_mlp(seed: int = 3) -> onnx.ModelProto:
    """Conv(+bias) -> Relu -> Flatten -> MatMul -> Add: one convolution and one dot to quantise."""
    rng = np.random.default_rng(seed)
    inits = {
        "w": rng.standard_normal((8, 3, 3, 3)).astype(np.float32),
        "b": rng.standard_normal(8).astype(np.float32),
        "w2": (rng.standard_normal((8 * 6 * 6, 10)) * 0.1).astype(np.float32),
        "b2": rng.standard_normal(10).astype(np.float32),
    }
    nodes = [
        oh.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv"),
        oh.make_node("Relu", ["c"], ["r"], name="relu"),
        oh.make_node("Flatten", ["r"], ["f"], name="flatten"),
        oh.make_node("MatMul", ["f", "w2"], ["m"], name="matmul"),
        oh.make_node("Add", ["m", "b2"], ["y"], name="add"),
    ]
    return _model(nodes, inits, [2, 10])


def matmul_only(seed: int = 4) -> onnx.ModelProto:
    """x viewed as rows of 6 -> MatMul (K = 6: padded for cuBLASLt) -> Add."""
    rng = np.random.default_rng(seed)
    inits = {
        "shape": np.array([36, 6], np.int64),
        "w": rng.standard_normal((6, 5)).astype(np.float32),
        "b": rng.standard_normal(5).astype(np.float32),
    }
    nodes = [
        oh.make_node("Reshape", ["x", "shape"], ["r"], name="reshape"),
        oh.make_node("MatMul", ["r", "w"], ["m"], name="matmul"),
        oh.make_node("Add", ["m", "b"], ["y"], name="add"),
    ]
    return _model(nodes, inits, [36, 5])


def inputs(n: int, seed: int = 5) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(X_SHAPE).astype(np.float32) for _ in range(n)]


# ``quantize_static`` settings: symmetric int8 (zero points 0), ORT's default (uint8 activations with
# zero points, int8 weights), the default per output channel, and int8 activations with zero points.
QDQ_STYLES = ("symmetric", "default", "per_channel", "int8_asymmetric")


def qdq_model(model: onnx.ModelProto, tmp: Path, style: str = "symmetric") -> onnx.ModelProto:
    """``quantize_static`` in QDQ format on fixed calibration data, in one of ``QDQ_STYLES``."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    data = inputs(4)

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.it = iter({"x": x} for x in data)

        def get_next(self) -> dict | None:
            return next(self.it, None)

    src, dst = tmp / "float.onnx", tmp / "qdq.onnx"
    onnx.save(model, src)
    extra = {"ActivationSymmetric": True, "WeightSymmetric": True} if style == "symmetric" else {}
    uint8 = style in ("default", "per_channel")
    quantize_static(
        str(src), str(dst), Reader(), quant_format=QuantFormat.QDQ, per_channel=style == "per_channel",
        activation_type=QuantType.QUInt8 if uint8 else QuantType.QInt8, weight_type=QuantType.QInt8,
        extra_options=extra,
    )  # fmt: skip
    return onnx.load(dst)


def write_table(model: onnx.ModelProto, path: Path) -> Path:
    """onnxruntime.quantization's calibration.json layout: every tensor's [lowest, highest] over
    ``inputs(8)``, computed on ORT's CPU EP."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    names = [o for n in m.graph.node for o in n.output if o != "y"]
    m.graph.output.extend(oh.make_empty_tensor_value_info(n) for n in names)
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    data = inputs(8)
    outs = [sess.run(names, {"x": x}) for x in data]
    ranges = {"x": (float(min(x.min() for x in data)), float(max(x.max() for x in data)))}
    for i, n in enumerate(names):
        ranges[n] = (float(min(o[i].min() for o in outs)), float(max(o[i].max() for o in outs)))
    path.write_text(json.dumps({k: {"lowest": lo, "highest": hi} for k, (lo, hi) in ranges.items()}))
    return path


def ep_quantised(model: onnx.ModelProto, table: Path, qtype: DType) -> Program:
    """The model parsed and quantised with ``table`` as the EP's Compile does (not yet compiled)."""
    from migraphx_ep.ep.calibration import quantize_with_table, read_table

    x = inputs(1)[0]
    res = parse_graph(model_to_dict(model), {"x": Shape(from_numpy(x.dtype), x.shape)})
    quantize_with_table(res.program, res.values, read_table(str(table), native=False), qtype, "test")
    return res.program


__all__ = ["conv_mlp", "ep_quantised", "inputs", "matmul_only", "qdq_model", "write_table"]

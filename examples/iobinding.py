"""IOBinding with the MIGraphX EP: inputs and outputs stay in GPU memory, and repeated Runs of one shape
never enter Python. Usage: ``python examples/iobinding.py [MODEL.onnx]`` (default: a small MLP)."""

from __future__ import annotations

import sys
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto
from onnx import helper as oh

import migraphx_ep  # noqa: F401 - registers the EP and routes its name


def mlp() -> bytes:
    rng = np.random.default_rng(0)
    w = oh.make_tensor("w", TensorProto.FLOAT, [256, 256], rng.standard_normal(256 * 256).astype(np.float32))
    graph = oh.make_graph(
        [oh.make_node("MatMul", ["x", "w"], ["h"]), oh.make_node("Relu", ["h"], ["y"])],
        "mlp",
        [oh.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 256])],
        [oh.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 256])],
        [w],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])
    model.ir_version = 9
    return model.SerializeToString()


def main() -> None:
    model = onnx.load(sys.argv[1]).SerializeToString() if len(sys.argv) > 1 else mlp()
    sess = ort.InferenceSession(
        model, providers=[("MIGraphXExecutionProvider", {"migraphx_target": "gpu"}), "CPUExecutionProvider"]
    )
    inp = sess.get_inputs()[0]
    dims = [d if isinstance(d, int) else 8 for d in inp.shape]
    host = np.random.default_rng(1).standard_normal(dims).astype(np.float32)
    x = ort.OrtValue.ortvalue_from_numpy(host, "cuda", 0)  # device memory from our allocator
    io = sess.io_binding()
    io.bind_ortvalue_input(inp.name, x)
    for out in sess.get_outputs():
        io.bind_output(out.name, "cuda")
    sess.run_with_iobinding(io)  # compiles this shape
    t = time.perf_counter()
    for _ in range(100):
        sess.run_with_iobinding(io)
    ms = (time.perf_counter() - t) * 10
    y = io.get_outputs()[0]
    print(f"{y.device_name()} output {y.shape()}, {ms:.3f} ms per run_with_iobinding")


if __name__ == "__main__":
    main()

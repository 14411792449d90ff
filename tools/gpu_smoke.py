"""Smoke check of the gpu target on a GPU machine: a fused pointwise graph, compiled and run through
the driver, NVRTC, the memory plan and CUDA-graph replay, compared with the ref target. Prints what
failed; exits non-zero on any mismatch."""

from __future__ import annotations

import sys
import time

import numpy as np
import onnx
import onnx.helper as oh

from migraphx_ep.frontend.graph import model_to_dict
from migraphx_ep.frontend.parser import parse_graph
from migraphx_ep.targets import get_target
from migraphx_ep.targets.gpu import gpu_available


def model() -> onnx.ModelProto:
    f = onnx.TensorProto.FLOAT
    nodes = [
        oh.make_node("Add", ["x", "y"], ["s"]),
        oh.make_node("Erf", ["s"], ["e"]),
        oh.make_node("Mul", ["e", "x"], ["m"]),
        oh.make_node("Transpose", ["m"], ["t"], perm=[1, 0]),
        oh.make_node("Relu", ["t"], ["out"]),
    ]
    g = oh.make_graph(
        nodes, "smoke",
        [oh.make_tensor_value_info("x", f, [64, 96]), oh.make_tensor_value_info("y", f, [1, 96])],
        [oh.make_tensor_value_info("out", f, [96, 64])],
    )  # fmt: skip
    return oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)])


def main() -> int:
    reason = gpu_available()
    print("gpu_available:", reason)
    if reason:
        return 1
    g = model_to_dict(model())
    rng = np.random.default_rng(0)
    feeds = {
        "x": rng.standard_normal((64, 96)).astype(np.float32),
        "y": rng.standard_normal((1, 96)).astype(np.float32),
    }
    ref = parse_graph(g, {}).program
    ref.compile(get_target("ref"))
    want = ref.run_numpy(feeds)
    prog = parse_graph(g, {}).program
    t0 = time.perf_counter()
    prog.compile(get_target("gpu"))
    print(f"compile {time.perf_counter() - t0:.3f}s", prog._exe.summary())
    got = prog.run_numpy(feeds)
    err = float(np.max(np.abs(got[0] - want[0])))
    print("max abs err", err)
    ts = []
    for _ in range(200):
        t = time.perf_counter()
        prog.run_numpy(feeds)
        ts.append(time.perf_counter() - t)
    print(f"run median {np.median(ts) * 1e6:.1f} us")
    return 0 if err < 1e-6 else 1


if __name__ == "__main__":
    sys.exit(main())

"""The shell's Run trace (csrc/run_trace.h): with it on, each Compute records when it starts and ends on
the clock of time.perf_counter_ns, so tools/run_overhead.py --trace can split a sess.run; with it off,
nothing is recorded. On the ref target (no GPU): Compute is the Python path, no copies."""

from __future__ import annotations

import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto
from onnx import helper as oh

from conftest import make_model, tensor
from migraphx_ep import _C

COMPUTE_BEGIN, COMPUTE_END = 2, 3


def _session() -> ort.InferenceSession:
    blob = make_model(
        [oh.make_node("Relu", ["x"], ["y"])],
        [tensor("x", TensorProto.FLOAT, [2, 3])],
        [tensor("y", TensorProto.FLOAT, [2, 3])],
    )
    return ort.InferenceSession(
        blob, providers=[("MIGraphXExecutionProvider", {"migraphx_target": "ref"}), "CPUExecutionProvider"]
    )


def test_trace_records_each_compute_within_its_run():
    sess = _session()
    x = np.arange(-3, 3, dtype=np.float32).reshape(2, 3)
    sess.run(None, {"x": x})
    _C.run_trace(True)
    _C.set_run_trace(True)
    try:
        spans = []
        for _ in range(3):
            t0 = time.perf_counter_ns()
            np.testing.assert_array_equal(sess.run(None, {"x": x})[0], np.maximum(x, 0))
            spans.append((t0, time.perf_counter_ns()))
    finally:
        _C.set_run_trace(False)
    marks, dropped = _C.run_trace(True)
    assert dropped == 0
    assert [m for _, m, _ in marks] == [COMPUTE_BEGIN, COMPUTE_END] * 3
    for k, (t0, t1) in enumerate(spans):
        (begin, _, _), (end, _, native) = marks[2 * k], marks[2 * k + 1]
        assert t0 <= begin <= end <= t1  # one clock: the shell's marks fall inside Python's span
        assert native == 0  # the ref target runs through Python
    assert _C.run_trace(True) == ([], 0)  # cleared by the read


def test_trace_off_records_nothing():
    sess = _session()
    _C.run_trace(True)
    sess.run(None, {"x": np.ones((2, 3), np.float32)})
    assert _C.run_trace(True) == ([], 0)

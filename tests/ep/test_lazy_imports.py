"""The EP's session path does not import ``onnx``: ORT hands it graphs as dicts, and importing onnx
(0.06-0.14 s) delayed every process's first session. Only the ModelProto helpers (``model_to_dict``,
``parse_onnx``, an EPContext node's recompile from the original model) import it, where they run."""

from __future__ import annotations

import os
import subprocess
import sys

MODEL = os.path.join(os.path.dirname(os.path.dirname(__file__)), "models", "bert.onnx")

SCRIPT = """
import sys
import numpy as np
import onnxruntime as ort
import migraphx_ep
sess = ort.InferenceSession(sys.argv[1], providers=["MIGraphXExecutionProvider", "CPUExecutionProvider"])
feeds = {i.name: np.ones((2, 5), np.int64) for i in sess.get_inputs()}
sess.run(None, feeds)
assert "MIGraphXExecutionProvider" in sess.get_providers()
print(sorted(m for m in sys.modules if m == "onnx" or m.startswith("onnx.")))
"""


def test_a_session_and_its_run_do_not_import_onnx():
    env = {**os.environ, "ORT_MIGRAPHX_TARGET": "ref"}
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, MODEL], capture_output=True, text=True, env=env, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout

"""The plugin-EP ABI versions the library negotiates with the running onnxruntime, and the callbacks
newer runtimes call (Sync through IOBinding)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort

from conftest import EP, chain_expected, chain_model, ones
from migraphx_ep import _C


def test_ort_api_versions():
    v = _C.ort_api_versions()
    header = _C.ORT_API_VERSION
    assert v["header"] == header >= 23
    # The headers' version, capped by what the running ORT serves (ORT 1.x serves API x); ORT has
    # loaded the library by now (import migraphx_ep registers it).
    major, minor = (int(p) for p in ort.__version__.split(".")[:2])
    assert major == 1 and v["runtime"] == min(header, minor)
    assert v["runtime_version"] == ort.__version__


def test_not_embedded_in_a_python_process():
    assert _C.embedded() is False  # Python imported us: the library started no interpreter
    info = _C.build_info()
    assert info["ort_include_dir"].endswith("onnxruntime")
    assert info["python_home"]


def test_io_binding_synchronize(stub):
    # ORT >= 1.25 asks each EP to Sync before a bound run; ours has nothing pending (host memory).
    sess = ort.InferenceSession(chain_model(), providers=[EP])
    x = ones(3) * 0.5
    binding = sess.io_binding()
    binding.bind_cpu_input("x", x)
    binding.bind_output("y")
    binding.synchronize_inputs()
    sess.run_with_iobinding(binding)
    binding.synchronize_outputs()
    np.testing.assert_allclose(binding.copy_outputs_to_cpu()[0], chain_expected(x))
    assert stub.runs == 1

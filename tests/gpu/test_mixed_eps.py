"""ORT's own CUDA EP and ours in one process, in both orders, over convolution variants.

Users mix EPs in one process. Once, after ORT's CUDA EP had run, our cuDNN search segfaulted on an OCR
detector's convolutions: ORT had loaded its own cuDNN and ours was a second copy whose parts resolved
to the first one's (see targets/gpu/libs.py ``already_loaded``). Each order runs in a fresh process, as
the load order is what matters, so a crash shows as a return code instead of killing pytest.

Needs onnxruntime-gpu (``CUDAExecutionProvider``): on the GPU machine, put its wheel on PYTHONPATH.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.gpu

SCRIPT = textwrap.dedent(
    """
    import sys
    import numpy as np
    import onnx
    from onnx import helper as oh, numpy_helper as nh
    import onnxruntime as ort
    import migraphx_ep  # noqa: F401

    rng = np.random.default_rng(0)
    F = onnx.TensorProto.FLOAT
    # (name, C_in, C_out, group, kernel, stride, dilation, pads)
    convs = [
        ("plain", 8, 16, 1, 3, 1, 1, [1, 1, 1, 1]),
        ("grouped", 16, 16, 4, 3, 1, 1, [1, 1, 1, 1]),
        ("depthwise", 16, 16, 16, 3, 2, 1, [1, 1, 1, 1]),
        ("dilated", 16, 8, 1, 3, 1, 2, [2, 2, 2, 2]),
        ("asym_pads", 8, 8, 1, 3, 1, 1, [0, 1, 1, 0]),
        ("large_kernel", 8, 8, 1, 7, 1, 1, [3, 3, 3, 3]),
        ("strided_5x5", 8, 8, 2, 5, 2, 1, [2, 2, 2, 2]),
    ]
    nodes, inits, x = [], [], "x"
    c_prev = 8
    for name, cin, cout, g, k, s, d, pads in convs:
        if cin != c_prev:
            w = rng.standard_normal((cin, c_prev, 1, 1)).astype(np.float32) * 0.3
            w = nh.from_array(w, name + "_adapt")
            inits.append(w)
            nodes.append(oh.make_node("Conv", [x, w.name], [name + "_in"]))
            x = name + "_in"
        w = nh.from_array(rng.standard_normal((cout, cin // g, k, k)).astype(np.float32) * 0.2, name + "_w")
        b = nh.from_array(rng.standard_normal(cout).astype(np.float32) * 0.1, name + "_b")
        inits += [w, b]
        nodes.append(oh.make_node("Conv", [x, w.name, b.name], [name], group=g, kernel_shape=[k, k],
                                  strides=[s, s], dilations=[d, d], pads=pads))
        nodes.append(oh.make_node("Relu", [name], [name + "_r"]))
        x, c_prev = name + "_r", cout
    wt = nh.from_array(rng.standard_normal((c_prev, 4, 4, 4)).astype(np.float32) * 0.2, "wt")
    inits.append(wt)
    nodes.append(oh.make_node("ConvTranspose", [x, "wt"], ["y"], strides=[2, 2], kernel_shape=[4, 4],
                              pads=[1, 1, 1, 1]))
    g = oh.make_graph(nodes, "convs", [oh.make_tensor_value_info("x", F, [2, 8, 40, 56])],
                      [oh.make_tensor_value_info("y", F, None)], inits)
    model = oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)])
    model.ir_version = 9
    model = model.SerializeToString()
    feed = {"x": rng.standard_normal((2, 8, 40, 56)).astype(np.float32)}
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feed)[0]
    ours = [("MIGraphXExecutionProvider", {"migraphx_target": "gpu", "migraphx_tf32_enable": "0"}),
            "CPUExecutionProvider"]
    theirs = [("CUDAExecutionProvider", {"use_tf32": "0"}), "CPUExecutionProvider"]
    order = [theirs, ours] if sys.argv[1] == "cuda-first" else [ours, theirs]
    for providers in order + order:  # and again, each session after the other's
        got = ort.InferenceSession(model, providers=providers).run(None, feed)[0]
        err = float(np.abs(got - want).max() / max(1.0, np.abs(want).max()))
        assert err < 1e-4, (providers[0], err)
    print("ok")
    """
)


def _has_cuda_ep() -> bool:
    import onnxruntime as ort

    return "CUDAExecutionProvider" in ort.get_available_providers()


@pytest.mark.parametrize("order", ["cuda-first", "ours-first"])
def test_ort_cuda_ep_and_ours_in_one_process(order):
    if not _has_cuda_ep():
        pytest.skip("onnxruntime-gpu is not installed: put its wheel on PYTHONPATH (see this file's doc)")
    r = subprocess.run(
        [sys.executable, "-c", SCRIPT, order], capture_output=True, text=True, timeout=600, env=os.environ
    )
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), (
        r.returncode,
        r.stdout[-2000:],
        r.stderr[-4000:],
    )

"""EPContext models on the gpu target: ORT's ModelCompiler writes a context holding gpu programs (a
``.mxr`` beside the model, or its bytes inside), and a session over it loads them, compiling nothing,
and answers as a session compiled from the original model does."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper as oh

from migraphx_ep import _routing

from .quantcheck import conv_mlp, inputs, qdq_model

pytestmark = pytest.mark.gpu

EP = "MIGraphXExecutionProvider"
GPU = {"migraphx_target": "gpu"}


def compile_context(src: Path, out: Path, embed: bool) -> onnx.ModelProto:
    so = ort.SessionOptions()
    _routing._attach(so, [(EP, GPU)])
    ort.ModelCompiler(so, str(src), embed_compiled_data_into_model=embed).compile_to_file(str(out))
    return onnx.load(out)


def session(path: Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), providers=[(EP, GPU), "CPUExecutionProvider"])


def targets(backend) -> set[str | None]:  # noqa: ANN001
    return {p.target_name for c in backend.eps[-1].compiled for p in c.programs.values()}


@pytest.mark.parametrize("kind", ["float", "qdq"])
@pytest.mark.parametrize("embed", [False, True], ids=["mxr_file", "embedded"])
def test_gpu_context_round_trip_compiles_nothing(tmp_path, recording, embed, kind) -> None:  # noqa: ANN001
    model = conv_mlp() if kind == "float" else qdq_model(conv_mlp(), tmp_path, "default")
    src, out = tmp_path / "m.onnx", tmp_path / "ctx" / "m_ctx.onnx"
    onnx.save(model, src)
    out.parent.mkdir()
    ctx = compile_context(src, out, embed)
    assert recording.counts() == (1, 0)
    (node,) = ctx.graph.node
    attrs = {a.name: oh.get_attribute_value(a) for a in node.attribute}
    assert node.op_type == "EPContext" and attrs["hardware_architecture"].startswith(b"gpu:sm_")
    assert sorted(os.listdir(out.parent)) == (
        ["m_ctx.onnx"] if embed else sorted(["m_ctx.onnx", attrs["ep_cache_context"].decode()])
    )

    fresh = session(src)
    assert recording.counts() == (1, 0) and targets(recording) == {"gpu"}
    loaded = session(out)
    assert recording.counts() == (0, 1) and targets(recording) == {"gpu"}  # loaded, not compiled
    for x in inputs(3, seed=41):
        want = fresh.run(None, {"x": x})[0]
        got = loaded.run(None, {"x": x})[0]
        # The same program: only the libraries' algorithm picks, timed again at load, may differ.
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))

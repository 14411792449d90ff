"""One com.microsoft node through real ORT sessions: CPU EP (the oracle) vs our EP on the ref target."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper

import migraphx_ep  # noqa: F401 - registers and routes the EP
from conftest import node_providers, profiled_options
from migraphx_ep.frontend import model_to_dict, parse_graph
from migraphx_ep.ir.dtypes import from_numpy
from migraphx_ep.ir.shape import Shape

EP_NAME = "MIGraphXExecutionProvider"
EP = (EP_NAME, {"migraphx_target": "ref"})


def ms_model(
    node: onnx.NodeProto,
    feeds: dict[str, np.ndarray],
    initializers: dict[str, np.ndarray] | None = None,
    n_out: int | None = None,
) -> bytes:
    """A one-node model: ``feeds`` become graph inputs, outputs are typed like the first input."""
    vis = [
        helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
        for k, v in feeds.items()
    ]
    inits = [onnx.numpy_helper.from_array(v, k) for k, v in (initializers or {}).items()]
    outs = [helper.make_value_info(o, onnx.TypeProto()) for o in node.output[:n_out] if o]
    g = helper.make_graph([node], "t", vis, outs, inits)
    m = helper.make_model(
        g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    )
    m.ir_version = 10
    return m.SerializeToString()


def cpu(model: bytes, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)


def ours(model: bytes, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Run on our EP and check that every node ran there (it was claimed, not left to the CPU EP)."""
    s = ort.InferenceSession(model, profiled_options(), providers=[EP, "CPUExecutionProvider"])
    got = s.run(None, feeds)
    providers = set(node_providers(s).values())
    assert providers == {EP_NAME}, f"not claimed: ran on {providers}"
    return got


def compare(
    model: bytes,
    feeds: dict[str, np.ndarray],
    rtol: float,
    atol: float,
    rows: list | None = None,
    oracle: bytes | None = None,
) -> list[np.ndarray]:
    """ORT CPU vs our EP, output by output (``rows[i]``: an index selecting the compared part).
    ``oracle``: an equivalent model for ORT CPU where its kernel cannot take ``model`` itself."""
    want, got = cpu(oracle or model, feeds), ours(model, feeds)
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g.dtype == w.dtype and g.shape == w.shape, (i, g.dtype, w.dtype, g.shape, w.shape)
        sel = rows[i] if rows is not None and rows[i] is not None else ...
        np.testing.assert_allclose(
            g[sel].astype(np.float64), w[sel].astype(np.float64), rtol=rtol, atol=atol, err_msg=f"output {i}"
        )
    return got


def refusal(model: bytes, feeds: dict[str, np.ndarray]) -> str | None:
    """Why the frontend refuses the (one) node with these input shapes; None if it claims it."""
    d = model_to_dict(onnx.load_from_string(model))
    shapes = {k: Shape(from_numpy(v.dtype), v.shape) for k, v in feeds.items()}
    refused = parse_graph(d, shapes, tolerant=True).refused
    return next(iter(refused.values()), None)

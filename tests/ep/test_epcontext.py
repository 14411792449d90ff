"""EPContext models through real ORT: ModelCompiler writes them, sessions load them compiling nothing."""

from __future__ import annotations

import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper as oh
from onnx import numpy_helper as nh

from conftest import make_model, tensor
from migraphx_ep import _routing, mxr

EP = "MIGraphXExecutionProvider"
RNG = np.random.default_rng(5)
REF = {"migraphx_target": "ref"}


def mlp(batch: int | str = 3) -> bytes:
    w1 = nh.from_array(RNG.standard_normal((8, 16)).astype(np.float32), "w1")
    w2 = nh.from_array(RNG.standard_normal((16, 4)).astype(np.float32), "w2")
    nodes = [
        oh.make_node("MatMul", ["x", "w1"], ["h"]),
        oh.make_node("Relu", ["h"], ["r"]),
        oh.make_node("MatMul", ["r", "w2"], ["z"]),
        oh.make_node("Softmax", ["z"], ["y"], axis=-1),
    ]
    return make_model(nodes, [tensor("x", T.FLOAT, [batch, 8])], [tensor("y", T.FLOAT, [batch, 4])], [w1, w2])


def with_refused_node() -> bytes:
    """relu(x @ w) + 0 * RandomUniformLike(...): our EP refuses RandomUniformLike (nondeterministic), so
    it splits the model into two partitions around a node ORT's CPU EP runs; the product is 0."""
    w = nh.from_array(RNG.standard_normal((8, 6)).astype(np.float32), "w")
    zero = nh.from_array(np.zeros((3, 6), np.float32), "zero")
    nodes = [
        oh.make_node("MatMul", ["x", "w"], ["h"]),
        oh.make_node("Relu", ["h"], ["r"]),
        oh.make_node("RandomUniformLike", ["r"], ["u"], seed=1.0, name="random"),
        oh.make_node("Mul", ["u", "zero"], ["m"]),
        oh.make_node("Add", ["r", "m"], ["y"]),
    ]
    return make_model(nodes, [tensor("x", T.FLOAT, [3, 8])], [tensor("y", T.FLOAT, [3, 6])], [w, zero])


def compile_model(src: str, out: str, embed: bool, options: dict | None = None) -> onnx.ModelProto:
    so = ort.SessionOptions()
    _routing._attach(so, [(EP, {**REF, **(options or {})})])
    ort.ModelCompiler(so, src, embed_compiled_data_into_model=embed).compile_to_file(out)
    return onnx.load(out)


def session(model: str | bytes, options: dict | None = None) -> ort.InferenceSession:
    return ort.InferenceSession(model, providers=[(EP, {**REF, **(options or {})}), "CPUExecutionProvider"])


def attrs(node: onnx.NodeProto) -> dict:
    return {a.name: oh.get_attribute_value(a) for a in node.attribute}


@pytest.mark.parametrize("embed", [False, True])
def test_round_trip_compiles_nothing_and_gives_identical_outputs(tmp_path, recording, embed):
    src, out = tmp_path / "m.onnx", tmp_path / "out" / "m_ctx.onnx"
    src.write_bytes(mlp())
    out.parent.mkdir()
    ctx = compile_model(str(src), str(out), embed)
    assert recording.counts() == (1, 0)  # compiling the model compiled its one partition
    (node,) = ctx.graph.node
    assert (node.op_type, node.domain, list(node.input), list(node.output)) == (
        "EPContext",
        "com.microsoft",
        ["x"],
        ["y"],
    )
    a = attrs(node)
    assert a["main_context"] == 1 and a["embed_mode"] == int(embed) and a["source"] == EP.encode()
    assert a["hardware_architecture"] == b"ref" and a["partition_name"] == node.name.encode()
    assert not ctx.graph.initializer  # the weights live in the program, not twice in the model
    if embed:
        assert a["ep_cache_context"].startswith(mxr.MAGIC)
        assert os.listdir(out.parent) == ["m_ctx.onnx"]
    else:
        name = a["ep_cache_context"].decode()
        assert name.endswith(".mxr") and os.sep not in name
        assert mxr.load_file(out.parent / name).program.is_compiled()  # a plain .mxr, beside the model

    x = RNG.standard_normal((3, 8)).astype(np.float32)
    want = session(str(src)).run(None, {"x": x})[0]
    got = session(str(out)).run(None, {"x": x})[0]
    assert recording.counts() == (0, 1)  # loaded, not compiled
    np.testing.assert_array_equal(got, want)


def test_refused_node_stays_an_ordinary_node(tmp_path, recording):
    src, out = tmp_path / "m.onnx", tmp_path / "m_ctx.onnx"
    src.write_bytes(with_refused_node())
    ctx = compile_model(str(src), str(out), embed=True)
    kinds = [(n.domain, n.op_type) for n in ctx.graph.node]
    assert kinds.count(("com.microsoft", "EPContext")) == 2 and ("", "RandomUniformLike") in kinds
    x = RNG.standard_normal((3, 8)).astype(np.float32)
    want = session(str(src)).run(None, {"x": x})[0]
    s = session(str(out))
    assert recording.counts() == (0, 2)
    np.testing.assert_array_equal(s.run(None, {"x": x})[0], want)


def test_context_for_other_options_version_or_target_is_refused(tmp_path, recording):
    src, out = tmp_path / "m.onnx", tmp_path / "m_ctx.onnx"
    src.write_bytes(mlp())
    ctx = compile_model(str(src), str(out), embed=True)
    with pytest.raises(Exception, match=r"compiled with option fp16=False, this session has fp16=True"):
        session(str(out), {"migraphx_fp16_enable": "1"})

    (node,) = ctx.graph.node
    old = next(a for a in node.attribute if a.name == "ep_sdk_version")
    old.s = b"0.0.0-other"
    with pytest.raises(Exception, match=r"made by migraphx-ep 0.0.0-other"):
        session(ctx.SerializeToString())

    # A program whose record names another target (as a gpu-compiled context would).
    ctx = onnx.load(str(out))
    blob = next(a for a in ctx.graph.node[0].attribute if a.name == "ep_cache_context")
    path = tmp_path / "p.mxr"
    path.write_bytes(blob.s)
    f = mxr.load_file(path)
    f.metadata["epcontext"]["target"] = "gpu"
    mxr.save(f.program, path, metadata=f.metadata)
    blob.s = path.read_bytes()
    with pytest.raises(Exception, match=r"compiled for target 'gpu', this session's target is 'ref'"):
        session(ctx.SerializeToString())


def test_bad_context_payloads_are_clear_errors(tmp_path, recording):
    src, out = tmp_path / "m.onnx", tmp_path / "m_ctx.onnx"
    src.write_bytes(mlp())
    ctx = compile_model(str(src), str(out), embed=False)
    name = attrs(ctx.graph.node[0])["ep_cache_context"].decode()
    os.remove(tmp_path / name)
    with pytest.raises(Exception, match=rf"EPContext node .*{name}.*cannot open"):
        session(str(out))
    blob = next(a for a in ctx.graph.node[0].attribute if a.name == "ep_cache_context")
    blob.s = b"../elsewhere.mxr"
    onnx.save(ctx, str(out))
    with pytest.raises(Exception, match=r"must be a relative path inside the model's directory"):
        session(str(out))
    ctx = compile_model(str(src), str(out), embed=True)
    blob = next(a for a in ctx.graph.node[0].attribute if a.name == "ep_cache_context")
    blob.s = blob.s[:-7]  # truncated
    with pytest.raises(Exception, match=r"embedded program: .*truncated"):
        session(ctx.SerializeToString())


def test_int8_context_round_trip_and_table_mismatch(tmp_path, recording):
    src, out, table = tmp_path / "m.onnx", tmp_path / "m_ctx.onnx", tmp_path / "cal.json"
    src.write_bytes(mlp())
    table.write_text('{"x": [-4, 4], "r": [0, 12]}')
    int8 = {"migraphx_int8_enable": "1", "migraphx_int8_calibration_table_name": str(table)}
    ctx = compile_model(str(src), str(out), embed=True, options=int8)
    x = RNG.standard_normal((3, 8)).astype(np.float32)
    want = session(str(src), int8).run(None, {"x": x})[0]
    s = session(str(out), int8)
    ops = [i.name for p in recording.eps[-1].compiled[0].programs.values() for i in p.get_main_module()]
    assert recording.counts() == (0, 1) and "quant_dot" in ops
    np.testing.assert_array_equal(s.run(None, {"x": x})[0], want)
    table.write_text('{"x": [-4, 4], "r": [0, 13]}')  # other scales: another program
    with pytest.raises(Exception, match=r"compiled with option calibration="):
        session(ctx.SerializeToString(), int8)


def test_dynamic_dims_are_refused_when_compiling(tmp_path, recording):
    src = tmp_path / "m.onnx"
    src.write_bytes(mlp(batch="N"))
    with pytest.raises(Exception, match=r"EPContext node holds one program compiled for static input dims"):
        compile_model(str(src), str(tmp_path / "m_ctx.onnx"), embed=True)


def test_context_model_runs_shapes_it_was_compiled_for_only(tmp_path, recording):
    src, out = tmp_path / "m.onnx", tmp_path / "m_ctx.onnx"
    src.write_bytes(mlp())
    ctx = compile_model(str(src), str(out), embed=True)
    # Loosen the declared input dims: a Run with another batch reaches the program check.
    ctx.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "N"
    ctx.graph.output[0].type.tensor_type.shape.dim[0].dim_param = "N"
    s = session(ctx.SerializeToString())
    s.run(None, {"x": np.zeros((3, 8), np.float32)})
    with pytest.raises(Exception, match=r"holds programs for input dims \[\[3, 8\]\], not \[\[5, 8\]\]"):
        s.run(None, {"x": np.zeros((5, 8), np.float32)})

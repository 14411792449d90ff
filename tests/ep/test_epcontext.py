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

import migraphx_ep
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


def _gpu_record(ctx: onnx.ModelProto, tmp: str) -> None:
    """Make the embedded program's record name the gpu target (as a gpu-compiled context's would)."""
    blob = next(a for a in ctx.graph.node[0].attribute if a.name == "ep_cache_context")
    path = os.path.join(tmp, "p.mxr")
    with open(path, "wb") as f:
        f.write(blob.s)
    f = mxr.load_file(path)
    f.metadata["epcontext"]["target"] = "gpu"
    mxr.save(f.program, path, metadata=f.metadata)
    with open(path, "rb") as g:
        blob.s = g.read()


def _with_attr(ctx: onnx.ModelProto, name: str, value: bytes) -> onnx.ModelProto:
    copy = onnx.ModelProto()
    copy.CopyFrom(ctx)
    for node in copy.graph.node:
        if node.op_type == "EPContext":
            next(a for a in node.attribute if a.name == name).s = value
    return copy


def test_mismatched_context_without_its_original_is_a_clear_error(tmp_path, recording):
    # The EPContext model is written elsewhere than its original: nothing to recompile from.
    src, out = tmp_path / "m.onnx", tmp_path / "out" / "m_ctx.onnx"
    src.write_bytes(mlp())
    out.parent.mkdir()
    ctx = compile_model(str(src), str(out), embed=True)
    with pytest.raises(Exception, match=r"compiled with option fp16=False, this session has fp16=True") as e:
        session(str(out), {"migraphx_fp16_enable": "1"})
    assert "the original model 'm.onnx' is not beside it" in str(e.value)

    old = _with_attr(ctx, "ep_sdk_version", b"0.0.0-other")
    with pytest.raises(Exception, match=r"made by migraphx-ep 0.0.0-other, this is .* loaded from bytes"):
        session(old.SerializeToString())

    _gpu_record(ctx, str(tmp_path))
    with pytest.raises(Exception, match=r"compiled for target 'gpu', this session's target is 'ref'"):
        session(ctx.SerializeToString())
    ctx.graph.node[0].attribute.remove(
        next(a for a in ctx.graph.node[0].attribute if a.name == "onnx_model_filename")
    )
    onnx.save(ctx, str(out))
    with pytest.raises(Exception, match=r"names no original model \(onnx_model_filename\)"):
        session(str(out))
    bad = _with_attr(onnx.load(str(out)), "ep_sdk_version", b"0.0.0-other")
    bad.graph.node[0].attribute.append(oh.make_attribute("onnx_model_filename", "../m.onnx"))
    onnx.save(bad, str(out))
    with pytest.raises(Exception, match=r"'../m.onnx' must be a relative path inside the model's directory"):
        session(str(out))


def test_mismatched_context_is_recompiled_from_its_original(tmp_path, recording, caplog):
    src, out = tmp_path / "m.onnx", tmp_path / "m_ctx.onnx"
    src.write_bytes(mlp())
    ctx = compile_model(str(src), str(out), embed=True)
    assert attrs(ctx.graph.node[0])["onnx_model_filename"] == b"m.onnx"
    x = RNG.standard_normal((3, 8)).astype(np.float32)
    fp16 = {"migraphx_fp16_enable": "1"}

    caplog.clear()
    got = session(str(out), fp16).run(None, {"x": x})[0]
    assert recording.counts() == (1, 0)  # not loaded: compiled again, for this session's options
    assert "compiled with option fp16=False, this session has fp16=True" in caplog.text
    assert f"recompiling its partition from the original model {src}" in caplog.text
    np.testing.assert_array_equal(got, session(str(src), fp16).run(None, {"x": x})[0])

    want = session(str(src)).run(None, {"x": x})[0]
    onnx.save(_with_attr(ctx, "ep_sdk_version", b"0.0.0-other"), str(tmp_path / "old_ctx.onnx"))
    caplog.clear()
    got = session(str(tmp_path / "old_ctx.onnx")).run(None, {"x": x})[0]
    assert recording.counts() == (1, 0) and "made by migraphx-ep 0.0.0-other" in caplog.text
    np.testing.assert_array_equal(got, want)

    _gpu_record(ctx, str(tmp_path))
    onnx.save(ctx, str(tmp_path / "gpu_ctx.onnx"))
    caplog.clear()
    got = session(str(tmp_path / "gpu_ctx.onnx")).run(None, {"x": x})[0]
    assert recording.counts() == (1, 0) and "compiled for target 'gpu'" in caplog.text
    np.testing.assert_array_equal(got, want)


def test_every_partition_is_recompiled_around_an_unclaimed_node(tmp_path, recording):
    src, out = tmp_path / "m.onnx", tmp_path / "m_ctx.onnx"
    src.write_bytes(with_refused_node())
    ctx = compile_model(str(src), str(out), embed=False)
    onnx.save(_with_attr(ctx, "ep_sdk_version", b"0.0.0-other"), str(out))
    x = RNG.standard_normal((3, 8)).astype(np.float32)
    got = session(str(out)).run(None, {"x": x})[0]
    assert recording.counts() == (2, 0)
    np.testing.assert_array_equal(got, session(str(src)).run(None, {"x": x})[0])


def test_an_original_without_the_partition_is_not_recompiled(tmp_path, recording):
    src, out = tmp_path / "m.onnx", tmp_path / "m_ctx.onnx"
    src.write_bytes(mlp())
    ctx = compile_model(str(src), str(out), embed=True)
    other = [oh.make_node("Relu", ["a"], ["y"])]  # another model under the original's name
    src.write_bytes(make_model(other, [tensor("a", T.FLOAT, [3, 4])], [tensor("y", T.FLOAT, [3, 4])]))
    onnx.save(_with_attr(ctx, "ep_sdk_version", b"0.0.0-other"), str(out))
    with pytest.raises(Exception, match=r"cannot be recompiled: in the original model .*'a' is not computed"):
        session(str(out))
    src.write_bytes(b"not a model")
    with pytest.raises(Exception, match=r"cannot be recompiled: the original model .*m.onnx cannot be read"):
        session(str(out))


def test_context_nodes_carry_the_attributes_ort_defines(tmp_path, recording):
    schemas = ort.capi._pybind_state.get_all_operator_schema()
    (schema,) = [s for s in schemas if s.name == "EPContext" and s.domain == "com.microsoft"]
    src, out = tmp_path / "m.onnx", tmp_path / "m_ctx.onnx"
    src.write_bytes(mlp())
    a = attrs(compile_model(str(src), str(out), embed=True).graph.node[0])
    # All of ORT's that mean something for us (notes and max_size do not: ORT adds max_size's default).
    assert set(a) - {"max_size"} == set(schema.attributes) - {"notes", "max_size"}
    assert a["ep_sdk_version"] == migraphx_ep.__version__.encode() and a["onnx_model_filename"] == b"m.onnx"
    so = ort.SessionOptions()
    _routing._attach(so, [(EP, REF)])
    compiler = ort.ModelCompiler(so, mlp(), embed_compiled_data_into_model=True)  # from bytes: no file name
    compiler.compile_to_file(str(tmp_path / "b_ctx.onnx"))
    assert "onnx_model_filename" not in attrs(onnx.load(str(tmp_path / "b_ctx.onnx")).graph.node[0])


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


def test_node_without_a_parser_stays_a_plain_onnx_node(tmp_path, recording, monkeypatch, capsys):
    """NonZero has no parser (its output's size depends on the data): left to ORT's CPU EP, it stays in
    the EPContext model as the original node, between our EPContext node and the model's outputs."""
    w = nh.from_array(RNG.standard_normal((8, 6)).astype(np.float32), "w")
    nodes = [
        oh.make_node("MatMul", ["x", "w"], ["h"]),
        oh.make_node("Relu", ["h"], ["r"]),
        oh.make_node("Softmax", ["r"], ["y"], axis=-1),
        oh.make_node("NonZero", ["r"], ["nz"], name="where_positive"),
    ]
    outputs = [tensor("y", T.FLOAT, [3, 6]), tensor("nz", T.INT64, [2, "n"])]
    src, out = tmp_path / "m.onnx", tmp_path / "m_ctx.onnx"
    src.write_bytes(make_model(nodes, [tensor("x", T.FLOAT, [3, 8])], outputs, [w]))
    monkeypatch.setenv("ORT_MIGRAPHX_DUMP_MODEL_OPS", "1")
    ctx = compile_model(str(src), str(out), embed=True)
    assert "refused  NonZero (where_positive): no parser for ai.onnx::NonZero" in capsys.readouterr().out
    context, plain = ctx.graph.node  # ORT orders them by dependency
    assert (context.domain, context.op_type) == ("com.microsoft", "EPContext")
    assert sorted(context.output) == ["r", "y"]  # r also feeds NonZero
    original = onnx.load(str(src)).graph.node[3]
    assert plain.SerializeToString() == original.SerializeToString()
    assert [o.name for o in ctx.graph.output] == ["y", "nz"]

    x = RNG.standard_normal((3, 8)).astype(np.float32)
    want = session(str(src)).run(None, {"x": x})
    got = session(str(out)).run(None, {"x": x})
    assert recording.counts() == (0, 1)
    for g, w_ in zip(got, want, strict=True):
        assert g.dtype == w_.dtype
        np.testing.assert_array_equal(g, w_)


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

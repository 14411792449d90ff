"""The real EP (not a stub) through stock onnxruntime: placement, fallback, shapes, errors, options."""

from __future__ import annotations

import logging
import os

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper as oh

import migraphx_ep  # noqa: F401 - registers and routes the EP
from conftest import make_model, node_providers, profiled_options, tensor

EP = "MIGraphXExecutionProvider"
RNG = np.random.default_rng(7)


def session(model: bytes, options: dict | None = None, profile: bool = True) -> ort.InferenceSession:
    so = profiled_options() if profile else ort.SessionOptions()
    return ort.InferenceSession(
        model, so, providers=[(EP, {"migraphx_target": "ref", **(options or {})}), "CPUExecutionProvider"]
    )


def cpu(model: bytes, feeds: dict) -> list[np.ndarray]:
    return ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)


def mlp() -> bytes:
    w1 = oh.make_tensor("w1", T.FLOAT, [8, 16], RNG.standard_normal(128).astype(np.float32).tolist())
    w2 = oh.make_tensor("w2", T.FLOAT, [16, 4], RNG.standard_normal(64).astype(np.float32).tolist())
    nodes = [
        oh.make_node("MatMul", ["x", "w1"], ["h"]),
        oh.make_node("Relu", ["h"], ["r"]),
        oh.make_node("MatMul", ["r", "w2"], ["z"]),
        oh.make_node("Softmax", ["z"], ["y"], axis=-1),
    ]
    return make_model(nodes, [tensor("x", T.FLOAT, ["N", 8])], [tensor("y", T.FLOAT, ["N", 4])], [w1, w2])


def test_whole_model_runs_on_the_ep_and_matches_cpu():
    model = mlp()
    s = session(model)
    x = RNG.standard_normal((3, 8)).astype(np.float32)
    np.testing.assert_allclose(s.run(None, {"x": x})[0], cpu(model, {"x": x})[0], rtol=1e-5, atol=1e-6)
    assert set(node_providers(s).values()) == {EP}
    assert s.get_providers()[0] == EP


def test_new_input_shapes_give_right_answers():
    model = mlp()
    s = session(model, profile=False)
    for n in (1, 5, 2, 5):
        x = RNG.standard_normal((n, 8)).astype(np.float32)
        np.testing.assert_allclose(s.run(None, {"x": x})[0], cpu(model, {"x": x})[0], rtol=1e-5, atol=1e-6)


def test_unsupported_node_in_the_middle_falls_back_and_stays_right(caplog):
    # NonZero has a data-dependent output shape: the compiler refuses it, ORT's CPU EP runs it, and the
    # nodes on both sides still run on our EP (two partitions), with the right answer.
    nodes = [
        oh.make_node("Relu", ["x"], ["r"]),
        oh.make_node("NonZero", ["r"], ["nz"]),
        oh.make_node("Cast", ["nz"], ["nzf"], to=T.FLOAT),
        oh.make_node("ReduceSum", ["nzf"], ["s"], keepdims=0),
        oh.make_node("Mul", ["r", "r"], ["m"]),
        oh.make_node("Add", ["m", "s"], ["y"]),
    ]
    model = make_model(nodes, [tensor("x", T.FLOAT, [4, 5])], [tensor("y", T.FLOAT, [4, 5])])
    with caplog.at_level(logging.WARNING, logger="migraphx_ep"):
        s = session(model)
    assert "NonZero x1" in caplog.text  # the refusal is reported, never silent
    x = RNG.standard_normal((4, 5)).astype(np.float32)
    np.testing.assert_allclose(s.run(None, {"x": x})[0], cpu(model, {"x": x})[0], rtol=1e-6)
    providers = node_providers(s)
    assert set(providers.values()) == {EP, "CPUExecutionProvider"}
    assert sum(p == EP for p in providers.values()) == 2  # two fused partitions around NonZero


def test_run_time_error_in_python_surfaces_as_ort_error():
    nodes = [oh.make_node("Gather", ["x", "i"], ["y"], axis=0)]
    model = make_model(
        nodes, [tensor("x", T.FLOAT, [3, 2]), tensor("i", T.INT64, [2])], [tensor("y", T.FLOAT, [2, 2])]
    )
    s = session(model, profile=False)
    x = np.ones((3, 2), np.float32)
    np.testing.assert_array_equal(s.run(None, {"x": x, "i": np.array([0, -1])})[0], x[[0, -1]])
    with pytest.raises(Exception, match=r"MIGraphXExecutionProvider.*IndexError.*out of range"):
        s.run(None, {"x": x, "i": np.array([0, 7])})
    assert s.run(None, {"x": x, "i": np.array([2, 1])})[0].shape == (2, 2)  # the session survives


def test_bad_option_fails_session_creation_with_its_name():
    with pytest.raises(Exception, match=r"migraphx_fp16_enable='maybe'"):
        session(mlp(), {"migraphx_fp16_enable": "maybe"}, profile=False)
    with pytest.raises(Exception, match=r"unknown .*'migraphx_bogus'.*valid options"):
        session(mlp(), {"migraphx_bogus": "1"}, profile=False)


def test_env_var_wins_over_option(monkeypatch):
    monkeypatch.setenv("ORT_MIGRAPHX_TARGET", "gpu")  # option says ref; the env var decides
    with pytest.raises(Exception, match=r"gpu target cannot run"):
        session(mlp(), {"migraphx_target": "ref"}, profile=False)


def test_dump_model_ops_lists_every_node(monkeypatch, capfd):
    monkeypatch.setenv("ORT_MIGRAPHX_DUMP_MODEL_OPS", "1")
    session(mlp(), profile=False)
    out = capfd.readouterr().out
    assert out.count("claimed  partition 0") == 4 and "Softmax" in out


def test_fp16_option_converts_the_program():
    model = mlp()
    x = RNG.standard_normal((4, 8)).astype(np.float32)
    want = cpu(model, {"x": x})[0]
    got = session(model, {"migraphx_fp16_enable": "1"}, profile=False).run(None, {"x": x})[0]
    assert got.dtype == np.float32  # model I/O keeps its types
    np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-3)
    assert not np.array_equal(got, session(model, profile=False).run(None, {"x": x})[0])  # really fp16


def test_save_then_load_compiled_model(tmp_path, caplog):
    path = str(tmp_path / "m.mxr")
    model = mlp()
    x = RNG.standard_normal((2, 8)).astype(np.float32)
    first = session(
        model, {"migraphx_save_compiled_model": "1", "migraphx_save_compiled_path": path}, profile=False
    ).run(None, {"x": x})[0]
    assert os.path.isfile(path)
    with caplog.at_level(logging.INFO, logger="migraphx_ep"):
        again = session(
            model, {"migraphx_load_compiled_model": "1", "migraphx_load_compiled_path": path}, profile=False
        ).run(None, {"x": x})[0]
    assert f"loaded compiled program from {path}" in caplog.text
    np.testing.assert_array_equal(first, again)


def test_compiled_model_for_another_model_is_not_run(tmp_path, caplog):
    path = str(tmp_path / "m.mxr")
    x = RNG.standard_normal((2, 8)).astype(np.float32)
    session(
        mlp(), {"migraphx_save_compiled_model": "1", "migraphx_save_compiled_path": path}, profile=False
    ).run(None, {"x": x})
    other = mlp()  # same structure, different random weights: a different model
    with caplog.at_level(logging.INFO, logger="migraphx_ep"):
        got = session(
            other, {"migraphx_load_compiled_model": "1", "migraphx_load_compiled_path": path}, profile=False
        ).run(None, {"x": x})[0]
    assert "compiled for a different model" in caplog.text and "loaded compiled" not in caplog.text
    np.testing.assert_allclose(got, cpu(other, {"x": x})[0], rtol=1e-5, atol=1e-6)


def test_corrupt_compiled_model_is_reported_and_recompiled(tmp_path, caplog):
    path = tmp_path / "m.mxr"
    path.write_bytes(b"definitely not an mxr file")
    model = mlp()
    x = RNG.standard_normal((2, 8)).astype(np.float32)
    with caplog.at_level(logging.WARNING, logger="migraphx_ep"):
        got = session(
            model,
            {"migraphx_load_compiled_model": "1", "migraphx_load_compiled_path": str(path)},
            profile=False,
        ).run(None, {"x": x})[0]
    assert str(path) in caplog.text and "compiling" in caplog.text
    np.testing.assert_allclose(got, cpu(model, {"x": x})[0], rtol=1e-5, atol=1e-6)


def test_model_cache_dir_second_session_loads(tmp_path, caplog):
    model = mlp()
    x = RNG.standard_normal((3, 8)).astype(np.float32)
    opts = {"migraphx_model_cache_dir": str(tmp_path)}
    a = session(model, opts, profile=False).run(None, {"x": x})[0]
    assert len(list(tmp_path.glob("*.mxr"))) == 1
    with caplog.at_level(logging.INFO, logger="migraphx_ep"):
        b = session(model, opts, profile=False).run(None, {"x": x})[0]
    assert "loaded compiled program" in caplog.text
    np.testing.assert_array_equal(a, b)
    session(model, opts, profile=False).run(None, {"x": np.ones((5, 8), np.float32)})  # new shape: new entry
    assert len(list(tmp_path.glob("*.mxr"))) == 2

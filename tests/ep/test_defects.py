"""Regression tests: NUL bytes in options, explicit device choice without a GPU, save/load of several
programs at one path across sessions, and the example's judgement of fp16/bf16 results."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import migraphx_ep  # noqa: F401 - registers and routes the EP
import migraphx_ep.targets.gpu as gpu
from conftest import load_script
from migraphx_ep.ep.options import SPECS, OptionError, check_provider_options, parse_options
from migraphx_ep.ep.provider import resolve_target
from migraphx_ep.targets import TargetError

EP = "MIGraphXExecutionProvider"
MODELS = os.path.join(os.path.dirname(__file__), "..", "models")
PATH_OPTIONS = [s.key for s in SPECS if s.key and s.parse.__name__ == "_path"]
PATH_ENVS = [s.env for s in SPECS if s.env and s.parse.__name__ == "_path"]


# -- 1. NUL bytes ------------------------------------------------------------------------------------
def test_every_path_option_is_covered():
    assert set(PATH_OPTIONS) == {
        "migraphx_model_cache_dir",
        "migraphx_save_compiled_path",
        "migraphx_load_compiled_path",
        "migraphx_int8_calibration_table_name",
    }
    assert "ORT_MIGRAPHX_MODEL_CACHE_PATH" in PATH_ENVS and len(PATH_ENVS) == 4


@pytest.mark.parametrize("key", PATH_OPTIONS)
def test_nul_in_path_option_is_an_error_naming_it(key):
    for check in (lambda o: parse_options(o, {}), check_provider_options):
        with pytest.raises(OptionError, match=f"{key}=.*NUL"):
            check({key: "cache\0dir"})


@pytest.mark.parametrize("name", [*PATH_ENVS, "ORT_MIGRAPHX_CACHE_PATH"])
def test_nul_in_path_variable_is_an_error_naming_it(name):
    with pytest.raises(OptionError, match=f"{name}=.*NUL"):
        parse_options({}, {name: "cache\0dir"})


def test_nul_in_any_raw_value_or_key_is_an_error():
    # What ORT would cut to a valid '1' or a valid key must be refused while the whole string is at hand.
    with pytest.raises(OptionError, match=r"migraphx_fp16_enable=.*NUL"):
        check_provider_options({"migraphx_fp16_enable": "1\0junk"})
    with pytest.raises(OptionError, match=r"option name .*NUL"):
        check_provider_options({"migraphx_model_cache_dir\0x": "d"})
    with pytest.raises(OptionError, match=r"unknown .*'bogus'"):
        check_provider_options({"bogus": "1"})
    check_provider_options({"fp16_enable": "1", "migraphx_model_cache_dir": "d"})  # fine as given


def test_nul_in_path_option_fails_the_session(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(Exception, match="migraphx_model_cache_dir"):
        ort.InferenceSession(
            os.path.join(MODELS, "resnet.onnx"),
            providers=[(EP, {"migraphx_target": "ref", "migraphx_model_cache_dir": "cache\0dir"})],
        )
    assert not (tmp_path / "cache").exists()


# -- 2. device choice without a GPU ------------------------------------------------------------------
@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(gpu, "gpu_available", lambda device_id=0: "no GPU on this test machine")


@pytest.mark.parametrize(
    "options,env",
    [
        ({"device_id": "0"}, {}),
        ({"device_id": "1"}, {}),
        ({"device_id": 0, "fp16_enable": "1"}, {}),
        ({"device_id": "0"}, {"ORT_MIGRAPHX_TARGET": "auto"}),
    ],
)
def test_explicit_device_id_without_gpu_is_an_error(no_gpu, options, env):
    o = parse_options(options, env)
    assert "device_id" in o.given
    with pytest.raises(TargetError, match=r"device_id=\d was set .*no GPU on this test machine"):
        resolve_target(o)


def test_target_gpu_without_gpu_is_an_error_naming_the_option(no_gpu):
    with pytest.raises(TargetError, match=r"migraphx_target=gpu .*no GPU on this test machine"):
        resolve_target(parse_options({"migraphx_target": "gpu"}, {}))


def test_auto_without_device_id_falls_back_with_a_warning(no_gpu, caplog):
    o = parse_options({}, {})
    assert "device_id" not in o.given
    with caplog.at_level(logging.WARNING, logger="migraphx_ep"):
        assert resolve_target(o) == "ref"
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
    assert "no GPU on this test machine" in caplog.text and "ref target" in caplog.text
    assert resolve_target(parse_options({"device_id": "0", "migraphx_target": "ref"}, {})) == "ref"


def test_explicit_device_id_fails_the_session(no_gpu):
    with pytest.raises(Exception, match=r"device_id=0 was set"):
        ort.InferenceSession(
            os.path.join(MODELS, "resnet.onnx"), providers=[(EP, {"device_id": 0}), "CPUExecutionProvider"]
        )


# -- 3. several programs saved at one path -----------------------------------------------------------
def test_one_path_keeps_every_program_across_sessions(tmp_path, recording, caplog):
    path = str(tmp_path / "m.mxr")
    opts = {
        "migraphx_target": "ref",
        "migraphx_save_compiled_model": "1",
        "migraphx_save_compiled_path": path,
        "migraphx_load_compiled_model": "1",
        "migraphx_load_compiled_path": path,
    }
    model = os.path.join(MODELS, "resnet.onnx")  # pixel_values [batch, 3, 32, 32]
    cpu = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)

    def session_runs(*batches: int) -> tuple[int, int]:
        s = ort.InferenceSession(model, providers=[(EP, opts), "CPUExecutionProvider"])
        for b in batches:
            x = rng.standard_normal((b, 3, 32, 32)).astype(np.float32)
            want = cpu.run(None, {"pixel_values": x})[0]
            np.testing.assert_allclose(s.run(None, {"pixel_values": x})[0], want, rtol=1e-4, atol=1e-5)
        compiled = recording.eps[-1].compiled
        return sum(c.compiles for c in compiled), sum(c.loads for c in compiled)

    assert session_runs(1, 2) == (2, 0)
    assert session_runs(3) == (1, 0)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="migraphx_ep"):
        assert session_runs(1) == (0, 1)  # b1 is still there: loaded, nothing compiled
    assert "compiled for a different model" not in caplog.text
    assert "m.mxr" in os.listdir(tmp_path) and len(os.listdir(tmp_path)) == 3  # the path + 2 siblings
    assert session_runs(2, 3, 1) == (0, 3)


# -- 5. examples/run_model.py in low precision ---------------------------------------------------------
EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "run_model.py")


def example(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, EXAMPLE, "--runs", "1", *args], capture_output=True, text=True, timeout=600
    )


@pytest.mark.parametrize(
    "model,option",
    [("bert_fp16.onnx", None), ("vit_fp16.onnx", None), ("bert.onnx", "migraphx_bf16_enable=1")],
)
def test_example_judges_low_precision_against_a_float32_reference(model, option):
    r = example("--model", os.path.join(MODELS, model), *(["--option", option] if option else []))
    assert r.returncode == 0 and "-> MATCH" in r.stdout, r.stdout + r.stderr
    assert "low precision" in r.stdout


def test_example_option_without_value_is_an_argparse_error():
    r = example("--option", "migraphx_fp16_enable")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "argument --option" in r.stderr and "'migraphx_fp16_enable'" in r.stderr
    r = example("--option", "migraphx_fp17_enable=1")
    assert r.returncode == 2 and "migraphx_fp17_enable" in r.stderr and "Traceback" not in r.stderr


def test_example_low_precision_judge_still_catches_wrong_numbers():
    mod = load_script(EXAMPLE, "run_model_example")
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((4, 16)).astype(np.float32)
    cpu = (ref + 1e-3 * rng.standard_normal(ref.shape)).astype(np.float16)  # an fp16 model's own error
    ok, _ = mod.judge_low([cpu.copy()], [cpu], [ref], onnx.TensorProto.FLOAT16)
    assert ok
    wrong = cpu.copy()
    wrong[1, 3] += 0.25  # one value off by a quarter: never a MATCH
    ok, text = mod.judge_low([wrong], [cpu], [ref], onnx.TensorProto.FLOAT16)
    assert not ok and "output 0" in text
    ok, _ = mod.judge_low([ref + 0.2], [ref], None, onnx.TensorProto.BFLOAT16)  # fp32 model, bf16 inside
    assert not ok
    nan = cpu.copy()
    nan[0, 0] = np.nan
    assert not mod.judge_low([nan], [cpu], [ref], onnx.TensorProto.FLOAT16)[0]

"""Compiled-model compatibility: the string ORT stores in our EPContext models and the factory's verdict on
it, through ORT's Python API, ORT's C API (a C++ host: the route on which ORT 1.32 checks it before a
session loads the model) and our decision table directly."""

from __future__ import annotations

import subprocess
from pathlib import Path

import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper as oh
from test_epcontext import REF, compile_model, mlp

import migraphx_ep
from conftest import make_model, tensor
from migraphx_ep.ep import bridge, compat
from migraphx_ep.ep.compat import Compatibility, Info, InfoError, Machine
from migraphx_ep.ep.options import parse_options
from test_cpp_host import BARE_ENV, _model, host  # noqa: F401 - host is a fixture

C = ort.capi._pybind_state
EP = "MIGraphXExecutionProvider"
KEY = f"ep_compatibility_info.{EP}"
VERSION = migraphx_ep.__version__
OPTIONS = compat.options_digest(parse_options(REF), "ref")


@pytest.fixture
def no_gpu(monkeypatch):
    """This machine as CI has it, whatever it really has: the gpu target unusable."""
    monkeypatch.setenv("MIGRAPHX_EP_DISABLE_GPU", "1")


def verdict(info: str) -> Compatibility:
    devices = [d for d in ort.get_ep_devices() if d.ep_name == EP]
    return Compatibility(int(C.get_model_compatibility_for_ep_devices(devices, info)))


def test_compiled_model_stores_our_string_and_it_is_optimal_here(tmp_path, no_gpu):
    src, out = tmp_path / "m.onnx", tmp_path / "m_ctx.onnx"
    src.write_bytes(mlp())
    ctx = compile_model(str(src), str(out), embed=True)
    info = {p.key: p.value for p in ctx.metadata_props}[KEY]
    assert info == f"{EP};format=1;version={VERSION};target=ref;options={OPTIONS}"
    assert C.get_compatibility_info_from_model(str(out), EP) == info
    assert verdict(info) == Compatibility.EP_SUPPORTED_OPTIMAL


def test_other_options_give_another_digest():
    assert compat.options_digest(parse_options({**REF, "migraphx_fp16_enable": "1"}), "ref") != OPTIONS
    # GPU-only options do not change a ref program; on the gpu target they do.
    tf32 = parse_options({**REF, "migraphx_tf32_enable": "0"})
    assert compat.options_digest(tf32, "ref") == OPTIONS
    assert compat.options_digest(tf32, "gpu") != compat.options_digest(parse_options(REF), "gpu")


def test_no_string_for_a_model_without_nodes_of_ours(tmp_path):
    src = tmp_path / "nz.onnx"
    nz = [oh.make_node("NonZero", ["x"], ["y"])]
    src.write_bytes(make_model(nz, [tensor("x", T.FLOAT, [3, 4])], [tensor("y", T.INT64, [2, None])]))
    ctx = compile_model(str(src), str(tmp_path / "nz_ctx.onnx"), embed=True)
    assert KEY not in {p.key for p in ctx.metadata_props}


def test_a_failing_string_is_logged_and_the_model_still_written(tmp_path, monkeypatch, capfd):
    from migraphx_ep.ep import provider

    def broken(self) -> str:
        raise RuntimeError("no string today")

    monkeypatch.setattr(provider.MIGraphXEp, "compatibility_info", broken)
    src, out = tmp_path / "m.onnx", tmp_path / "m_ctx.onnx"
    src.write_bytes(mlp())
    ctx = compile_model(str(src), str(out), embed=True)
    assert KEY not in {p.key for p in ctx.metadata_props}
    assert [n.op_type for n in ctx.graph.node] == ["EPContext"]
    assert "GetCompiledModelCompatibilityInfo: RuntimeError: no string today" in capfd.readouterr().err


@pytest.mark.parametrize(
    ("info", "want", "why"),
    [
        (f"version=0.0.9;target=ref;options={OPTIONS}", "PREFER_RECOMPILATION", "made by migraphx-ep 0.0.9"),
        (f"version=99.0;target=ref;options={OPTIONS}", "PREFER_RECOMPILATION", "made by migraphx-ep 99.0"),
        (f"version={VERSION};target=ref;options=0123456789abcdef", "OPTIMAL", ""),  # the session's to judge
        (f"version={VERSION};target=gpu;arch=sm_90;options={OPTIONS}", "UNSUPPORTED", "no usable GPU"),
    ],
)
def test_verdicts_through_ort(no_gpu, caplog, info, want, why):
    assert (
        verdict(f"{EP};format=1;{info}").name == f"EP_{'SUPPORTED_' if want != 'UNSUPPORTED' else ''}{want}"
    )
    assert why in caplog.text


@pytest.mark.parametrize(
    "info",
    [
        "",
        "junk",
        EP,
        f"{EP};",
        f"OtherEP;format=1;version={VERSION};target=ref;options={OPTIONS}",
        f"{EP};format=2;version={VERSION};target=ref;options={OPTIONS}",
        f"{EP};format=1;version={VERSION};target=ref",
        f"{EP};format=1;version={VERSION};target=ref;options={OPTIONS};options={OPTIONS}",
        f"{EP};format=1;version={VERSION};target=ref;arch=sm_90;options={OPTIONS}",
        f"{EP};format=1;version={VERSION};target=gpu;options={OPTIONS}",
        f"{EP};format=1;version={VERSION};target=npu;options={OPTIONS}",
        f"{EP};format=1;version={VERSION};target=ref;options=XYZ",
        f"{EP};format=1;version=1 0;target=ref;options={OPTIONS}",
        f"{EP};format=1;version={VERSION};target=ref;options={OPTIONS};color=blue",
        f"{EP};format=1;version={VERSION};target=ref;options={OPTIONS};" + "x" * 5000,
        f"{EP};format=1;version=\u00e9\u4e2d;target=ref;options={OPTIONS}",
    ],
)
def test_unreadable_strings_are_unsupported(no_gpu, caplog, info):
    assert verdict(info) == Compatibility.EP_UNSUPPORTED
    assert "unreadable compatibility info" in caplog.text


def test_bytes_that_are_not_utf8_are_unsupported(caplog):
    assert compat.validate(b"\xffMIGraphX\xfe") == Compatibility.EP_UNSUPPORTED
    assert "not UTF-8" in caplog.text


class _Judge:
    """A backend with a say on compatibility strings: a fixed answer, or an exception."""

    def __init__(self, answer: object) -> None:
        self.answer = answer

    def validate_compatibility(self, info: bytes) -> int:
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer  # type: ignore[return-value]


def test_the_verdict_comes_from_the_backend(stub):
    # A backend without validate_compatibility (the test stub) has no opinion.
    assert verdict("anything") == Compatibility.EP_NOT_APPLICABLE
    try:
        bridge.set_backend(_Judge(2))
        assert verdict("anything") == Compatibility.EP_SUPPORTED_PREFER_RECOMPILATION
        # A verdict that cannot be reached is an error status naming why, never a guess.
        bridge.set_backend(_Judge(7))
        with pytest.raises(Exception, match=r"validate_compatibility returned 7, not an OrtCompiledModel"):
            verdict("anything")
        bridge.set_backend(_Judge(RuntimeError("judge unavailable")))
        with pytest.raises(Exception, match=r"ValidateCompiledModelCompatibilityInfo: .*judge unavailable"):
            verdict("anything")
    finally:
        bridge.set_backend(None)


GPU90 = Machine(VERSION, "gpu", ("sm_90",))


@pytest.mark.parametrize(
    ("info", "here", "want", "why"),
    [
        (Info(VERSION, "gpu", OPTIONS, "sm_90"), GPU90, "EP_SUPPORTED_OPTIMAL", ""),
        (Info(VERSION, "ref", OPTIONS), Machine(VERSION, "ref", (), "no driver"), "EP_SUPPORTED_OPTIMAL", ""),
        (Info(VERSION, "ref", OPTIONS), Machine(VERSION, "ref", ("sm_90",)), "EP_SUPPORTED_OPTIMAL", ""),
        (
            Info(VERSION, "gpu", OPTIONS, "sm_80"),
            GPU90,
            "PREFER_RECOMPILATION",
            "sm_80, this machine has sm_90",
        ),
        (
            Info(VERSION, "gpu", OPTIONS, "sm_90"),
            Machine(VERSION, "gpu", ("sm_90", "sm_80")),
            "PREFER_RECOMPILATION",
            "compiled for sm_90, this machine has sm_80",
        ),
        (
            Info(VERSION, "ref", OPTIONS),
            GPU90,
            "PREFER_RECOMPILATION",
            "ref target (CPU), and this machine has",
        ),
        (
            Info(VERSION, "gpu", OPTIONS, "sm_90"),
            Machine(VERSION, "ref", ("sm_90",)),
            "PREFER_RECOMPILATION",
            "ORT_MIGRAPHX_TARGET=ref here",
        ),
        (
            Info("0.0.1", "gpu", OPTIONS, "sm_80"),
            GPU90,
            "PREFER_RECOMPILATION",
            "made by migraphx-ep 0.0.1, this is " + VERSION + "; compiled for sm_80",
        ),
        (
            Info(VERSION, "gpu", OPTIONS, "sm_90"),
            Machine(VERSION, "ref", (), "no driver"),
            "EP_UNSUPPORTED",
            "no usable GPU: no driver",
        ),
    ],
)
def test_decision_table(info, here, want, why):
    got, reason = compat.decide(str(info), here)
    assert got.name.endswith(want) and why in reason
    assert compat.parse(str(info)) == info


def test_parse_names_what_is_wrong():
    with pytest.raises(InfoError, match=r"format '7'; this package reads format 1"):
        compat.parse(f"{EP};format=7;version=1;target=ref;options={OPTIONS}")
    with pytest.raises(InfoError, match=r"lacks arch"):
        compat.parse(f"{EP};format=1;version=1;target=gpu;options={OPTIONS}")


# -- ORT's C API checks the string before a session loads the model --------------------------------
def _host(exe: Path, model: Path) -> tuple[int, str]:
    proc = subprocess.run(
        [str(exe), migraphx_ep.get_library_path(), str(model), "migraphx_target=ref"],
        capture_output=True,
        text=True,
        env={**BARE_ENV, "MIGRAPHX_EP_DISABLE_GPU": "1"},
        cwd=model.parent,
        timeout=300,
    )
    return proc.returncode, proc.stdout + proc.stderr


def test_c_api_session_creation_checks_the_string(host, tmp_path):  # noqa: F811 - the fixture
    compiled = tmp_path / "m_ctx.onnx"
    ctx = compile_model(str(_model(tmp_path / "m.onnx")), str(compiled), embed=True)
    info = {p.key: p.value for p in ctx.metadata_props}[KEY]

    def load(name: str, value: str) -> tuple[int, str]:
        for p in ctx.metadata_props:
            if p.key == KEY:
                p.value = value
        onnx.save(ctx, str(tmp_path / name))
        return _host(host, tmp_path / name)

    # The host runs the model on our EP, then on ORT's CPU EP alone, which cannot run an EPContext node:
    # "claimed_by" says our session was made and ran.
    rc, log = load("same.onnx", info)
    assert "claimed_by=MIGraphXExecutionProvider" in log, log
    rc, log = load("old.onnx", info.replace(f"version={VERSION}", "version=0.0.9"))
    assert "claimed_by=MIGraphXExecutionProvider" in log, log
    assert "compiled model EP_SUPPORTED_PREFER_RECOMPILATION: made by migraphx-ep 0.0.9" in log
    assert "reports compiled model is supported but suboptimal" in log  # ORT's warning

    rc, log = load("gpu.onnx", info.replace("target=ref", "target=gpu;arch=sm_90"))
    assert rc == 2 and "claimed_by" not in log, log
    assert "error=CreateSession: Compiled model is not supported by execution provider: " + EP in log
    assert (
        "compiled model EP_UNSUPPORTED: compiled for the gpu target (sm_90), and this machine has no " in log
    )
    rc, log = load("junk.onnx", "junk")
    assert rc == 2 and "Compiled model is not supported by execution provider" in log, log
    assert "unreadable compatibility info: it starts with 'junk'" in log


class _FakeDriver:
    """cuda.bindings.driver as far as compat._gpu_archs uses it: devices with compute capabilities."""

    class CUdevice_attribute:  # noqa: N801 - the binding's name
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = "major"
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = "minor"

    def __init__(self, *ccs: tuple[int, int]) -> None:
        self.ccs = ccs

    def cuDeviceGet(self, ordinal: int) -> tuple[int, int]:  # noqa: N802
        return 0, ordinal

    def cuDeviceGetAttribute(self, attr: str, dev: int) -> tuple[int, int]:  # noqa: N802
        return 0, self.ccs[dev][0 if attr == "major" else 1]


def test_this_machine_reads_every_gpus_architecture(monkeypatch):
    import migraphx_ep.targets.gpu as gpu
    from migraphx_ep.targets.gpu import cuda

    monkeypatch.delenv("ORT_MIGRAPHX_TARGET", raising=False)
    monkeypatch.setattr(gpu, "gpu_available", lambda device_id=0: None)
    monkeypatch.setattr(cuda, "cu", _FakeDriver((9, 0), (8, 6)))
    monkeypatch.setattr(cuda, "device_count", lambda: 2)
    assert compat.this_machine() == Machine(VERSION, "gpu", ("sm_90", "sm_86"))
    monkeypatch.setenv("ORT_MIGRAPHX_TARGET", "ref")  # every session here compiles for ref
    assert compat.this_machine() == Machine(VERSION, "ref", ("sm_90", "sm_86"))
    monkeypatch.setattr(gpu, "gpu_available", lambda device_id=0: "no driver here")
    assert compat.this_machine() == Machine(VERSION, "ref", (), "no driver here")


def test_a_gpu_session_names_its_gpus_architecture(monkeypatch):
    from migraphx_ep.targets.gpu import cuda

    class Device:
        arch = "sm_89"

    monkeypatch.setattr(cuda.Device, "get", classmethod(lambda cls, device_id=0: Device()))
    opts = parse_options({"device_id": "0"})
    info = compat.session_info(opts, "gpu")
    assert str(info) == f"{EP};format=1;version={VERSION};target=gpu;arch=sm_89;options={info.options}"
    assert compat.parse(str(info)) == info

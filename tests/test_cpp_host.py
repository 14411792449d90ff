"""A C++ program with no Python in it runs a model on our EP through ORT's plugin route
(tests/cpp/host.cpp): the plugin starts the interpreter itself (csrc/python_host.cpp). The host is
compiled here with the system C++ compiler (a C++17 compiler is a platform requirement, see README)
against the ORT headers the library was built with, and linked to the onnxruntime wheel's library."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import onnx
import onnx.numpy_helper as nh
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP
from onnx import helper as oh

import migraphx_ep
from migraphx_ep import _C

ROOT = Path(__file__).resolve().parents[1]
# A host process without Python: none of the interpreter's variables, no venv, no loader paths.
BARE_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C"}


def _ort_include_dir() -> str:
    candidates = [_C.build_info()["ort_include_dir"], os.environ.get("ONNXRUNTIME_INCLUDE_DIR", "")]
    candidates += sorted(glob.glob(str(ROOT / "build/*/_ort_headers/x/usr/include/onnxruntime")))
    for d in candidates:
        if d and os.path.isfile(os.path.join(d, "onnxruntime_c_api.h")):
            return d
    pytest.fail(f"no ONNX Runtime C headers found (tried {candidates}); rebuild migraphx_ep")


def _compiler() -> str:
    for name in (os.environ.get("CXX", ""), "c++", "g++", "clang++"):
        if name and shutil.which(name):
            return shutil.which(name)  # type: ignore[return-value]
    pytest.fail("no C++ compiler (CXX, c++, g++ or clang++): the README requires a C++17 compiler")


@pytest.fixture(scope="module")
def host(tmp_path_factory) -> Path:
    if not _C.build_info()["python_library"]:
        pytest.skip("this build links no libpython (statically linked interpreter): C/C++ hosts unsupported")
    out = tmp_path_factory.mktemp("cpp_host")
    # The wheel ships libonnxruntime.so.1.X.Y only; its soname is libonnxruntime.so.1.
    libs = sorted(glob.glob(os.path.join(os.path.dirname(ort.__file__), "capi", "libonnxruntime.so.*")))
    assert libs, f"the onnxruntime wheel at {os.path.dirname(ort.__file__)} has no libonnxruntime.so.*"
    lib = Path(libs[0])
    soname = out / ("libonnxruntime.so." + ort.__version__.split(".")[0])
    soname.symlink_to(lib)
    exe = out / "host"
    cmd = [_compiler(), "-std=c++17", "-O1", "-Wall", "-Wextra", "-I", _ort_include_dir()]
    cmd += [str(ROOT / "tests/cpp/host.cpp"), str(soname), f"-Wl,-rpath,{out}", "-o", str(exe)]
    built = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, f"{' '.join(cmd)}\n{built.stderr}"
    assert "warning" not in built.stderr, built.stderr
    return exe


def _model(path: Path) -> Path:
    nodes = [
        oh.make_node("Add", ["x", "b"], ["a"]),
        oh.make_node("Relu", ["a"], ["r"]),
        oh.make_node("Mul", ["r", "w"], ["m"]),
        oh.make_node("Sigmoid", ["m"], ["y"]),
    ]
    inits = [
        nh.from_array(np.linspace(-1, 1, 8).astype(np.float32), "b"),
        nh.from_array(np.full(8, 1.5, np.float32), "w"),
    ]
    graph = oh.make_graph(
        nodes,
        "cpp_host",
        [oh.make_tensor_value_info("x", TP.FLOAT, [4, 8])],
        [oh.make_tensor_value_info("y", TP.FLOAT, [4, 8])],
        inits,
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def _run(host: Path, library: str, model: Path, *options: str) -> tuple[int, dict[str, str], str]:
    proc = subprocess.run(
        [str(host), library, str(model), *options],
        capture_output=True,
        text=True,
        env=BARE_ENV,
        cwd=model.parent,
        timeout=300,
    )
    fields = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)
    return proc.returncode, fields, proc.stdout + proc.stderr


def test_cpp_host_without_python_runs_model_on_our_ep(host, tmp_path):
    model = _model(tmp_path / "m.onnx")
    rc, out, log = _run(host, migraphx_ep.get_library_path(), model, "migraphx_target=ref")
    assert rc == 0, log
    assert out["ort_version"] == ort.__version__
    assert out["ep_device"] == "MIGraphXExecutionProvider vendor=migraphx-ep"
    assert out["claimed_by"] == "MIGraphXExecutionProvider"  # the session refused any CPU fallback
    assert out["elements"] == "32" and float(out["max_abs_diff"]) <= 1e-6, log
    assert out["unregistered"] == "1"


def test_cpp_host_gets_a_clear_error_when_the_package_is_missing(host, tmp_path):
    # The library alone, without the migraphx_ep package beside it: CreateEpFactories must say so.
    lonely = tmp_path / "site" / "migraphx_ep" / Path(migraphx_ep.get_library_path()).name
    lonely.parent.mkdir(parents=True)
    shutil.copy(migraphx_ep.get_library_path(), lonely)
    rc, out, log = _run(host, str(lonely), _model(tmp_path / "m.onnx"))
    assert rc == 3, log  # an OrtStatus from RegisterExecutionProviderLibrary, not a crash
    assert "cannot run Python in this process" in out["register_error"], log
    assert "cannot import migraphx_ep" in out["register_error"] and "migraphx_ep.ep" in log

#!/usr/bin/env bash
# Creates .venv (if missing) and installs migraphx-ep into it, building the C++ shell.
# Everything comes from the project's own files: PyPI for Python packages, Debian's archive for the
# ONNX Runtime C headers (see cmake/fetch_ort_headers.sh). Sourced by run_example.sh and run_tests.sh.
#
# The build runs without pip's build isolation, against build tools installed in the venv itself: the
# CMake tree under build/ then sees the same compiler, Python and pybind11 paths every time, so a re-run
# rebuilds nothing in csrc/ unless a file there changed (an isolated build gets a fresh temporary
# pybind11 each time, and CMake rebuilds everything).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${MIGRAPHX_EP_VENV:-.venv}
PY=${PYTHON:-python3}
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip
# The build backend's requirements (pyproject.toml [build-system]); CMake from PyPI only when
# the machine has none.
build_tools=("scikit-build-core>=0.10" "pybind11>=2.13")
command -v cmake >/dev/null 2>&1 || build_tools+=(cmake)
"$VENV/bin/python" -m pip install -q "${build_tools[@]}"
"$VENV/bin/python" -m pip install -q --no-build-isolation ".[test]"

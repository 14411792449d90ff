#!/usr/bin/env bash
# Creates .venv (if missing) and installs migraphx-ep into it, building the C++ shell.
# Everything comes from the project's own files: PyPI for Python packages, Debian's archive for the
# ONNX Runtime C headers (see cmake/fetch_ort_headers.sh). Sourced by run_example.sh and run_tests.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${MIGRAPHX_EP_VENV:-.venv}
PY=${PYTHON:-python3}
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q ".[test]"

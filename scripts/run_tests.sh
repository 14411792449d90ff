#!/usr/bin/env bash
# Set up, then run the whole test suite (GPU tests skip where no GPU exists). Extra args go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# Run from a directory where ./src is not importable so the *installed* package (with its native
# library) is the one under test.
exec "${MIGRAPHX_EP_VENV:-.venv}/bin/python" -m pytest -q "$@"

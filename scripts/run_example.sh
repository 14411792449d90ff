#!/usr/bin/env bash
# The main job: set up, then run an example model through ORT with MIGraphXExecutionProvider
# (ref target where there is no GPU) and compare with ORT's CPU EP. Extra args go to the example.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec "${MIGRAPHX_EP_VENV:-.venv}/bin/python" examples/run_model.py "$@"

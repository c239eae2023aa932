#!/usr/bin/env bash
# The prepared device check (docs/gpu.md): bash bench/gpu_check.sh --out DIR [--device cuda|cpu] [--compile blocks|model|none]
# Runs from the repo root with the repo on PYTHONPATH: nothing to install.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}" exec "${PYTHON:-python3}" -m bench.gpu_check "$@"

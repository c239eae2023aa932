#!/usr/bin/env bash
# DeepSpeed for the device check's zero2 rows, as wheels the GPU machine can unpack without pip or a
# network (docs/gpu.md): bash bench/make_wheelhouse.sh [DIR]   (default: bench/wheelhouse, ~9 MB)
# Needs the registry (here, not on the GPU machine) and this venv's torch, which DeepSpeed's setup.py
# imports to build its wheel (ops are built just in time on the GPU, never here: DS_BUILD_OPS=0).
# The binary wheels are the GPU image's: CPython 3.12, Linux x86_64. Versions: those the CPU tests run.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT="${1:-bench/wheelhouse}"
PY="${PYTHON:-python3}"
mkdir -p "$OUT"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
"$PY" -m pip download -q --no-deps -d "$TMP" deepspeed==0.19.8
DS_BUILD_OPS=0 "$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$OUT" "$TMP"/deepspeed-0.19.8.tar.gz
# DeepSpeed's requirements that the GPU image lacks (torch, numpy, tqdm, packaging are there)
"$PY" -m pip download -q --no-deps -d "$OUT" --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
  hjson==3.1.0 py-cpuinfo==9.0.0 msgpack==1.2.4 ninja==1.13.2 einops==0.8.2 psutil==7.2.2 \
  pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 typing-extensions==4.16.0
ls -l "$OUT"

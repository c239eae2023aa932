#!/usr/bin/env bash
# Tiny-model validation loss after the same number of steps: adamw, muon_moonlight, orscale_lm,
# 3 seeds each, same peak LR and schedule (configs/tiny.yaml). Prints the comparison table.
#   bench/bench_tiny_optimizers.sh [extra key=value ...]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-runs/bench-tiny}
for optim in adamw muon_moonlight orscale_lm; do
  for seed in 1 2 3; do
    python train.py --config configs/tiny.yaml optim.name=$optim train.seed=$seed \
      run.dir=$out/$optim-s$seed run.resume=none run.overwrite=true train.progress=false "$@" >/dev/null
  done
done
python -m launch.compare $out/*

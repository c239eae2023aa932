#!/usr/bin/env bash
# One node, N processes (default: every visible GPU).
#   launch/torchrun.sh configs/125m.yaml optim.name=orscale_lm parallel.backend=fsdp
set -euo pipefail
config=${1:?usage: launch/torchrun.sh CONFIG [key=value ...]}; shift
nproc=${NPROC:-$(python -c 'import torch; print(max(torch.cuda.device_count(), 1))')}
exec torchrun --standalone --nproc_per_node="$nproc" "$(dirname "$0")/../train.py" --config "$config" "$@"

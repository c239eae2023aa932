#!/usr/bin/env bash
# One node, N processes (default: every visible GPU), through python -m launch.launcher (torchrun with a
# clean preemption path: SIGTERM -> checkpoint -> exit 0).
#   launch/scripts/torchrun.sh configs/125m.yaml optim.name=orscale_lm parallel.backend=fsdp
set -euo pipefail
config=${1:?usage: launch/scripts/torchrun.sh CONFIG [key=value ...]}; shift
nproc=${NPROC:-$(python -c 'import torch; print(max(torch.cuda.device_count(), 1))')}
cd "$(dirname "$0")/../.."
exec python -m launch.launcher --standalone --nproc_per_node="$nproc" train.py --config "$config" "$@"

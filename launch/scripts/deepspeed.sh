#!/usr/bin/env bash
# The DeepSpeed launcher (one node, or a hostfile for many): ZeRO-1/2 runs.
#   launch/scripts/deepspeed.sh configs/125m.yaml parallel.backend=zero1 optim.name=orscale_lm
#   HOSTFILE=hosts.txt launch/scripts/deepspeed.sh configs/1.1b.yaml parallel.backend=zero2
set -euo pipefail
config=${1:?usage: launch/scripts/deepspeed.sh CONFIG [key=value ...]}; shift
hostfile_args=()
[ -n "${HOSTFILE:-}" ] && hostfile_args=(--hostfile "$HOSTFILE")
nproc=${NPROC:-$(python -c 'import torch; print(max(torch.cuda.device_count(), 1))')}
exec deepspeed "${hostfile_args[@]}" --num_gpus "$nproc" "$(dirname "$0")/../../train.py" --config "$config" "$@"

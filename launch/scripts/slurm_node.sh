#!/usr/bin/env bash
# One node's part of a multi-node Slurm job: `srun` runs it once per node (launch/scripts/slurm.sbatch,
# and the jobs `python -m launch.sweep --submit` writes), from the project root. It starts torchrun
# (python -m launch.launcher) with one worker per GPU of this node, the task's CPUs shared among them.
#   bash launch/scripts/slurm_node.sh TORCHRUN_ARGS... train.py --config CONFIG [key=value ...]
# Workers: $ORSCALE_NPROC when set, else the GPUs Slurm gave this node ($SLURM_GPUS_ON_NODE; else the
# count in $SLURM_GPUS_PER_NODE: "4", "gpu:4", "a100:4", "a100:2,v100:2"), else those nvidia-smi lists.
# Threads per worker ($OMP_NUM_THREADS when unset): the task's CPUs ($SLURM_CPUS_PER_TASK) / workers.
set -euo pipefail
node=${SLURMD_NODENAME:-$(hostname)}
workers=${ORSCALE_NPROC:-${SLURM_GPUS_ON_NODE:-}}
if [ -z "$workers" ] && [ -n "${SLURM_GPUS_PER_NODE:-}" ]; then
  workers=0
  IFS=, read -ra kinds <<< "$SLURM_GPUS_PER_NODE"
  for kind in "${kinds[@]}"; do
    count=${kind##*:}
    case $count in '' | *[!0-9]*) workers="SLURM_GPUS_PER_NODE=$SLURM_GPUS_PER_NODE"; break ;; esac
    workers=$((workers + count))
  done
fi
if [ -z "$workers" ] && command -v nvidia-smi > /dev/null; then
  workers=$(nvidia-smi -L | grep -c '^GPU ' || true)
fi
case $workers in
  '' | 0 | *[!0-9]*)
    echo "error: $node: no GPU count for this node (SLURM_GPUS_ON_NODE, SLURM_GPUS_PER_NODE and nvidia-smi" \
      "give ${workers:-none}); submit with --gpus-per-node=N, or set ORSCALE_NPROC=N workers per node" >&2
    exit 2
    ;;
esac
cpus=${SLURM_CPUS_PER_TASK:-$(nproc)}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$((cpus / workers > 0 ? cpus / workers : 1))}
exec python -m launch.launcher --nproc_per_node="$workers" "$@"

"""torchrun, with a signal path that lets preempted runs end cleanly.

    python -m launch.launcher --nproc_per_node=8 train.py --config configs/125m.yaml
    (any torchrun arguments; launch/scripts/torchrun.sh and launch/scripts/slurm.sbatch use it)

Plain torchrun turns SIGTERM into an exception: it signals its workers, kills them 30 s later
whatever they are doing (a checkpoint of a large model takes longer) and exits 1. Here torchrun
ignores SIGTERM/SIGINT; this launcher forwards them to the workers, which finish their step, save
a checkpoint and exit 0, and torchrun then exits 0 with them. A second signal kills everything.
When Slurm signals every process of the step, the workers get it directly and torchrun ignores it.
If this launcher is killed outright, torchrun goes with it (parent-death signal), and the workers
go with torchrun (train.py asks for the same). torchrun runs through `launch/launcher/torchrun.py`,
which keeps its traceback out of the way when a worker stopped on a one-line user error.
"""

from __future__ import annotations

import signal
import subprocess
import sys

from launch.launcher.parent_death import ask_for_death_signal


def _die_with_parent() -> None:
    """In the child, before exec: SIGKILL when this launcher dies; ignore the stop signals."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    ask_for_death_signal()


def main(argv: list[str] | None = None) -> int:
    import psutil

    argv = sys.argv[1:] if argv is None else argv
    # torchrun handles SIGHUP/SIGQUIT as usual but leaves SIGTERM/SIGINT alone (ignored, see above).
    proc = subprocess.Popen(
        [sys.executable, "-m", "launch.launcher.torchrun", "--signals-to-handle=SIGHUP,SIGQUIT", *argv],
        preexec_fn=_die_with_parent,
    )
    received = 0

    def forward(signum: int, frame) -> None:
        nonlocal received
        received += 1
        try:
            workers = psutil.Process(proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return
        for worker in workers:
            try:
                worker.send_signal(signal.SIGTERM if received == 1 else signal.SIGKILL)
            except psutil.NoSuchProcess:
                pass
        if received > 1:
            proc.kill()

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    return proc.wait()

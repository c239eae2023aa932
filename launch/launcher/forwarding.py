"""torchrun, with a signal path that lets preempted runs end cleanly (docs/running.md, "SIGTERM to `torchrun`"):

    python -m launch.launcher --nproc_per_node=8 train.py --config configs/125m.yaml   # any torchrun arguments

Plain torchrun kills its workers 30 s after SIGTERM whatever they are doing (a large checkpoint takes longer). Here
torchrun ignores SIGTERM/SIGINT and this launcher forwards them to the workers, which save and exit 0; a second
signal kills everything; when Slurm signals every process of the step, the workers get it directly. If this launcher
is killed outright, torchrun goes with it (parent-death signal), and the workers go with torchrun. torchrun runs
through `launch/launcher/torchrun.py` (quiet after a user error).
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys

from launch.launcher.parent_death import ask_for_death_signal


def _die_with_parent() -> None:
    """In the child, before exec: SIGKILL when this launcher dies; ignore the stop signals."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    ask_for_death_signal()


def _asks_for_help(argv: list[str]) -> bool:
    """`-h`/`--help` among the launcher's own arguments (before the training script and its arguments)."""
    for arg in argv:
        if arg in ("-h", "--help"):
            return True
        if not arg.startswith("-"):
            return False
    return False


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if _asks_for_help(argv):  # answered here: torchrun's own help would import torch first (seconds)
        print(f"usage: python -m launch.launcher [torchrun's arguments] SCRIPT [ARGS ...]\n\n{__doc__.strip()}")
        print("\ntorchrun's arguments: python -m torch.distributed.run --help")
        return 0
    import psutil

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
            with contextlib.suppress(psutil.NoSuchProcess):
                worker.send_signal(signal.SIGTERM if received == 1 else signal.SIGKILL)
        if received > 1:
            proc.kill()

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    return proc.wait()

"""Launching, in one place: `python -m launch.launcher` (`forwarding`: torchrun with SIGTERM forwarded
to the workers, so a preempted run saves and exits 0), the torchrun it starts (`torchrun`: quiet after
a one-line user error), and a worker dying with its launcher (`parent_death`, which train.py calls
before its heavy imports: this package imports nothing heavy). The scripts for one node and for Slurm
are `launch/scripts/`."""

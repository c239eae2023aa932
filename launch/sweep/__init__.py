"""Sweeps (`python -m launch.sweep SWEEP.yaml`): the sweep file (`spec`), running cells locally or
as Slurm jobs (`jobs`), and the command line (`__main__`)."""

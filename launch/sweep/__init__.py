"""Sweeps (`python -m launch.sweep SWEEP.yaml`): the sweep file (`spec`, its `lr_search` in
`search_spec`, the value checks both use in `spec_values`, the cells, groups and sweep it reads into
in `cells`), which cells can run now (`plan`), cooldown branches of wsd cells (`branches`), running
cells locally or as Slurm jobs (`jobs`, the job script from `slurm`), and the command line
(`sweep_cli`, run by `__main__`)."""

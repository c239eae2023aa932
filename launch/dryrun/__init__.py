"""A dry run of the real training step at any world size, in one process (docs/scaling.md, "The
dry run"): `python -m launch.dryrun --config configs/1.1b.yaml --world 64 [--replicate 8]`.

Modules: `fake_world` (torch's fake process group and fake tensors around the project's own code;
the collective log), `measure` (one rank set up and stepped, measured: `dry_run`), `report` (the
per-rank table and the table of many configurations), `__main__` (the command line).
"""

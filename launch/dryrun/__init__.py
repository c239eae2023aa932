"""A dry run of the real training step at any world size, in one process (`python -m launch.dryrun`;
docs/scaling.md, "The dry run")."""

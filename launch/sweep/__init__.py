"""Sweeps of training runs and their cooldown branches (`python -m launch.sweep SWEEP.yaml`;
docs/sweeps.md)."""

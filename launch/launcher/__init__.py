"""Launching workers (`python -m launch.launcher`, the torchrun it starts, a worker dying with its
launcher); it imports nothing heavy, since train.py imports it first."""

"""The launcher: composes `models`, `data`, `orscale`, `evals` and `records` into training runs and
the commands around them (ARCHITECTURE.md maps its modules)."""

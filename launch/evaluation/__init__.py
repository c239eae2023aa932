"""Evaluation of a live model (validation loss: `validation`; downstream tasks: `downstream`) and of a
checkpoint or an HF export (`python -m launch.evaluation`: `offline`; docs/evaluation.md). Nothing is
imported here, so that the command reads its arguments before torch is imported."""

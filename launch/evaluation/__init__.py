"""Evaluation of a live model (validation loss: `val_loss`; downstream tasks: `tasks`) and of a
checkpoint or an HF export (`python -m launch.evaluation`: `offline`; docs/evaluation.md). Nothing is
imported here, so that the command reads its arguments before torch is imported."""

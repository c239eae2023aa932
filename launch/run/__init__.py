"""One training run: its setup, run directory, resume point, lock, and what it measures and prints."""

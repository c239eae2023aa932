"""One training run: its build (a Trainer from the config), checks, run directory, resume point, lock,
and what it measures and prints."""

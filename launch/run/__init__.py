"""One run: its setup (`setup`), run directory with metrics and mirrors (`run_dir`), where it starts
(`resume`), its lock (`lock`), its own checkpoint part (`train_state`), what a log line measures
(`meter`), provenance (`provenance`), and reading run directories back (`records`)."""

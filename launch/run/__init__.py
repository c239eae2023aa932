"""One run: its setup (`setup`), run directory with metrics, mirrors and the window audit (`run_dir`),
where it starts (`resume`), its lock (`lock`), its own checkpoint part (`train_state`), what a log line
measures (`meter`), what it prints while it trains (`progress`), provenance (`provenance`), and reading
run directories back (`records`)."""

"""One run: its setup (`setup`), run directory with metrics, mirrors and the window audit (`run_dir`),
where it starts (`resume`), its lock (`lock`), its own checkpoint part (`train_state`), what a log line
measures (`meter`), what it prints while it trains (`progress`), provenance (`provenance`), profiler
traces and CUDA memory snapshots (`profiling`, through `cuda_memory`). Run
directories are read back by records/read.py (the sweep's and the report's one reader)."""

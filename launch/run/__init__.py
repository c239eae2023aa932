"""One run: its build (`build`: a `launch.trainer.Trainer` from the config), the config checks and the
step's shape (`setup`), run directory with metrics, mirrors and the window audit (`run_dir`),
where it starts (`resume`), its lock (`lock`), its own checkpoint part (`train_state`), what a log line
measures (`meter`), what it prints while it trains (`progress`), provenance (`provenance`), profiler
traces and CUDA memory snapshots (`profiling`, through `cuda_memory`). Run
directories are read back by records/read.py (the sweep's and the report's one reader)."""

"""The parallelism backends (`parallel.backend`), one class per file, and their table
(`launch/backends/registry.py`)."""

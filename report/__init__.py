"""The comparison report (`python -m report RUNS_DIR --out DIR`): run directories, read through
`records`, to report.md, summary.json and figures; it imports no part of the launcher."""

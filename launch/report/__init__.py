"""The comparison report (`python -m launch.report RUNS_DIR --out DIR`): rows, groups, fits and
comparisons from run logs (`build`), statistics (`stats`), report.md and summary.json
(`markdown`), figures (`plots`); the paper's published numbers are data (`paper_results.json`)."""

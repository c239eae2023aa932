"""The comparison report (`python -m launch.report RUNS_DIR --out DIR`). `build` composes it from the
pieces below it: runs grouped into rows (`rows`), scaling series and data efficiency (`series`), the
four answers (`analysis`, rendered by `headline`), statistics (`stats`), report.md and summary.json
(`markdown`, `sections`), figures (`plots` on `plot_kit`); the paper's published numbers are data
(`paper_results.json`)."""

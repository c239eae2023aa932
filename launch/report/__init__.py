"""The comparison report (`python -m launch.report RUNS_DIR --out DIR`). `build` composes it from the
pieces below it: runs grouped into rows (`rows`) and the sweep plan's selection and protocols
(`selection`), scaling series and data efficiency (`series`), the four answers (`analysis`, rendered
by `headline`), the protocols side by side (`protocols`), statistics (`stats`), report.md and
summary.json (`markdown`, `sections`), figures (`figures.write_all`: one `plot_*` module per figure,
on `plot_kit`); the paper's published numbers are data (`paper_results.json`)."""

"""The comparison report (`python -m report RUNS_DIR --out DIR`): from run directories to report.md,
summary.json and figures. It reads run directories through `records` (the run records' one reader,
shared with the launcher) and imports no part of the launcher.

runs        the finished runs as a table, grouped into rows and groups (best point, score, edge)
selection   the sweep plan applied: search and evaluation seeds, statuses, the protocols' views
stats       t-tests and intervals (scipy), Holm, least-squares lines, power-law fits
analysis    every number computed once into a Report
headline    report.md's top: the four answers and the protocols
markdown    report.md: the preamble and the detail sections
summary     summary.json, one shape per kind of object
plots       the figures' kit and write_all; figures_training, figures_scaling: one function a figure
fmt         numbers, intervals, optimizer names and tables as report.md writes them
build, cli  the pipeline and the command line; paper_results.json: the paper's published numbers
"""

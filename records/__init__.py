"""Run records: a run directory and a sweep's plan, read back by one set of rules. The layer below
both of their readers: the launcher (a resume reads metrics.jsonl, a sweep asks whether a cell
finished and keeps its plan) and the comparison report. Imports neither.

read     run directories read back (config.yaml, run.log, metrics.jsonl; diagnostics, downstream)
         and `strict_json`, the one JSON rule of metrics.jsonl and summary.json
points   what launch.sweep writes and the report reads: points, run names, the best-point and
         grid-edge rule, sweep_plan.json
"""

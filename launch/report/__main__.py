"""`python -m launch.report RUNS_DIR --out DIR`, the old name of `python -m report`."""

import sys

from report.cli import main

sys.exit(main(prog="python -m launch.report"))

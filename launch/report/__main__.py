"""`python -m launch.report`: see launch/report/cli.py."""

import sys

from launch.report.cli import main

sys.exit(main())

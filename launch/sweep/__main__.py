"""`python -m launch.sweep`: see launch/sweep/cli.py."""

import sys

from launch.sweep.cli import main

sys.exit(main())

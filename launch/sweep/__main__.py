"""`python -m launch.sweep`: see launch/sweep/sweep_cli.py."""

import sys

from launch.sweep.sweep_cli import main

sys.exit(main())

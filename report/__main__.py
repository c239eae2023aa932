"""`python -m report`: see report/cli.py."""

import sys

from report.cli import main

sys.exit(main())

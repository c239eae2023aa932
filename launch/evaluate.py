"""`python -m launch.evaluate`, the old name of `python -m launch.evaluation` (launch/evaluation/offline.py)."""

import sys

from launch.evaluation.offline import main

if __name__ == "__main__":
    sys.exit(main())

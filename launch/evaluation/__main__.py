"""`python -m launch.evaluation`: see launch/evaluation/offline.py."""

import sys

from launch.evaluation.offline import main

sys.exit(main())

"""`python -m launch.launcher`: see launch/launcher/forwarding.py."""

import sys

from launch.launcher.forwarding import main

sys.exit(main())

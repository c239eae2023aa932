"""`python -m launch.evaluation`: see launch/evaluation/offline.py."""

import sys

from launch.evaluation.offline_args import parse_args


def main() -> int:
    args = parse_args(sys.argv[1:])
    from launch.evaluation.offline import run  # torch, the model and the task code: seconds to import

    return run(args)


sys.exit(main())

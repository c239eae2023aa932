"""Train the paper's GPT: set up the run, then the loop.

    python train.py --config configs/tiny.yaml [section.key=value ...]
    torchrun --nproc_per_node=N train.py --config configs/125m.yaml

`train(cfg)` is in `launch/loop.py`: it builds the trainer (`launch/run/build.py`), whose one loop, the
same for every backend, is step, the loop features' hooks (`launch/features/`), save (`launch/trainer.py`).
"""

import sys

if __name__ == "__main__":
    # First, before torch is imported: a launcher killed meanwhile takes this worker along.
    from launch.launcher.parent_death import die_with_parent

    die_with_parent()

    from launch.train_args import parse_args

    parse_args(sys.argv[1:])  # --help and a usage error before torch is imported (seconds)

    from launch.loop import main

    sys.exit(main())

"""Train the paper's GPT: set up the run, then the loop.

    python train.py --config configs/tiny.yaml [section.key=value ...]
    torchrun --nproc_per_node=N train.py --config configs/125m.yaml

The loop itself is `launch/loop.py` (`train(cfg)`: setup, then step / log / evaluate / checkpoint,
the same for every backend); the setup is `launch/run/setup.py`.
"""

import sys

if __name__ == "__main__":
    # First, before torch is imported: a launcher killed meanwhile takes this worker along.
    from launch.launcher.parent_death import die_with_parent

    die_with_parent()

    from launch.loop import main

    sys.exit(main())

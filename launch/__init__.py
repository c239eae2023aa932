"""The launcher: composes `models`, `data` and `orscale` into runs, and sits on top of them (nothing
below imports it). Rooms by concern:

    config.py, errors.py, nested.py   the run config (YAML + dotted overrides), user errors, dotted keys
    loop.py                           train(cfg): setup, then the loop; `python train.py` is its main
    runtime/                          process groups, stop signals, parent death, console logging
    engine/                           the Engine interface, one class per backend, parallelize, spikes
    checkpoint/                       checkpointer of parts, inspection, manifest, safe DCP reading
    run/                              setup, run directory, resume, lock, train state, meter, records
    sweep/, report/                   python -m launch.sweep / python -m launch.report
    export.py, launcher.py            python -m launch.export / python -m launch.launcher (torchrun)
    scripts/                          torchrun.sh, deepspeed.sh, slurm.sbatch (the one Slurm recipe)
"""

"""The launcher: composes `models`, `data`, `orscale`, `evals` and `records` into runs, and sits on top
of them (nothing below imports it; `report` only through the old command name below). Rooms by concern:

    config.py, errors.py, nested.py   the run config (YAML + dotted overrides), user errors, dotted keys
    loop.py                           train(cfg): build the trainer, then fit; `python train.py` is its main
    trainer.py                        Trainer: the run's components and features, the one loop
    features/                         the loop features, one per file, and their registry
    runtime/                          process groups, collective timeouts, stall dumps, stop signals, console
    engine/                           the Engine interface, one class per backend, parallelize
    dryrun/                           python -m launch.dryrun (the real step of any world size, one process)
    checkpoint/                       checkpointer of parts, inspection (find, check, load a GPT), manifest,
                                      safe DCP reading, the portable (any-backend) view
    run/                              build, setup (checks), run directory, resume, lock, train state, meter, progress,
                                      provenance
    evaluation/                       validation loss, downstream tasks in the loop and offline
                                      (python -m launch.evaluation)
    launcher/                         python -m launch.launcher (torchrun with a clean SIGTERM path), the
                                      torchrun it starts, parent death
    sweep/                            python -m launch.sweep (cells, the LR search, Slurm jobs)
    branch.py                         python -m launch.branch (cooldown branches of a wsd run)
    report/                           python -m launch.report, the old name of python -m report
    export.py                         python -m launch.export (Hugging Face transformers)
    scripts/                          torchrun.sh, deepspeed.sh, slurm.sbatch (the one Slurm recipe)
"""

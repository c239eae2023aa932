"""What a training process needs from its environment: process groups and small collectives
(`process_group`), collective timeouts (`hangs`), stack dumps of a stalled step (`stall_watch`),
stop signals (`preemption`), console logging (`console`) and the attention kernel (`attention`);
dying with the launcher is `launch.launcher.parent_death`. Nothing here knows about configs, runs
or models."""

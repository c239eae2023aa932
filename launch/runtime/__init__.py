"""What a training process needs from its environment: process groups and small collectives
(`process_group`), collective timeouts (`hangs`), stack dumps of a stalled step (`stall_watch`),
stop signals (`preemption`), dying with its launcher (`parent_death`) and console logging
(`console`). Nothing here knows about configs, runs or models."""

"""What a training process needs from its environment: process groups and small collectives
(`process_group`), stop signals (`preemption`), dying with its launcher (`parent_death`) and
console logging (`console`). Nothing here knows about configs, runs or models."""

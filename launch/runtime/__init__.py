"""What a training process needs from its environment (process groups, timeouts, stall dumps, stop
signals, console, the attention kernel); nothing here knows about configs, runs or models."""

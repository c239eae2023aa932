"""Distributed execution of the optimizers under FSDP2, DDP and DeepSpeed ZeRO-1/2: where their steps
run, never what they compute (``orscale.muon_family``)."""

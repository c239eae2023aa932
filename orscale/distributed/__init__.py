"""Distributed execution of the Muon family, under one roof: owner-rank Newton–Schulz over FSDP2
row shards (``fsdp``), DDP replicas (``ddp``) and DeepSpeed ZeRO-1/2 flat partitions (``zero``),
with the owner assignment and bucketing they share (``owners``); ZeRO's matrix layout inside its
partitions (``zero_layout``) and its world-size-free checkpoints (``zero_checkpoint``); CBP, LAMB
and LARS over FSDP2 shards (``elementwise``). The algorithm itself stays in ``orscale.muon_family``;
these subclasses override only its hooks."""

"""Where parameters live under torchrun: the process group, DDP or FSDP2 placement (`placement.py`) and the
block-by-block sharding of an encoder (`fsdp.py`).
May import: torch.distributed, the library, `gradcache.train.config` / `errors` / `checkpoints`."""

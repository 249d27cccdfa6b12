"""Where parameters live under torchrun: the process group, the check of `--device`, DDP or FSDP2 placement
(`placement.py`), DeepSpeed's ZeRO engine (`deepspeed.py`), which of them a run asks for (`placement_choice.py`)
and the block-by-block sharding of an encoder (`fsdp.py`).
May import: torch.distributed, the library, `gradcache.train.config` / `errors` / `checkpoints`."""

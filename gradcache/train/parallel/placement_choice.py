"""Which placement a run's options ask for: DeepSpeed's ZeRO engine (`--deepspeed`, deepspeed.py), FSDP2 (`--fsdp`)
or replicated (DDP under torchrun, a plain module alone: placement.py). Apart from the placements it chooses
between, so that each of them imports `Placement` and none imports the others."""
from __future__ import annotations

from gradcache.train.config import RunConfig
from gradcache.train.parallel.deepspeed import DeepSpeedPlacement
from gradcache.train.parallel.placement import Placement, Replicated, Sharded


def placement_for(config: RunConfig) -> Placement:
    """The placement of `config`: DeepSpeed's with --deepspeed, else sharded with --fsdp, else replicated."""
    if config.deepspeed is not None:
        return DeepSpeedPlacement(config)
    return Sharded(config) if config.fsdp else Replicated(config)

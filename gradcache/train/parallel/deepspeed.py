"""`--deepspeed CONFIG.json`: a DeepSpeed config file read and made to agree with the run's global batch.

GradCache replaces DeepSpeed's gradient accumulation, so the batch keys follow `--batch-size` (the global batch):
`train_batch_size` is the global batch, `train_micro_batch_size_per_gpu` the per-rank batch (global / world size)
and `gradient_accumulation_steps` 1. A key left out or set to "auto" is filled so (as the Hugging Face Trainer fills
its "auto" values); a contradicting value is refused naming both. Any other "auto" is refused: the program fills the
batch keys alone. What the engine itself cannot run exactly (fp16, ZeRO stage 0, ...) is refused by
`gradcache.deepspeed_engine.check_deepspeed_engine` with the key's name.
"""
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gradcache.train.errors import UsageError

AUTO = "auto"


def deepspeed_config(path: str | Path, global_batch: int, world_size: int) -> dict[str, Any]:
    """The config in `path`, its batch keys set from `global_batch` over `world_size` ranks.

    Raises:
        UsageError: a missing or unreadable file, not a JSON object, a global batch that does not split evenly over
            the ranks, a batch key contradicting `--batch-size`, or an "auto" outside the batch keys.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise UsageError(f"--deepspeed {path}: cannot read the file ({error.strerror or error}); give the path of a "
                         "DeepSpeed JSON config.") from None
    try:
        config = json.loads(text)
    except json.JSONDecodeError as error:
        raise UsageError(f"--deepspeed {path}: not valid JSON ({error.msg} at line {error.lineno}, column "
                         f"{error.colno}).") from None
    if not isinstance(config, dict):
        raise UsageError(f"--deepspeed {path}: the config must be a JSON object, got {type(config).__name__}.")
    if global_batch % world_size:
        raise UsageError(f"--batch-size {global_batch} does not split over {world_size} ranks; under --deepspeed "
                         "every rank takes the same share (train_micro_batch_size_per_gpu): give a multiple of "
                         f"{world_size}.")
    wanted = {"train_batch_size": (global_batch, f"--batch-size {global_batch}"),
              "train_micro_batch_size_per_gpu": (global_batch // world_size,
                                                 f"--batch-size {global_batch} over {world_size} ranks"),
              "gradient_accumulation_steps": (1, "GradCache, which replaces DeepSpeed's accumulation")}
    for key, (value, source) in wanted.items():
        given = config.get(key, AUTO)
        if given != AUTO and given != value:
            raise UsageError(f"--deepspeed {path}: {key} is {given!r}, but {source} makes it {value}; set it to "
                             f"{value} or \"auto\", or leave it out.")
        config[key] = value
    for where in _autos(config):
        raise UsageError(f"--deepspeed {path}: {where} is \"auto\"; the program fills only the batch keys "
                         f"({', '.join(wanted)}): give {where} a value.")
    return config


def _autos(value: Any, where: str = "") -> Iterator[str]:
    """The dotted key of every "auto" left in `value`."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _autos(item, f"{where}.{key}" if where else str(key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _autos(item, f"{where}[{index}]")
    elif value == AUTO:
        yield where

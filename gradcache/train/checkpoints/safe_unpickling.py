"""Reading a DeepSpeed checkpoint's files without running them: DeepSpeed itself reads them with pickle
(`torch.load(..., weights_only=False)` in `engine.load_checkpoint` and `zero_to_fp32`), so a file from elsewhere
could run any code it carries. `screen_pickle` reads a file once with torch's weights-only unpickler, which builds
tensors, plain values and the classes named in `DEEPSPEED_GLOBALS` alone, and refuses anything else before any of
it runs; `DeepSpeedCheckpoint` (checkpoints/deepspeed_checkpoint.py) screens every file of a `last.ds` so before
DeepSpeed reads one.

`DEEPSPEED_GLOBALS` are the classes DeepSpeed 0.19 pickles into the ZeRO-1, 2 and 3 checkpoints of the program's
runs (float32 weights, with or without LoRA): the optimizer state's loss scaler, its ZeRO stage and, at stages 1
and 2, the parameters' fragment addresses. Each is rebuilt from its stored fields without calling user code (a
dataclass, a plain object, an enum looked up by value). Whatever else a file names is refused.
"""
from __future__ import annotations

import os
import pickle
from pathlib import Path

import torch

from gradcache.train.checkpoints.atomic import _refused  # the one reading of torch's refusal message
from gradcache.train.checkpoints.checksum import CHECKSUM_VERSION
from gradcache.train.checkpoints.state_bounds import bounds_fault
from gradcache.train.errors import CheckpointError
from gradcache.train.deepspeed_output import deepspeed_output_to_stderr


def deepspeed_globals() -> list[type]:
    """The DeepSpeed classes a checkpoint of the program's runs holds, beside tensors and plain values."""
    with deepspeed_output_to_stderr():  # DeepSpeed, imported for --deepspeed runs only, logs as it is imported
        from deepspeed.runtime.fp16.loss_scaler import LossScaler
        from deepspeed.runtime.zero.config import ZeroStageEnum
        from deepspeed.utils.tensor_fragment import fragment_address

    return [LossScaler, ZeroStageEnum, fragment_address]


def screen_pickle(path: str | os.PathLike, checkpoint: str | os.PathLike) -> None:
    """Read the file `path` of the DeepSpeed checkpoint `checkpoint` with the weights-only unpickler (its tensors
    memory-mapped, not read), allowing `deepspeed_globals()` alone, and bound what it holds
    (checkpoints/state_bounds.py). Give it a file no one else can change (the screen's private copy): DeepSpeed
    reads the file again, with pickle.

    Raises:
        CheckpointError: it holds anything else (code among it), is no torch file at all, or holds more than a
            state dict can (a cycle, nesting or sharing beyond any, a tensor past its storage); nothing of it ran.
    """
    path = Path(path)
    try:
        with torch.serialization.safe_globals(deepspeed_globals()):
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError as error:  # what the weights-only unpickler refuses
        raise CheckpointError(f"DeepSpeed checkpoint {str(checkpoint)!r}: {path.name} holds something other than "
                              f"tensors, plain values and the classes DeepSpeed writes ({_refused(error)}); a "
                              "--deepspeed run never writes that, so the file was altered or not written by "
                              "gradcache train. It was refused without running any of it; resume from another "
                              "checkpoint (previous.ds) or start afresh") from None
    except Exception as error:  # torch raises several unrelated types for a file that is no torch file
        raise CheckpointError(f"DeepSpeed checkpoint {str(checkpoint)!r}: cannot read {path.name} (truncated, "
                              f"damaged, or no torch file): {str(error).splitlines()[0][:300]}") from None
    fault = bounds_fault(state, CHECKSUM_VERSION)
    if fault:
        raise CheckpointError(f"DeepSpeed checkpoint {str(checkpoint)!r}: {path.name} holds {fault}, which no "
                              "state dict does; a --deepspeed run never writes that, so the file was altered or not "
                              "written by gradcache train. It was refused before DeepSpeed read it; resume from "
                              "another checkpoint (previous.ds) or start afresh")


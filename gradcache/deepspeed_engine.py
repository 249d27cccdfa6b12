"""A DeepSpeed engine as a GradCache encoder: recognised without importing deepspeed, its config checked for
what cannot be exact, and one gradient reduction per optimizer step.

The engine runs every chunk's forward (phases (1) and (3)) as any encoder; phase (3)'s backward passes are
ordinary `torch.autograd.backward(outputs, cached_gradients)` calls through its outputs, which DeepSpeed 0.19
accepts from ZeRO stage 1 on (its hooks on the outputs run what `engine.backward` would run around them). All of
one step's backward passes sit in one `engine.coalesce_grad_reduction()` block: ZeRO leaves each chunk's
gradient on the parameters, summed by autograd, and reduces the sum once when the block exits (ZeRO-1 and ZeRO-2:
one bucketed reduction pass; ZeRO-3: one reduce-scatter pass, holding the whole unpartitioned gradient until then).
The caller then calls `engine.step()`.

An engine may also wrap the whole loss (the Hugging Face Trainer's model is the `CachedLoss`): then its
`engine.backward(loss)` runs phase (3), and `reduced_once_above_the_loss` around that call coalesces the reduction
the same way, every chunk's backward an ordinary one (ZeRO-3 gathers the parameters of each chunk's backward and
leaves its gradient on them until the block exits).
"""
from __future__ import annotations

import contextlib
import sys
import weakref
from collections.abc import Iterator

import torch
from torch import nn

# the engine's global step at its last GradCache reduction: a second one before `engine.step()` is refused
_REDUCED_AT: weakref.WeakKeyDictionary[nn.Module, int] = weakref.WeakKeyDictionary()
# engines wrapping a whole GradCache loss whose `engine.backward(loss)` is running inside `reduced_once_above_the_loss`
_ABOVE_THE_LOSS: list[nn.Module] = []


def is_deepspeed_engine(module: object) -> bool:
    """Whether `module` is a DeepSpeed engine, without importing deepspeed (a program holding an engine has)."""
    deepspeed = sys.modules.get("deepspeed")
    engine_class = getattr(deepspeed, "DeepSpeedEngine", None)
    return engine_class is not None and isinstance(module, engine_class)


def partitions_parameters(module: object) -> bool:
    """Whether `module` is a DeepSpeed engine at ZeRO stage 3, whose forward and backward gather each submodule's
    partitioned parameters as it runs: collectives every rank must join, as under FSDP2."""
    return is_deepspeed_engine(module) and module.zero_optimization_stage() == 3


def check_deepspeed_engine(engine: nn.Module) -> None:
    """Raise a ValueError naming the config key for an engine whose GradCache gradient cannot be exact, before
    any state is touched; nothing for any other module.

    Refused: ZeRO stage 0 (its engine needs `engine.backward(loss)` and has no coalesced reduction), DeepSpeed's
    own gradient accumulation (`gradient_accumulation_steps` > 1: GradCache replaces it, and the engine would
    divide the cached gradients by it), fp16 loss scaling (`fp16.enabled`, or `torch_autocast` in float16: the
    scale does not reach the cached gradients, and a dynamic scale skips steps the full-batch reference does not),
    `managed_gradient_accumulation: false`, pipeline parallelism, and a DeepSpeed without
    `engine.coalesce_grad_reduction` (before 0.19.1).
    """
    if not is_deepspeed_engine(engine):
        return
    fix = "GradCache caches the full batch's gradient and reduces it once per engine.step()"
    if not callable(getattr(engine, "coalesce_grad_reduction", None)):
        import deepspeed

        raise ValueError(
            f"deepspeed {deepspeed.__version__} has no engine.coalesce_grad_reduction(), which GradCache needs to "
            'reduce once per step: pip install -e ".[deepspeed]" (deepspeed>=0.19.1).'
        )
    stage = int(engine.zero_optimization_stage())
    if stage == 0:
        raise ValueError(
            "zero_optimization.stage is 0 in the DeepSpeed config: a stage-0 engine needs engine.backward(loss) and "
            "cannot coalesce its reduction; set zero_optimization.stage to 1, 2 or 3 (or use DDP)."
        )
    steps = engine.gradient_accumulation_steps()
    if steps != 1:
        raise ValueError(
            f"gradient_accumulation_steps is {steps} in the DeepSpeed config; {fix}, so set it to 1 and give the "
            "whole batch to one GradCache step (chunk_size bounds the memory instead)."
        )
    if engine.fp16_enabled() or (engine.torch_autocast_enabled() and engine.torch_autocast_dtype() == torch.float16):
        key = "fp16.enabled" if engine.fp16_enabled() else "torch_autocast.dtype float16"
        raise ValueError(
            f"{key} in the DeepSpeed config: fp16 loss scaling cannot be exact with GradCache (the scale does not "
            "reach the cached gradients, and a dynamic scale skips steps that the full batch would take); use "
            'bf16 ("bf16": {"enabled": true}) or fp32.'
        )
    if not engine.managed_gradient_accumulation():
        raise ValueError(
            "managed_gradient_accumulation is false in the DeepSpeed config; GradCache coalesces one step's "
            "reduction through the engine's managed boundary: remove the key (it defaults to true)."
        )
    if getattr(engine, "pipeline_parallelism", False):
        raise ValueError(
            f"the DeepSpeed engine runs a PipelineModule (pipeline parallelism), whose engine.train_batch owns "
            f"forward and backward; {fix}: give deepspeed.initialize the encoder as a plain nn.Module."
        )


@contextlib.contextmanager
def coalesced_reduction(engine: nn.Module) -> Iterator[None]:
    """One step's backward passes through `engine`, reduced once when the block exits.

    Raises:
        RuntimeError: inside `engine.backward(loss)` (it reduces again after the block: back-propagate a CachedLoss
            with `loss.backward()`), or a second GradCache backward before `engine.step()` (ZeRO-1/2 would replace
            the first step's gradient with the second's, ZeRO-3 add them); both before any gradient is written.
    """
    if getattr(engine, "_running_engine_backward", False):
        raise RuntimeError(
            "a GradCache loss over a DeepSpeed engine was back-propagated with engine.backward(loss), which reduces "
            "the gradients again after GradCache's one reduction; call loss.backward() and then engine.step(). "
            "No gradient of this step was written."
        )
    step = engine.global_steps
    if _REDUCED_AT.get(engine) == step:
        raise RuntimeError(
            f"a second GradCache backward through this DeepSpeed engine before engine.step() (global step {step}); "
            "ZeRO keeps one reduced gradient per step, so call engine.step() after each GradCache step (give one "
            "step the whole batch to accumulate). No gradient of this backward was written."
        )
    with engine.coalesce_grad_reduction():
        yield
    _REDUCED_AT[engine] = step


@contextlib.contextmanager
def reduced_once_above_the_loss(engine: nn.Module) -> Iterator[None]:
    """Around `engine.backward(loss)` for an engine whose module computes a GradCache loss (a `CachedLoss` inside
    it): phase (3)'s backward passes accumulate on the parameters and the engine reduces their sum once, when the
    block exits (its own backward epilogue reduces nothing inside `coalesce_grad_reduction`). Call `engine.step()`
    after the block. Inside it, `reduces_above_the_loss()` is True, so every chunk's backward is an ordinary one.

    Raises:
        ValueError: an engine `check_deepspeed_engine` refuses, before anything runs.
    """
    check_deepspeed_engine(engine)
    with engine.coalesce_grad_reduction():
        _ABOVE_THE_LOSS.append(engine)
        try:
            yield
        finally:
            _ABOVE_THE_LOSS.pop()


def reduces_above_the_loss() -> bool:
    """Whether the running backward is inside `reduced_once_above_the_loss`: a DeepSpeed engine above the loss
    coalesces this step's reduction, so the encoders' backward passes need hold nothing off themselves."""
    return bool(_ABOVE_THE_LOSS)

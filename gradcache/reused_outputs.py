"""`reuse_outputs`: submodules that learn nothing run in phase (1) only.

A submodule of an encoder with no parameter that requires grad (a frozen vision tower under LoRA on the language
model), fed inputs that require no grad, returns a constant: its output in phase (3) is the one it returned in
phase (1). So phase (1) keeps each call's output, per chunk (`recording`), and phase (3) returns it in place of
running the module again (`reusing`). Exact, dropout included:
  - inside the module: the kept output carries the masks phase (1) drew;
  - in the rest of the model: phase (1) also keeps where the module's draws left the random generators, and phase
    (3), replaying the chunk's random state, moves them there when it skips the module. The rest of the model
    draws after the module what it drew in phase (1). A module that drew nothing keeps no generator state.
A call in phase (3) whose inputs require grad is refused (ValueError): the gradient into them would be lost.

Costs, per chunk re-encoded in phase (3): the bytes of what the module returned (every tensor of its output,
each storage once: Qwen2-VL's tower returns its hidden states before and after the merger, both kept), plus 5 KB
of CPU generator state per call of a module that drew. `KeptOutputs.nbytes` counts them for `memory_budget`.
"""
from __future__ import annotations

import contextlib
import copy
import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from gradcache.random_state import NO_DRAWS, RandomState
from gradcache.recompute_check import RecomputationMismatchError


def check_reuse_outputs(value: Any, name: str = "reuse_outputs") -> None:
    """Refuse a `reuse_outputs` that is not None nor a sequence of distinct `nn.Module`s (TypeError), or whose
    modules are nested in one another or learn (ValueError); `name` is how the message names the option."""
    if value is None:
        return
    if isinstance(value, nn.Module) or not isinstance(value, Sequence) or isinstance(value, (str, bytes)):
        raise TypeError(f"{name} must be a list of submodules (e.g. [model.visual]) or None, got {value!r}.")
    for i, module in enumerate(value):
        if not isinstance(module, nn.Module):
            raise TypeError(f"{name}[{i}] must be an nn.Module (a submodule of an encoder), got {module!r}.")
    for i, module in enumerate(value):
        for j, other in enumerate(value):
            if i != j and any(inner is module for inner in other.modules()):
                what = "listed twice" if module is other else f"inside {name}[{j}] ({type(other).__name__})"
                raise ValueError(f"{name}[{i}] ({type(module).__name__}) is {what}; list each module once, the "
                                 "outermost only: its whole computation is reused.")
    check_frozen(value, name)


def check_frozen(modules: Sequence[nn.Module], name: str = "reuse_outputs") -> None:
    """ValueError naming the first listed module that has a parameter requiring grad: phase (3) would not run
    it, and its gradient would be lost."""
    for i, module in enumerate(modules):
        for parameter_name, parameter in module.named_parameters():
            if parameter.requires_grad:
                raise ValueError(
                    f"{name}[{i}] ({type(module).__name__}) has a parameter that requires grad ({parameter_name!r}); "
                    "its output is reused only when the module learns nothing, since phase (3) does not run it. "
                    f"Freeze it ({name}[{i}].requires_grad_(False)) or leave it out of {name}."
                )


def check_within(modules: Sequence[nn.Module], encoders: Sequence[nn.Module], name: str = "reuse_outputs") -> None:
    """ValueError naming a listed module that is a submodule of none of the encoders: it would never run."""
    inside = {id(m) for encoder in encoders for m in encoder.modules()}
    for i, module in enumerate(modules):
        if id(module) not in inside:
            raise ValueError(
                f"{name}[{i}] ({type(module).__name__}) is not a submodule of any encoder of this step, so it would "
                "never run; list submodules of the encoders (e.g. [model.visual] for a Qwen2-VL encoder `model`)."
            )


def within(modules: Sequence[nn.Module], encoder: nn.Module) -> list[nn.Module]:
    """The listed modules that are submodules of `encoder`."""
    inside = {id(m) for m in encoder.modules()}
    return [m for m in modules if id(m) in inside]


@dataclass
class _Call:
    output: Any  # what the module returned: containers rebuilt, tensors detached
    random_after: RandomState | None  # the generators after the call, where the call drew


@dataclass
class KeptOutputs:
    """One chunk's calls of the listed modules (`modules`, those inside its encoder) in phase (1), in call order
    per module (`calls[m]`), and their bytes (`nbytes`: each tensor storage once, plus the generator states)."""

    modules: Sequence[nn.Module]
    calls: list[list[_Call]] = field(default_factory=list)
    nbytes: int = 0
    _storages: set[tuple[str, int]] = field(default_factory=set)

    def add(self, m: int, output: Any, random_after: RandomState | None) -> None:
        kept = _rebuilt(output)
        for tensor in _tensors_in(kept):
            key = (str(tensor.device), tensor.untyped_storage().data_ptr())
            if key not in self._storages:
                self._storages.add(key)
                self.nbytes += tensor.untyped_storage().nbytes()
        if random_after is not None:
            self.nbytes += random_after.cpu.numel() + sum(state.numel() for _, state in random_after.cuda)
        self.calls[m].append(_Call(kept, random_after))


@contextlib.contextmanager
def recording(modules: Sequence[nn.Module], cuda_devices: Sequence[int]) -> Iterator[KeptOutputs]:
    """Phase (1): run each listed module as usual, keeping what every call returns and, when the call drew random
    numbers, the generator states after it (the CPU one and those of `cuda_devices`)."""
    kept = KeptOutputs(modules, [[] for _ in modules])

    def record(m: int, forward: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        before = RandomState.capture(devices=cuda_devices)
        output = forward(*args, **kwargs)
        drew = before.kept_if_drawn() is not NO_DRAWS
        kept.add(m, output, RandomState.capture(devices=cuda_devices) if drew else None)
        return output

    with _forwards_replaced(modules, record):
        yield kept


@contextlib.contextmanager
def reusing(kept: KeptOutputs | None, name: str) -> Iterator[None]:
    """Phase (3), inside the chunk's random-state replay: each call of a listed module returns what the same call
    returned in phase (1), and moves the generators to where that call left them; nothing runs. With `kept`
    None (nothing kept for this chunk: the memory budget was spent) the modules run as usual.

    Raises:
        ValueError: a call's inputs hold a tensor that requires grad (its gradient would be lost).
        RecomputationMismatchError: phase (3) calls a module another number of times than phase (1).
    """
    if kept is None:
        yield
        return
    modules = kept.modules
    used = [0] * len(modules)

    def reuse(m: int, forward: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        module = modules[m]
        if any(t.requires_grad for t in _tensors_in((args, kwargs))):
            raise ValueError(
                f"reuse_outputs lists {type(module).__name__}, whose inputs require grad in phase (3) of {name}: its "
                "kept output would cut the gradient to them (and to whatever computed them). List a module whose "
                "inputs learn nothing, or leave it out of reuse_outputs. No gradient of this chunk was written."
            )
        calls = kept.calls[m]
        if used[m] == len(calls):
            raise RecomputationMismatchError(
                f"phase (3) of {name} called {type(module).__name__} (listed in reuse_outputs) more often than "
                f"phase (1) did ({len(calls)} time(s)): the encoder's second pass differs from its first. No "
                "gradient of this chunk was written."
            )
        call = calls[used[m]]
        used[m] += 1
        if call.random_after is not None:  # skip the module's draws, as if it had drawn them
            call.random_after.restore()
        return _rebuilt(call.output)  # containers anew: the caller may change them (Qwen2-VL splits its output)

    with _forwards_replaced(modules, reuse):
        yield
    for m, calls in enumerate(kept.calls):
        if used[m] != len(calls):
            raise RecomputationMismatchError(
                f"phase (3) of {name} called {type(modules[m]).__name__} (listed in reuse_outputs) {used[m]} "
                f"time(s), phase (1) {len(calls)}: the encoder's second pass differs from its first."
            )


@contextlib.contextmanager
def _forwards_replaced(modules: Sequence[nn.Module], wrapper: Callable[..., Any]) -> Iterator[None]:
    """Each module's `forward` replaced by `wrapper(m, forward, *args, **kwargs)` (m: its place in `modules`,
    forward: the one it had), as an instance attribute, so the module's hooks still run around it; put back after."""
    previous = []
    try:
        for m, module in enumerate(modules):
            previous.append(module.__dict__.get("forward"))
            module.forward = functools.partial(wrapper, m, module.forward)
        yield
    finally:
        for module, forward in zip(modules, previous):
            if forward is None:
                del module.forward
            else:
                module.forward = forward


def _rebuilt(value: Any) -> Any:
    """`value` with its tuples, lists and mappings (a transformers ModelOutput) copied and its tensors detached:
    the same storages, in containers of its own."""
    if isinstance(value, torch.Tensor):
        return value.detach()
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a namedtuple
        return type(value)(*map(_rebuilt, value))
    if isinstance(value, (tuple, list)):
        return type(value)(map(_rebuilt, value))
    if isinstance(value, Mapping):
        copied = copy.copy(value)
        for key in value.keys():
            copied[key] = _rebuilt(value[key])
        return copied
    return value


def _tensors_in(value: Any) -> list[torch.Tensor]:
    """Every tensor inside tuples, lists and mappings."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors_in(v)]
    if isinstance(value, Mapping):
        return [t for v in value.values() for t in _tensors_in(v)]
    return []

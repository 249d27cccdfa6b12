"""The original GradCache's functional form (luyug/GradCache's `grad_cache.functional`), for a training loop that
collects a loader's sub-batches itself: `@cached` on the function that calls the model, `@cat_input_tensor` on
the loss.

    @cached
    def call_model(model, batch):
        return model(**batch).pooler_output

    @cat_input_tensor
    def contrastive_loss(x, y):  # x, y: lists of sub-batch embeddings, concatenated into (N, D)
        ...

    rx, cx = call_model(model, xx)  # (1) under no_grad, random and autocast state recorded; rx a leaf
    ...                             #     (one call per sub-batch, reps and closures kept in lists)
    loss = contrastive_loss(reps_x, reps_y)
    loss.backward()                 # (2) the gradient cache: d loss / d rep in each rep's .grad
    for closure, rep in zip(closures_x, reps_x):
        closure(rep)                # (3) re-encode with a graph under the recorded state, back-propagate rep.grad

After every closure has run, each parameter's `.grad` equals that of one backward over the whole batch encoded
at once (dropout included: each sub-batch's re-encoding draws the masks its first pass drew). The same step
without writing the loop: `GradCache(...).step(Chunks(sub_batches), ...)` (gradcache/chunks.py).
"""
from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from gradcache.autocast import AutocastState
from gradcache.batchnorm import running_stats_frozen
from gradcache.inputs import tensors_of
from gradcache.random_state import RandomState, cuda_devices_of
from gradcache.recompute_check import RecomputeCheck
from gradcache.reused_outputs import check_frozen, check_reuse_outputs, recording, reusing

__all__ = ["cached", "cat_input_tensor"]

Closure = Callable[..., None]


def cached(
    func: Callable[..., torch.Tensor | tuple[torch.Tensor, ...]] | None = None, *,
    reuse_outputs: Sequence[nn.Module] | None = None,
) -> Callable[..., Any]:
    """`func(*args, **kwargs) -> rep(s)` becomes `call(*args, **kwargs) -> (*reps, closure)`: the reps computed
    under `torch.no_grad()` as leaves requiring grad, and `closure(*reps)` that, after a backward over a loss of
    them, re-encodes `func(*args, **kwargs)` with a graph and back-propagates each rep's `.grad` through it.

    The first call records the CPU and CUDA random state and the autocast state; the closure replays them, so
    dropout draws the same masks and the gradient is that of the reps the loss saw. The closure runs once; it
    checks each re-encoded rep against the cached one (as `check_recompute` does in `GradCache`) before its
    backward. BatchNorm running statistics of the modules among the arguments are not advanced a second time.

    Args:
        func: calls the model; returns one floating-point tensor of reps, or a tuple or list of them. Without
            it, `cached(reuse_outputs=[...])` is the decorator.
        reuse_outputs: submodules of the model that learn nothing (a frozen vision tower), whose outputs the
            first call keeps and the closure returns instead of running them again, as GradCache's option of
            that name (`gradcache.reused_outputs`): exact, dropout included.

    Returns:
        A function returning `(rep, closure)` for one tensor, `(rep_1, ..., rep_k, closure)` for k, as the
        original's. Call `closure(rep)` (or `closure(rep_1, ..., rep_k)`, or `closure((rep_1, ...))`) with the
        reps it returned, after `loss.backward()`.

    Raises:
        TypeError: `func` returns anything but floating-point tensors; `reuse_outputs` is not a list of modules.
        ValueError: a module of `reuse_outputs` has a parameter requiring grad (at the call, before any
            gradient), or its inputs require grad (in the closure, before its backward).
        ValueError, RuntimeError: the closure gets other reps than its call returned, a rep without `.grad`
            (no backward has reached it yet), or runs a second time.

    Example:
        >>> call_model = cached(lambda model, batch: model(**batch).pooler_output)
        >>> rep, closure = call_model(model, batch); loss_of(rep).backward(); closure(rep)
        >>> call_vlm = cached(reuse_outputs=[vlm.visual])(lambda model, batch: model(**batch).last_hidden_state[:, -1])
    """
    check_reuse_outputs(reuse_outputs)
    reused = list(reuse_outputs or [])
    if func is None:
        return functools.partial(cached, reuse_outputs=reuse_outputs)

    @functools.wraps(func)
    def first_pass(*args: Any, **kwargs: Any) -> tuple[Any, ...]:
        tensors = [t for value in (*args, *kwargs.values()) for t in tensors_of(value)]
        modules = [value for value in (*args, *kwargs.values()) if isinstance(value, nn.Module)]
        check_frozen(reused)  # again: a module may have been unfrozen since the decorator
        random_state = RandomState.capture(tensors, cuda_devices_of(modules))
        autocast_state = AutocastState.capture()
        record = recording(reused, [d for d, _ in random_state.cuda]) if reused else contextlib.nullcontext()
        with torch.no_grad(), record as kept:
            reps = _reps(func(*args, **kwargs), func)
        random_state = random_state.kept_if_drawn()
        leaves = tuple(rep.detach().requires_grad_() for rep in reps)
        spent = False

        def closure(*given: Any) -> None:
            nonlocal spent, kept
            if spent:
                raise RuntimeError(
                    f"this closure of {_name(func)} already ran: it back-propagates its cached gradient once. Call "
                    "the cached function again for the next batch."
                )
            reps_given = _given(given, leaves, func)
            with torch.enable_grad(), random_state.replay(), autocast_state.apply(), running_stats_frozen(modules):
                with reusing(kept, _name(func)):
                    again = _reps(func(*args, **kwargs), func)
            kept = None  # spent
            if len(again) != len(leaves):
                raise ValueError(
                    f"{_name(func)} returned {len(leaves)} rep(s) on its first call and {len(again)} when re-encoded; "
                    "it must return as many each time."
                )
            check = RecomputeCheck(0.0, given=False)  # the tolerance of the precision the reps were computed in
            for k, (new, old) in enumerate(zip(again, leaves)):
                check(new, old, autocast_state, _name(func), f"rep {k + 1} of {len(leaves)}")
            pairs = [(new, rep.grad.to(new.dtype)) for new, rep in zip(again, reps_given) if new.requires_grad]
            spent = True
            if pairs:
                torch.autograd.backward([new for new, _ in pairs], [grad for _, grad in pairs])

        return (*leaves, closure)

    return first_pass


def cat_input_tensor(func: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """`func` called with every positional or keyword argument that is a non-empty list of tensors replaced by
    their concatenation along dim 0 (`torch.cat(value)`), so a loss written for (N, D) embeddings takes lists of
    sub-batch reps; any other argument (a tensor, a tuple, a number) passes unchanged.

    Example:
        >>> loss = cat_input_tensor(contrastive_loss)([rx_1, rx_2], [ry_1, ry_2])  # contrastive_loss(x, y), (N, D)
    """

    @functools.wraps(func)
    def concatenated(*args: Any, **kwargs: Any) -> torch.Tensor:
        return func(*(_joined(v) for v in args), **{k: _joined(v) for k, v in kwargs.items()})

    return concatenated


def _joined(value: Any) -> Any:
    if isinstance(value, list) and value and all(isinstance(v, torch.Tensor) for v in value):
        return torch.cat(value)
    return value


def _reps(output: Any, func: Callable[..., Any]) -> tuple[torch.Tensor, ...]:
    """`func`'s output as a tuple of reps, or a TypeError that says what it should return."""
    reps = tuple(output) if isinstance(output, (tuple, list)) else (output,)
    if not reps or not all(isinstance(r, torch.Tensor) and r.is_floating_point() for r in reps):
        what = type(output).__name__ if not isinstance(output, Mapping) else "mapping (a model output?)"
        raise TypeError(
            f"{_name(func)}, decorated with @cached, returned a {what}; it must return the reps: a floating-point "
            "tensor, or a tuple of them (e.g. return model(**batch).pooler_output)."
        )
    return reps


def _given(
    given: tuple[Any, ...], leaves: tuple[torch.Tensor, ...], func: Callable[..., Any],
) -> tuple[torch.Tensor, ...]:
    """The reps a closure was called with, checked to be the ones its call returned, each with a `.grad`."""
    if len(given) == 1 and isinstance(given[0], (tuple, list)):
        given = tuple(given[0])
    if len(given) != len(leaves) or not all(g is leaf for g, leaf in zip(given, leaves)):
        raise ValueError(
            f"this closure of {_name(func)} takes the {len(leaves)} rep(s) its call returned, in order "
            f"(closure(rep) as in luyug/GradCache), got {len(given)} other value(s); pass the reps the loss used."
        )
    for k, rep in enumerate(given):
        if rep.grad is None:
            raise ValueError(
                f"rep {k + 1} of {_name(func)} has no .grad: call loss.backward() on a loss computed from it "
                "(e.g. through a @cat_input_tensor loss) before its closure. No gradient was written."
            )
    return given


def _name(func: Callable[..., Any]) -> str:
    return getattr(func, "__qualname__", None) or repr(func)

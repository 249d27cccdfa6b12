"""Matryoshka representation learning: one loss summed over nested prefixes of the embeddings."""

from __future__ import annotations

import inspect
import math
from collections.abc import Sequence
from numbers import Integral, Real
from typing import Any

import torch
from torch import nn

from .checks import check_embeddings
from .precision import compute_dtype
from .queue import SharedQueueCall

__all__ = ["Matryoshka"]


class Matryoshka(nn.Module):
    """The inner loss at several embedding widths, each on the first d_k columns of every embedding, weighted.

    L = sum_k w_k * loss(e_1[:, :d_k], e_2[:, :d_k], ...),  over every embedding argument e_i of the inner loss.

    Paper: Kusupati et al. 2022, "Matryoshka Representation Learning", https://arxiv.org/abs/2205.13147; the
    same sum as sentence-transformers' ``MatryoshkaLoss``. Its ``shrink`` truncates each embedding and then
    L2-normalises it; every gradcache loss normalises its rows itself (cosine similarity), so handing it the
    truncated rows is that shrink: the same value and gradients (the tests compare both).

    Under GradCache and CachedLoss the sum is computed in phase (2) from the cached full-width embeddings: each
    chunk is still encoded twice, never once per dimension, and the gradient equals FullBatch's on every encoder
    parameter and on the inner loss's learnable temperature and bias (shared by every dimension, trained once).
    Tiled inner losses (``tile_size``) work as they are. Cost: the inner loss once per dimension. The inner
    loss's own methods are reached through ``.loss`` (``loss_fn.loss.clamp_logit_scale()`` for CLIP).

    Queue: an inner loss with ``queue_size`` > 0 keeps ONE queue of full-width rows. Each call reads it once,
    hands each dimension its first d_k columns, and pushes the full-width rows once, after the whole sum (under
    gradients and for a finite sum, the queue's usual rules): the queue advances once per call of
    ``Matryoshka``, not once per dimension (see ``SharedQueueCall`` in ``queue.py``).

    Args:
        loss: the inner loss, an ``nn.Module`` taking (N, D) embeddings (``InfoNCE``, ``NTXent``, ``ClipLoss``,
            ``SigLipLoss``, or one of yours that normalises its rows and pushes its input tensors to its queues
            as it receives them, after its own cast to the compute dtype, as these do).
        dims: d_1 > d_2 > ... >= 1, strictly decreasing ints, e.g. ``(768, 512, 256, 128, 64)``. ``dims[0]``
            may be smaller than the embedding width (as in sentence-transformers; the columns past it are then
            not trained), never larger.
        weights: w_k, one finite number > 0 per dimension (drop a dimension rather than weight it 0, which would
            compute its loss for nothing); None for all 1.

    Shapes (``forward``):
        the inner loss's arguments: every tensor is an (N_i, D) embedding with D >= dims[0], truncated to
        (N_i, d_k); anything else (a ``None`` for InfoNCE's absent negatives) passes unchanged.
        Returns a 0-dim tensor in the inner loss's dtype.

    Raises:
        TypeError: ``loss`` is not an ``nn.Module`` or is already a ``Matryoshka``; a dim that is not an int; a
            weight that is not a number; arguments that do not fit the inner loss's ``forward``.
        ValueError: empty dims, a dim < 1, dims not strictly decreasing, weights of another length, a weight
            that is not finite or not > 0; at ``forward``, ``dims[0]`` larger than the embedding width (before
            any loss runs or any queue changes), and whatever the inner loss refuses.

    Example:
        >>> loss_fn = Matryoshka(InfoNCE(temperature=0.05), dims=(384, 256, 128, 64))
        >>> query, positive = torch.randn(8, 384), torch.randn(8, 384)
        >>> loss = loss_fn(query, positive)  # InfoNCE at 384 + at 256 + at 128 + at 64 columns
    """

    def __init__(self, loss: nn.Module, dims: Sequence[int], *, weights: Sequence[float] | None = None) -> None:
        super().__init__()
        if isinstance(loss, Matryoshka):
            raise TypeError(
                f"loss is already a Matryoshka (dims={loss.dims}); pass its inner loss (loss.loss) with the dims "
                f"you want instead of nesting two"
            )
        if not isinstance(loss, nn.Module):
            raise TypeError(
                f"loss must be an nn.Module (InfoNCE, NTXent, ClipLoss, SigLipLoss, ...), got {type(loss).__name__}; "
                f"wrap a plain function in an nn.Module so its parameters and queue are registered"
            )
        self.loss = loss
        self.dims = _check_dims(dims)
        self.weights = _check_weights(weights, len(self.dims))

    def extra_repr(self) -> str:
        return f"dims={self.dims}, weights={self.weights}"

    def negatives_per_anchor(self, seen: int, hard_negatives: int = 0) -> int:
        """The inner loss's count: every dimension contrasts each anchor with the same negatives.

        Raises:
            TypeError: the inner loss has no ``negatives_per_anchor`` method.
            ValueError: whatever the inner loss's method refuses.
        """
        count = getattr(self.loss, "negatives_per_anchor", None)
        if not callable(count):
            raise TypeError(
                f"the inner loss {type(self.loss).__name__} has no negatives_per_anchor(seen, hard_negatives) "
                f"method; derive it from gradcache.losses.base.LossBase or define that method on it"
            )
        return count(seen, hard_negatives)

    def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        named = self._named_embeddings(args, kwargs)
        check_embeddings(**named)  # each floating, 2-D, finite and of one width, before the width is read
        name, first = next(iter(named.items()))
        width = first.shape[1]
        if self.dims[0] > width:
            raise ValueError(
                f"Matryoshka dims[0]={self.dims[0]} is larger than the embedding width {width} of {name} "
                f"(dims={self.dims}); pass dims no larger than {width}, e.g. dims=({width}, ...), or give the "
                f"encoder an output of at least {self.dims[0]} columns"
            )
        # Cast once to the compute dtype: the inner loss's own cast is then a no-op, so the tensors it pushes to
        # its queue are the prefixes handed to it here, which ``widen`` maps back to full width.
        dtype = compute_dtype(*named.values())
        full_args = [_cast(a, dtype) for a in args]
        full_kwargs = {k: _cast(v, dtype) for k, v in kwargs.items()}
        first_call: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # id(prefix) -> (prefix, full), dims[0]

        def widen(pushed: torch.Tensor) -> torch.Tensor:
            entry = first_call.get(id(pushed))
            if entry is None or entry[0] is not pushed:
                raise RuntimeError(
                    f"{type(self.loss).__name__} pushed into its queue a tensor that Matryoshka did not hand it; "
                    f"Matryoshka shares a queue only with a loss that pushes its input tensors as it receives them "
                    f"(gradcache's losses do)"
                )
            return entry[1]

        terms = []
        with SharedQueueCall(self.loss, width, widen) as shared:
            for k, (dim, weight) in enumerate(zip(self.dims, self.weights)):
                cut_args = [_prefix(a, dim) for a in full_args]  # each (N_i, dim)
                cut_kwargs = {key: _prefix(v, dim) for key, v in full_kwargs.items()}
                if k == 0:
                    pairs = [*zip(cut_args, full_args), *((cut_kwargs[key], v) for key, v in full_kwargs.items())]
                    first_call.update({id(c): (c, f) for c, f in pairs if isinstance(f, torch.Tensor)})
                terms.append(weight * self.loss(*cut_args, **cut_kwargs))
            total = sum(terms[1:], terms[0])  # dims is non-empty (checked in __init__)
            shared.push(total)
        return total

    def _named_embeddings(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, torch.Tensor]:
        """The tensor arguments under the inner loss's parameter names (``query``, ``positive``, ...)."""
        signature = inspect.signature(self.loss.forward)
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError as error:
            raise TypeError(f"the arguments do not fit {type(self.loss).__name__}.forward{signature}: {error}") from None
        named: dict[str, Any] = {}
        for name, value in bound.arguments.items():
            kind = signature.parameters[name].kind
            if kind is inspect.Parameter.VAR_POSITIONAL:
                named.update({f"{name}[{i}]": v for i, v in enumerate(value)})
            elif kind is inspect.Parameter.VAR_KEYWORD:
                named.update(value)
            else:
                named[name] = value
        tensors = {name: value for name, value in named.items() if isinstance(value, torch.Tensor)}
        if not tensors:
            raise TypeError(
                f"Matryoshka got no embedding tensor among the arguments of {type(self.loss).__name__}.forward; "
                f"pass the (N, D) embeddings it truncates"
            )
        return tensors


def _cast(value: Any, dtype: torch.dtype) -> Any:
    return value.to(dtype) if isinstance(value, torch.Tensor) else value


def _prefix(value: Any, dim: int) -> Any:
    return value[:, :dim] if isinstance(value, torch.Tensor) else value  # (N, D) -> (N, dim), a view


def _check_dims(dims: object) -> tuple[int, ...]:
    if isinstance(dims, (str, bytes)) or not isinstance(dims, Sequence):
        raise TypeError(f"dims must be a sequence of ints such as (768, 512, 256), got {dims!r}")
    if not dims:
        raise ValueError("dims is empty; pass at least one embedding width, e.g. dims=(768, 512, 256)")
    for index, dim in enumerate(dims):
        if isinstance(dim, bool) or not isinstance(dim, Integral):
            raise TypeError(f"dims[{index}] must be an int, got {dim!r} of type {type(dim).__name__} (dims={dims!r})")
        if dim < 1:
            raise ValueError(f"dims[{index}]={dim} must be >= 1 (a number of columns); dims={tuple(dims)}")
    values = tuple(int(d) for d in dims)
    for index in range(1, len(values)):
        if values[index] >= values[index - 1]:
            raise ValueError(
                f"dims must be strictly decreasing, but dims[{index}]={values[index]} follows "
                f"dims[{index - 1}]={values[index - 1]} (dims={values}); pass "
                f"dims={tuple(sorted(set(values), reverse=True))}, with weights in the same order"
            )
    return values


def _check_weights(weights: object, count: int) -> tuple[float, ...]:
    if weights is None:
        return (1.0,) * count
    if isinstance(weights, (str, bytes)) or not isinstance(weights, Sequence):
        raise TypeError(f"weights must be None or a sequence of {count} numbers, one per dim, got {weights!r}")
    if len(weights) != count:
        raise ValueError(
            f"weights has {len(weights)} entries but dims has {count}; pass one weight per dim, or None for all 1"
        )
    for index, weight in enumerate(weights):
        if isinstance(weight, bool) or not isinstance(weight, Real):
            raise TypeError(f"weights[{index}] must be a number, got {weight!r} of type {type(weight).__name__}")
        if not math.isfinite(float(weight)) or float(weight) <= 0.0:
            raise ValueError(
                f"weights[{index}]={weight!r} must be finite and > 0; drop that dim from dims instead of "
                f"weighting it 0"
            )
    return tuple(float(w) for w in weights)

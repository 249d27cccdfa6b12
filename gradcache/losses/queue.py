"""A ring buffer of past embeddings that a loss adds to its candidates as constant negatives (MoCo, XBM).

    queue_t = the last ``size`` rows enqueued by calls 1 .. t - 1 (detached),  candidates_t = [batch_t; queue_t]

Memory: ``size`` x D floats per queue, in the loss's compute dtype (float32, or float64 for float64 inputs).

When it advances: once per call of the loss made with gradients enabled, after the loss is computed and only
if it is finite; never under ``torch.no_grad()`` (evaluation). With ``warmup`` = k the first k such calls
neither read nor fill the queue, as XBM starts its memory only after a warm-up (the first steps' embeddings go
stale fastest); call k + 1 starts from an empty queue. GradCache, CachedLoss and FullBatch call the loss once
per step (the queue advances by the global batch); NaiveAccumulation once per micro-batch (accumulation with a
memory bank, ContAccum's setting).

Distributed: the strategies gather every rank's embeddings before calling the loss, so every rank enqueues the
same global batch and the queues agree with no communication of their own. A loss with a queue inside a
DDP-wrapped module (a ``CachedLoss`` inside the model a trainer wraps) has rank 0's buffers broadcast at every
forward under DDP's default ``broadcast_buffers=True``: harmless while the queues agree, but Q x D floats sent per
forward; keep the loss outside the wrapped module (the strategies take it apart from the encoders) or pass
``broadcast_buffers=False`` (which also stops syncing BatchNorm buffers). A loss called on each rank's own,
ungathered batch keeps a queue per rank: there ``broadcast_buffers=True`` would overwrite them all with rank 0's.

Saved state: the buffers ``rows`` (size, D), ``pointer`` (next row to overwrite), ``count`` (rows filled) and
``calls`` (calls counted), so the queue moves with ``.to()`` and travels in ``state_dict()`` and checkpoints.
D is unknown until the first call, so a fresh queue holds a (0, 0) ``rows`` placeholder and
``_load_from_state_dict`` adopts the saved shape: ``load_state_dict`` on a fresh loss accepts a saved queue.

Two queues as one (``QueuePair``): a loss over paired inputs (x_i, y_i) keeps one queue per side (``ClipLoss``:
``image_queue`` and ``text_queue``; ``SigLipLoss``: ``a_queue`` and ``b_queue``, each named after the input whose
rows it keeps, so the state_dict keys say what they hold). ``loss.queues`` shows both as one ``QueuePair``, sides
``first`` and ``second``, which checks both widths before either is read and pushes both sides together.

Several calls as one (``SharedQueueCall``): a wrapper that calls its loss several times on column prefixes of
the same embeddings (``Matryoshka``, once per dimension) keeps ONE queue of full-width rows. Inside the block
each queue's ``contents`` is read once, on the first call, and cut to each call's width; ``push`` records the
first call's rows instead of enqueuing them; the wrapper then pushes their full-width rows once, under the rules
above, so the queue advances once per call of the wrapper, not once per dimension.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from gradcache.ranges import is_int

__all__ = ["EmbeddingQueue", "QueuePair", "SharedQueueCall", "check_queue_options", "make_queue", "queued_negatives"]


def _check_count(value: object, name: str) -> int:
    if not is_int(value):
        raise TypeError(f"{name} must be an int >= 0 (0: off), got {value!r} of type {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{name} must be an int >= 0 (0: off), got {value}; pass 0 to turn it off")
    return value


def check_queue_options(queue_size: object, queue_warmup: object) -> tuple[int, int]:
    """Return ``(queue_size, queue_warmup)`` if both are ints >= 0; raise TypeError/ValueError naming them."""
    size, warmup = _check_count(queue_size, "queue_size"), _check_count(queue_warmup, "queue_warmup")
    if warmup and not size:
        raise ValueError(f"queue_warmup={warmup} needs a queue: pass queue_size > 0 too, or queue_warmup=0 "
                         "(a warm-up needs a queue, which queue_size=0 turns off)")
    return size, warmup


def make_queue(queue_size: object, queue_warmup: object) -> EmbeddingQueue | None:
    """An ``EmbeddingQueue`` for a loss's ``queue_size`` and ``queue_warmup`` options; None for queue_size=0."""
    size, warmup = check_queue_options(queue_size, queue_warmup)
    return EmbeddingQueue(size, warmup) if size else None


def queued_negatives(loss: nn.Module) -> int:
    """Queued rows the next call of ``loss`` adds to each anchor's negatives: 0 without a queue, during its
    warm-up, or while empty; then the rows filled so far, up to ``queue_size`` (a loss's queues fill together)."""
    for module in loss.modules():
        if isinstance(module, EmbeddingQueue):
            return int(module.count) if module.active else 0
    return 0


class EmbeddingQueue(nn.Module):
    """The last ``size`` rows pushed into it, oldest first, as constants (no gradient reaches them).

    Args:
        size: rows kept (>= 1).
        warmup: calls with gradients, counted by ``push``, during which the queue is neither used nor filled.

    Example:
        >>> queue = EmbeddingQueue(size=4096)
        >>> negatives = queue.contents(like=embeddings)  # (count, D), or None on the first call
        >>> loss = ...  # with negatives as extra candidates
        >>> queue.push(loss, embeddings)  # advances only under grad and for a finite loss
    """

    rows: torch.Tensor
    pointer: torch.Tensor
    count: torch.Tensor
    calls: torch.Tensor
    _shared: _SharedState | None = None  # set only inside a SharedQueueCall block (a class default: old pickles)

    def __init__(self, size: int, warmup: int = 0) -> None:
        super().__init__()
        self.size, self.warmup = check_queue_options(size, warmup)
        if not self.size:
            raise ValueError("EmbeddingQueue needs size >= 1; a loss with queue_size=0 keeps no queue")
        self.register_buffer("rows", torch.zeros(0, 0))  # (size, D) once the first call fixes D
        self.register_buffer("pointer", torch.zeros((), dtype=torch.long))
        self.register_buffer("count", torch.zeros((), dtype=torch.long))
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))

    def extra_repr(self) -> str:
        return f"size={self.size}, warmup={self.warmup}, filled={int(self.count)}"

    @property
    def active(self) -> bool:
        """Whether the warm-up is over, so that calls read and fill the queue."""
        return int(self.calls) >= self.warmup

    def check_width(self, width: int, option: str = "queue_size") -> None:
        """Raise ValueError, touching nothing, if the queue already holds rows of another width than ``width``.

        Inside a ``SharedQueueCall`` the full width was checked on entry and any narrower width is a prefix of it.
        """
        if self._shared is not None and width <= self._shared.width:
            return
        if self.rows.numel() and self.rows.shape[1] != width:
            raise ValueError(
                f"{option}: the queue holds embeddings of width {self.rows.shape[1]} (from earlier calls or a loaded "
                f"state_dict) but this batch has width {width}; use one embedding size, or call reset() on the "
                f"loss's queues (loss.queue; ClipLoss and SigLipLoss: loss.queues) or build a fresh loss to start an "
                f"empty queue"
            )

    def contents(self, like: torch.Tensor) -> torch.Tensor | None:
        """(count, D) queued rows, oldest first, on ``like``'s device and dtype; None when empty or warming up.

        Inside a ``SharedQueueCall``: the rows read on the block's first call, cut to ``like``'s width (count, d).
        """
        self.check_width(like.shape[1])
        if self._shared is not None:
            return self._shared.contents(self, like)
        return self._read(like)

    def _read(self, like: torch.Tensor) -> torch.Tensor | None:
        filled = int(self.count)
        if not self.active or not filled:
            return None
        # A copy, never a view: the loss's graph saves it and the next push writes into ``rows`` in place.
        if filled == self.size:
            rows = torch.roll(self.rows, -int(self.pointer), dims=0)  # the oldest row is at the pointer
        else:
            rows = self.rows[:filled].clone()  # unfilled: rows 0 .. count - 1, oldest first
        return rows.to(device=like.device, dtype=like.dtype)

    def push(self, loss: torch.Tensor, *embeddings: torch.Tensor) -> None:
        """Enqueue ``embeddings`` (stacked, detached) if gradients are on and ``loss`` is finite; else nothing.

        The finiteness check reads one value from the device (one synchronisation per call). Inside a
        ``SharedQueueCall`` it only records the first call's ``embeddings``, for the block's one push.
        """
        if self._shared is not None:
            self._shared.record(embeddings)
            return
        if not torch.is_grad_enabled() or not bool(torch.isfinite(loss.detach())):
            return
        with torch.no_grad():
            self._advance(torch.cat([e.detach() for e in embeddings]))  # (B, D)

    def _advance(self, new: torch.Tensor) -> None:
        self.check_width(new.shape[1])
        if self.calls.device != new.device:  # follow the embeddings: a loss without parameters is rarely moved
            self.pointer, self.count, self.calls = (b.to(new.device) for b in (self.pointer, self.count, self.calls))
        if not self.active:
            self.calls += 1
            return
        if not self.rows.numel():
            self._resize(new.new_zeros(self.size, new.shape[1]))
        self._resize(self.rows.to(new.device))
        kept = new[-self.size:].to(self.rows.dtype)  # more rows than the queue holds: the last ones win
        start = int(self.pointer) + new.shape[0] - kept.shape[0]
        index = (start + torch.arange(kept.shape[0], device=new.device)) % self.size  # (m,)
        self.rows[index] = kept
        self.pointer.fill_((int(self.pointer) + new.shape[0]) % self.size)
        self.count.fill_(min(int(self.count) + new.shape[0], self.size))
        self.calls += 1

    def reset(self) -> None:
        """Empty the queue and restart the warm-up; the next call fixes the width again."""
        self._resize(torch.zeros(0, 0, device=self.rows.device))
        for buffer in (self.pointer, self.count, self.calls):
            buffer.zero_()

    def _resize(self, rows: torch.Tensor) -> None:
        self.rows = rows  # a registered buffer: assignment replaces it

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, local_metadata: dict[str, Any],
                              strict: bool, missing_keys: list[str], unexpected_keys: list[str],
                              error_msgs: list[str]) -> None:
        saved = state_dict.get(prefix + "rows")
        if isinstance(saved, torch.Tensor):
            if saved.numel() and (saved.ndim != 2 or saved.shape[0] != self.size):
                error_msgs.append(
                    f"{prefix}rows: the saved queue holds {tuple(saved.shape)} rows but this loss has "
                    f"queue_size={self.size}; build the loss with queue_size={saved.shape[0]} to load it"
                )
                return
            # Adopt the saved shape (a fresh queue is (0, 0)); the copy below fills it.
            self._resize(torch.empty(saved.shape, dtype=saved.dtype, device=self.rows.device))
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)


class QueuePair:
    """The two queues of a loss over paired inputs (x_i, y_i): x's rows in ``first``, y's in ``second``, used together.

        contents(x, y) -> (queued x rows, queued y rows);  push(loss, x, y): x's rows to first, y's to second

    A view of two ``EmbeddingQueue`` submodules that the loss keeps under its own attribute names (its
    ``queue_names``); both are None for a loss without a queue, and then every method does nothing.

    Args:
        first, second: the queues of the first and the second input, or both None.

    Example:
        >>> queued_images, queued_texts = clip_loss.queues.contents(image, text)  # None, None while empty
        >>> clip_loss.queues.push(loss, image, text)
    """

    def __init__(self, first: EmbeddingQueue | None, second: EmbeddingQueue | None) -> None:
        if (first is None) != (second is None):
            raise ValueError("a QueuePair holds two queues or none; got one queue and None")
        self.first, self.second = first, second

    def contents(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Each side's ``EmbeddingQueue.contents``; both widths checked before either queue is read."""
        if self.first is None:
            return None, None
        self.first.check_width(x.shape[1])
        self.second.check_width(y.shape[1])
        return self.first.contents(x), self.second.contents(y)

    def push(self, loss: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> None:
        """``EmbeddingQueue.push`` of x's rows into ``first`` and y's into ``second``, under the same rules."""
        if self.first is not None:
            self.first.push(loss, x)
            self.second.push(loss, y)

    def reset(self) -> None:
        """Empty both queues and restart their warm-up (``EmbeddingQueue.reset``)."""
        if self.first is not None:
            self.first.reset()
            self.second.reset()


class _SharedState:
    """One queue's side of a ``SharedQueueCall``: its rows as read once, and the rows its first call pushed."""

    def __init__(self, width: int) -> None:
        self.width = width
        self.read = False
        self.rows: torch.Tensor | None = None  # (count, width), a copy: never written in place
        self.pushed: tuple[torch.Tensor, ...] | None = None

    def contents(self, queue: EmbeddingQueue, like: torch.Tensor) -> torch.Tensor | None:
        if not self.read:
            self.rows, self.read = queue._read(like), True
        return None if self.rows is None else self.rows[:, : like.shape[1]]  # (count, d): the first d columns

    def record(self, embeddings: tuple[torch.Tensor, ...]) -> None:
        if self.pushed is None:  # every call pushes the same rows, cut to another width: keep the first
            self.pushed = embeddings


class SharedQueueCall:
    """Several calls of ``loss`` on column prefixes of the same (N, width) embeddings, seen by its queues as one.

        queue rows read once (full width), each call given their first d columns; one push of full-width rows

    Inside the block each ``EmbeddingQueue`` of ``loss`` returns, from ``contents(like)``, the rows it held on
    entry cut to ``like``'s width, and records what the first call pushes instead of enqueuing it. ``push(value)``,
    called once at the end, enqueues those rows mapped back to full width by ``widen`` under the queue's usual
    rules (gradients on, ``value`` finite). Leaving the block without ``push`` (an error in a call) leaves every
    queue as it was.

    Args:
        loss: the module whose queues (every ``EmbeddingQueue`` among its modules) are shared.
        width: the full embedding width; a queue already holding rows of another width raises on entry.
        widen: maps a tensor that ``loss`` pushed on the first call (a prefix view of an input) to its full-width
            (N, width) rows.

    Raises:
        ValueError: a queue of ``loss`` holds rows of another width than ``width`` (on entry, nothing changed).

    Example:
        >>> with SharedQueueCall(inner, width=64, widen=full_rows_of) as shared:
        ...     total = inner(query[:, :64], positive[:, :64]) + inner(query[:, :32], positive[:, :32])
        ...     shared.push(total)
    """

    def __init__(self, loss: nn.Module, width: int,
                 widen: Callable[[torch.Tensor], torch.Tensor]) -> None:
        self.queues = [m for m in loss.modules() if isinstance(m, EmbeddingQueue)]
        self.width, self.widen = width, widen

    def __enter__(self) -> SharedQueueCall:
        for queue in self.queues:  # every width checked before any queue changes mode
            queue.check_width(self.width)
        for queue in self.queues:
            queue._shared = _SharedState(self.width)
        return self

    def __exit__(self, *exc_info: object) -> None:
        for queue in self.queues:
            queue._shared = None

    def push(self, value: torch.Tensor) -> None:
        """Enqueue, once, the full-width rows of what the first call pushed into each queue."""
        for queue in self.queues:
            state, queue._shared = queue._shared, None
            if state is not None and state.pushed is not None:
                queue.push(value, *(self.widen(e) for e in state.pushed))

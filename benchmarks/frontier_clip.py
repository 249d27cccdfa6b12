"""The frontier's frozen-tower point: CLIP with a frozen image tower (locked-image tuning) under GradCache,
against the two parts it should cost and no more.

    frozen_tower   GradCache([frozen image tower, text tower], ClipLoss): the image tower runs once per chunk,
                   without a graph, and is never re-encoded
    image_nograd   the image tower alone, chunk by chunk, without a graph (what phase (1) must spend on it)
    text_alone     GradCache of the text tower alone against the same images' embeddings held as constants
                   (an `nn.Identity` "tower" over precomputed embeddings: no parameters, encoded once)

Target: frozen_tower at most 1.05 x (image_nograd + text_alone). The encoders are the benchmarks'
CLIP of `benchmarks.workloads` (the conv image tower, the byte-level text transformer) on random inputs.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from benchmarks.round_robin import medians, per_round_ratio
from gradcache import GradCache

CONFIGURATIONS = ["image_nograd", "text_alone", "frozen_tower"]
REFERENCES = ("image_nograd",)  # not a training step: timed only, as the unit it is compared with
TARGET = 1.05


def build_clip_steps(settings: dict[str, Any], device: torch.device, only: str | None = None
                     ) -> tuple[dict[str, Callable[[], None]], dict[str, dict[str, Any]]]:
    """name -> one step (gradients cleared after it) of each configuration; `only` builds that one alone."""
    from benchmarks.workloads import build_workload

    workload = build_workload({"task": "clip", "model": "convnet", "image_size": settings["image_size"],
                               "batch": settings["batch"], "strategy": "gradcache", "seed": 0,
                               "text_length": settings["max_length"]}, device)
    image_tower, text_tower = workload.encoders
    image_tower.requires_grad_(False)
    images, tokens = workload.inputs
    chunk = settings["chunk"]
    learned = [*text_tower.parameters(), *workload.loss.parameters()]

    def cleared(step: Callable[[], Any]) -> Callable[[], None]:
        def run() -> None:
            step()
            for parameter in learned:
                parameter.grad = None
        return run

    steps: dict[str, Callable[[], None]] = {}
    if only in (None, "image_nograd"):
        steps["image_nograd"] = lambda: _encode_without_graph(image_tower, images, chunk)
    if only in (None, "text_alone"):
        with torch.no_grad():
            fixed = torch.cat([image_tower(piece) for piece in images.split(chunk)])
        alone = GradCache([nn.Identity(), text_tower], workload.loss, chunk)
        steps["text_alone"] = cleared(lambda: alone.step(fixed, tokens))
    if only in (None, "frozen_tower"):
        frozen = GradCache([image_tower, text_tower], workload.loss, chunk)
        steps["frozen_tower"] = cleared(lambda: frozen.step(images, tokens))
    return steps, {}


@torch.no_grad()
def _encode_without_graph(encoder: nn.Module, images: torch.Tensor, chunk: int) -> None:
    for piece in images.split(chunk):
        encoder(piece)


def target_lines(times: dict[str, list[float]]) -> list[str]:
    """The frozen-tower target as measured: frozen_tower / (image_nograd + text_alone), median per round."""
    if not {"frozen_tower", "image_nograd", "text_alone"} <= set(times):
        return []
    seconds = medians(times)
    ratio = per_round_ratio(times, "frozen_tower", ("image_nograd", "text_alone"))
    verdict = "met" if ratio <= TARGET else "missed"
    return [f"frozen image tower: {seconds['frozen_tower']:.3f} s = {ratio:.3f} x (image_nograd "
            f"{seconds['image_nograd']:.3f} + text_alone {seconds['text_alone']:.3f} s); target <= {TARGET}: {verdict}"]

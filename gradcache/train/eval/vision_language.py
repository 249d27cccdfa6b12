"""A vision-language model's inputs as embeddings, for the commands and evaluation: `vision_language_embedder`
builds `LoadedModel.embed_inputs` from an encoder and its collator."""
from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from gradcache.models.vision_language import VisionLanguageEncoder
from gradcache.models.vision_language_collator import VisionLanguageCollator, VisionLanguageInput
from gradcache.ranges import check_int

TOWERS = ("query", "passage")


def vision_language_embedder(encoder: VisionLanguageEncoder, collator: VisionLanguageCollator, device: torch.device,
                             batch_size: int) -> Callable[[Sequence[VisionLanguageInput], str], torch.Tensor]:
    """(inputs, tower) -> (N, D) float32 embeddings on the CPU, in the inputs' order: each input (a text, its
    images or both) collated as the `tower` side ("query": `collator.queries`, with the query prompt; "passage":
    `collator.passages`) and embedded by `encoder` in eval mode without gradients, `batch_size` inputs at a time
    (the encoder's train or eval mode restored after).

    The callable raises ValueError for a `tower` that is neither, and passes on the collator's (an input with
    neither text nor an image, one longer than its `max_length`: the message names its place in its batch).

    Example:
        >>> embed = vision_language_embedder(encoder, collator, torch.device("cpu"), batch_size=16)
        >>> embed([VisionLanguageInput(text="a cat"), VisionLanguageInput(images=(image,))], "query").shape
        torch.Size([2, 32])
    """
    check_int(batch_size, "batch_size")

    def embed_inputs(inputs: Sequence[VisionLanguageInput], tower: str) -> torch.Tensor:
        if tower not in TOWERS:
            raise ValueError(f"tower={tower!r}: choose one of {', '.join(TOWERS)}")
        collate = collator.queries if tower == "query" else collator.passages
        training, chunks = encoder.training, []
        encoder.eval()
        try:
            with torch.inference_mode():
                for start in range(0, len(inputs), batch_size):
                    batch = collate(inputs[start:start + batch_size])
                    chunks.append(encoder(**{key: value.to(device) for key, value in batch.items()}).float().cpu())
        finally:
            encoder.train(training)  # evaluation during a run leaves the encoder as it found it
        return torch.cat(chunks) if chunks else torch.empty(0, encoder.out_dim or 0)

    return embed_inputs

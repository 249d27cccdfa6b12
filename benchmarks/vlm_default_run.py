"""A study for `gradcache train vlm`'s default run (issue 48 item 2): does the tiny Qwen2-VL preset, trained with
GradCache on the built-in shapes and captions for a few minutes on 2 CPU cores, rise clearly above its untrained
start in held-out retrieval?

Rows cycle through three kinds: image -> its caption, caption -> its image, and image + text -> caption (the query
holds the image and the caption's place and background words, so the model must join what it sees with what it
reads). Held-out: images and captions of an independent stream, ranked both ways (`image_to_text_recall@1`,
`text_to_image_recall@1`, `mrr@10`), before training (`_random_init`) and at the end. The whole model trains (a
random vision tower is nothing to keep frozen).

    python -m benchmarks.vlm_default_run --cpu-seconds 180 --seed 0

The budget is this process's CPU time on one thread (`time.process_time`), so a machine shared with other work
trains as many steps as an idle one: 180 CPU-seconds on one thread stands for at most 3 minutes on 2 idle cores
(a second thread only adds). On a busy 2-core machine a second torch thread made each step 50 times slower.
Not a test; wall times on a shared machine are not figures.

Seen once per seed (defaults: batch 64 in chunks of 32, 256 held-out shapes; about 800 steps in the budget, on a
2-core machine shared with other work, so the CPU seconds hold and the wall times do not), held-out recall@1
untrained -> trained, image to text / text to image: seed 0: 0.0 -> 56.3 / 0.8 -> 58.6; seed 1: 0.4 -> 57.0 /
0.0 -> 59.8; seed 2: 0.0 -> 49.6 / 1.2 -> 57.0.
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch
from PIL import Image

from gradcache import GradCache
from gradcache.losses import InfoNCE
from gradcache.models import (
    VisionLanguageCollator, VisionLanguageEncoder, VisionLanguageInput, build_vision_language_model,
)
from gradcache.train.data.images.shapes import caption_words, render_shapes
from gradcache.train.eval.images import retrieval_recall


def pictures(images: torch.Tensor) -> list[Image.Image]:
    return [Image.fromarray(image.permute(1, 2, 0).numpy()) for image in images]  # (3, H, W) uint8 -> PIL


def place(caption: str) -> str:
    """The words after the shape ('in the top left on a dark background'): what the image + text row reads."""
    return " ".join(caption.split()[4:])


def pair(kind: int, image: Image.Image, caption: str) -> tuple[VisionLanguageInput, VisionLanguageInput]:
    if kind == 0:
        return VisionLanguageInput(images=(image,)), VisionLanguageInput(caption)
    if kind == 1:
        return VisionLanguageInput(caption), VisionLanguageInput(images=(image,))
    return VisionLanguageInput(place(caption), (image,)), VisionLanguageInput(caption)


@torch.no_grad()
def embed(encoder: VisionLanguageEncoder, collator: VisionLanguageCollator, inputs: list[VisionLanguageInput],
          batch_size: int = 64) -> np.ndarray:
    encoder.eval()
    parts = [encoder(**collator(inputs[start:start + batch_size])) for start in range(0, len(inputs), batch_size)]
    encoder.train()
    return torch.cat(parts).numpy()


def mrr10(queries: np.ndarray, corpus: np.ndarray, relevant: np.ndarray) -> float:
    scores = queries @ corpus.T  # (Q, C)
    rank = (scores > scores[np.arange(len(queries)), relevant][:, None]).sum(1) + 1  # (Q,)
    return 100.0 * float(np.where(rank <= 10, 1.0 / rank, 0.0).mean())


def evaluate(encoder, collator, images, captions) -> dict[str, float]:
    image_embeddings = embed(encoder, collator, [VisionLanguageInput(images=(image,)) for image in images])
    caption_embeddings = embed(encoder, collator, [VisionLanguageInput(caption) for caption in captions])
    recall = retrieval_recall(image_embeddings, caption_embeddings, captions, ks=(1,))
    index = np.arange(len(images))
    return {"image_to_text_recall@1": recall["image_to_text_recall@1"],
            "text_to_image_recall@1": recall["text_to_image_recall@1"],
            "image_to_text_mrr@10": mrr10(image_embeddings, caption_embeddings, index),
            "text_to_image_mrr@10": mrr10(caption_embeddings, image_embeddings, index)}


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu-seconds", type=float, default=180.0, help="training CPU time (default 180)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--chunk-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--temperature", type=float, default=0.05)
    parser.add_argument("--train-size", type=int, default=4096)
    parser.add_argument("--test-size", type=int, default=256)
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    train = render_shapes(args.train_size, args.image_size, seed=args.seed)
    test = render_shapes(args.test_size, args.image_size, seed=args.seed + 1_000_003)
    train_images, test_images = pictures(train.images), pictures(test.images)
    model, processor = build_vision_language_model("tiny-qwen2-vl", caption_words(), seed=args.seed)
    encoder = VisionLanguageEncoder(model, train_vision=True)
    collator = VisionLanguageCollator(processor)
    metrics = {f"{key}_random_init": value
               for key, value in evaluate(encoder, collator, test_images, test.captions).items()}
    print(json.dumps(metrics), flush=True)
    cache = GradCache([encoder, encoder], InfoNCE(args.temperature), args.chunk_size)
    optimizer = torch.optim.AdamW(encoder.parameters(), lr=args.lr, weight_decay=0.01)
    generator = torch.Generator().manual_seed(args.seed)
    start, cpu_start, steps = time.monotonic(), time.process_time(), 0
    while time.process_time() - cpu_start < args.cpu_seconds:
        rows = torch.randint(len(train_images), (args.batch_size,), generator=generator).tolist()
        pairs = [pair((steps + k) % 3, train_images[r], train.captions[r]) for k, r in enumerate(rows)]
        queries, passages = collator([q for q, _ in pairs]), collator([p for _, p in pairs])
        optimizer.zero_grad(set_to_none=True)
        loss = cache.step(queries, passages)
        optimizer.step()
        steps += 1
        if steps % 20 == 0:
            print(f"step {steps} loss {loss.item():.3f} cpu {time.process_time() - cpu_start:.0f}s", flush=True)
    metrics.update(evaluate(encoder, collator, test_images, test.captions))
    metrics.update(steps=steps, cpu_seconds=round(time.process_time() - cpu_start, 1),
                   wall_seconds=round(time.monotonic() - start, 1), seed=args.seed)
    print(json.dumps(metrics), flush=True)
    return metrics


if __name__ == "__main__":
    main()

"""GradCache inside the Hugging Face Trainer: CLIP-style training of two towers with a learnable temperature.

Shows: `GradCacheTrainer` with a `CachedLoss` as the Trainer's model. Every step's loss is over the whole
batch (batch - 1 negatives per example) while the encoders only ever hold one chunk's activations; the
Trainer's gradient accumulation, `--bf16` and its DDP launch work unchanged:

    python examples/huggingface_trainer.py --steps 30
    torchrun --nproc_per_node 2 examples/huggingface_trainer.py --bf16    # the loss sees both ranks' batches

Needs: `pip install "gradcache[huggingface]"` (transformers, accelerate). No download: the pairs are
synthetic, each "caption" a few tokens that depend on its "image" vector.
"""
from __future__ import annotations

import argparse
import tempfile

import torch
from torch import nn
from transformers import TrainingArguments

from gradcache import CachedLoss
from gradcache.integrations.huggingface import GradCacheTrainer
from gradcache.losses import ClipLoss

VOCAB, WORDS, FEATURES = 64, 6, 32


class Pairs(torch.utils.data.Dataset):
    """Image vectors and captions whose token ids are a fixed random function of the image."""

    def __init__(self, size: int, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.images = torch.randn(size, FEATURES, generator=g)
        codebook = torch.randn(FEATURES, VOCAB, generator=g)
        self.captions = (self.images @ codebook).topk(WORDS, dim=1).indices  # (size, WORDS)

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"image": self.images[i], "caption": self.captions[i]}


def collate(rows: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return {key: torch.stack([row[key] for row in rows]) for key in rows[0]}


def towers(width: int = 64) -> tuple[nn.Module, nn.Module]:
    image = nn.Sequential(nn.Linear(FEATURES, width), nn.GELU(), nn.Linear(width, width))
    text = nn.Sequential(nn.EmbeddingBag(VOCAB, width), nn.GELU(), nn.Linear(width, width))  # mean of tokens
    return image, text


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30, help="optimizer steps (default 30)")
    parser.add_argument("--batch-size", type=int, default=256, help="pairs per step and rank (default 256)")
    parser.add_argument("--chunk-size", type=int, default=32, help="pairs per encoder pass (default 32)")
    parser.add_argument("--accumulation", type=int, default=1, help="micro-batches per optimizer step (default 1)")
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast (default off)")
    parser.add_argument("--output-dir", default=None, help="Trainer output folder (default: a temporary one)")
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    image, text = towers()
    cached = CachedLoss([image, text], ClipLoss(temperature=0.07, learnable=True), chunk_size=args.chunk_size)
    training = TrainingArguments(
        args.output_dir or tempfile.mkdtemp(prefix="gradcache-hf-"), max_steps=args.steps, learning_rate=3e-3,
        per_device_train_batch_size=args.batch_size, gradient_accumulation_steps=args.accumulation,
        bf16=args.bf16, use_cpu=not torch.cuda.is_available(), remove_unused_columns=False,  # entries = inputs
        logging_steps=max(1, args.steps // 5), save_strategy="no", report_to=[], disable_tqdm=True,
    )
    trainer = GradCacheTrainer(cached, training, input_names=("image", "caption"),
                               train_dataset=Pairs(args.batch_size * args.steps * args.accumulation),
                               data_collator=collate)
    result = trainer.train()
    batch = args.batch_size * training.world_size  # the loss is over every rank's pairs
    print(f"mean training loss {result.training_loss:.3f} (chance: log({batch}) = {torch.log(torch.tensor(float(batch))):.3f})")
    return result.training_loss


if __name__ == "__main__":
    main()

"""GradCache inside PyTorch Lightning: a retrieval dual encoder trained with InfoNCE over each whole batch.

Shows: `GradCacheModule`, whose `training_step` returns `CachedLoss`'s loss under automatic optimization.
Lightning keeps its own precision, clipping, accumulation and DDP; the gradients stay those of one full-batch
step, and under DDP they synchronise once per optimizer step:

    python examples/lightning_module.py --steps 30
    python examples/lightning_module.py --precision bf16-mixed --devices 2 --strategy ddp   # 2 CPU processes

Needs: `pip install "gradcache[lightning]"`. No download: queries and passages are synthetic token ids, each
passage sharing half its tokens with its query.
"""
from __future__ import annotations

import argparse

import lightning.pytorch as pl
import torch
from torch import nn

from gradcache.integrations.lightning import GradCacheModule
from gradcache.losses import InfoNCE

VOCAB, LENGTH = 128, 8


def pairs(size: int, seed: int = 0) -> torch.utils.data.TensorDataset:
    """(query, passage) token ids; a passage keeps its query's first half and draws the rest at random."""
    g = torch.Generator().manual_seed(seed)
    queries = torch.randint(0, VOCAB, (size, LENGTH), generator=g)
    passages = torch.cat([queries[:, : LENGTH // 2], torch.randint(0, VOCAB, (size, LENGTH // 2), generator=g)], 1)
    return torch.utils.data.TensorDataset(queries, passages)


def encoder(width: int = 64) -> nn.Module:
    """One tower shared by queries and passages: mean of token embeddings, then an MLP."""
    return nn.Sequential(nn.EmbeddingBag(VOCAB, width), nn.Linear(width, width), nn.GELU(), nn.Linear(width, width))


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30, help="optimizer steps (default 30)")
    parser.add_argument("--batch-size", type=int, default=256, help="pairs per step and process (default 256)")
    parser.add_argument("--chunk-size", type=int, default=32, help="pairs per encoder pass (default 32)")
    parser.add_argument("--accumulation", type=int, default=1, help="accumulate_grad_batches (default 1)")
    parser.add_argument("--precision", default="32-true", help="Lightning precision, e.g. bf16-mixed (default 32-true)")
    parser.add_argument("--devices", type=int, default=1, help="processes (default 1)")
    parser.add_argument("--strategy", default="auto", help="Lightning strategy, e.g. ddp (default auto)")
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    module = GradCacheModule(encoder(), InfoNCE(temperature=0.05), chunk_size=args.chunk_size,
                             optimizer=lambda parameters: torch.optim.AdamW(parameters, lr=3e-3))
    loader = torch.utils.data.DataLoader(pairs(args.batch_size * args.steps * args.accumulation),
                                         batch_size=args.batch_size, shuffle=True)
    trainer = pl.Trainer(max_steps=args.steps, accelerator="auto", devices=args.devices, strategy=args.strategy,
                         precision=args.precision, gradient_clip_val=1.0, accumulate_grad_batches=args.accumulation,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, log_every_n_steps=1)
    trainer.fit(module, loader)
    loss = float(trainer.callback_metrics["train_loss"])
    batch = args.batch_size * trainer.world_size  # the loss is over every process's pairs
    print(f"last training loss {loss:.3f} (chance: log({batch}) = {torch.log(torch.tensor(float(batch))):.3f})")
    return loss


if __name__ == "__main__":
    main()

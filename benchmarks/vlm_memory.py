"""Peak memory and step time of a vision-language embedder's step: GradCache, GradCache with the frozen vision
tower reused (`reuse_outputs`), sentence-transformers' `CachedMultipleNegativesRankingLoss` at the same
mini-batch, and accumulation, N growing.

The model: a Qwen2-VL architecture from a config, random weights (seed 0): ``--text-layers`` (4) language layers
of width ``--width`` (256), a ``--vision-blocks`` (4) block vision tower of width ``--vision-width`` (256), patch
14, merge 2; a word-level tokenizer and a Qwen2-VL processor made here, with a small chat template, so
sentence-transformers reads it as one multimodal model (Transformer, last-token Pooling, Normalize). The vision
tower is frozen on every side, the language model learns. The batch: N (anchor, positive) rows cycling through
text only, image only, image + text and two images + text (each column shifted), images of 112 x 112 to 224 x
112 pixels (64 to 128 patches, 16 to 32 image tokens), one batch's `preprocess` per column. The loss: MNRL at
scale 20 (ours: InfoNCE at temperature 0.05 over the normalised embeddings, the same loss). A step is the loss's
forward and backward, not the optimizer. Ours splits each column by itself (no `split_fn`: each chunk holds its
rows' images, told by `num_images_per_sample`), in the same mini-batches of rows as the peer.

Exactness: at ``--check-size`` (64: 4 chunks of 16) every side's gradient on every trainable parameter against one
full-batch backward (FullBatch), relative to the largest entry (accumulation is not a large batch: its error is
reported, not required). Our sides trim each chunk's trailing padding, as the peer's mini-batches are trimmed.
Memory: each (side, N) point in a fresh process (``fresh_process.py``), a step at N = 2 x --chunk first
(initialisation, splitting included, not counted), then the peak RSS above the baseline over one step at N (CUDA:
``torch.cuda.max_memory_allocated``). Time: per N, every side in one process, round robin over ``--rounds``
rounds (``round_robin.py``), medians and per-round ratios to the peer.

    python -m benchmarks.vlm_memory                 # memory at N = 64 to 512, time at 64 and 256; exactness
    python -m benchmarks.vlm_memory --sizes 64,128 --time-sizes 64 --rounds 9
    python -m benchmarks.vlm_memory --device cuda --sizes 512,2048
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from benchmarks.flags import HelpFormatter, add_shared_options, integer_list, output_folder
from benchmarks.fresh_process import LIVE_TENSORS_ENV, PeakMemory, report, reset_peak_rss, run_point
from benchmarks.report import add_peak_ratios, machine_context, plot_lines, print_table, write_csv
from benchmarks.round_robin import medians, per_round_ratio, round_robin

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # local files only

MB = 2**20
SIDES = ("gradcache", "gradcache_reuse", "st_cached", "accumulation")
PEER = "st_cached"
EXACT = ("gradcache", "gradcache_reuse", "st_cached")  # accumulation is not a large batch: reported, not required
COLUMNS = ["side", "measure", "n", "chunk", "width", "vision_width", "status", "peak_mb", "memory_ratio_to_st",
           "step_s", "time_ratio_to_st", "rounds", "max_relative_error", "exact", "loss_value", "process_s", "error",
           *machine_context(0, "cpu")]
TABLE = ["side", "measure", "n", "status", "peak_mb", "memory_ratio_to_st", "step_s", "time_ratio_to_st",
         "max_relative_error", "loadavg_1m"]
WORDS = ["a", "cat", "dog", "on", "the", "mat", "red", "blue", "photo", "of", "is", "sits", "green", "tree",
         "small", "big", "house", "car", "near", "under"]
SPECIAL = ["<|pad|>", "<|endoftext|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
CHAT_TEMPLATE = ("{% for message in messages %}{% for content in message['content'] %}"
                 "{% if content['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|> "
                 "{% elif content['type'] == 'text' %}{{ content['text'] }} {% endif %}{% endfor %}{% endfor %}")
IMAGE_SIZES = [(112, 112), (224, 112), (112, 168), (168, 112)]  # (width, height): 64 to 128 patches


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter)
    parser.add_argument("--sizes", default="64,128,256,512", help="comma-separated N of the memory points")
    parser.add_argument("--time-sizes", default="64,256", help="comma-separated N timed round robin ('' none)")
    parser.add_argument("--check-size", type=int, default=64,
                        help="N of the exactness check, more than --chunk so that it splits (0: none)")
    parser.add_argument("--sides", default=",".join(SIDES), help=f"comma-separated subset of {','.join(SIDES)}")
    parser.add_argument("--chunk", type=int, default=16, help="our chunk_size and their mini_batch_size")
    parser.add_argument("--width", type=int, default=256, help="the language model's hidden size")
    parser.add_argument("--text-layers", type=int, default=4, help="language model layers")
    parser.add_argument("--vision-width", type=int, default=256, help="the vision tower's hidden size")
    parser.add_argument("--vision-blocks", type=int, default=4, help="vision tower blocks")
    parser.add_argument("--rounds", type=int, default=9, help="round-robin rounds per timed N (median reported)")
    parser.add_argument("--model-dir", default=None, help="where the model is written (default: a temporary folder)")
    add_shared_options(parser, "vlm_memory", memory_budget_gb=12.0, time_budget_s=1800.0)
    return parser


def save_model(folder: Path, width: int, text_layers: int, vision_width: int, vision_blocks: int) -> Path:
    """The Qwen2-VL and its processor (word-level tokenizer, chat template) written to `folder`: no download."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import (
        PreTrainedTokenizerFast, Qwen2VLConfig, Qwen2VLImageProcessor, Qwen2VLModel, Qwen2VLProcessor,
        Qwen2VLVideoProcessor,
    )

    if (folder / "config.json").exists():
        return folder
    vocab = {token: index for index, token in enumerate([*SPECIAL, *WORDS, "[UNK]"])}
    words = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=words, pad_token="<|pad|>", eos_token="<|endoftext|>",
                                        unk_token="[UNK]")
    tokenizer.add_special_tokens({"additional_special_tokens": SPECIAL[2:]})
    pixels = dict(min_pixels=112 * 112, max_pixels=224 * 168)
    processor = Qwen2VLProcessor(image_processor=Qwen2VLImageProcessor(**pixels), tokenizer=tokenizer,
                                 video_processor=Qwen2VLVideoProcessor(**pixels), chat_template=CHAT_TEMPLATE)
    heads = max(1, width // 64)
    config = Qwen2VLConfig(
        text_config=dict(hidden_size=width, intermediate_size=4 * width, num_hidden_layers=text_layers,
                         num_attention_heads=heads, num_key_value_heads=max(1, heads // 2), vocab_size=len(vocab),
                         max_position_embeddings=1024, attention_dropout=0.0,
                         rope_scaling={"type": "mrope", "mrope_section": _mrope(width // heads)},
                         pad_token_id=vocab["<|pad|>"], bos_token_id=None, eos_token_id=vocab["<|endoftext|>"]),
        vision_config=dict(depth=vision_blocks, embed_dim=vision_width, hidden_size=width,
                           num_heads=max(1, vision_width // 64), mlp_ratio=4, patch_size=14, spatial_merge_size=2,
                           temporal_patch_size=2, in_channels=3),
        image_token_id=vocab["<|image_pad|>"], video_token_id=vocab["<|video_pad|>"],
        vision_start_token_id=vocab["<|vision_start|>"], vision_end_token_id=vocab["<|vision_end|>"],
        pad_token_id=vocab["<|pad|>"], bos_token_id=None, eos_token_id=vocab["<|endoftext|>"],
    )
    torch.manual_seed(0)
    Qwen2VLModel(config).float().save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder


def _mrope(head_dim: int) -> list[int]:
    """M-RoPE's (temporal, height, width) sections of head_dim / 2 rotary pairs, as Qwen2-VL splits them."""
    half = head_dim // 2
    return [half - 2 * (half * 3 // 8), half * 3 // 8, half * 3 // 8]


def load_model(folder: str, device: str):
    """The SentenceTransformer (Transformer, last-token Pooling, Normalize), its vision tower frozen."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

    transformer = Transformer(folder)
    model = SentenceTransformer(modules=[transformer, Pooling(transformer.get_embedding_dimension(), "lasttoken"),
                                         Normalize()], device=device).train()
    tower(model).requires_grad_(False)
    return model


def tower(model) -> torch.nn.Module:
    """The model's vision tower (Qwen2VLModel.visual)."""
    return model[0].model.visual


def rows_of(n: int, shift: int, generator) -> list[Any]:
    """N inputs cycling text only, image only, image + text, two images + text, from `shift`."""
    from PIL import Image

    def image() -> Any:
        width, height = IMAGE_SIZES[int(generator.integers(len(IMAGE_SIZES)))]
        return Image.fromarray(generator.integers(0, 256, (height, width, 3), dtype="uint8"))

    def text() -> str:
        return " ".join(WORDS[int(k)] for k in generator.integers(0, len(WORDS), int(generator.integers(3, 12))))

    rows = []
    for k in range(n):
        kind = (k + shift) % 4
        rows.append(text() if kind == 0 else image() if kind == 1 else {"image": image(), "text": text()}
                    if kind == 2 else {"image": [image(), image()], "text": text()})
    return rows


def batch(model, n: int, seed: int = 0) -> list[dict[str, Any]]:
    """The trainer's `sentence_features` of N (anchor, positive) mixed rows."""
    import numpy

    generator = numpy.random.default_rng(seed)
    columns = []
    for shift in (0, 2):
        features = model.preprocess(rows_of(n, shift, generator))
        columns.append({k: v.to(model.device) if isinstance(v, torch.Tensor) else v for k, v in features.items()})
    return columns


class Embedder(torch.nn.Module):
    """The SentenceTransformer as an encoder of one column's features: (B, D) normalised embeddings."""

    def __init__(self, model) -> None:
        super().__init__()
        self.model = model

    def forward(self, **features: Any) -> torch.Tensor:
        return self.model(dict(features))["sentence_embedding"]


def build_step(side: str, model, chunk: int):
    """side -> a function of the features running one forward and backward, returning the loss."""
    from gradcache import FullBatch, GradCache, NaiveAccumulation
    from gradcache.losses import InfoNCE

    if side == "st_cached":
        from sentence_transformers.sentence_transformer.losses import CachedMultipleNegativesRankingLoss

        loss = CachedMultipleNegativesRankingLoss(model, scale=20.0, mini_batch_size=chunk)

        def peer(features: list[dict[str, Any]]) -> torch.Tensor:
            value = loss([dict(f) for f in features], None)
            value.backward()
            return value.detach()

        return peer
    encoder, info_nce = Embedder(model), InfoNCE(temperature=0.05)
    if side == "full_batch":
        strategy = FullBatch(encoder, info_nce)
    elif side == "accumulation":
        strategy = NaiveAccumulation(encoder, info_nce, chunk, trim_padding=True)
    else:
        reused = {"reuse_outputs": [tower(model)]} if side == "gradcache_reuse" else {}
        strategy = GradCache(encoder, info_nce, chunk, trim_padding=True, **reused)
    return lambda features: strategy.step(*features)


def step(model, run, features: list[dict[str, Any]]) -> float:
    """One forward and backward; the gradients dropped after."""
    value = run(features)
    model.zero_grad(set_to_none=True)
    return float(value)


def gradients(model, run, features: list[dict[str, Any]]) -> tuple[float, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    value = float(run(features))
    grads = {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return value, grads


def check_exactness(args: argparse.Namespace, sides: list[str]) -> list[dict[str, Any]]:
    """Every side's gradients at --check-size against FullBatch's, relative to its largest entry."""
    torch.set_num_threads(args.threads)
    model = load_model(args.model_dir, args.device)
    features = batch(model, args.check_size, seed=3)
    _, want = gradients(model, build_step("full_batch", model, args.chunk), features)
    scale = max(g.abs().max().item() for g in want.values())
    rows = []
    for side in sides:
        value, got = gradients(model, build_step(side, model, args.chunk), features)
        error = max((got[k] - want[k]).abs().max().item() for k in want) / scale if got.keys() == want.keys() \
            else float("inf")
        rows.append({"side": side, "measure": "exactness", "n": args.check_size, "status": "ok",
                     "max_relative_error": error, "exact": error <= 1e-5 if side in EXACT else "",
                     "loss_value": value})
    return rows


def run_one_point(point: dict[str, Any]) -> dict[str, Any]:
    """Child process: one step at N above the baseline taken after a step at N = 2 x chunk."""
    torch.set_num_threads(point["threads"])
    device = torch.device(point["device"])
    model = load_model(point["model_dir"], point["device"])
    run = build_step(point["side"], model, point["chunk"])
    # initialisation of both libraries, not counted: at two chunks, so each side's splitting has run once too
    step(model, run, batch(model, 2 * point["chunk"], seed=1))
    features = batch(model, point["n"])
    if device.type == "cpu":
        reset_peak_rss()  # the peak restarts here: imports and setup excluded
    peak = PeakMemory(device, int(point["memory_budget_gb"] * 2**30))
    value = step(model, run, features)
    return {"status": "ok", "peak_mb": peak.peak_above_baseline() / MB, "loss_value": value}


def time_sides(args: argparse.Namespace, n: int, sides: list[str]) -> list[dict[str, Any]]:
    """Every side at N in this process, round robin."""
    torch.set_num_threads(args.threads)
    model = load_model(args.model_dir, args.device)
    features = batch(model, n)
    runs = {side: build_step(side, model, args.chunk) for side in sides}
    values = {side: step(model, run, features) for side, run in runs.items()}
    times = round_robin({side: (lambda run=run: step(model, run, features)) for side, run in runs.items()},
                        args.rounds, torch.device(args.device))
    figures = medians(times)
    return [{"side": side, "measure": "time", "n": n, "status": "ok", "step_s": figures[side],
             "time_ratio_to_st": per_round_ratio(times, side, [PEER]) if PEER in sides else "",
             "rounds": args.rounds, "loss_value": values[side]} for side in sides]


def _sides(text: str) -> list[str]:
    chosen = [s for s in text.split(",") if s]
    for side in chosen:
        if side not in SIDES:
            raise ValueError(f"--sides: unknown side {side!r}; choose from {', '.join(SIDES)}")
    return chosen


def run_sweep(args: argparse.Namespace) -> list[dict[str, Any]]:
    sides = _sides(args.sides)
    common = {"chunk": args.chunk, "width": args.width, "vision_width": args.vision_width}
    rows: list[dict[str, Any]] = []
    if args.check_size:
        context = machine_context(args.threads, args.device)
        rows.extend({**row, **common, **context} for row in check_exactness(args, sides))
    for n in integer_list(args.sizes, "--sizes") if args.sizes else []:
        point_rows = {}
        for side in sides:
            point = {"side": side, "n": n, "model_dir": args.model_dir, "threads": args.threads,
                     "device": args.device, "chunk": args.chunk, "memory_budget_gb": args.memory_budget_gb}
            row = {"side": side, "measure": "memory", "n": n, **common, **machine_context(args.threads, args.device)}
            row.update(run_point(__spec__.name, point, args.time_budget_s, env=LIVE_TENSORS_ENV))
            point_rows[side] = row
            print(json.dumps({key: row.get(key) for key in TABLE if key in row}), flush=True)
        add_peak_ratios(point_rows, PEER, "memory_ratio_to_st")
        rows.extend(point_rows.values())
    for n in integer_list(args.time_sizes, "--time-sizes") if args.time_sizes else []:
        context = machine_context(args.threads, args.device)
        rows.extend({**row, **common, **context} for row in time_sides(args, n, sides))
    return rows


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    parser = get_args_parser()
    args = parser.parse_args(argv)
    if args.point is not None:
        report(run_one_point(json.loads(args.point)))
        return []
    _sides(args.sides)  # refuse bad flags before any work
    if args.chunk < 1 or args.check_size < 0:
        parser.error(f"--chunk must be at least 1 and --check-size at least 0, got {args.chunk} and {args.check_size}")
    if 0 < args.check_size <= args.chunk:  # one chunk is the full batch: the check could not fail
        parser.error(f"--check-size {args.check_size} is not more than --chunk {args.chunk}, so nothing is split "
                     "and the check could not fail; give a larger --check-size, or 0 for none")
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(args.model_dir or Path(scratch) / "tiny-qwen2-vl")
        args.model_dir = str(save_model(folder, args.width, args.text_layers, args.vision_width, args.vision_blocks))
        started = time.perf_counter()
        rows = run_sweep(args)
    output_dir = output_folder(args)
    write_csv(output_dir / f"{args.name}.csv", rows, COLUMNS)
    memory = [r for r in rows if r["measure"] == "memory"]
    timed = [r for r in rows if r["measure"] == "time"]
    title = (f"VLM embedder step, Qwen2-VL {args.text_layers}x{args.width} text, {args.vision_blocks}x"
             f"{args.vision_width} vision (frozen), chunk {args.chunk}, {args.device}, {args.threads} threads")
    if memory:
        plot_lines(output_dir / f"{args.name}.png", memory, "n", [("peak_mb", "peak memory above baseline (MiB)")],
                   "side", title)
    if timed:
        stem = f"{args.name}_time" if memory else args.name  # a run of times alone: NAME.png
        plot_lines(output_dir / f"{stem}.png", timed, "n", [("step_s", "step time (s), median")], "side", title)
    print_table(rows, TABLE)
    print(f"{time.perf_counter() - started:.0f} s")
    return rows


if __name__ == "__main__":
    main()

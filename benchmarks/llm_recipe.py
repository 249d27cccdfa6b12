"""An E5-Mistral-style step against batch size: GradCache against accumulation and the full batch, on a decoder.

The recipe of docs/training.md "Training an LLM embedder", in the library's form: one decoder shared by queries
and passages (`HuggingFaceEncoder(pooling="last")`, EOS appended by `HuggingFaceTokenizer`), a query prompt,
LoRA rank 16 with alpha 32 on every linear layer of each block (`gradcache.train.modes.lora.add_lora`),
activation checkpointing, bf16 autocast, InfoNCE at temperature 0.02, AdamW on the adapter. Strategies:
`gradcache` (chunks of at most `--chunk` rows and `--chunk-tokens` padded tokens, over the rows sorted by
length),
`naive` (`NaiveAccumulation`, the same micro-batch, `trim_padding`) and `full_batch` (`FullBatch`).

CPU form (default): a randomly initialised `LlamaForCausalLM` of the `tiny` shape (hidden 256, 4 layers, 4
heads, intermediate 688, vocabulary 32,000; `--hidden ...` change it) saved in a temporary folder, and a
word-level tokenizer built here over generated words; queries and passages of random generated words of
long-tailed length. Nothing is downloaded. Peak memory: one point per fresh process (`fresh_process.py`: peak
RSS above the baseline after the model is built, one step). Step time: the strategies timed round robin in one
process (`round_robin.py`), medians over rounds, and the per-round ratio to `naive`; `full_batch` only where its
memory point ran.

Named shapes (`--shape NAME`, one of `SHAPES`: mistral-7b, qwen2-1.5b, qwen2-0.5b, tiny): the decoder is built
in each process from a transformers config, with random weights (weights change neither memory nor time),
directly in its dtype on its device (`from_config` under `torch.device`: a 7B decoder takes its 14.2 GB (13.2
GiB) of bf16 weights on the GPU and none on the host; nothing is written but the tokenizer), with the generated
tokenizer at the shape's vocabulary size. `--hidden ...` given beside `--shape` change that shape's sizes.

GPU form (`--gpu` with `--shape NAME` or `--model DIR`, a local decoder folder with its tokenizer): bf16
weights, global batch 2,048 on one GPU, chunks of at most 64 rows and 8192 tokens, `gradcache` and `naive`, peak
`torch.cuda.max_memory_allocated`. Unrun: no GPU was available when it was written.

Plan: before the first point it prints one line per (strategy, batch) with its planned peak (`point_plan`:
the weights, the adapter's states and the activations of the largest graph the step holds, by arithmetic over
the batch's own token lengths) and its estimated seconds, then `plan: N points, planned peak X GiB, ~Y s`
(`--plan-only`: that, and nothing run).

Memory budget (`--memory-budget-gb`, GiB; default 12, 70 with `--gpu`): the memory of the model and its step,
all of it: the weights (bf16 with `--gpu`, else fp32), the LoRA adapter with its gradient and AdamW's two
moments, and the step's activations, as `point_plan` counts them. A point whose planned peak exceeds it is
skipped (recorded as `skipped`, not run into an OOM); a budget below every point's plan (below the weights,
say) is refused before any point runs (exit 2, naming the option and the smallest budget that fits). While a
point runs, the budget caps it: on CUDA the process's caching allocator (`torch.cuda.set_per_process_memory_fraction`, which counts
the weights already loaded), on the CPU a watchdog on the RSS growth above the built model, allowed the budget
less the model's parameter bytes.

    python -m benchmarks.llm_recipe                                   # CPU: batch 32, 64, 128, 256
    python -m benchmarks.llm_recipe --batches 32,64 --rounds 5
    python -m benchmarks.llm_recipe --shape tiny --batches 8 --rounds 1        # the shapes' path, on the CPU
    python -m benchmarks.llm_recipe --gpu --shape mistral-7b --rounds 3 --name llm_recipe_gpu --write-results
    python -m benchmarks.llm_recipe --gpu --model ~/models/mistral-7b --rounds 3
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import math
import os
import random
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from benchmarks.atomic_output import replaced
from benchmarks.flags import (
    HelpFormatter,
    OptionParser,
    add_shared_options,
    finite_positive,
    integer_list,
    output_folder,
    whole_number,
)
from benchmarks.fresh_process import LIVE_TENSORS_ENV, PeakMemory, report, reset_peak_rss, run_point
from benchmarks.report import machine_context, plot_lines, print_table
from benchmarks.round_robin import medians, per_round_ratio, round_robin

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # local folders only

GB = 2**30
MB = 2**20
STRATEGIES = ("gradcache", "naive", "full_batch")
QUERY_PROMPT = "Instruct: Given a query, retrieve the passage that answers it. Query: "
TEMPERATURE = 0.02  # E5-Mistral's
LORA_DROPOUT = 0.05
# E5-Mistral's LoRA targets: every linear layer of a Llama / Mistral / Qwen2 block.
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
SPECIAL = ["<pad>", "<unk>", "<s>", "</s>"]
PAD_ID, BOS_ID, EOS_ID = 0, 2, 3  # SPECIAL's positions: the generated tokenizer's ids, in every built config
MAX_POSITIONS = 2048
GPU_BATCH = 2048
CPU_MEMORY_BUDGET_GB = 12.0
MAX_LENGTH = 131_072  # tokens per text: the longest context of the decoders planned here, and more
MAX_CHUNK_TOKENS = 2**24
MAX_LORA_RANK = 4_096
MAX_VOCAB = 262_144  # above Gemma's 256,000; planning writes a word-level tokenizer of this many words
GPU_MEMORY_BUDGET_GB = 70.0  # an 80 GB H100's memory, less room for the CUDA context and the allocator's slack
TABLE = ["strategy", "batch", "status", "planned_mb", "peak_mb", "step_s", "min_s", "max_s", "ratio_to_naive",
         "loss_value", "loadavg_1m"]


@dataclass(frozen=True)
class Shape:
    """A decoder's sizes and its transformers family (`FAMILIES`: the config class, and whether q, k and v have
    biases); `tied_embeddings`: its LM head shares the embedding (the base model this script trains has none)."""

    family: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    tied_embeddings: bool = False

    @property
    def qkv_bias(self) -> bool:
        return FAMILIES[self.family][1]

    def sizes(self) -> dict[str, int]:
        """The sizes `decoder_parameters` and `lora_parameters` take (vocabulary aside)."""
        return {"hidden": self.hidden, "layers": self.layers, "heads": self.heads, "kv_heads": self.kv_heads,
                "intermediate": self.intermediate}

    def parameters(self) -> int:
        """The base model's parameters (no LM head)."""
        return decoder_parameters(**self.sizes(), vocab=self.vocab, qkv_bias=self.qkv_bias)


FAMILIES: dict[str, tuple[str, bool]] = {"llama": ("LlamaConfig", False), "mistral": ("MistralConfig", False),
                                         "qwen2": ("Qwen2Config", True)}
# The named shapes, from each model's published config.json (Qwen2's small models tie their LM head).
SHAPES: dict[str, Shape] = {
    "tiny": Shape("llama", hidden=256, layers=4, heads=4, kv_heads=4, intermediate=688, vocab=32000),
    "qwen2-0.5b": Shape("qwen2", hidden=896, layers=24, heads=14, kv_heads=2, intermediate=4864, vocab=151936,
                        tied_embeddings=True),
    "qwen2-1.5b": Shape("qwen2", hidden=1536, layers=28, heads=12, kv_heads=2, intermediate=8960, vocab=151936,
                        tied_embeddings=True),
    "mistral-7b": Shape("mistral", hidden=4096, layers=32, heads=32, kv_heads=8, intermediate=14336, vocab=32000),
}
SIZE_OPTIONS = {"hidden": "--hidden", "layers": "--layers", "heads": "--heads", "kv_heads": "--kv-heads",
                "intermediate": "--intermediate", "vocab": "--vocab"}


def get_args_parser() -> argparse.ArgumentParser:
    parser = OptionParser(description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter)
    parser.add_argument("--gpu", action="store_true", help="the GPU form: --shape NAME or --model DIR in bf16, "
                        "batch 2048, cuda, gradcache and naive, --memory-budget-gb 70 (each default below that it "
                        "changes is said in its help)")
    parser.add_argument("--shape", choices=list(SHAPES), default=None,
                        help="build a decoder of this shape in each process, random weights in its dtype on its "
                        "device, no folder written (required with --gpu unless --model; default: the tiny shape "
                        "saved in a temporary folder)")
    parser.add_argument("--model", default=None, help="a local decoder folder with its tokenizer (default: a "
                        "random decoder, --shape's or the tiny one)")
    parser.add_argument("--batches", default=None, help="comma-separated batch sizes, pairs per step "
                        f"(default 32,64,128,256; {GPU_BATCH} with --gpu)")
    parser.add_argument("--strategies", default=None, help=f"comma-separated subset of {','.join(STRATEGIES)} "
                        "(default: all three; gradcache,naive with --gpu)")
    parser.add_argument("--chunk", type=int, default=None, help="most rows per chunk (GradCache), rows per "
                        "micro-batch (naive) (default 8; 64 with --gpu)")
    parser.add_argument("--chunk-tokens", type=int, default=None,
                        help="GradCache's chunk_tokens, most padded tokens per chunk (default 512; 8192 with --gpu)")
    parser.add_argument("--max-length", type=int, default=None, help="tokens per text (default 128; 512 with --gpu)")
    parser.add_argument("--query-words", default="6,24", help="fewest,most words of a query")
    parser.add_argument("--passage-words", default="16,120", help="fewest,most words of a passage (long-tailed)")
    parser.add_argument("--lora-rank", type=int, default=16, help="LoRA rank (alpha is twice it)")
    parser.add_argument("--autocast", choices=("bf16", "none"), default="bf16",
                        help="the encoder under bf16 autocast, or in its weights' dtype (a CPU without avx512_bf16 "
                        "or AMX runs bf16 matrix products slowly: compare with none there)")
    tiny = SHAPES["tiny"]
    for field, flag in SIZE_OPTIONS.items():
        what = {"hidden": "hidden size", "layers": "layers", "heads": "attention heads",
                "kv_heads": "key-value heads", "intermediate": "MLP width",
                "vocab": "vocabulary (and the generated tokenizer's)"}[field]
        extra = (" (default: --shape's, or --heads where --heads is given and the shape has as many key-value heads "
                 "as heads)") if field == "kv_heads" else f" (default: --shape's; {getattr(tiny, field)}, tiny's)"
        parser.add_argument(flag, type=int, default=None, help=f"the built decoder's {what}{extra}")
    parser.add_argument("--rounds", type=int, default=7, help="round-robin rounds per batch (medians reported)")
    parser.add_argument("--plan-only", action="store_true", help="print the plan (and refuse a budget below it) "
                        "and run nothing: no decoder is built, no device is used")
    add_shared_options(parser, "llm_recipe", memory_budget_gb=CPU_MEMORY_BUDGET_GB, time_budget_s=1800.0)
    budget = next(action for action in parser._actions if action.dest == "memory_budget_gb")  # flags' shared option
    budget.default = None
    budget.help = (f"GiB the model and its step may take, all of it: weights, the adapter's states, activations; a "
                   f"point planned above it is skipped, a budget below every point's plan refused (default "
                   f"{CPU_MEMORY_BUDGET_GB:g}; {GPU_MEMORY_BUDGET_GB:g} with --gpu)")
    return parser


def resolve_args(args: argparse.Namespace, parser: argparse.ArgumentParser) -> argparse.Namespace:
    """Fill the defaults that depend on `--gpu` and `--shape` (`args.built_shape`: the decoder to build, None with
    `--model`); bad values exit 2 through `parser.error`, naming the option."""
    if args.model is not None and args.shape is not None:
        parser.error(f"--model {args.model} and --shape {args.shape} both name the decoder; give one of them")
    if args.gpu and args.model is None and args.shape is None:
        parser.error(f"--gpu needs --shape NAME (a decoder built here with random weights: {', '.join(SHAPES)}) "
                     "or --model DIR (a local decoder folder with its tokenizer), e.g. --gpu --shape mistral-7b")
    if args.gpu:
        args.device = "cuda"
    args.batches = args.batches or (str(GPU_BATCH) if args.gpu else "32,64,128,256")
    args.strategies = args.strategies or ("gradcache,naive" if args.gpu else ",".join(STRATEGIES))
    args.chunk = args.chunk or (64 if args.gpu else 8)
    args.chunk_tokens = args.chunk_tokens or (8192 if args.gpu else 512)
    args.max_length = args.max_length or (512 if args.gpu else 128)
    if args.memory_budget_gb is None:
        args.memory_budget_gb = GPU_MEMORY_BUDGET_GB if args.gpu else CPU_MEMORY_BUDGET_GB
    try:
        finite_positive(args.memory_budget_gb, "--memory-budget-gb", "GiB for the weights, the adapter's states and "
                        "the activations")
        finite_positive(args.time_budget_s, "--time-budget-s", "seconds a point may take")
        whole_number(args.max_length, "--max-length", 1, MAX_LENGTH, "tokens per text")
        whole_number(args.lora_rank, "--lora-rank", 1, MAX_LORA_RANK, "a rank past a layer's width adds nothing")
        whole_number(args.chunk_tokens, "--chunk-tokens", 1, MAX_CHUNK_TOKENS, "padded tokens per chunk")
        if args.vocab is not None:
            whole_number(args.vocab, "--vocab", 100, MAX_VOCAB, "the plan writes a tokenizer of that many words")
        args.batch_list = integer_list(args.batches, "--batches")
        args.query_range = integer_list(args.query_words, "--query-words")
        args.passage_range = integer_list(args.passage_words, "--passage-words")
    except ValueError as error:
        parser.error(str(error))
    for flag, pair in (("--query-words", args.query_range), ("--passage-words", args.passage_range)):
        if len(pair) != 2 or not 1 <= pair[0] <= pair[1]:
            parser.error(f"{flag}={','.join(map(str, pair))} must be two counts FEWEST,MOST with 1 <= FEWEST <= MOST")
    args.strategy_list = args.strategies.split(",")
    unknown = [name for name in args.strategy_list if name not in STRATEGIES]
    if unknown:
        parser.error(f"--strategies: unknown {','.join(unknown)}; choose from {','.join(STRATEGIES)}")
    if min(args.batch_list) < 2 or args.chunk < 1 or args.rounds < 1:
        parser.error("--batches must be at least 2 (in-batch negatives), --chunk and --rounds at least 1")
    args.built_shape = built_shape(args, parser)
    return args


def built_shape(args: argparse.Namespace, parser: argparse.ArgumentParser) -> Shape | None:
    """The decoder to build: `--shape` (tiny by default) with the sizes given by `--hidden ...`; None with
    `--model`, which brings its config (then a size option is an error)."""
    given = {field: getattr(args, field) for field in SIZE_OPTIONS if getattr(args, field) is not None}
    if args.model is not None:
        if given:
            flags = " ".join(f"{SIZE_OPTIONS[field]} {value}" for field, value in given.items())
            parser.error(f"{flags}: sizes of a built decoder, but --model {args.model} brings its own config.json; "
                         "drop them, or build one with --shape NAME instead of --model")
        return None
    base = SHAPES[args.shape or "tiny"]
    if "heads" in given and "kv_heads" not in given and base.kv_heads == base.heads:
        given["kv_heads"] = given["heads"]  # multi-head attention stays multi-head
    shape = dataclasses.replace(base, **given)
    name = f"--shape {args.shape}" if args.shape else "the tiny shape"
    for field, flag in SIZE_OPTIONS.items():
        if getattr(shape, field) < 1:
            parser.error(f"{flag} {getattr(shape, field)} must be at least 1")
    if shape.hidden % shape.heads or shape.heads % shape.kv_heads:
        parser.error(f"{name} with hidden {shape.hidden}, heads {shape.heads}, key-value heads {shape.kv_heads}: "
                     "--hidden must be a multiple of --heads and --heads of --kv-heads")
    if shape.vocab < 100:
        parser.error(f"--vocab {shape.vocab} leaves the generated tokenizer no words for the texts; give 100 or more")
    return shape


# ---- the decoder, the tokenizer and the texts, all built here -------------------------------------------------

def generated_words(count: int) -> list[str]:
    """`count` distinct lower-case words of two to four consonant-vowel syllables, in a fixed order."""
    syllables = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]  # 70
    words: list[str] = []
    for length in (2, 3, 4):
        for index in range(len(syllables) ** length):
            if len(words) == count:
                return words
            parts, rest = [], index
            for _ in range(length):
                rest, digit = divmod(rest, len(syllables))
                parts.append(syllables[digit])
            words.append("".join(parts))
    raise ValueError(f"count={count} is more words than four syllables make")


def prompt_words() -> list[str]:
    return sorted({word.strip(":,.").lower() for word in QUERY_PROMPT.split()} | {":", ",", "."})


def write_tokenizer(folder: Path, vocab_size: int) -> list[str]:
    """A word-level tokenizer of `vocab_size` tokens (special, the prompt's words, generated words) that adds BOS,
    as Llama's does, and not EOS (`HuggingFaceTokenizer` appends it); returns the generated words."""
    import transformers
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

    fixed = SPECIAL + prompt_words()
    words = generated_words(vocab_size - len(fixed))
    vocab = {token: index for index, token in enumerate(fixed + words)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.normalizer = normalizers.Lowercase()
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                             special_tokens=[("<s>", vocab["<s>"])])
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>",
                                                unk_token="<unk>", pad_token="<pad>", padding_side="right")
    fast.save_pretrained(folder)
    return words


def decoder_config(shape: Shape) -> Any:
    """The transformers config of `shape` (`FAMILIES`' class), with the generated tokenizer's special ids."""
    import transformers

    config_class = getattr(transformers, FAMILIES[shape.family][0])
    # Mistral-7B v0.2's full attention (v0.1's window of 4096 tokens is wider than any text here)
    extra = {"sliding_window": None} if shape.family == "mistral" else {}
    return config_class(vocab_size=shape.vocab, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
                        num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
                        num_key_value_heads=shape.kv_heads, max_position_embeddings=MAX_POSITIONS,
                        pad_token_id=PAD_ID, bos_token_id=BOS_ID, eos_token_id=EOS_ID,
                        tie_word_embeddings=shape.tied_embeddings, **extra)


def build_decoder(shape: Shape, dtype: torch.dtype, device: torch.device) -> torch.nn.Module:
    """A randomly initialised base model (no LM head) of `shape`, its parameters created in `dtype` on `device`
    (no copy in another dtype or on the host: a 7B decoder in bf16 on a GPU takes its 13.2 GiB there alone)."""
    import transformers

    with torch.device(device):
        return transformers.AutoModel.from_config(decoder_config(shape), dtype=dtype)


def write_decoder(folder: Path, hidden: int, layers: int, heads: int, intermediate: int, vocab: int,
                  seed: int = 0, kv_heads: int | None = None) -> Path:
    """A randomly initialised `LlamaForCausalLM` (`kv_heads` default: `heads`) and its tokenizer saved in `folder`
    (no download)."""
    import transformers

    folder.mkdir(parents=True, exist_ok=True)
    write_tokenizer(folder, vocab)
    shape = Shape("llama", hidden, layers, heads, kv_heads or heads, intermediate, vocab)
    torch.manual_seed(seed)
    transformers.LlamaForCausalLM(decoder_config(shape)).save_pretrained(folder)
    return folder


def texts(batch: int, words: Sequence[str], query_range: Sequence[int], passage_range: Sequence[int],
          seed: int = 0) -> tuple[list[str], list[str]]:
    """`batch` queries and passages of random words; passage lengths long-tailed (most short, a few at the most),
    each passage sharing a few words with its query."""
    draw = random.Random(seed)
    queries, passages = [], []
    for _ in range(batch):
        query = draw.choices(words, k=draw.randint(*query_range))
        low, high = passage_range
        length = min(high, low + int(draw.expovariate(4.0 / (high - low + 1))))
        passage = draw.choices(words, k=length)
        passage[: min(3, length)] = query[: min(3, length)]
        draw.shuffle(passage)
        queries.append(" ".join(query))
        passages.append(" ".join(passage))
    return queries, passages


# ---- one step -------------------------------------------------------------------------------------------------

def build_encoder(point: dict[str, Any], device: torch.device) -> torch.nn.Module:
    """The decoder of `point["shape"]` built on `device`, or the folder `point["model"]`, in bf16 under
    `point["bf16_weights"]` (else fp32), checkpointed, LoRA added."""
    import transformers

    from gradcache.models import HuggingFaceEncoder
    from gradcache.train.modes.lora import LoraSettings, add_lora

    dtype = torch.bfloat16 if point["bf16_weights"] else torch.float32
    if point.get("shape"):
        model = build_decoder(Shape(**point["shape"]), dtype, device)
    else:
        model = transformers.AutoModel.from_pretrained(point["model"], dtype=dtype, local_files_only=True)
    encoder = HuggingFaceEncoder(model, pooling="last")
    encoder.set_grad_checkpointing(True)
    rank = point["lora_rank"]
    add_lora(encoder, LoraSettings(rank, 2.0 * rank, LORA_DROPOUT, LORA_TARGETS))
    return encoder.to(device)


def build_strategy(name: str, encoder: torch.nn.Module, point: dict[str, Any]) -> Any:
    from gradcache import FullBatch, GradCache, NaiveAccumulation
    from gradcache.losses import InfoNCE

    loss = InfoNCE(temperature=TEMPERATURE)
    options = {"autocast_dtype": torch.bfloat16 if point["autocast"] == "bf16" else None}
    if name == "gradcache":
        return GradCache(encoder, loss, point["chunk"], chunk_tokens=point["chunk_tokens"], **options)
    if name == "naive":
        return NaiveAccumulation(encoder, loss, point["chunk"], trim_padding=True, **options)
    return FullBatch(encoder, loss, **options)


def batch_inputs(point: dict[str, Any], device: torch.device) -> tuple[dict[str, torch.Tensor], ...]:
    """The batch's tokenized queries (with the prompt and its `prompt_length`) and passages, on `device`, by the
    tokenizer in the folder `point["tokenizer"]`."""
    from gradcache.models import HuggingFaceTokenizer

    tokenize = HuggingFaceTokenizer(point["tokenizer"], max_length=point["max_length"])
    vocabulary = generated_words(max(50, min(20000, tokenize.vocab_size - 100)))  # within a built tokenizer's words
    queries, passages = texts(point["batch"], vocabulary, point["query_words"], point["passage_words"])
    sides = tokenize(queries, prompt=QUERY_PROMPT), tokenize(passages)
    return tuple({key: value.to(device) for key, value in side.items()} for side in sides)


def step_of(strategy: Any, encoder: torch.nn.Module, optimizer: torch.optim.Optimizer,
            inputs: Sequence[dict[str, torch.Tensor]]) -> Callable[[], float]:
    """One training step: the strategy's forward and backward, AdamW on the adapter, gradients dropped."""

    def step() -> float:
        loss = strategy.step(*inputs)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())
    return step


def trained(encoder: torch.nn.Module) -> list[torch.nn.Parameter]:
    return [p for p in encoder.parameters() if p.requires_grad]


def run_one_point(point: dict[str, Any]) -> dict[str, Any]:
    """Child process: build, then one step measured for peak memory above the built state, under the point's
    budget (the whole process's on CUDA; on the CPU the RSS growth, allowed the budget less the parameters)."""
    if point["threads"]:
        torch.set_num_threads(point["threads"])
    device = torch.device(point["device"])
    torch.manual_seed(0)
    encoder = build_encoder(point, device)
    inputs = batch_inputs(point, device)
    optimizer = torch.optim.AdamW(trained(encoder), lr=1e-4)
    strategy = build_strategy(point["strategy"], encoder, point)
    weights = sum(p.numel() * p.element_size() for p in encoder.parameters())  # in the baseline, not in peak_mb
    budget = int(point["memory_budget_gb"] * GB) if point["memory_budget_gb"] else None
    if device.type == "cpu":
        reset_peak_rss()  # the build's transient peak (weights loaded, then copied) is not the step's
        budget = max(1, budget - weights) if budget else None  # the watchdog sees the growth above the model
    peak = PeakMemory(device, budget)
    loss_value = step_of(strategy, encoder, optimizer, inputs)()
    peak_bytes = peak.peak_above_baseline()
    peak.stop()
    tokens = sum(int(side["attention_mask"].sum()) for side in inputs)
    return {"status": "ok", "peak_mb": peak_bytes / MB, "weights_mb": weights / MB, "loss_value": loss_value,
            "tokens": tokens, "trained_parameters": sum(p.numel() for p in trained(encoder))}


def time_batch(point: dict[str, Any], names: Sequence[str], rounds: int) -> dict[str, list[float]]:
    """This process: the named strategies on one shared encoder, timed round robin; the device's cache is
    emptied after, so the next batch's fresh processes find the memory free."""
    device = torch.device(point["device"])
    torch.manual_seed(0)
    encoder = build_encoder(point, device)
    inputs = batch_inputs(point, device)
    optimizer = torch.optim.AdamW(trained(encoder), lr=1e-4)
    steps = {name: step_of(build_strategy(name, encoder, point), encoder, optimizer, inputs) for name in names}
    times = round_robin(steps, rounds, device)
    del steps, optimizer, encoder, inputs
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return times


# ---- the plan: memory and time by arithmetic -------------------------------------------------------------------

# The parts of a planned peak, in bytes (`memory_parts`): the model's, then the step's.
PARTS = ("weights", "lora_states", "checkpoints", "one_layer", "weight_copies", "backward", "cache", "loss",
         "runtime")
# What a first step's peak holds beyond its tensors: on the CPU its RSS growth (autograd's and oneDNN's
# scratch, the allocator) over the tensors, up to 70 MiB in float32 on the 2-core development machine (the
# tensors torch.profiler saw were 5% under to 15% over `memory_parts`'; under bf16 autocast, oneDNN's buffers
# added up to 140 MiB more); on CUDA cuBLAS's workspaces.
RUNTIME_BYTES = 64 * MB
# Conservative sustained rates: bf16 on a GPU at a fifth of an H100's dense peak (LoRA over a frozen 7B decoder,
# short rows); on a CPU half what the 2-core development machine ran the step at, in float32 or bf16 (a CPU that
# emulates bf16 runs it up to ten times slower).
FLOP_RATE = {"cuda": 2e14, "cpu": 5e10}
# Seconds to start a fresh process and build (imports, the CUDA context, the decoder, the tokenizer).
PROCESS_S = {"cuda": 30.0, "cpu": 5.0}


def decoder_parameters(hidden: int, layers: int, heads: int, kv_heads: int, intermediate: int, vocab: int,
                       qkv_bias: bool = False) -> int:
    """Parameters of a Llama / Mistral / Qwen2 base model (no LM head): embeddings, per layer q, k, v, o, gate,
    up, down (biases on q, k and v where `qkv_bias`, as in Qwen2) and two RMSNorms, and the final norm."""
    kv = hidden // heads * kv_heads
    per_layer = hidden * (2 * hidden + 2 * kv) + 3 * hidden * intermediate + 2 * hidden
    if qkv_bias:
        per_layer += hidden + 2 * kv
    return vocab * hidden + layers * per_layer + hidden


def lora_parameters(hidden: int, layers: int, heads: int, kv_heads: int, intermediate: int, rank: int) -> int:
    """Adapter parameters of rank `rank` on `LORA_TARGETS`: r x (fan_in + fan_out) per adapted (fan_in, fan_out)."""
    kv = hidden // heads * kv_heads
    shapes = [(hidden, hidden), (hidden, kv), (hidden, kv), (hidden, hidden),
              (hidden, intermediate), (hidden, intermediate), (intermediate, hidden)]
    return layers * sum(rank * (fan_in + fan_out) for fan_in, fan_out in shapes)


def layer_token_bytes(shape: Shape, rank: int, compute_bytes: int, mask_bytes: int) -> int:
    """Bytes per token that one layer's graph holds: what checkpointing recomputes for the layer in backward,
    the tensors autograd saves in a Llama / Mistral / Qwen2 block with peft's LoRA on `LORA_TARGETS`:

    - each RMSNorm: its fp32 input (4 x hidden);
    - each adapter: its dropout's mask (`mask_bytes`: a bool on CUDA, the fp32 adapter input's 4 bytes on the
      CPU) and lora_A's input in the compute dtype (`compute_bytes`) per fan-in (hidden for q, k, v, o, gate and
      up, intermediate for down), and lora_B's input (rank);
    - attention (SDPA): q, k and v (k and v repeated to every head) and its output, 4 x hidden, and its fp32
      log-sum-exp per head;
    - the MLP: gate's output, SiLU's and up's, 3 x intermediate.

    The frozen projections save nothing (their input's gradient needs their weight alone); the mask SDPA saves,
    (rows x length^2), is counted by `memory_parts`."""
    hidden, intermediate = shape.hidden, shape.intermediate
    adapters = (6 * hidden + intermediate) * (mask_bytes + compute_bytes) + len(LORA_TARGETS) * rank * compute_bytes
    return 2 * 4 * hidden + adapters + 4 * hidden * compute_bytes + 4 * shape.heads + 3 * intermediate * compute_bytes


def memory_parts(shape: Shape, rank: int, graph: Sequence[tuple[int, int]], loss_rows: int, embedded_rows: int,
                 weight_bytes: int = 2, compute_bytes: int = 2, mask_bytes: int = 1) -> dict[str, int]:
    """Bytes of one step's peak, by `PARTS`, for the largest graph the step holds at once, `graph`: its
    (rows, padded length) segments (a GradCache chunk; a micro-batch's or the full batch's queries and passages).

    - `weights`: the frozen base model, `weight_bytes` a parameter (2: bf16, this script's `--gpu`; 4: fp32);
    - `lora_states`: the adapter in fp32 (peft keeps adapters in fp32), its gradient and AdamW's two moments,
      16 bytes a parameter;
    - `checkpoints`: with activation checkpointing, each layer's input over all of the graph's tokens, in the
      residual stream's dtype (the weights'): layers x tokens x hidden x `weight_bytes`;
    - `one_layer`: the layer recomputed in backward, for one segment at a time (backward runs through the
      passages' graph, then the queries'): `layer_token_bytes` a token, and the attention mask SDPA saves,
      rows x length^2 x `compute_bytes` (SDPA keeps no attention matrix); the largest segment's;
    - `weight_copies`: under autocast to another dtype than the weights', the recomputed layer's projections cast
      to it;
    - `backward`: that layer's gradients in flight, tokens x (3 x intermediate x `compute_bytes` + 2 x hidden x 4)
      over the largest segment;
    - `cache`: the fp32 embeddings of `embedded_rows` queries and passages and their gradients,
      2 x (2 x rows x hidden x 4) (GradCache's cache: the whole batch);
    - `loss`: InfoNCE's (rows x rows) fp32 similarities, softmax and gradient over `loss_rows`, 3 x rows^2 x 4;
    - `runtime`: `RUNTIME_BYTES`, what the step holds beyond its tensors.

    The token ids and masks (8 bytes a position) are left out: under 0.1% of a 7B decoder's plan."""
    hidden, layers = shape.hidden, shape.layers
    tokens = sum(rows * length for rows, length in graph)
    widest = max(rows * length for rows, length in graph)  # backward recomputes one segment's layer at a time
    per_token = layer_token_bytes(shape, rank, compute_bytes, mask_bytes)
    layer_weights = (shape.parameters() - (shape.vocab + 1) * hidden) // layers
    return {
        "weights": shape.parameters() * weight_bytes,
        "lora_states": lora_parameters(**shape.sizes(), rank=rank) * 16,
        "checkpoints": layers * tokens * hidden * weight_bytes,
        "one_layer": max(rows * length * (per_token + length * compute_bytes) for rows, length in graph),
        "weight_copies": layer_weights * compute_bytes if compute_bytes != weight_bytes else 0,
        "backward": widest * (3 * shape.intermediate * compute_bytes + 2 * hidden * 4),
        "cache": 2 * (2 * embedded_rows * hidden * 4),
        "loss": 3 * loss_rows * loss_rows * 4,
        "runtime": RUNTIME_BYTES,
    }


def memory_plan(shape: Shape, rank: int = 16, batch: int = GPU_BATCH, chunk_tokens: int = 8192,
                max_length: int = 512, weight_bytes: int = 2) -> dict[str, float]:
    """GiB of one GradCache step of the recipe on one GPU at its worst: every chunk `chunk_tokens` tokens of
    rows `max_length` long (`memory_parts` with bf16 compute and CUDA's bool dropout masks), part by part, and
    their `total`; `base_parameters` and `lora_parameters` beside. `weight_bytes` 2: bf16 weights (this script's
    `--gpu`); 4: fp32 (`gradcache train text --precision bf16`, which autocasts fp32 weights)."""
    rows = max(1, chunk_tokens // max_length)
    parts = memory_parts(shape, rank, [(rows, max_length)], batch, batch, weight_bytes=weight_bytes)
    plan = {name: value / GB for name, value in parts.items()}
    plan["total"] = sum(plan.values())
    plan["base_parameters"] = float(shape.parameters())
    plan["lora_parameters"] = float(lora_parameters(**shape.sizes(), rank=rank))
    return plan


def shape_of_folder(folder: str) -> Shape:
    """The `Shape` of the config.json in `folder` (no weights are read); a model type outside `FAMILIES` is
    counted as a Llama."""
    import transformers

    config = transformers.AutoConfig.from_pretrained(folder, local_files_only=True)
    heads = config.num_attention_heads
    return Shape(config.model_type if config.model_type in FAMILIES else "llama", config.hidden_size,
                 config.num_hidden_layers, heads, getattr(config, "num_key_value_heads", None) or heads,
                 config.intermediate_size, config.vocab_size, bool(getattr(config, "tie_word_embeddings", False)))


def plan_of_folder(folder: str, rank: int, batch: int, chunk_tokens: int) -> dict[str, float]:
    """`memory_plan` for the config.json in `folder` (no weights are read)."""
    return memory_plan(shape_of_folder(folder), rank, batch, chunk_tokens)


def step_graphs(strategy: str, inputs: Sequence[dict[str, torch.Tensor]], chunk: int,
                chunk_tokens: int) -> list[list[tuple[int, int]]]:
    """The graphs one step of `strategy` holds in turn over the batch's tokenized `inputs`, each as its
    (rows, padded length) segments: GradCache's chunks of each side (`gradcache.token_chunks.token_plan`, the
    strategy's own cut), accumulation's micro-batches of `chunk` rows of both sides, each trimmed to its longest
    row, or the full batch of both sides at the tokenizer's padding."""
    from gradcache.inputs import kept_positions
    from gradcache.token_chunks import padded_lengths, token_plan

    lengths = [padded_lengths(kept_positions(side)).tolist() for side in inputs]
    if strategy == "gradcache":
        graphs = []
        for side, side_lengths in zip(inputs, lengths):
            order, sizes = token_plan(side, chunk_tokens, chunk)
            start = 0
            for rows in sizes:
                graphs.append([(rows, side_lengths[int(order[start])])])  # longest first: the chunk's length
                start += rows
        return graphs
    rows_total = len(lengths[0])
    if strategy == "naive":
        return [[(len(side[k:k + chunk]), max(side[k:k + chunk])) for side in lengths]
                for k in range(0, rows_total, chunk)]
    return [[(rows_total, max(side)) for side in lengths]]


@dataclass(frozen=True)
class PointPlan:
    """One point's plan: `parts` (bytes, `PARTS`) of its peak, its step's and its own estimated seconds (its fresh
    process: start, build, one step; and its share of the batch's round robin: a warm-up and `--rounds` steps)."""

    strategy: str
    batch: int
    parts: dict[str, int]
    step_s: float
    estimated_s: float

    @property
    def peak_bytes(self) -> int:
        return sum(self.parts.values())

    def row(self) -> dict[str, Any]:
        model = self.parts["weights"] + self.parts["lora_states"]
        return {"strategy": self.strategy, "batch": self.batch, "weights_gib": self.parts["weights"] / GB,
                "states_gib": self.parts["lora_states"] / GB, "activations_gib": (self.peak_bytes - model) / GB,
                "planned_gib": self.peak_bytes / GB, "step_s": round(self.step_s, 2),
                "estimated_s": round(self.estimated_s, 1)}


def point_plan(shape: Shape, strategy: str, inputs: Sequence[dict[str, torch.Tensor]],
               args: argparse.Namespace) -> PointPlan:
    """The plan of one (strategy, batch) over the batch's tokenized `inputs`: `memory_parts` of the step's largest
    graph (bf16 weights with `--gpu`, else fp32; bf16 compute under `--autocast bf16` or bf16 weights), and the
    step's seconds by a FLOP count at `FLOP_RATE`: per padded token twice the blocks' parameters, per row
    4 x layers x hidden x length^2 for attention; GradCache's step five forwards' worth (the no-grad pass, the
    graph pass, checkpointing's recompute, a backward of two), the others' four."""
    batch = len(inputs[0]["attention_mask"])
    graphs = step_graphs(strategy, inputs, args.chunk, args.chunk_tokens)
    largest = max(graphs, key=lambda graph: sum(rows * length for rows, length in graph))
    rows = batch if strategy != "naive" else max(segments[0][0] for segments in graphs)
    weight_bytes = 2 if args.gpu else 4
    compute_bytes = 2 if args.gpu or args.autocast == "bf16" else 4
    mask_bytes = 1 if args.device == "cuda" else 4
    parts = memory_parts(shape, args.lora_rank, largest, rows, rows, weight_bytes, compute_bytes, mask_bytes)
    blocks = shape.parameters() - shape.vocab * shape.hidden
    forward = sum(2 * blocks * count * length + 4 * shape.layers * shape.hidden * count * length**2
                  for graph in graphs for count, length in graph)
    device = "cuda" if args.device == "cuda" else "cpu"
    step_s = forward * (5 if strategy == "gradcache" else 4) / FLOP_RATE[device]
    return PointPlan(strategy, batch, parts, step_s, PROCESS_S[device] + step_s * (args.rounds + 2))


def sweep_plan(args: argparse.Namespace, shape: Shape, tokenizer: str) -> list[PointPlan]:
    """Every (strategy, batch) point's plan, over the texts each batch's points will tokenize."""
    plans = []
    for batch in args.batch_list:
        inputs = batch_inputs(point_of(args, None, tokenizer, None, "", batch), torch.device("cpu"))
        plans.extend(point_plan(shape, strategy, inputs, args) for strategy in args.strategy_list)
    return plans


def fits(plan: PointPlan, budget_gb: float) -> bool:
    return plan.peak_bytes <= budget_gb * GB


def plan_seconds(plans: Sequence[PointPlan], budget_gb: float, device: str) -> float:
    """The sweep's estimated seconds: the points within the budget, and a build per batch for its round robin."""
    running = [plan for plan in plans if fits(plan, budget_gb)]
    batches = {plan.batch for plan in running}
    return sum(plan.estimated_s for plan in running) + len(batches) * PROCESS_S[device]


def print_plan(plans: Sequence[PointPlan], budget_gb: float, device: str, title: str) -> None:
    """The plan, as benchmarks/gpu prints its own: a line per point, then `plan: N points, planned peak X GiB,
    ~Y s` over the points within the budget."""
    print(title, flush=True)
    rows = [{**plan.row(), "runs": "yes" if fits(plan, budget_gb) else "skipped: over --memory-budget-gb"}
            for plan in plans]
    print_table(rows, ["strategy", "batch", "weights_gib", "states_gib", "activations_gib", "planned_gib", "step_s",
                       "estimated_s", "runs"])
    running = [plan for plan in plans if fits(plan, budget_gb)]
    peak = max((plan.peak_bytes for plan in running), default=0) / GB
    print(f"plan: {len(plans)} points, planned peak {peak:.3g} GiB, ~{plan_seconds(plans, budget_gb, device):.0f} s "
          f"({len(running)} within --memory-budget-gb {budget_gb:g})", flush=True)


def budget_refusal(plans: Sequence[PointPlan], budget_gb: float) -> str | None:
    """Why no point fits `budget_gb` (every plan above it, the weights' own bytes say), with the smallest budget
    that fits one and the one that fits all; None where one fits."""
    if any(fits(plan, budget_gb) for plan in plans):
        return None
    smallest = min(plans, key=lambda plan: plan.peak_bytes)
    parts = smallest.parts

    def up(count: int) -> str:  # GiB, up to the next tenth
        return f"{math.ceil(count / GB * 10) / 10:g}"
    return (f"--memory-budget-gb {budget_gb:g} is below every point's planned peak: the smallest, {smallest.strategy} "
            f"at batch {smallest.batch}, plans {smallest.peak_bytes / GB:.3g} GiB: {parts['weights'] / GB:.3g} of "
            f"weights, {parts['lora_states'] / GB:.3g} of LoRA and AdamW states, "
            f"{(smallest.peak_bytes - parts['weights'] - parts['lora_states']) / GB:.3g} of activations. Give "
            f"--memory-budget-gb {up(smallest.peak_bytes)} or more ({up(max(p.peak_bytes for p in plans))} fits "
            "every point), or a smaller --shape, --batches or --chunk-tokens")


# ---- the sweep -------------------------------------------------------------------------------------------------

def point_of(args: argparse.Namespace, model: str | None, tokenizer: str, shape: Shape | None, strategy: str,
             batch: int) -> dict[str, Any]:
    """The JSON a point's process gets: the decoder (`shape`'s fields to build, or the folder `model`), the
    tokenizer's folder, the step's settings."""
    return {"model": model, "tokenizer": tokenizer, "shape": dataclasses.asdict(shape) if shape else None,
            "strategy": strategy, "batch": batch, "chunk": args.chunk,
            "chunk_tokens": args.chunk_tokens, "max_length": args.max_length, "query_words": args.query_range,
            "passage_words": args.passage_range, "lora_rank": args.lora_rank, "autocast": args.autocast,
            "bf16_weights": args.gpu,
            "threads": args.threads, "device": args.device, "memory_budget_gb": args.memory_budget_gb}


def run_sweep(args: argparse.Namespace, model: str | None, tokenizer: str, shape: Shape | None,
              plans: Sequence[PointPlan]) -> list[dict[str, Any]]:
    """Memory of every (strategy, batch) in a fresh process, a point planned over the budget skipped, then each
    batch's strategies that ran, round robin. `shape`: the decoder each process builds (None: the folder)."""
    if args.threads:
        torch.set_num_threads(args.threads)
    planned = {(plan.strategy, plan.batch): plan for plan in plans}
    rows = []
    for batch in args.batch_list:
        batch_rows = []
        for strategy in args.strategy_list:
            plan = planned[(strategy, batch)]
            row = {"strategy": strategy, "batch": batch, "chunk": args.chunk, "chunk_tokens": args.chunk_tokens,
                   "planned_mb": plan.peak_bytes / MB, "estimated_step_s": plan.step_s,
                   **machine_context(args.threads, args.device)}
            if fits(plan, args.memory_budget_gb):
                env = LIVE_TENSORS_ENV if args.device == "cpu" else None
                point = point_of(args, model, tokenizer, shape, strategy, batch)
                row.update(run_point(__spec__.name, point, args.time_budget_s, env))
            else:
                row.update(status="skipped", error=f"planned {plan.peak_bytes / GB:.3g} GiB > --memory-budget-gb "
                                                   f"{args.memory_budget_gb:g}")
            print(json.dumps({key: row.get(key) for key in TABLE if key in row}), flush=True)
            batch_rows.append(row)
        timed = [row["strategy"] for row in batch_rows if row.get("status") == "ok"]
        if timed:
            times = time_batch(point_of(args, model, tokenizer, shape, "", batch), timed, args.rounds)
            middle = medians(times)
            for row in batch_rows:
                name = row["strategy"]
                if name in times:
                    row.update(step_s=middle[name], min_s=min(times[name]), max_s=max(times[name]),
                               rounds=args.rounds)
                    if "naive" in times:
                        row["ratio_to_naive"] = per_round_ratio(times, name, ["naive"])
        rows.extend(batch_rows)
    return rows


def prepare_decoder(args: argparse.Namespace, scratch: Path) -> tuple[str | None, str, Shape, Shape | None]:
    """(model folder or None, tokenizer folder, the shape the plan counts, the shape each process builds or None):
    `--model DIR` as it is; `--shape` (or `--plan-only`) a tokenizer written in `scratch` at the shape's
    vocabulary; else the tiny shape (with `--hidden ...`) saved in `scratch` by `write_decoder`."""
    if args.model is not None:
        return args.model, args.model, shape_of_folder(args.model), None
    shape = args.built_shape
    if args.shape is not None or args.plan_only:
        folder = scratch / "tokenizer"
        write_tokenizer(folder, shape.vocab)
        return None, str(folder), shape, shape
    folder = str(write_decoder(scratch / "decoder", shape.hidden, shape.layers, shape.heads, shape.intermediate,
                               shape.vocab, kv_heads=shape.kv_heads))
    return folder, folder, shape, None


def plan_title(args: argparse.Namespace, shape: Shape) -> str:
    source = f"--model {args.model}" if args.model else f"--shape {args.shape}" if args.shape else "the tiny shape"
    dtype = "bf16" if args.gpu else "fp32"
    return (f"llm_recipe plan: {source} ({shape.parameters() / 1e9:.3g} B parameters, {dtype} weights, LoRA "
            f"{args.lora_rank}) on {args.device}, autocast {args.autocast}, chunk {args.chunk}, chunk_tokens "
            f"{args.chunk_tokens}, --memory-budget-gb {args.memory_budget_gb:g}")


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    parser = get_args_parser()
    args = parser.parse_args(argv)
    if args.point is not None:
        report(run_one_point(json.loads(args.point)))
        return []
    args = resolve_args(args, parser)
    settings = {key: value for key, value in vars(args).items() if key not in ("point", "built_shape")}
    with tempfile.TemporaryDirectory(prefix="llm-recipe-") as scratch:
        model, tokenizer, shape, built = prepare_decoder(args, Path(scratch))
        plans = sweep_plan(args, shape, tokenizer)
        print_plan(plans, args.memory_budget_gb, args.device, plan_title(args, shape))
        refusal = budget_refusal(plans, args.memory_budget_gb)
        if refusal:
            parser.error(refusal)
        if args.plan_only:
            return []
        settings["decoder_shape"] = dataclasses.asdict(shape)
        settings["plan"] = [{**plan.row(), "parts_bytes": plan.parts} for plan in plans]
        rows = run_sweep(args, model, tokenizer, built, plans)
    output_dir = output_folder(args)
    document = {"settings": settings, "machine": machine_context(args.threads, args.device), "rows": rows}
    with replaced(output_dir / f"{args.name}.json") as handle:
        json.dump(document, handle, indent=1, default=str)
    plot_lines(output_dir / f"{args.name}.png", rows, "batch", [("peak_mb", "peak memory above baseline (MiB)"),
               ("step_s", "step time (s)")], "strategy",
               f"LoRA {args.lora_rank}, last-token pooling, query prompt, autocast {args.autocast}, checkpointing; "
               f"chunk {args.chunk}, chunk_tokens {args.chunk_tokens}, {args.device}, {args.threads} threads")
    print_table(rows, TABLE)
    print(f"wrote {output_dir / (args.name + '.json')}")
    return rows


if __name__ == "__main__":
    main()

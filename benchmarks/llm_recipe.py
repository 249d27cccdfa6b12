"""An E5-Mistral-style step against batch size: GradCache against accumulation and the full batch, on a decoder.

The recipe of docs/training.md "Training an LLM embedder", in the library's form: one decoder shared by queries
and passages (`HuggingFaceEncoder(pooling="last")`, EOS appended by `HuggingFaceTokenizer`), a query prompt,
LoRA rank 16 with alpha 32 on every linear layer of each block (`gradcache.train.modes.lora.add_lora`),
activation checkpointing, bf16 autocast, InfoNCE at temperature 0.02, AdamW on the adapter. Strategies:
`gradcache` (chunks of at most `--chunk` rows and `--chunk-tokens` padded tokens, over the rows sorted by
length),
`naive` (`NaiveAccumulation`, the same micro-batch, `trim_padding`) and `full_batch` (`FullBatch`).

CPU form (default): a randomly initialised `LlamaForCausalLM` built here from a config (hidden 256, 4 layers, 4
heads, intermediate 688, vocabulary 32,000) and a word-level tokenizer built here over generated words; queries
and passages of random generated words of long-tailed length. Nothing is downloaded. Peak memory: one point per
fresh process (`fresh_process.py`: peak RSS above the baseline after the model is built, one step). Step time:
the strategies timed round robin in one process (`round_robin.py`), medians over rounds, and the per-round ratio
to `naive`; `full_batch` only where its memory point ran.

GPU form (`--gpu --model DIR`): a local 7B-class decoder folder (Mistral-7B, Qwen2-7B ...) loaded in bf16 with
its own tokenizer, global batch 2,048 on one GPU, chunks of at most 64 rows and 8192 tokens, `gradcache` and
`naive`, peak `torch.cuda.max_memory_allocated`. It prints `memory_plan`'s arithmetic for the folder's config
before it runs. Unrun: no GPU was available when it was written.

    python -m benchmarks.llm_recipe                                   # CPU: batch 32, 64, 128, 256
    python -m benchmarks.llm_recipe --batches 32,64 --rounds 5
    python -m benchmarks.llm_recipe --gpu --model ~/models/mistral-7b --rounds 3 --name llm_recipe_gpu --write-results
"""
from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from benchmarks.flags import HelpFormatter, add_shared_options, integer_list, output_folder
from benchmarks.fresh_process import LIVE_TENSORS_ENV, PeakMemory, report, reset_peak_rss, run_point
from benchmarks.report import machine_context, plot_lines, print_table
from benchmarks.round_robin import medians, per_round_ratio, round_robin

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # local folders only

GB = 2**30
MB = 2**20
STRATEGIES = ("gradcache", "naive", "full_batch")
QUERY_PROMPT = "Instruct: Given a query, retrieve the passage that answers it. Query: "
TEMPERATURE = 0.02  # E5-Mistral's
# E5-Mistral's LoRA targets: every linear layer of a Llama / Mistral / Qwen2 block.
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
SPECIAL = ["<pad>", "<unk>", "<s>", "</s>"]
GPU_BATCH = 2048
TABLE = ["strategy", "batch", "status", "peak_mb", "step_s", "min_s", "max_s", "ratio_to_naive", "loss_value",
         "loadavg_1m"]


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter)
    parser.add_argument("--gpu", action="store_true", help="the GPU form: --model DIR in bf16, batch 2048, cuda, "
                        "gradcache and naive (each default below that it changes is said in its help)")
    parser.add_argument("--model", default=None, help="a local decoder folder with its tokenizer (required with "
                        "--gpu; default: a random Llama built from --hidden ... in a temporary folder)")
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
    parser.add_argument("--hidden", type=int, default=256, help="the built decoder's hidden size")
    parser.add_argument("--layers", type=int, default=4, help="the built decoder's layers")
    parser.add_argument("--heads", type=int, default=4, help="the built decoder's attention heads")
    parser.add_argument("--intermediate", type=int, default=688, help="the built decoder's MLP width")
    parser.add_argument("--vocab", type=int, default=32000, help="the built decoder's vocabulary (and tokenizer's)")
    parser.add_argument("--rounds", type=int, default=7, help="round-robin rounds per batch (medians reported)")
    add_shared_options(parser, "llm_recipe", memory_budget_gb=12.0, time_budget_s=1800.0)
    return parser


def resolve_args(args: argparse.Namespace, parser: argparse.ArgumentParser) -> argparse.Namespace:
    """Fill the defaults that depend on `--gpu`; bad values exit 2 through `parser.error`, naming the option."""
    if args.gpu and args.model is None:
        parser.error("--gpu needs --model DIR: a local 7B-class decoder folder (config, weights, tokenizer)")
    if args.gpu:
        args.device = "cuda"
    args.batches = args.batches or (str(GPU_BATCH) if args.gpu else "32,64,128,256")
    args.strategies = args.strategies or ("gradcache,naive" if args.gpu else ",".join(STRATEGIES))
    args.chunk = args.chunk or (64 if args.gpu else 8)
    args.chunk_tokens = args.chunk_tokens or (8192 if args.gpu else 512)
    args.max_length = args.max_length or (512 if args.gpu else 128)
    try:
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
    return args


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


def write_decoder(folder: Path, hidden: int, layers: int, heads: int, intermediate: int, vocab: int,
                  seed: int = 0) -> Path:
    """A randomly initialised `LlamaForCausalLM` and its tokenizer saved in `folder` (no download)."""
    import transformers

    folder.mkdir(parents=True, exist_ok=True)
    write_tokenizer(folder, vocab)
    config = transformers.LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate,
                                      num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
                                      max_position_embeddings=2048, pad_token_id=0, bos_token_id=2, eos_token_id=3,
                                      tie_word_embeddings=False)
    torch.manual_seed(seed)
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
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
    """The decoder at `point["model"]` (bf16 weights under `point["bf16_weights"]`), checkpointed, LoRA added."""
    import transformers

    from gradcache.models import HuggingFaceEncoder
    from gradcache.train.modes.lora import LoraSettings, add_lora

    dtype = torch.bfloat16 if point["bf16_weights"] else torch.float32
    model = transformers.AutoModel.from_pretrained(point["model"], dtype=dtype, local_files_only=True)
    encoder = HuggingFaceEncoder(model, pooling="last")
    encoder.set_grad_checkpointing(True)
    rank = point["lora_rank"]
    add_lora(encoder, LoraSettings(rank, 2.0 * rank, 0.05, LORA_TARGETS))
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
    """The batch's tokenized queries (with the prompt and its `prompt_length`) and passages, on `device`."""
    from gradcache.models import HuggingFaceTokenizer

    tokenize = HuggingFaceTokenizer(point["model"], max_length=point["max_length"])
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
    """Child process: build, then one step measured for peak memory above the built state."""
    if point["threads"]:
        torch.set_num_threads(point["threads"])
    device = torch.device(point["device"])
    torch.manual_seed(0)
    encoder = build_encoder(point, device)
    inputs = batch_inputs(point, device)
    optimizer = torch.optim.AdamW(trained(encoder), lr=1e-4)
    strategy = build_strategy(point["strategy"], encoder, point)
    budget = int(point["memory_budget_gb"] * GB) if point["memory_budget_gb"] else None
    if device.type == "cpu":
        reset_peak_rss()  # the build's transient peak (weights loaded, then copied) is not the step's
    peak = PeakMemory(device, budget)
    loss_value = step_of(strategy, encoder, optimizer, inputs)()
    peak_bytes = peak.peak_above_baseline()
    peak.stop()
    tokens = sum(int(side["attention_mask"].sum()) for side in inputs)
    weights = sum(p.numel() * p.element_size() for p in encoder.parameters())  # in the baseline, not in peak_mb
    return {"status": "ok", "peak_mb": peak_bytes / MB, "weights_mb": weights / MB, "loss_value": loss_value,
            "tokens": tokens, "trained_parameters": sum(p.numel() for p in trained(encoder))}


def time_batch(point: dict[str, Any], names: Sequence[str], rounds: int) -> dict[str, list[float]]:
    """This process: the named strategies on one shared encoder, timed round robin."""
    device = torch.device(point["device"])
    torch.manual_seed(0)
    encoder = build_encoder(point, device)
    inputs = batch_inputs(point, device)
    optimizer = torch.optim.AdamW(trained(encoder), lr=1e-4)
    steps = {name: step_of(build_strategy(name, encoder, point), encoder, optimizer, inputs) for name in names}
    return round_robin(steps, rounds, device)


# ---- the GPU form's memory arithmetic --------------------------------------------------------------------------

def decoder_parameters(hidden: int, layers: int, heads: int, kv_heads: int, intermediate: int, vocab: int) -> int:
    """Parameters of a Llama / Mistral base model (no LM head): embeddings, per layer q, k, v, o, gate, up, down
    and two RMSNorms, and the final norm."""
    kv = hidden // heads * kv_heads
    per_layer = hidden * (2 * hidden + 2 * kv) + 3 * hidden * intermediate + 2 * hidden
    return vocab * hidden + layers * per_layer + hidden


def lora_parameters(hidden: int, layers: int, heads: int, kv_heads: int, intermediate: int, rank: int) -> int:
    """Adapter parameters of rank `rank` on `LORA_TARGETS`: r x (fan_in + fan_out) per adapted (fan_in, fan_out)."""
    kv = hidden // heads * kv_heads
    shapes = [(hidden, hidden), (hidden, kv), (hidden, kv), (hidden, hidden),
              (hidden, intermediate), (hidden, intermediate), (intermediate, hidden)]
    return layers * sum(rank * (fan_in + fan_out) for fan_in, fan_out in shapes)


def memory_plan(hidden: int, layers: int, heads: int, kv_heads: int, intermediate: int, vocab: int,
                rank: int = 16, batch: int = GPU_BATCH, chunk_tokens: int = 8192,
                weight_bytes: int = 2) -> dict[str, float]:
    """GB (10^9 bytes) of one GradCache step of the recipe on one GPU, part by part, and their `total`:

    - `weights`: the frozen base model, `weight_bytes` a parameter: 2 in bf16 (this script's `--gpu`), 4 in fp32
      (`gradcache train text --precision bf16`, which autocasts fp32 weights);
    - `lora_states`: the adapter in fp32 (peft keeps adapters in fp32), its gradient and AdamW's two moments,
      16 bytes a parameter;
    - `checkpoints`: with activation checkpointing, each layer's bf16 input for a chunk: layers x tokens x hidden
      x 2 bytes;
    - `one_layer`: the one layer recomputed in backward, all of its bf16 activations: tokens x (6 hidden +
      4 intermediate) x 2 bytes (q, k, v, attention output, two norms; gate, up, their product, down's input);
      attention through SDPA keeps no (tokens x tokens) matrix;
    - `cache`: the cached fp32 embeddings of the queries and passages (2 x batch x hidden x 4 bytes) and their
      gradients, as much again;
    - `loss`: InfoNCE's (batch x batch) fp32 similarities, softmax and their gradient, 3 x batch^2 x 4 bytes.
    """
    base = decoder_parameters(hidden, layers, heads, kv_heads, intermediate, vocab)
    adapter = lora_parameters(hidden, layers, heads, kv_heads, intermediate, rank)
    parts = {
        "weights": base * weight_bytes,
        "lora_states": adapter * 16,
        "checkpoints": layers * chunk_tokens * hidden * 2,
        "one_layer": chunk_tokens * (6 * hidden + 4 * intermediate) * 2,
        "cache": 2 * (2 * batch * hidden * 4),
        "loss": 3 * batch * batch * 4,
    }
    plan = {name: value / 1e9 for name, value in parts.items()}
    plan["total"] = sum(plan.values())
    plan["base_parameters"] = float(base)
    plan["lora_parameters"] = float(adapter)
    return plan


def plan_of_folder(folder: str, rank: int, batch: int, chunk_tokens: int) -> dict[str, float]:
    """`memory_plan` for the config.json in `folder` (no weights are read)."""
    import transformers

    config = transformers.AutoConfig.from_pretrained(folder, local_files_only=True)
    heads = config.num_attention_heads
    return memory_plan(config.hidden_size, config.num_hidden_layers, heads,
                       getattr(config, "num_key_value_heads", None) or heads, config.intermediate_size,
                       config.vocab_size, rank, batch, chunk_tokens)


# ---- the sweep -------------------------------------------------------------------------------------------------

def point_of(args: argparse.Namespace, model: str, strategy: str, batch: int) -> dict[str, Any]:
    return {"model": model, "strategy": strategy, "batch": batch, "chunk": args.chunk,
            "chunk_tokens": args.chunk_tokens, "max_length": args.max_length, "query_words": args.query_range,
            "passage_words": args.passage_range, "lora_rank": args.lora_rank, "autocast": args.autocast,
            "bf16_weights": args.gpu,
            "threads": args.threads, "device": args.device, "memory_budget_gb": args.memory_budget_gb}


def run_sweep(args: argparse.Namespace, model: str) -> list[dict[str, Any]]:
    """Memory of every (strategy, batch) in a fresh process, then each batch's strategies that ran, round robin."""
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = []
    for batch in args.batch_list:
        batch_rows = []
        for strategy in args.strategy_list:
            row = {"strategy": strategy, "batch": batch, "chunk": args.chunk, "chunk_tokens": args.chunk_tokens,
                   **machine_context(args.threads, args.device)}
            env = LIVE_TENSORS_ENV if args.device == "cpu" else None
            row.update(run_point(__spec__.name, point_of(args, model, strategy, batch), args.time_budget_s, env))
            print(json.dumps({key: row.get(key) for key in TABLE if key in row}), flush=True)
            batch_rows.append(row)
        timed = [row["strategy"] for row in batch_rows if row.get("status") == "ok"]
        if timed:
            times = time_batch(point_of(args, model, "", batch), timed, args.rounds)
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


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    parser = get_args_parser()
    args = parser.parse_args(argv)
    if args.point is not None:
        report(run_one_point(json.loads(args.point)))
        return []
    args = resolve_args(args, parser)
    settings = {key: value for key, value in vars(args).items() if key not in ("point",)}
    if args.gpu:
        plan = plan_of_folder(args.model, args.lora_rank, max(args.batch_list), args.chunk_tokens)
        print("memory plan (GB): " + ", ".join(f"{name} {value:.3g}" for name, value in plan.items()), flush=True)
        settings["memory_plan_gb"] = plan
    with tempfile.TemporaryDirectory(prefix="llm-recipe-") as scratch:
        model = args.model or str(write_decoder(Path(scratch) / "decoder", args.hidden, args.layers, args.heads,
                                                args.intermediate, args.vocab))
        rows = run_sweep(args, model)
    output_dir = output_folder(args)
    document = {"settings": settings, "machine": machine_context(args.threads, args.device), "rows": rows}
    with open(output_dir / f"{args.name}.json", "w") as handle:
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

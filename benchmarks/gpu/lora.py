"""Section `lora`: an LLM embedder's step on a random decoder built from a `LlamaConfig` (no download): peft
LoRA on every linear layer of each block (dropout 0.1, attention dropout 0.1), the model's activation
checkpointing, bf16 autocast, last-token pooling, InfoNCE, GradCache with `chunk_tokens`. Replayed against the
same chunks with every graph kept (LoRA gradients compared), and timed round robin against NaiveAccumulation
with the same rows per micro-batch (`trim_padding`)."""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from benchmarks.gpu.case import Case, estimated_seconds
from benchmarks.gpu.replay import KEEP_EVERY_GRAPH
from benchmarks.gpu.sizes import DecoderSize, Sizes
from benchmarks.gpu.towers import CUDA_OVERHEAD_BYTES, max_rel_error
from benchmarks.round_robin import medians, per_round_ratio, round_robin
from gradcache import GradCache, NaiveAccumulation, losses

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]  # E5-Mistral's
TOLERANCE = 1e-2  # bf16, relative to the largest LoRA gradient
TEMPERATURE = 0.02


def intermediate(size: DecoderSize) -> int:
    return 3 * size.hidden


def block_parameters(size: DecoderSize) -> int:
    return size.layers * (4 * size.hidden**2 + 3 * size.hidden * intermediate(size))


def fixed_bytes(size: DecoderSize) -> int:
    """float32 weights and their bf16 autocast copies, the ids and masks, CUDA's workspaces."""
    weights = block_parameters(size) + size.vocab * size.hidden
    return 6 * weights + 2 * size.n * size.length * 16 + CUDA_OVERHEAD_BYTES


def layer_bytes_per_token(size: DecoderSize) -> int:
    """What one checkpointed layer's recompute and backward hold per token (bf16 and float32 values, LoRA's
    dropout masks, the MLP's gradients), an allowance of 60 h + 12 intermediate bytes."""
    return 60 * size.hidden + 12 * intermediate(size)


def plan_bytes(size: DecoderSize, kept_rows: int, chunk_rows: int, chunk_tokens: int) -> int:
    """`kept_rows` rows' checkpointed graphs (each layer's input, float32 and bf16, twice over for an allowance),
    one chunk's layer in backward, its (H, L, L) attention where SDPA falls back to its math kernel, the caches."""
    kept = kept_rows * size.length * size.layers * 12 * size.hidden
    chunk = chunk_tokens * layer_bytes_per_token(size) + chunk_rows * size.heads * size.length**2 * 12
    caches = 2 * 3 * 4 * size.n * size.hidden
    return fixed_bytes(size) + kept + chunk + caches + 4 * 4 * size.n * size.n


def step_flops(size: DecoderSize) -> float:
    """Forward, backward, checkpoint's recompute and GradCache's re-encoding over both sides' tokens (a long-tailed
    length: about a quarter of the longest on average)."""
    tokens = 2 * size.n * size.length / 4
    return 6 * block_parameters(size) * tokens * (4 / 3) * (4 / 3)


def cases(sizes: Sizes, device: torch.device) -> list[Case]:
    size, rounds = sizes.lora, sizes.lora_rounds
    kept = plan_bytes(size, 2 * size.n, size.chunk, size.chunk_tokens)
    timed = plan_bytes(size, 0, size.chunk, max(size.chunk_tokens, size.chunk * size.length))
    return [Case("lora", "replayed_vs_kept", kept, estimated_seconds(2 * step_flops(size), device, 5.0),
                 _replayed_vs_kept(size)),
            Case("lora", "time_vs_naive", timed, estimated_seconds(2 * (rounds + 1) * step_flops(size), device, 5.0),
                 _time_vs_naive(size, rounds))]


def build_encoder(size: DecoderSize, device: torch.device) -> torch.nn.Module:
    """A random Llama (its base model) with last-token pooling, checkpointing and LoRA, in training mode."""
    import transformers

    from gradcache.models import HuggingFaceEncoder
    from gradcache.train.modes.lora import LoraSettings, add_lora

    config = transformers.LlamaConfig(vocab_size=size.vocab, hidden_size=size.hidden, intermediate_size=intermediate(size),
                                      num_hidden_layers=size.layers, num_attention_heads=size.heads,
                                      num_key_value_heads=size.heads, max_position_embeddings=max(256, size.length),
                                      attention_dropout=0.1, pad_token_id=0, tie_word_embeddings=False)
    torch.manual_seed(0)
    encoder = HuggingFaceEncoder(transformers.LlamaModel(config), pooling="last")
    encoder.set_grad_checkpointing(True)
    add_lora(encoder, LoraSettings(size.rank, 2.0 * size.rank, 0.1, TARGETS))
    return encoder.to(device).train()


def batch(size: DecoderSize, device: torch.device) -> tuple[dict[str, torch.Tensor], ...]:
    """Queries and passages of long-tailed lengths (a tenth at `length`), right-padded."""
    g = torch.Generator().manual_seed(0)
    sides = []
    for _ in range(2):
        lengths = torch.where(torch.rand(size.n, generator=g) < 0.1, size.length,
                              torch.randint(2, max(3, size.length // 8), (size.n,), generator=g))
        mask = (torch.arange(size.length)[None, :] < lengths[:, None]).long()  # (n, L)
        ids = torch.randint(1, size.vocab, (size.n, size.length), generator=g) * mask
        sides.append({"input_ids": ids.to(device), "attention_mask": mask.to(device)})
    return tuple(sides)


def _lora_gradients(encoder: torch.nn.Module) -> list[torch.Tensor]:
    return [p.grad.detach().float().clone() for p in encoder.parameters() if p.requires_grad]


def _replayed_vs_kept(size: DecoderSize) -> Callable[[torch.device], dict[str, Any]]:
    def run(device: torch.device) -> dict[str, Any]:
        encoder, inputs = build_encoder(size, device), batch(size, device)
        loss = losses.InfoNCE(temperature=TEMPERATURE)
        found, seconds = [], 0.0
        for budget in (KEEP_EVERY_GRAPH, None):
            encoder.zero_grad(set_to_none=True)
            strategy = GradCache(encoder, loss, size.chunk, chunk_tokens=size.chunk_tokens, memory_budget=budget,
                                 autocast_dtype=torch.bfloat16)
            torch.manual_seed(1)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            started = time.perf_counter()
            strategy.step(*inputs)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            seconds = time.perf_counter() - started
            found.append(_lora_gradients(encoder))
        want, got = found
        error = max_rel_error(got, want)
        return {"step_s": seconds, "max_rel_error": error, "tolerance": TOLERANCE,
                "failure": f"max_rel_error {error:.3g} > {TOLERANCE}" if error > TOLERANCE else None}
    return run


def _time_vs_naive(size: DecoderSize, rounds: int) -> Callable[[torch.device], dict[str, Any]]:
    def run(device: torch.device) -> dict[str, Any]:
        encoder, inputs = build_encoder(size, device), batch(size, device)
        loss = losses.InfoNCE(temperature=TEMPERATURE)
        strategies = {"gradcache": GradCache(encoder, loss, size.chunk, chunk_tokens=size.chunk_tokens,
                                             autocast_dtype=torch.bfloat16),
                      "naive": NaiveAccumulation(encoder, loss, size.chunk, trim_padding=True,
                                                 autocast_dtype=torch.bfloat16)}

        def step_of(strategy: Any) -> Callable[[], None]:
            def step() -> None:
                strategy.step(*inputs)
                encoder.zero_grad(set_to_none=True)
            return step

        times = round_robin({name: step_of(s) for name, s in strategies.items()}, rounds, device)
        return {"step_s": medians(times)["gradcache"], "seconds": medians(times), "rounds": rounds,
                "ratio_to_naive": {"gradcache": per_round_ratio(times, "gradcache", ["naive"])}}
    return run

"""Section `vlm`: a vision-language embedder's step on a random Qwen2-VL built from a config (the 2B shape at GPU
size: language model 1,536 x 28, vision tower 1,280 x 32; no download), in bf16: peft LoRA on every linear layer
of the language model (dropout 0.1, attention dropout 0.1), the vision tower frozen, the language model's
activation checkpointing, last-token pooling, InfoNCE. N rows a side cycling text only, image only, image + text,
two images + text, laid out as Qwen2-VL's processor lays them out; `chunk_tokens` (rows sorted by length, their
images with them, vision patches counted beside the tokens). One GradCache step with the tower reused (`reuse_outputs`) against one without: the
LoRA gradients compared, both timed."""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import torch

from benchmarks.gpu.case import Case, estimated_seconds
from benchmarks.gpu.sizes import Sizes, VlmSize
from benchmarks.gpu.towers import CUDA_OVERHEAD_BYTES, max_rel_error
from gradcache import GradCache, losses

TARGETS = r".*language_model.*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)"
TOLERANCE = 1e-2  # bf16, relative to the largest LoRA gradient; the same kernels on both sides
TEMPERATURE = 0.02
PATCH, MERGE, TEMPORAL = 14, 2, 2
SPECIAL = {"pad": 0, "vision_start": 1, "vision_end": 2, "image": 3, "video": 4}  # ids below the text's


def patches_per_image(size: VlmSize) -> int:
    return (size.image_side // PATCH) ** 2


def tokens_per_image(size: VlmSize) -> int:
    return patches_per_image(size) // MERGE**2 + 2  # the image's tokens between vision_start and vision_end


def row_lengths(size: VlmSize) -> list[int]:
    """Each row's tokens, cycling text only, image only, image + text, two images + text."""
    image, text = tokens_per_image(size), size.text_tokens
    return [(text, image, image + text, 2 * image + text)[k % 4] for k in range(size.n)]


def images_per_side(size: VlmSize) -> int:
    return sum((0, 1, 1, 2)[k % 4] for k in range(size.n))


def layer_parameters(size: VlmSize) -> int:
    """The language model's decoder layers (what a token's matmuls run through)."""
    attention = size.hidden * size.hidden * 2 + 2 * size.hidden * (size.hidden // size.heads) * size.kv_heads
    return size.layers * (attention + 3 * size.hidden * size.intermediate)


def vision_parameters(size: VlmSize) -> int:
    width = size.vision_width
    merged = width * MERGE**2
    return size.vision_depth * 12 * width**2 + 3 * TEMPORAL * PATCH**2 * width + merged * merged + merged * size.hidden


def plan_bytes(size: VlmSize, reused: bool) -> int:
    """bf16 weights; LoRA's float32 weights, gradients and Adam-free copies; one chunk's checkpointed language
    layers (each layer's input, twice over for an allowance) and one layer in backward (60 h + 12 intermediate
    bytes a token, as the lora section); the tower's forward over one chunk's patches (16 x width bytes a patch;
    `chunk_tokens` bounds a chunk's tokens and patches together);
    with `reused`, every re-encoded chunk's kept tower outputs (hidden states before and after the merger, bf16);
    the caches and the loss."""
    weights = 2 * (layer_parameters(size) + size.vocab * size.hidden + vision_parameters(size))
    adapters = 3 * 4 * size.layers * size.rank * (4 * 2 * size.hidden + 3 * (size.hidden + size.intermediate))
    chunk = size.chunk_tokens * (size.layers * 4 * size.hidden + 60 * size.hidden + 12 * size.intermediate)
    tower = size.chunk_tokens * 16 * size.vision_width  # chunk_tokens counts a chunk's patches beside its tokens
    patches = 2 * images_per_side(size) * patches_per_image(size)
    kept = patches * 2 * (size.vision_width + size.hidden // MERGE**2) if reused else 0
    inputs = patches * TEMPORAL * PATCH**2 * 3 * 4 + 2 * size.n * max(row_lengths(size)) * 8 * 3
    caches = 2 * 3 * 4 * size.n * size.hidden + 4 * 4 * size.n * size.n
    return weights + adapters + chunk + tower + kept + inputs + caches + CUDA_OVERHEAD_BYTES


def step_flops(size: VlmSize, reused: bool) -> float:
    """The language model: forward, backward (input gradients), checkpoint's recompute and GradCache's
    re-encoding, 8 P per token; the tower: a forward in phase (1), another in phase (3) unless reused."""
    tokens = 2 * sum(row_lengths(size))
    patches = 2 * images_per_side(size) * patches_per_image(size)
    return 8 * layer_parameters(size) * tokens + 2 * (1 if reused else 2) * vision_parameters(size) * patches


def cases(sizes: Sizes, device: torch.device) -> list[Case]:
    size = sizes.vlm
    seconds = estimated_seconds(step_flops(size, True) + step_flops(size, False), device, 10.0)
    return [Case("vlm", "reuse_vs_rerun", plan_bytes(size, True), seconds, _reuse_vs_rerun(size))]


def build_encoder(size: VlmSize, device: torch.device) -> torch.nn.Module:
    """A random Qwen2-VL in bf16 with LoRA on its language model (the tower frozen), checkpointing, last-token
    pooling, in training mode."""
    import peft
    import transformers

    head_dim = size.hidden // size.heads
    half = head_dim // 2
    config = transformers.Qwen2VLConfig(
        text_config=dict(hidden_size=size.hidden, intermediate_size=size.intermediate, num_hidden_layers=size.layers,
                         num_attention_heads=size.heads, num_key_value_heads=size.kv_heads, vocab_size=size.vocab,
                         max_position_embeddings=4096, attention_dropout=0.1,
                         rope_scaling={"type": "mrope", "mrope_section": [half - 2 * (half * 3 // 8), half * 3 // 8,
                                                                          half * 3 // 8]},
                         pad_token_id=SPECIAL["pad"], bos_token_id=None, eos_token_id=None),
        vision_config=dict(depth=size.vision_depth, embed_dim=size.vision_width, hidden_size=size.hidden,
                           num_heads=size.vision_heads, mlp_ratio=4, patch_size=PATCH, spatial_merge_size=MERGE,
                           temporal_patch_size=TEMPORAL, in_channels=3),
        image_token_id=SPECIAL["image"], video_token_id=SPECIAL["video"],
        vision_start_token_id=SPECIAL["vision_start"], vision_end_token_id=SPECIAL["vision_end"],
        pad_token_id=SPECIAL["pad"], bos_token_id=None, eos_token_id=None,
    )
    torch.manual_seed(0)
    model = transformers.Qwen2VLModel(config).to(device=device, dtype=torch.bfloat16)
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    lora = peft.LoraConfig(r=size.rank, lora_alpha=2 * size.rank, lora_dropout=0.1, target_modules=TARGETS)
    model = peft.get_peft_model(model, lora)  # freezes every base weight, the tower's included
    return LastToken(model).train()


class LastToken(torch.nn.Module):
    """The last attended position's hidden state of right-padded rows: (B, hidden)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, **inputs: Any) -> torch.Tensor:
        hidden = self.model(**inputs).last_hidden_state  # (B, L, hidden)
        last = inputs["attention_mask"].sum(1) - 1  # (B,)
        return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]


def tower(encoder: LastToken) -> torch.nn.Module:
    return encoder.model.base_model.model.visual


def batch(size: VlmSize, device: torch.device, seed: int) -> dict[str, torch.Tensor]:
    """One side's rows as Qwen2-VL's processor lays them out: input_ids (N, L) right-padded, each image as
    vision_start, its image tokens, vision_end; attention_mask; mm_token_type_ids (1 at image tokens);
    pixel_values (patches, 1,176) in row order, bf16; image_grid_thw (images, 3)."""
    g = torch.Generator().manual_seed(seed)
    grid = size.image_side // PATCH
    rows, images = [], 0
    for k in range(size.n):
        count, text = (0, 1, 1, 2)[k % 4], 0 if k % 4 == 1 else size.text_tokens
        ids = []
        for _ in range(count):
            ids += [SPECIAL["vision_start"], *[SPECIAL["image"]] * (grid * grid // MERGE**2), SPECIAL["vision_end"]]
        rows.append(ids + torch.randint(len(SPECIAL), size.vocab, (text,), generator=g).tolist())
        images += count
    longest = max(len(ids) for ids in rows)
    input_ids = torch.full((size.n, longest), SPECIAL["pad"])
    attention_mask = torch.zeros(size.n, longest, dtype=torch.long)
    for b, ids in enumerate(rows):
        input_ids[b, :len(ids)], attention_mask[b, :len(ids)] = torch.tensor(ids), 1
    found = {"input_ids": input_ids, "attention_mask": attention_mask,
             "mm_token_type_ids": (input_ids == SPECIAL["image"]).long(),
             "pixel_values": torch.randn(images * grid * grid, 3 * TEMPORAL * PATCH**2, generator=g).to(torch.bfloat16),
             "image_grid_thw": torch.tensor([[1, grid, grid]] * images)}
    return {key: value.to(device) for key, value in found.items()}


def _lora_gradients(encoder: torch.nn.Module) -> list[torch.Tensor]:
    return [p.grad.detach().float().clone() for p in encoder.parameters() if p.requires_grad]


def _reuse_vs_rerun(size: VlmSize) -> Callable[[torch.device], dict[str, Any]]:
    def run(device: torch.device) -> dict[str, Any]:
        encoder = build_encoder(size, device)
        inputs = [batch(size, device, seed) for seed in (0, 1)]
        loss = losses.InfoNCE(temperature=TEMPERATURE)
        options = {"chunk_tokens": size.chunk_tokens, "trim_padding": True, "autocast_dtype": torch.bfloat16}
        warm = [batch(dataclasses.replace(size, n=4), device, 2) for _ in range(2)]  # first calls' kernels, untimed
        GradCache(encoder, loss, size.chunk, **options).step(*warm)
        found, seconds = {}, {}
        for name in ("rerun", "reuse"):
            encoder.zero_grad(set_to_none=True)
            reused = {"reuse_outputs": [tower(encoder)]} if name == "reuse" else {}
            strategy = GradCache(encoder, loss, size.chunk, **options, **reused)
            torch.manual_seed(1)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            started = time.perf_counter()
            strategy.step(*inputs)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            seconds[name] = time.perf_counter() - started
            found[name] = _lora_gradients(encoder)
        error = max_rel_error(found["reuse"], found["rerun"])
        return {"step_s": seconds["reuse"], "seconds": seconds, "ratio_reuse_to_rerun": seconds["reuse"] / seconds["rerun"],
                "max_rel_error": error, "tolerance": TOLERANCE,
                "failure": f"max_rel_error {error:.3g} > {TOLERANCE}" if error > TOLERANCE else None}
    return run

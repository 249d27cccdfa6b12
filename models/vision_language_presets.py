"""Named vision-language models built from a config with random weights, no download: the Qwen2-VL architecture
at sizes a CPU trains in minutes, with its processor over a word-level tokenizer of the words it will read."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from torch import nn

# The special tokens Qwen2-VL's processor and model read (padding, end, the image's bounds and its pad token).
QWEN2_VL_SPECIAL = ["<|pad|>", "<|endoftext|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
UNKNOWN = "[UNK]"


@dataclass(frozen=True)
class VisionLanguagePreset:
    """A Qwen2-VL-architecture model's sizes."""

    hidden_size: int = 64  # the language model's width, and so the embedding's
    layers: int = 2
    heads: int = 4  # head width hidden_size / heads = 16; rotary sections (temporal, height, width) = 2, 3, 3
    key_value_heads: int = 2
    intermediate_size: int = 128
    vision_width: int = 64
    vision_depth: int = 2
    vision_heads: int = 4
    patch_size: int = 8  # pixels a patch side; 2 x 2 patches merge into one image token
    min_pixels: int = 32 * 32  # the processor's pixel budget per image: a 32 x 32 image holds 4 image tokens
    max_pixels: int = 64 * 64
    max_positions: int = 512


VISION_LANGUAGE_PRESETS: dict[str, VisionLanguagePreset] = {
    # the default of `gradcache train vlm`: trains on the built-in shapes and captions on 2 CPU cores
    "tiny-qwen2-vl": VisionLanguagePreset(),
}


def build_vision_language_model(preset: str | VisionLanguagePreset, words: Sequence[str],
                                seed: int = 0) -> tuple[nn.Module, Any]:
    """(Qwen2VLModel with random weights drawn from `seed`, its Qwen2VLProcessor) of `preset`, the tokenizer
    word-level over `words` (split on whitespace; any other word reads as [UNK]) and Qwen2-VL's special tokens.

    Raises:
        ValueError: an unknown preset name; no words.
    """
    import torch
    from transformers import Qwen2VLConfig, Qwen2VLModel

    if isinstance(preset, str):
        if preset not in VISION_LANGUAGE_PRESETS:
            raise ValueError(f"preset={preset!r} is not a vision-language preset; choose one of "
                             f"{sorted(VISION_LANGUAGE_PRESETS)}")
        preset = VISION_LANGUAGE_PRESETS[preset]
    processor, vocabulary = _processor(preset, words)
    head = preset.hidden_size // preset.heads
    sections = [head // 8, (head // 2 - head // 8) // 2]
    sections.append(head // 2 - sum(sections))  # temporal, height, width: half the head's rotary width in all
    special = dict(pad_token_id=vocabulary["<|pad|>"], bos_token_id=None, eos_token_id=vocabulary["<|endoftext|>"])
    config = Qwen2VLConfig(
        text_config=dict(hidden_size=preset.hidden_size, intermediate_size=preset.intermediate_size,
                         num_hidden_layers=preset.layers, num_attention_heads=preset.heads,
                         num_key_value_heads=preset.key_value_heads, vocab_size=len(vocabulary),
                         max_position_embeddings=preset.max_positions,
                         rope_scaling={"type": "mrope", "mrope_section": sections}, **special),
        vision_config=dict(depth=preset.vision_depth, embed_dim=preset.vision_width, hidden_size=preset.hidden_size,
                           num_heads=preset.vision_heads, mlp_ratio=2, patch_size=preset.patch_size,
                           spatial_merge_size=2, temporal_patch_size=2, in_channels=3),
        image_token_id=vocabulary["<|image_pad|>"], video_token_id=vocabulary["<|video_pad|>"],
        vision_start_token_id=vocabulary["<|vision_start|>"], vision_end_token_id=vocabulary["<|vision_end|>"],
        **special,
    )
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        model = Qwen2VLModel(config).float()
    finally:
        torch.random.set_rng_state(generator_state)  # the caller's stream is left where it was
    return model, processor


def _processor(preset: VisionLanguagePreset, words: Sequence[str]) -> tuple[Any, dict[str, int]]:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import (
        PreTrainedTokenizerFast, Qwen2VLImageProcessor, Qwen2VLProcessor, Qwen2VLVideoProcessor,
    )

    distinct = sorted({word for text in words for word in text.split()} - {*QWEN2_VL_SPECIAL, UNKNOWN})
    if not distinct:
        raise ValueError("words is empty; give the words the model will read (the training texts' words)")
    vocabulary = {token: index for index, token in enumerate([*QWEN2_VL_SPECIAL, UNKNOWN, *distinct])}
    tokenizer = Tokenizer(models.WordLevel(vocabulary, unk_token=UNKNOWN))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<|pad|>", eos_token="<|endoftext|>",
                                   unk_token=UNKNOWN, padding_side="left")
    fast.add_special_tokens({"additional_special_tokens": QWEN2_VL_SPECIAL[2:]})
    size = {"shortest_edge": preset.min_pixels, "longest_edge": preset.max_pixels}
    sizes = dict(size=size, patch_size=preset.patch_size, merge_size=2, temporal_patch_size=2)
    processor = Qwen2VLProcessor(image_processor=Qwen2VLImageProcessor(**sizes), tokenizer=fast,
                                 video_processor=Qwen2VLVideoProcessor(**sizes), chat_template=None)
    return processor, vocabulary

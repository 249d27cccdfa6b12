"""Tiny vision-language models with their own processors, built from a config in the test (no download): a
Qwen2-VL (grid-flattened patches: `pixel_values` (patches, 1176) with `image_grid_thw`) and an Idefics3
(sample-first tiles: `pixel_values` (B, tiles, 3, 32, 32) with `pixel_attention_mask`), each with a word-level
`tokenizers` tokenizer holding the model's special tokens, and batches mixing the rows a VLM embedder trains
on: text only, image only, image + text, two images + text.

Hidden width 32, one layer in each tower, images of a few patches: a forward takes milliseconds.
`VisionLanguageEncoder` pools a model's last hidden states into (B, D) embeddings over the attended positions
(masked mean), so trimming padding and splitting rows leave each row's embedding as it was.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything below is local; never ask the hub

WORDS = ["a", "cat", "dog", "on", "the", "mat", "red", "blue", "photo", "of", "is", "sits", "green", "tree"]
TEXTS = ["a cat", "the red photo of a dog", "a dog sits on the mat", "blue tree", "the cat is green",
         "a photo", "red mat"]

QWEN_SPECIAL = ["<|pad|>", "<|endoftext|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
QWEN_IMAGE = "<|vision_start|><|image_pad|><|vision_end|>"
# Messages as Qwen2-VL's template renders them, without the roles: each image as QWEN_IMAGE, each text as it is,
# space-separated (the word-level tokenizer splits on spaces). sentence-transformers renders every input
# (text, image, image + text) through it and counts each row's images (num_images_per_sample).
QWEN_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if message['content'] is string %}{{ message['content'] }} {% else %}"
    "{% for content in message['content'] %}{% if content['type'] == 'image' %}" + QWEN_IMAGE + " "
    "{% elif content['type'] == 'text' %}{{ content['text'] }} {% endif %}{% endfor %}{% endif %}{% endfor %}"
)
IDEFICS_SPECIAL = ["<pad>", "<end_of_utterance>", "<fake_token_around_image>", "<image>", "<global-img>"]
IDEFICS_IMAGE = "<image>"


def _tokenizer(special: list[str], pad: str, eos: str, padding_side: str, extra: list[str] = ()):
    """A WordLevel tokenizer over WORDS and the model's special tokens, as a PreTrainedTokenizerFast."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: index for index, token in enumerate([*special, *extra, *WORDS, "[UNK]"])}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token=pad, eos_token=eos, unk_token="[UNK]",
                                   padding_side=padding_side)
    fast.add_special_tokens({"additional_special_tokens": [t for t in [*special, *extra] if t not in (pad, eos)]})
    return fast, vocab


def images(count: int, seed: int = 0) -> list[Any]:
    """`count` small RGB images of a few different sizes (so their patch counts differ), random colours."""
    import numpy as np
    from PIL import Image

    generator = np.random.default_rng(seed)
    sizes = [(56, 56), (112, 56), (56, 84), (84, 84)]
    return [Image.fromarray(generator.integers(0, 256, (h, w, 3), dtype=np.uint8)) for w, h in
            (sizes[k % len(sizes)] for k in range(count))]


def tiny_qwen2_vl(seed: int = 0, padding_side: str = "right", dropout: float = 0.0):
    """A Qwen2VLModel (text: 1 layer, width 32; vision: 1 block, width 32, patch 14, merge 2) and its processor
    (min 56x56, max 84x112 pixels: 16 to 48 patches, 4 to 12 image tokens per image)."""
    from transformers import (
        Qwen2VLConfig, Qwen2VLImageProcessor, Qwen2VLModel, Qwen2VLProcessor, Qwen2VLVideoProcessor,
    )

    tokenizer, vocab = _tokenizer(QWEN_SPECIAL, "<|pad|>", "<|endoftext|>", padding_side)
    pixels = dict(min_pixels=56 * 56, max_pixels=84 * 112)
    processor = Qwen2VLProcessor(image_processor=Qwen2VLImageProcessor(**pixels), tokenizer=tokenizer,
                                 video_processor=Qwen2VLVideoProcessor(**pixels), chat_template=QWEN_CHAT_TEMPLATE)
    config = Qwen2VLConfig(
        text_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1, vocab_size=len(vocab), max_position_embeddings=256,
                         attention_dropout=dropout, rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]},
                         pad_token_id=vocab["<|pad|>"], bos_token_id=None, eos_token_id=vocab["<|endoftext|>"]),
        vision_config=dict(depth=1, embed_dim=32, hidden_size=32, num_heads=2, mlp_ratio=2, patch_size=14,
                           spatial_merge_size=2, temporal_patch_size=2, in_channels=3),
        image_token_id=vocab["<|image_pad|>"], video_token_id=vocab["<|video_pad|>"],
        vision_start_token_id=vocab["<|vision_start|>"], vision_end_token_id=vocab["<|vision_end|>"],
        pad_token_id=vocab["<|pad|>"], bos_token_id=None, eos_token_id=vocab["<|endoftext|>"],
    )
    torch.manual_seed(seed)
    return Qwen2VLModel(config).float(), processor


def tiny_idefics3(seed: int = 0, padding_side: str = "right", dropout: float = 0.0):
    """An Idefics3Model (text: Llama, 1 layer, width 32; vision: 1 layer, width 32, 32x32 tiles of 8x8 patches,
    scale factor 2: 4 image tokens per tile) and its processor (images split into up to 2x2 tiles + a global one)."""
    from transformers import Idefics3Config, Idefics3ImageProcessor, Idefics3Model, Idefics3Processor

    tiles = [f"<row_{r}_col_{c}>" for r in (1, 2) for c in (1, 2)]
    tokenizer, vocab = _tokenizer(IDEFICS_SPECIAL, "<pad>", "<end_of_utterance>", padding_side, tiles)
    image_processor = Idefics3ImageProcessor(size={"longest_edge": 64}, max_image_size={"longest_edge": 32})
    processor = Idefics3Processor(image_processor=image_processor, tokenizer=tokenizer, image_seq_len=4,
                                  chat_template=None)
    config = Idefics3Config(
        text_config=dict(model_type="llama", hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, vocab_size=len(vocab),
                         attention_dropout=dropout, pad_token_id=vocab["<pad>"]),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                           image_size=32, patch_size=8, attention_dropout=dropout),
        image_token_id=vocab["<image>"], scale_factor=2, pad_token_id=vocab["<pad>"],
    )
    torch.manual_seed(seed)
    return Idefics3Model(config).float(), processor


# The mixed rows: (words, images in the row). Text only, image only, image + text, two images + text.
ROW_KINDS = ("text", "image", "image+text", "two images+text")


def mixed_rows(count: int, image_marker: str, seed: int = 0) -> tuple[list[str], list[list[Any]]]:
    """`count` rows cycling through ROW_KINDS from `seed`: each row's text (with `image_marker` where an image
    goes) and its images."""
    texts, row_images, pictures = [], [], iter(images(2 * count, seed))
    for k in range(count):
        kind, words = ROW_KINDS[(k + seed) % len(ROW_KINDS)], TEXTS[(k + seed) % len(TEXTS)]
        if kind == "text":
            texts.append(words), row_images.append([])
        elif kind == "image":
            texts.append(image_marker), row_images.append([next(pictures)])
        elif kind == "image+text":
            texts.append(f"{image_marker} {words}"), row_images.append([next(pictures)])
        else:
            texts.append(f"{image_marker} {words} {image_marker}"), row_images.append([next(pictures), next(pictures)])
    return texts, row_images


def qwen2_vl_batch(processor, count: int, seed: int = 0) -> dict[str, Any]:
    """A Qwen2-VL processor's output for `count` mixed rows (images flattened over the batch, in row order)."""
    texts, row_images = mixed_rows(count, QWEN_IMAGE, seed)
    flat = [image for row in row_images for image in row]
    return dict(processor(text=texts, images=flat or None, padding=True, return_tensors="pt"))


def idefics3_batch(processor, count: int, seed: int = 0) -> dict[str, Any]:
    """An Idefics3 processor's output for `count` mixed rows (tiles per row, padded to the batch's most)."""
    texts, row_images = mixed_rows(count, IDEFICS_IMAGE, seed)
    return dict(processor(text=texts, images=row_images if any(row_images) else None, padding=True,
                          return_tensors="pt"))


class VisionLanguageEncoder(nn.Module):
    """`model(**inputs).last_hidden_state` mean-pooled over each row's attended positions: (B, D)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, **inputs: Any) -> torch.Tensor:
        hidden = self.model(**inputs).last_hidden_state  # (B, L, D)
        mask = inputs["attention_mask"].unsqueeze(-1).to(hidden.dtype)  # (B, L, 1)
        return (hidden * mask).sum(dim=1) / mask.sum(dim=1)  # (B, D)


def write_tiny_qwen2_vl(folder: Path, seed: int = 0, padding_side: str = "right") -> Path:
    """The tiny Qwen2-VL and its processor saved to `folder` (for a sentence-transformers Transformer)."""
    model, processor = tiny_qwen2_vl(seed, padding_side)
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder

"""Rows of text and images -> a VLM processor's batch: `<image>` placeholders take the row's images in order
(else the images go before the text), each image resized keeping its aspect to a pixel budget by the model's own
processor, and a row longer than `max_length` refused by name rather than truncated into its image tokens."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from gradcache.ranges import check_int

PLACEHOLDER = "<image>"  # where a row's text wants an image; the rows' images fill them in order
# Qwen2-VL's family wraps each image's tokens in these (its chat template writes them); others expand alone.
QWEN_VISION_BOUNDS = ("<|vision_start|>", "<|vision_end|>")


@dataclass(frozen=True)
class VisionLanguageInput:
    """One side of a row: its text, its images (PIL images), or both."""

    text: str | None = None
    images: tuple[Any, ...] = ()


class VisionLanguageCollator:
    """inputs (text and/or images each) -> the processor's batch (``input_ids``, ``attention_mask``, pixel keys).

    Each input's text becomes ``prompt + text + end_token``, where each ``<image>`` in the text is replaced by the
    model's image marker (Qwen2-VL: ``<|vision_start|><|image_pad|><|vision_end|>``; Idefics3: ``<image>``) and
    takes the input's next image; an input without a placeholder has its images' markers put before its text.
    The end token (the tokenizer's EOS by default) is the token last-token pooling reads. Padding is on the
    ``padding_side`` (left: a decoder's last token then sits in the last column).

    ``max_pixels`` caps each image's pixels, aspect kept, through the processor's own resize: Qwen2-VL's
    ``size={"longest_edge": max_pixels}`` (its pixel budget), Idefics3's ``size={"longest_edge": isqrt(max_pixels)}``
    (its longest side). An input whose tokens, image tokens included, exceed ``max_length`` is refused
    (ValueError naming the input and the length it needs): truncating into image tokens breaks the model.

    Args:
        processor: a transformers VLM processor (``tokenizer``, ``image_processor``, ``image_token``).
        max_pixels: each image's pixel budget; None: the processor's own.
        max_length: the most tokens an input may hold; None: no bound.
        query_prompt, passage_prompt: texts put before each query's / passage's content (``queries`` and
            ``passages``).
        padding_side: ``"left"`` or ``"right"``.
        end_token: appended to every input's text; None: the tokenizer's EOS token; ``""``: nothing.

    Raises:
        ValueError: a bad ``max_pixels``, ``max_length`` or ``padding_side``; a processor whose resize takes no
            pixel budget when ``max_pixels`` is given.
    """

    def __init__(self, processor: Any, *, max_pixels: int | None = None, max_length: int | None = None,
                 query_prompt: str = "", passage_prompt: str = "", padding_side: str = "left",
                 end_token: str | None = None) -> None:
        for name, value in (("max_pixels", max_pixels), ("max_length", max_length)):
            check_int(value, name, optional="no bound")
        if padding_side not in ("left", "right"):
            raise ValueError(f"padding_side={padding_side!r}: choose 'left' or 'right'")
        self.processor = processor
        self.max_length = max_length
        self.query_prompt, self.passage_prompt = query_prompt, passage_prompt
        self.padding_side = padding_side
        tokenizer = processor.tokenizer
        self.end_token = tokenizer.eos_token or "" if end_token is None else end_token
        image_token = processor.image_token
        vocabulary = tokenizer.get_vocab()
        bounds = all(token in vocabulary for token in QWEN_VISION_BOUNDS)
        self.image_marker = f"{QWEN_VISION_BOUNDS[0]}{image_token}{QWEN_VISION_BOUNDS[1]}" if bounds else image_token
        self.image_token_id = vocabulary[image_token]
        self.images_kwargs = {} if max_pixels is None else _pixel_budget(processor.image_processor, max_pixels)
        # Qwen2-VL's processor takes one flat list of images, Idefics3's a list per row.
        self.images_per_row = "pixel_attention_mask" in getattr(processor.image_processor, "model_input_names", ())

    def queries(self, inputs: Sequence[VisionLanguageInput]) -> dict[str, torch.Tensor]:
        return self(inputs, self.query_prompt)

    def passages(self, inputs: Sequence[VisionLanguageInput]) -> dict[str, torch.Tensor]:
        return self(inputs, self.passage_prompt)

    def __call__(self, inputs: Sequence[VisionLanguageInput], prompt: str = "") -> dict[str, torch.Tensor]:
        texts = [self.text(item, index, prompt) for index, item in enumerate(inputs)]
        row_images = [list(item.images) for item in inputs]
        if not any(row_images):
            images = None
        elif self.images_per_row:
            images = row_images
        else:
            images = [image for row in row_images for image in row]
        batch = dict(self.processor(text=texts, images=images, padding=True, padding_side=self.padding_side,
                                    return_tensors="pt", **self.images_kwargs))
        self._check_lengths(batch)
        return batch

    def text(self, item: VisionLanguageInput, index: int, prompt: str = "") -> str:
        """`item`'s text as the processor reads it: prompt, image markers in place, end token."""
        if not isinstance(item, VisionLanguageInput):
            raise TypeError(f"input {index} is a {type(item).__name__}; give VisionLanguageInput(text=..., images=...)")
        text, count = item.text or "", len(item.images)
        if not text and not count:
            raise ValueError(f"input {index} has neither text nor an image; give it one or the other, or leave the "
                             "row out")
        placeholders = text.count(PLACEHOLDER)
        if placeholders and placeholders != count:
            raise ValueError(f"input {index} holds {placeholders} {PLACEHOLDER} placeholders for {count} images; "
                             f"give one {PLACEHOLDER} per image, or none to put the images before the text")
        if placeholders:
            text = text.replace(PLACEHOLDER, self.image_marker)
        else:
            text = self.image_marker * count + text
        return f"{prompt}{text}{self.end_token}"

    @property
    def chat_template(self) -> str:
        """`text` as a Jinja chat template, for a processor that renders messages (sentence-transformers renders
        every input, text, image or both, as one user message): the system messages' texts as the prompt, then the
        user's texts with each `<image>` placeholder taking the next image's marker, else the images' markers
        before the text, then the end token; an input with neither, or with placeholders that do not match its
        images, raises as `text` does. The same input renders to the same string as `text(item, index, prompt)`."""
        marker, end = (json.dumps(token, ensure_ascii=False) for token in (self.image_marker, self.end_token))
        placeholder = json.dumps(PLACEHOLDER, ensure_ascii=False)
        return "".join((
            '{%- set ns = namespace(prompt="", text="", images=0) -%}',
            "{%- for message in messages -%}",
            '{%- if message["content"] is string -%}{%- set parts = [{"type": "text", "text": message["content"]}] -%}',
            '{%- else -%}{%- set parts = message["content"] -%}{%- endif -%}',
            "{%- for part in parts -%}",
            '{%- if part["type"] == "image" -%}{%- set ns.images = ns.images + 1 -%}',
            '{%- elif part["type"] == "text" and message["role"] == "system" -%}',
            '{%- set ns.prompt = ns.prompt + part["text"] -%}',
            '{%- elif part["type"] == "text" -%}{%- set ns.text = ns.text + part["text"] -%}',
            '{%- else -%}{{- raise_exception("an input holds a " ~ part["type"] ~ "; give text and images only") -}}',
            "{%- endif -%}{%- endfor -%}{%- endfor -%}",
            f"{{%- set placeholders = ns.text.count({placeholder}) -%}}",
            "{%- if not ns.text and not ns.images -%}",
            '{{- raise_exception("an input has neither text nor an image; give it one or the other") -}}',
            "{%- endif -%}",
            "{%- if placeholders and placeholders != ns.images -%}",
            f'{{{{- raise_exception("an input holds " ~ placeholders ~ " " ~ {placeholder} ~ " placeholders for " ~ '
            f'ns.images ~ " images; give one per image, or none to put the images before the text") -}}}}',
            "{%- endif -%}",
            "{{- ns.prompt -}}",
            f"{{%- if placeholders -%}}{{{{- ns.text.replace({placeholder}, {marker}) -}}}}",
            f"{{%- else -%}}{{%- for _ in range(ns.images) -%}}{{{{- {marker} -}}}}{{%- endfor -%}}{{{{- ns.text -}}}}",
            "{%- endif -%}",
            f"{{{{- {end} -}}}}",
        ))

    def _check_lengths(self, batch: dict[str, torch.Tensor]) -> None:
        if self.max_length is None:
            return
        lengths = batch["attention_mask"].sum(dim=1)  # (B,)
        for index in (lengths > self.max_length).nonzero().flatten().tolist():
            image_tokens = int(batch["input_ids"][index].eq(self.image_token_id).sum())
            raise ValueError(f"input {index} holds {int(lengths[index])} tokens ({image_tokens} of them image tokens),"
                             f" more than max_length={self.max_length}; raise max_length to {int(lengths[index])} "
                             "or lower max_pixels (an image is never truncated: its tokens must all be there)")


def _pixel_budget(image_processor: Any, max_pixels: int) -> dict[str, Any]:
    """The processor call's keyword that resizes each image, aspect kept, to at most `max_pixels` pixels."""
    size = getattr(image_processor, "size", None)
    get = (lambda key: size.get(key)) if isinstance(size, dict) else (lambda key: getattr(size, key, None))
    if hasattr(image_processor, "merge_size") and get("longest_edge") is not None:  # Qwen2-VL: edges are pixels
        shortest = get("shortest_edge") or max_pixels
        return {"size": {"shortest_edge": min(shortest, max_pixels), "longest_edge": max_pixels}}
    if get("longest_edge") is not None:  # Idefics3 / SmolVLM: the longest side in pixels
        return {"size": {"longest_edge": max(1, math.isqrt(max_pixels))}}
    raise ValueError(f"max_pixels={max_pixels} cannot be passed to {type(image_processor).__name__}, whose resize "
                     f"takes no pixel budget (size={size!r}); leave max_pixels None and set the processor's size")

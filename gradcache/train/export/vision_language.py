"""A vision-language embedder as a sentence-transformers folder that sentence-transformers 6.3 loads as it is:
`SentenceTransformer(folder)` encodes a text, an image, or an image and its text (`{"image": ..., "text": ...}`) as
`VisionLanguageEncoder` after `VisionLanguageCollator` embeds them.

The folder: the Hugging Face model (`model.safetensors`, `config.json`, readable by `transformers.AutoModel`) and its
processor at the top; `modules.json` listing Transformer -> Pooling (`1_Pooling`: `lasttoken` or `mean`) ->
Normalize (`2_Normalize`, when the encoder normalises); `sentence_bert_config.json` with a `modality_config` for
text, image and message inputs (every input goes through the processor's chat template as one message) and
`max_seq_length` = the run's `--max-length`; `config_sentence_transformers.json` with the prompts `"query"` and
`"document"`. The processor is the run's, with three things written into it: the collator's text as its chat
template (`VisionLanguageCollator.chat_template`: the prompt, the image markers in place of `<image>` or before the
text, the end token that last-token pooling reads), the pixel budget as its image processor's own size (the
`--max-pixels` resize), and left padding. A LoRA model is written merged, and its adapter alone in `adapter/`.
"""
from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

from torch import nn

from gradcache.models.sentence_transformers_folder import QUERY_PROMPT_NAME
from gradcache.models.vision_language import VisionLanguageEncoder
from gradcache.models.vision_language_collator import VisionLanguageCollator
from gradcache.train.export.sentence_transformers import (
    ADAPTER_FOLDER,
    PASSAGE_PROMPT_NAME,
    adapter_card,
    write_json,
)

_POOLING_MODE = {"last": "lasttoken", "mean": "mean"}  # VisionLanguageEncoder's pooling -> sentence-transformers'
# The classes sentence-transformers 6.3 saves these modules as (what it writes in modules.json itself).
_TRANSFORMER = "sentence_transformers.base.modules.transformer.Transformer"
_POOLING = "sentence_transformers.sentence_transformer.modules.pooling.Pooling"
_NORMALIZE = "sentence_transformers.base.modules.normalize.Normalize"
_HIDDEN_STATES = {"method": "forward", "method_output_name": "last_hidden_state"}


def write_vision_language_folder(encoder: VisionLanguageEncoder, processor: Any, folder: Path, *, base: str,
                                 max_length: int | None, max_pixels: int | None, query_prompt: str | None,
                                 passage_prompt: str | None) -> None:
    """Write `encoder` (its model, pooling and normalisation) and `processor` into the new or empty `folder` as a
    sentence-transformers folder (module docstring).

    Args:
        encoder: the trained model; its `.model` may be a peft `PeftModel` (LoRA on the language model): the
            adapter is then written to `folder/adapter` (`PeftModel.save_pretrained`) and a merged copy of the
            model to `folder`, the encoder itself left as it was.
        processor: the processor the run embedded with.
        base: the base model the card names (the run's `--model`: a folder or a preset name).
        max_length: the run's `--max-length` (`max_seq_length`; sentence-transformers truncates longer inputs);
            None: none written.
        max_pixels: the run's `--max-pixels`, written as the image processor's size; None: its own.
        query_prompt, passage_prompt: the run's prompts, saved as `"query"` and `"document"`; None: none.

    Raises:
        ValueError: a processor whose resize takes no pixel budget while `max_pixels` is given.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    model, adapted = encoder.model, _is_peft_model(encoder.model)
    if adapted:
        model.save_pretrained(folder / ADAPTER_FOLDER)  # adapter_config.json + adapter_model.safetensors
        model = copy.deepcopy(model).merge_and_unload()  # the encoder keeps its adapter
    model.save_pretrained(folder, safe_serialization=True)
    _saved_processor(processor, max_pixels).save_pretrained(folder)
    modules = [{"idx": 0, "name": "0", "path": "", "type": _TRANSFORMER},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": _POOLING}]
    if encoder.normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": _NORMALIZE})
        (folder / "2_Normalize").mkdir(exist_ok=True)
    write_json(folder / "modules.json", modules)
    transformer = {"transformer_task": "feature-extraction",
                   "modality_config": {"text": _HIDDEN_STATES, "image": _HIDDEN_STATES,
                                       "message": {**_HIDDEN_STATES, "format": "structured"}},
                   "module_output_name": "token_embeddings", "unpad_inputs": False}
    if max_length is not None:
        transformer["max_seq_length"] = max_length
    write_json(folder / "sentence_bert_config.json", transformer)
    (folder / "1_Pooling").mkdir(exist_ok=True)
    write_json(folder / "1_Pooling" / "config.json", {"embedding_dimension": encoder.out_dim,
                                                      "pooling_mode": _POOLING_MODE[encoder.pooling],
                                                      "include_prompt": True})
    prompts = {name: prompt for name, prompt in ((QUERY_PROMPT_NAME, query_prompt),
                                                 (PASSAGE_PROMPT_NAME, passage_prompt)) if prompt is not None}
    write_json(folder / "config_sentence_transformers.json",
               {"model_type": "SentenceTransformer", "prompts": prompts, "default_prompt_name": None,
                "similarity_fn_name": "cosine"})
    (folder / "README.md").write_text(_card(base, encoder, max_length, prompts, adapted), encoding="utf-8")


def _is_peft_model(model: nn.Module) -> bool:
    peft = sys.modules.get("peft")  # a PeftModel exists only where peft was imported
    return peft is not None and isinstance(model, peft.PeftModel)


def _saved_processor(processor: Any, max_pixels: int | None) -> Any:
    """A copy of `processor` as the folder holds it: the collator's text as its chat template, the pixel budget as
    its image processor's size, left padding (the last column then holds each input's last token)."""
    collator = VisionLanguageCollator(processor, max_pixels=max_pixels)
    saved = copy.deepcopy(processor)
    saved.chat_template = collator.chat_template
    for key, value in collator.images_kwargs.items():  # {"size": ...}: what the collator passes at each call
        setattr(saved.image_processor, key, value)
    saved.tokenizer.padding_side = "left"
    return saved


def _card(base: str, encoder: VisionLanguageEncoder, max_length: int | None, prompts: dict[str, str],
          adapted: bool) -> str:
    """README.md: what the model is and the lines that load and use it."""
    pooled = {"last": "its last token's (the end token)", "mean": "the mean of its tokens'"}[encoder.pooling]
    prompted = "".join(f'\n{name}_embeddings = model.encode(texts, prompt_name="{name}")  # after {prompt!r}'
                       for name, prompt in prompts.items())
    text = (
        "# A vision-language embedder trained by gradcache\n\n"
        f"Base model: `{base}`. Each input (a text, an image, or an image and its text) is one sequence of the "
        f"model; its embedding is {pooled} last hidden state"
        f"{', of unit length' if encoder.normalize else ''}.\n\n```python\n"
        "from PIL import Image\n"
        "from sentence_transformers import SentenceTransformer\n"
        'model = SentenceTransformer("RUN/model")\n'
        "image = Image.open(\"photo.png\")\n"
        'embeddings = model.encode(["a text", image, {"image": image, "text": "its caption"}])'
        f"{prompted}\n```\n\n"
        "Write `<image>` in a text where its image goes; without one, the images come before the text. "
        "Several images: `{\"image\": [first, second], \"text\": ...}`."
        + (f" Inputs longer than {max_length} tokens, image tokens included, are cut (sentence-transformers) or "
           "refused (`gradcache encode`)." if max_length is not None else "") + "\n"
    )
    return text + (adapter_card(base) if adapted else "")

"""A text tower as a sentence-transformers folder: `SentenceTransformer(folder)` loads it and embeds as the run
did, and `transformers.AutoModel.from_pretrained(folder)` reads its weights.

The folder is written in the layout all-MiniLM-L6-v2 ships (and sentence-transformers 3 to 6 read): the Hugging
Face model and its tokenizer at the top (`model.safetensors`, `config.json`, tokenizer files), `modules.json`
listing Transformer -> Pooling (`1_Pooling/config.json`: `mean_tokens`, `cls_token` or `lasttoken`, and
`include_prompt`) -> Normalize when the tower normalises, `sentence_bert_config.json` with `max_seq_length` = the
run's `--max-length`, and `config_sentence_transformers.json` with the run's prompts, under the names
`encode(..., prompt_name=...)`, `encode_query` and `encode_document` look up: `"query"` and `"document"`.
The tokenizer is the one the run tokenised with (`HuggingFaceTokenizer`): where it appends the EOS token, the
saved tokenizer does too, so sentence-transformers tokenises as the run did.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from torch import nn

from gradcache.models import HuggingFaceEncoder, HuggingFaceTokenizer
from gradcache.models.hf_tokenizer import tokenizer_folder
from gradcache.models.multi_vector_folder import is_multi_vector_folder, read_multi_vector_folder
from gradcache.models.sentence_transformers_folder import QUERY_PROMPT_NAME, read_sentence_transformer_folder

_POOLING_KEYS = ("cls_token", "mean_tokens", "max_tokens", "mean_sqrt_len_tokens", "weightedmean_tokens", "lasttoken")
_POOLING_KEY = {"mean": "mean_tokens", "cls": "cls_token", "last": "lasttoken"}  # HuggingFaceEncoder's -> ST's
PASSAGE_PROMPT_NAME = "document"  # the first name sentence-transformers' encode_document looks up
ADAPTER_FOLDER = "adapter"  # a LoRA run's adapter alone: RUN/model/adapter (query/adapter, passage/adapter)
_MODULE = "sentence_transformers.models."  # the module paths every sentence-transformers version reads


def write_sentence_transformers_folder(tower: HuggingFaceEncoder, base_folder: str | os.PathLike, max_seq_length: int,
                                       folder: str | os.PathLike, query_prompt: str | None = None,
                                       passage_prompt: str | None = None) -> None:
    """Write `tower` (its model, pooling and normalisation) with the tokenizer of `base_folder` (the `--model` the
    run started from) into the new or empty `folder`.

    The pooler that `HuggingFaceEncoder` drops (never read, never trained) is written back from `base_folder`
    when that model has one, so `AutoModel.from_pretrained(folder)` finds every weight it expects.

    Args:
        tower: the trained text encoder.
        base_folder: the Hugging Face or sentence-transformers folder the run's `--model` named.
        max_seq_length: the most tokens per text the run trained with (`--max-length`).
        folder: where to write.
        query_prompt, passage_prompt: the run's prompts (`--query-prompt`, `--passage-prompt`); None: none.
    """
    folder = Path(folder)
    write_transformer(tower.model, base_folder, max_seq_length, folder)
    modules = [{"idx": 0, "name": "0", "path": "", "type": _MODULE + "Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": _MODULE + "Pooling"}]
    if tower.normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": _MODULE + "Normalize"})
        (folder / "2_Normalize").mkdir(exist_ok=True)
    write_json(folder / "modules.json", modules)
    write_json(folder / "sentence_bert_config.json", {"max_seq_length": max_seq_length,
                                                       "do_lower_case": tokenizer_folder(Path(base_folder))[1]})
    (folder / "1_Pooling").mkdir(exist_ok=True)
    pooling = {"word_embedding_dimension": tower.out_dim,
               **{f"pooling_mode_{key}": key == _POOLING_KEY[tower.pooling] for key in _POOLING_KEYS},
               "include_prompt": tower.include_prompt}
    write_json(folder / "1_Pooling" / "config.json", pooling)
    prompts = {name: prompt for name, prompt in ((QUERY_PROMPT_NAME, query_prompt),
                                                 (PASSAGE_PROMPT_NAME, passage_prompt)) if prompt is not None}
    write_json(folder / "config_sentence_transformers.json",
                {"prompts": prompts, "default_prompt_name": None, "similarity_fn_name": "cosine"})
    pooled = {"cls": "hidden[:, 0]",
              "last": "hidden[torch.arange(len(hidden)), (mask[..., 0] * torch.arange(mask.shape[1])).argmax(1)]"
                      "  # each text's last token",
              "mean": "(hidden * mask).sum(1) / mask.sum(1)  # mean over the tokens"}[tower.pooling]
    prompted = "".join(f'\n{name}_embeddings = model.encode(texts, prompt_name="{name}")  # prepends {prompt!r}'
                       for name, prompt in prompts.items())
    (folder / "README.md").write_text(
        "# A sentence-transformers model trained by gradcache\n\n```python\n"
        "from sentence_transformers import SentenceTransformer\n"
        'model = SentenceTransformer("RUN/model")\n'
        f"embeddings = model.encode(texts)  # {'unit length, ' if tower.normalize else ''}at most {max_seq_length} "
        f"tokens per text{prompted}\n```\n\nWith transformers alone"
        f"{' (prepend the prompt to each text yourself)' if prompts else ''}:\n\n```python\n"
        "import torch, transformers\n"
        'tokenizer = transformers.AutoTokenizer.from_pretrained("RUN/model")\n'
        'model = transformers.AutoModel.from_pretrained("RUN/model")\n'
        f"batch = tokenizer(texts, padding=True, truncation=True, max_length={max_seq_length}, return_tensors='pt')\n"
        "hidden = model(**batch).last_hidden_state\n"
        "mask = batch['attention_mask'].unsqueeze(-1).float()\n"
        f"embeddings = {pooled}\n"
        + ("embeddings = torch.nn.functional.normalize(embeddings, dim=-1)\n" if tower.normalize else "")
        + "```\n", encoding="utf-8")


def write_transformer(model: nn.Module, base_folder: str | os.PathLike, max_seq_length: int,
                      folder: str | os.PathLike) -> None:
    """A sentence-transformers folder's `Transformer` module: the Hugging Face `model` (safetensors; the pooler a
    tower dropped put back from the base model where it has one, so `from_pretrained` finds every weight) and the
    tokenizer of `base_folder` (the run's `--model`, or its sentence-transformers or MultiVectorEncoder folder's
    model path), with the EOS the run appended, into the new or empty `folder`."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if is_multi_vector_folder(base_folder):  # a MultiVectorEncoder's (--kind multi-vector from its own export)
        source = read_multi_vector_folder(base_folder).model_path
    else:
        layout = read_sentence_transformer_folder(base_folder)
        source = Path(base_folder) if layout is None else layout.model_path
    restored = _put_back_pooler(model, source)
    try:
        model.save_pretrained(folder, safe_serialization=True)
    finally:
        if restored:
            model.pooler = None
    HuggingFaceTokenizer(source, max_seq_length).tokenizer.save_pretrained(folder)


def _put_back_pooler(model: nn.Module, source: Path) -> bool:
    """Give `model` (pooler removed) the pooler of the model in `source`, if it has one; True when it did."""
    if getattr(model, "pooler", False) is not None:
        return False
    import transformers

    base = transformers.AutoModel.from_pretrained(os.fspath(source), local_files_only=True)
    pooler = getattr(base, "pooler", None)
    if not isinstance(pooler, nn.Module):
        return False
    model.pooler = pooler.to(next(model.parameters()).device)
    return True


def adapter_card(base: str) -> str:
    """The model card's section on a LoRA run's adapter (`ADAPTER_FOLDER`): the model above is merged with it, and
    the lines that load it alone on its base model `base`."""
    return ("\n## The LoRA adapter\n\nThe model above is merged with its adapter. The adapter alone, on its base "
            f"model:\n\n```python\nimport peft, transformers\nbase = transformers.AutoModel.from_pretrained("
            f'"{base}")\nmodel = peft.PeftModel.from_pretrained(base, "RUN/model/{ADAPTER_FOLDER}")\n```\n')


def write_json(path: Path, value: object) -> None:
    """A configuration file of the folder, indented as sentence-transformers writes them."""
    path.write_text(json.dumps(value, indent=2) + "\n", encoding="utf-8")

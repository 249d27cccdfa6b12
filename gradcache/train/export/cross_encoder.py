"""A cross-encoder as a sentence-transformers `CrossEncoder` folder: `CrossEncoder(folder).predict(pairs)` gives
Sigmoid of the run's scores, and `transformers.AutoModelForSequenceClassification.from_pretrained(folder)` reads
its weights.

The layout is the one `CrossEncoder.save` writes in sentence-transformers 6.3: the Hugging Face model and its
tokenizer at the top (`model.safetensors`, `config.json`, tokenizer files whose `model_max_length` is the run's
`--max-length`, the most tokens per pair), `modules.json` listing one `Transformer` module of task
`sequence-classification`, and `config_sentence_transformers.json` naming the activation `predict` applies
(Sigmoid, its default for one label, and the one the training loss applied).
"""
from __future__ import annotations

import os
from pathlib import Path

from gradcache.models.cross_encoder import HuggingFaceCrossEncoder, weights_folder
from gradcache.train.export.sentence_transformers import write_json

SIGMOID = "torch.nn.modules.activation.Sigmoid"  # how sentence-transformers names the activation it restores


def write_cross_encoder_folder(scorer: HuggingFaceCrossEncoder, base_folder: str | os.PathLike, max_length: int,
                               folder: str | os.PathLike) -> None:
    """Write `scorer`'s model, with the tokenizer of `base_folder` (the run's `--model`) truncating pairs at
    `max_length` tokens, into the new or empty `folder` (module docstring)."""
    import transformers

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    scorer.model.save_pretrained(folder, safe_serialization=True)
    tokenizer = transformers.AutoTokenizer.from_pretrained(os.fspath(weights_folder(base_folder)),
                                                           local_files_only=True)
    tokenizer.model_max_length = max_length
    tokenizer.save_pretrained(folder)
    write_json(folder / "modules.json", [{"idx": 0, "name": "0", "path": "",
                                           "type": "sentence_transformers.base.modules.transformer.Transformer"}])
    write_json(folder / "sentence_bert_config.json", {
        "transformer_task": "sequence-classification",
        "modality_config": {"text": {"method": "forward", "method_output_name": "logits"}},
        "module_output_name": "scores"})
    write_json(folder / "config_sentence_transformers.json", {"activation_fn": SIGMOID, "model_type": "CrossEncoder",
                                                                "default_prompt_name": None, "prompts": {}})
    (folder / "README.md").write_text(
        "# A cross-encoder (reranker) trained by gradcache\n\n```python\n"
        "from sentence_transformers import CrossEncoder\n"
        'model = CrossEncoder("RUN/model")\n'
        f"scores = model.predict([(query, passage), ...])  # Sigmoid of the logit, at most {max_length} tokens per "
        "pair\nranked = model.rank(query, passages)\n```\n\nWith transformers alone:\n\n```python\n"
        "import torch, transformers\n"
        'tokenizer = transformers.AutoTokenizer.from_pretrained("RUN/model")\n'
        'model = transformers.AutoModelForSequenceClassification.from_pretrained("RUN/model")\n'
        f"batch = tokenizer(queries, passages, padding=True, truncation=True, max_length={max_length}, "
        "return_tensors='pt')\n"
        "scores = torch.sigmoid(model(**batch).logits[:, 0])\n```\n", encoding="utf-8")


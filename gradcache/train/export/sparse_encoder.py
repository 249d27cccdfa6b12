"""A SPLADE tower (`--kind sparse`) as a sentence-transformers `SparseEncoder` folder: `SparseEncoder(folder)`
loads it offline and its `encode` gives the rows the run's model gives.

The layout is the one sentence-transformers 6.3 saves for a masked-LM SPLADE model: the Hugging Face
`*ForMaskedLM` model (its head included) and its tokenizer at the top; `modules.json` listing the fill-mask
`Transformer` -> `SpladePooling` (`1_SpladePooling/config.json`: the tower's pooling and activation);
`sentence_bert_config.json` with the fill-mask task and `max_seq_length` = the run's `--max-length`; and
`config_sentence_transformers.json` with `model_type` `SparseEncoder`, dot-product similarity and the run's
prompts under the names `encode_query` and `encode_document` look up (`"query"`, `"document"`).
"""
from __future__ import annotations

import os
from pathlib import Path

from gradcache.models.hf_tokenizer import tokenizer_folder
from gradcache.models.sentence_transformers_folder import QUERY_PROMPT_NAME
from gradcache.models.splade import SpladeEncoder
from gradcache.train.export.sentence_transformers import PASSAGE_PROMPT_NAME, write_json, write_transformer

POOLING_FOLDER = "1_SpladePooling"
TRANSFORMER_TYPE = "sentence_transformers.base.modules.transformer.Transformer"
SPLADE_POOLING_TYPE = "sentence_transformers.sparse_encoder.modules.splade_pooling.SpladePooling"


def write_sparse_encoder_folder(tower: SpladeEncoder, base_folder: str | os.PathLike, max_seq_length: int,
                                folder: str | os.PathLike, query_prompt: str | None = None,
                                passage_prompt: str | None = None) -> None:
    """Write `tower` (its masked-LM model, head included) with the tokenizer of `base_folder` (the run's
    `--model`) into the new or empty `folder` (module docstring).

    Args:
        tower: the trained SPLADE encoder.
        base_folder: the Hugging Face or sentence-transformers folder the run's `--model` named.
        max_seq_length: the most tokens per text the run trained with (`--max-length`).
        folder: where to write.
        query_prompt, passage_prompt: the run's prompts (`--query-prompt`, `--passage-prompt`); None: none.
    """
    folder = Path(folder)
    write_transformer(tower.model, base_folder, max_seq_length, folder)
    write_json(folder / "modules.json", [
        {"idx": 0, "name": "0", "path": "", "type": TRANSFORMER_TYPE},
        {"idx": 1, "name": "1", "path": POOLING_FOLDER, "type": SPLADE_POOLING_TYPE}])
    write_json(folder / "sentence_bert_config.json", {
        "transformer_task": "fill-mask", "max_seq_length": max_seq_length,
        "do_lower_case": tokenizer_folder(Path(base_folder))[1],
        "modality_config": {"text": {"method": "forward", "method_output_name": "logits"}},
        "module_output_name": "token_embeddings"})
    (folder / POOLING_FOLDER).mkdir(exist_ok=True)
    write_json(folder / POOLING_FOLDER / "config.json",
                {"pooling_strategy": tower.pooling_strategy, "activation_function": tower.activation_function,
                 "embedding_dimension": tower.out_dim})
    prompts = {name: prompt for name, prompt in ((QUERY_PROMPT_NAME, query_prompt),
                                                 (PASSAGE_PROMPT_NAME, passage_prompt)) if prompt is not None}
    write_json(folder / "config_sentence_transformers.json",
                {"model_type": "SparseEncoder", "prompts": prompts, "default_prompt_name": None,
                 "similarity_fn_name": "dot"})
    prompted = "".join(f'\n{name}_rows = model.encode(texts, prompt_name="{name}")  # prepends {prompt!r}'
                       for name, prompt in prompts.items())
    (folder / "README.md").write_text(
        "# A SPLADE model trained by gradcache (`--kind sparse`)\n\n```python\n"
        "from sentence_transformers import SparseEncoder\n"
        'model = SparseEncoder("RUN/model")\n'
        f"rows = model.encode(texts)  # (N, {tower.out_dim}) sparse, at most {max_seq_length} tokens per text"
        f"{prompted}\nscores = model.similarity(query_rows, document_rows)  # dot products\n```\n\n"
        "With transformers alone"
        f"{' (prepend the prompt to each text yourself)' if prompts else ''}:\n\n```python\n"
        "import torch, transformers\n"
        'tokenizer = transformers.AutoTokenizer.from_pretrained("RUN/model")\n'
        'model = transformers.AutoModelForMaskedLM.from_pretrained("RUN/model")\n'
        f"batch = tokenizer(texts, padding=True, truncation=True, max_length={max_seq_length}, return_tensors='pt')\n"
        "logits = model(**batch).logits * batch['attention_mask'].unsqueeze(-1)\n"
        "rows = torch.log1p(torch.relu(logits)).amax(dim=1)  # (N, vocabulary)\n```\n", encoding="utf-8")


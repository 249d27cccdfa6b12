"""A multi-vector tower (`--kind multi-vector`) as a sentence-transformers `MultiVectorEncoder` folder:
`MultiVectorEncoder(folder)` loads it offline and its `encode_query` / `encode_document` return the run's token
vectors (each text's `values[mask]`).

The layout is the one sentence-transformers 6 saves for a fresh `MultiVectorEncoder`: the Hugging Face model and
its tokenizer at the top, `modules.json` listing Transformer -> Dense (`1_Dense`: the (D, hidden) projection
without bias, `linear.weight` in `model.safetensors`) -> MultiVectorMask (`2_MultiVectorMask`: no skiplist) ->
Normalize (`3_Normalize`), all on `token_embeddings`; `sentence_bert_config.json` with `max_seq_length` = the run's
`--max-length` and, with `--query-expansion`, the Transformer's `query_expansion` (strategy "fixed", the run's
length and attend, the default token) as `MultiVectorEncoder.save` writes it; `config_sentence_transformers.json`
with `model_type` "MultiVectorEncoder", similarity "maxsim" and the run's prompts as "query" and "document".
"""
from __future__ import annotations

import os
from pathlib import Path

from safetensors.torch import save_file

from gradcache.models.hf_tokenizer import tokenizer_folder
from gradcache.models.multi_vector import MultiVectorTextEncoder
from gradcache.models.query_expansion import QueryExpansion
from gradcache.models.sentence_transformers_folder import QUERY_PROMPT_NAME
from gradcache.train.export.sentence_transformers import PASSAGE_PROMPT_NAME, write_json, write_transformer

_BASE = "sentence_transformers.base.modules."
MODULES = [  # (folder, class) as sentence-transformers 6.3 saves a MultiVectorEncoder
    ("", _BASE + "transformer.Transformer"),
    ("1_Dense", _BASE + "dense.Dense"),
    ("2_MultiVectorMask", "sentence_transformers.multi_vector_encoder.modules.multi_vector_mask.MultiVectorMask"),
    ("3_Normalize", _BASE + "normalize.Normalize"),
]
TOKENS = {"module_input_name": "token_embeddings", "module_output_name": "token_embeddings"}


def write_multi_vector_folder(tower: MultiVectorTextEncoder, base_folder: str | os.PathLike, max_seq_length: int,
                              folder: str | os.PathLike, query_prompt: str | None = None,
                              passage_prompt: str | None = None, query_expansion: QueryExpansion | None = None
                              ) -> None:
    """Write `tower` (its model and projection) with the tokenizer of `base_folder` (the run's `--model`) into the
    new or empty `folder` (module docstring).

    Args:
        tower: the trained multi-vector encoder.
        base_folder: the Hugging Face, sentence-transformers or MultiVectorEncoder folder the run's `--model`
            named.
        max_seq_length: the most tokens per text the run trained with (`--max-length`).
        folder: where to write.
        query_prompt, passage_prompt: the run's prompts (`--query-prompt`, `--passage-prompt`); None: none.
        query_expansion: the run's (`--query-expansion`, `--attend-to-expansion`); None: none.
    """
    folder = Path(folder)
    write_transformer(tower.model, base_folder, max_seq_length, folder)
    write_json(folder / "modules.json", [{"idx": k, "name": str(k), "path": path, "type": kind}
                                          for k, (path, kind) in enumerate(MODULES)])
    expansion = {} if query_expansion is None else {"query_expansion": query_expansion.to_sentence_transformers()}
    write_json(folder / "sentence_bert_config.json", {
        "transformer_task": "feature-extraction",
        "modality_config": {"text": {"method": "forward", "method_output_name": "last_hidden_state"}},
        "module_output_name": "token_embeddings", **expansion, "max_seq_length": max_seq_length,
        "do_lower_case": tokenizer_folder(Path(base_folder))[1]})
    dense = folder / "1_Dense"
    dense.mkdir(exist_ok=True)
    weight = tower.projection.weight.detach().float().cpu().contiguous()  # (D, hidden)
    save_file({"linear.weight": weight}, str(dense / "model.safetensors"))
    write_json(dense / "config.json", {"in_features": weight.shape[1], "out_features": weight.shape[0],
                                        "bias": False, "activation_function": "torch.nn.modules.linear.Identity",
                                        **TOKENS})
    (folder / "2_MultiVectorMask").mkdir(exist_ok=True)
    write_json(folder / "2_MultiVectorMask" / "config.json",
                {"skiplist_words": [], "skiplist_tasks": ["document"], "keep_only_token_ids": None})
    (folder / "3_Normalize").mkdir(exist_ok=True)
    write_json(folder / "3_Normalize" / "config.json", TOKENS)
    prompts = {name: prompt for name, prompt in ((QUERY_PROMPT_NAME, query_prompt),
                                                 (PASSAGE_PROMPT_NAME, passage_prompt)) if prompt is not None}
    write_json(folder / "config_sentence_transformers.json",
                {"model_type": "MultiVectorEncoder", "prompts": {"query": "", "document": "", **prompts},
                 "default_prompt_name": None, "similarity_fn_name": "maxsim"})
    query_tokens = (f"at most {max_seq_length} tokens" if query_expansion is None
                    else f"exactly {query_expansion.length} tokens (query expansion)")
    (folder / "README.md").write_text(
        "# A multi-vector (ColBERT) model trained by gradcache\n\n```python\n"
        "from sentence_transformers import MultiVectorEncoder\n"
        'model = MultiVectorEncoder("RUN/model")\n'
        "queries = model.encode_query(query_texts)  # per text, (tokens, "
        f"{weight.shape[0]}) unit vectors, {query_tokens}\n"
        "documents = model.encode_document(passages)\n"
        "scores = model.similarity(queries, documents)  # MaxSim: sum over query tokens of the best match\n```\n",
        encoding="utf-8")


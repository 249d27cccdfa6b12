"""A tiny BERT and its WordPiece tokenizer written to a folder by the test itself: no download, loads in ms.

The vocabulary is the special tokens, single characters and their ``##`` continuations, so any lower-cased
ASCII text tokenises (character by character) without ``[UNK]``.
"""
from __future__ import annotations

import json
import string
from pathlib import Path

import torch

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
CHARACTERS = list(string.ascii_lowercase + string.digits + string.punctuation)


def write_tiny_bert(folder: Path, seed: int = 0, dropout: float = 0.0, hidden_size: int = 16,
                    sentence_transformers: dict | None = None) -> Path:
    """Write a 2-layer BERT (hidden ``hidden_size``) and its tokenizer to ``folder``; returns ``folder``.

    ``sentence_transformers``: also write ``modules.json`` and ``1_Pooling/config.json`` as sentence-transformers
    saves them, e.g. ``{"pooling_mode_cls_token": True, "normalize": True}``.
    """
    import transformers

    folder.mkdir(parents=True, exist_ok=True)
    vocab = SPECIAL + CHARACTERS + [f"##{c}" for c in CHARACTERS]
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    # positional: transformers 4 names it vocab_file, transformers 5 vocab
    tokenizer = transformers.BertTokenizer(str(folder / "vocab.txt"), do_lower_case=True)
    tokenizer.save_pretrained(folder)
    torch.manual_seed(seed)
    config = transformers.BertConfig(
        vocab_size=len(vocab), hidden_size=hidden_size, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=2 * hidden_size, max_position_embeddings=128,
        hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout,
    )
    transformers.BertModel(config).save_pretrained(folder)
    if sentence_transformers is not None:
        options = dict(sentence_transformers)
        normalize = options.pop("normalize", False)
        modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                   {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
        if normalize:
            modules.append({"idx": 2, "name": "2", "path": "2_Normalize",
                            "type": "sentence_transformers.models.Normalize"})
        (folder / "modules.json").write_text(json.dumps(modules), encoding="utf-8")
        (folder / "1_Pooling").mkdir(exist_ok=True)
        (folder / "1_Pooling" / "config.json").write_text(
            json.dumps({"word_embedding_dimension": hidden_size, **options}), encoding="utf-8")
        (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 64}), encoding="utf-8")
    return folder

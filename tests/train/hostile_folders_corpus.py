"""Hostile model folders and sizes of issue 40 (items 2 and 6), beside tests/train/hostile_corpus.py and in its format
(`HostileCase`: the bad input, the status name of docs/outputs.md's table, the fragments of the one-line message).

Resource bombs: a multi-vector export's Dense config edited to 2e9 features (a 128 GB projection), a
`--token-dim 2000000000`, lengths from a folder's JSON or an option beyond the model's positions (a query expansion
padding every query to 10**9 tokens aborts the tokenizer), a tokenizer's `model_max_length -1`. Tampered JSON:
wrong types, missing keys, unknown modules in multi-vector and cross-encoder folders. Folders of another kind: a
multi-vector export given to the other kinds, a SparseEncoder folder to the multi-vector kind, a BERT tokenizer in a
Qwen2 folder. Each must end with USAGE (exit status 2) and one line naming the file and key (or the option), the
value and the fix.

A case's `build(folder, exports)` copies one of the untampered folders of `exports` (`write_exports`: written once
per test module from the tiny models of tests/tiny_*.py, no download) into `folder`, tampers with the copy, and
returns the command that meets it; what a command writes goes into `folder` (`OUTPUTS`) or `folder/run`.
"""
from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.train.conftest import TINY
from tests.train.hostile_corpus import HostileCase

MULTI_VECTOR, CROSS_ENCODER, SPARSE, BERT, QWEN_BERT = "multi-vector", "cross-encoder", "sparse", "bert", "qwen2-bert"
TOKEN_DIM = 8  # the multi-vector export's projection width
OUTPUTS = ("out.npz", "out.npy", "metrics.json")  # the files encode and eval write into a case's folder


def write_exports(root: Path) -> Path:
    """The untampered folders the cases copy, written into `root`: a tiny BERT, its multi-vector export
    (`--kind multi-vector`'s writer), a cross-encoder export, a SparseEncoder export, and a Qwen2 model holding the
    BERT's tokenizer files instead of its own."""
    from gradcache.models.cross_encoder import HuggingFaceCrossEncoder
    from gradcache.models.multi_vector import MultiVectorTextEncoder
    from gradcache.models.splade import SpladeEncoder
    from gradcache.train.export.cross_encoder import write_cross_encoder_folder
    from gradcache.train.export.multi_vector import write_multi_vector_folder
    from gradcache.train.export.sparse_encoder import write_sparse_encoder_folder
    from tests.tiny_cross_encoder import write_tiny_cross_encoder
    from tests.tiny_decoder_model import write_tiny_decoder
    from tests.tiny_text_model import write_tiny_bert
    from tests.train.kinds.sparse_models import write_tiny_splade

    bert = write_tiny_bert(root / BERT)
    write_multi_vector_folder(MultiVectorTextEncoder(bert, token_dim=TOKEN_DIM), bert, 32, root / MULTI_VECTOR)
    reranker = write_tiny_cross_encoder(root / "reranker")
    write_cross_encoder_folder(HuggingFaceCrossEncoder(reranker, 32), reranker, 32, root / CROSS_ENCODER)
    splade = write_tiny_splade(root / "splade")
    write_sparse_encoder_folder(SpladeEncoder(splade), splade, 32, root / SPARSE)
    qwen = write_tiny_decoder(root / QWEN_BERT, "qwen2")
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (qwen / name).unlink(missing_ok=True)
    for name in ("tokenizer.json", "vocab.txt"):  # no tokenizer_class: transformers picks Qwen2's by model_type
        shutil.copy(bert / name, qwen / name)
    return root


def _copy(exports: Path, kind: str, folder: Path) -> Path:
    return Path(shutil.copytree(exports / kind, folder / kind))


def _edit(path: Path, change: Callable[[Any], Any]) -> None:
    """Write `change(values)` (or `values`, changed in place, where it returns None) back to the JSON file."""
    values = json.loads(path.read_text(encoding="utf-8"))
    changed = change(values)
    path.write_text(json.dumps(values if changed is None else changed), encoding="utf-8")


def _texts(folder: Path) -> Path:
    path = folder / "texts.txt"
    path.write_text("who bakes bread?\nthe baker bakes bread\n", encoding="utf-8")
    return path


def _pairs(folder: Path) -> Path:
    path = folder / "pairs.jsonl"
    path.write_text("".join(json.dumps({"query": f"what is item {i}", "positive": f"item {i} is a thing"}) + "\n"
                            for i in range(40)), encoding="utf-8")
    return path


def _encode(folder: Path, model: Path, *extra: str, suffix: str = ".npz") -> list[str]:
    return ["encode", str(model), "--data", str(_texts(folder)), "--output", str(folder / f"out{suffix}"),
            *extra]


def _eval(folder: Path, model: Path, *extra: str) -> list[str]:
    return ["eval", str(model), "--data", str(_pairs(folder)), "--output", str(folder / "metrics.json"),
            *extra]


def _train(folder: Path, model: Path, *extra: str) -> list[str]:
    return ["train", "text", "--model", str(model), *TINY["text"], "--data", str(_pairs(folder)),
            "--output-dir", str(folder / "run"), *extra]


def tampered(kind: str, command: Callable[..., list[str]]) -> Callable[..., Callable[[Path, Path], list[str]]]:
    """Cases of one export: `tampered(kind, command)(file, change, *extra)` copies the export of `kind`, changes its
    `file` (relative to it) by `change`, and meets it with `command(folder, model, *extra)`."""
    def case(file: str, change: Callable[[Any], Any], *extra: str) -> Callable[[Path, Path], list[str]]:
        def build(folder: Path, exports: Path) -> list[str]:
            model = _copy(exports, kind, folder)
            _edit(model / file, change)
            return command(folder, model, *extra)

        return build

    return case


tampered_multi_vector = tampered(MULTI_VECTOR, _encode)  # the multi-vector export, encoded
tampered_cross_encoder = tampered(CROSS_ENCODER, _eval)  # the cross-encoder export, its pairs reranked


def trained_from(kind: str, *extra: str) -> Callable[[Path, Path], list[str]]:
    """A case: `gradcache train text --model` the untampered export of `kind`, with `extra` options."""
    return lambda folder, exports: _train(folder, exports / kind, *extra)


def _set(key: str, value: Any) -> Callable[[dict], None]:
    return lambda values: values.__setitem__(key, value)  # None: the values changed in place


def _drop(key: str) -> Callable[[dict], None]:
    return lambda values: values.__delitem__(key)


def _module_type(place: int, kind: str) -> Callable[[list], None]:
    return lambda modules: modules[place].__setitem__("type", kind)


def dense_weights_missing(folder: Path, exports: Path) -> list[str]:
    model = _copy(exports, MULTI_VECTOR, folder)
    (model / "1_Dense" / "model.safetensors").unlink()
    return _encode(folder, model)


def qwen2_with_bert_tokenizer(folder: Path, exports: Path) -> list[str]:
    return _encode(folder, exports / QWEN_BERT, suffix=".npy")


def eos_the_template_cannot_append(folder: Path, exports: Path) -> list[str]:
    """A BERT tokenizer given an EOS token ([MASK]) it does not append: appending it after [CLS] $A [SEP] makes the
    tokenizers library panic, which must not reach the user as a traceback."""
    model = _copy(exports, BERT, folder)
    _edit(model / "tokenizer_config.json", _set("eos_token", "[MASK]"))
    return _encode(folder, model, suffix=".npy")


def config_size_not_a_number(folder: Path, exports: Path) -> list[str]:
    model = _copy(exports, BERT, folder)
    _edit(model / "config.json", _set("hidden_size", "16"))
    return _encode(folder, model, suffix=".npy")


DENSE = "1_Dense/config.json"
SETTINGS = "sentence_bert_config.json"
ST_CONFIG = "config_sentence_transformers.json"
HUGE = 10**9
EXPANSION = {"strategy": "fixed", "attend": False, "token": None, "length": HUGE}

FOLDER_CASES = [
    # --- resource bombs: sizes checked against the weights and the positions before anything is built -----------
    HostileCase("dense-out-features-2e9", tampered_multi_vector(DENSE, _set("out_features", 2_000_000_000)), "USAGE",
                ("1_Dense/config.json: out_features 2000000000", f"set out_features to {TOKEN_DIM}")),
    HostileCase("dense-in-features-negative", tampered_multi_vector(DENSE, _set("in_features", -5)), "USAGE",
                ("1_Dense/config.json: in_features -5", "set in_features to 16")),
    HostileCase("max-seq-length-huge", tampered_multi_vector(SETTINGS, _set("max_seq_length", HUGE)), "USAGE",
                (f"sentence_bert_config.json: max_seq_length {HUGE}", "128 positions", "give at most 128")),
    HostileCase("max-seq-length-negative", tampered_multi_vector(SETTINGS, _set("max_seq_length", -1)), "USAGE",
                ("sentence_bert_config.json: max_seq_length -1", "at least 2")),
    HostileCase("query-expansion-length-huge",
                tampered_multi_vector(SETTINGS, _set("query_expansion", EXPANSION), "--tower", "query"), "USAGE",
                (f"sentence_bert_config.json: query_expansion length {HUGE}", "give at most 128")),
    HostileCase("token-dim-2e9", trained_from(BERT, "--kind", "multi-vector", "--token-dim", "2000000000"), "USAGE",
                ("--token-dim 2000000000", "[1, 65536]")),
    HostileCase("token-dim-0", trained_from(BERT, "--kind", "multi-vector", "--token-dim", "0"), "USAGE",
                ("--token-dim 0", "[1, 65536]")),
    HostileCase("query-expansion-option-huge", trained_from(BERT, "--kind", "multi-vector", "--query-expansion",
                                                            str(HUGE)), "USAGE",
                (f"--query-expansion {HUGE}", "128 positions", "give at most 128")),
    HostileCase("max-length-beyond-positions", trained_from(BERT, "--max-length", "100000"), "USAGE",
                ("--max-length 100000", "bert/config.json: max_position_embeddings", "give at most 128")),
    HostileCase("cross-encoder-train-max-length-100000",
                trained_from(CROSS_ENCODER, "--kind", "cross-encoder", "--max-length", "100000"), "USAGE",
                ("--max-length 100000", "max_position_embeddings", "give at most 128")),
    HostileCase("cross-encoder-eval-max-length-100000", tampered_cross_encoder(ST_CONFIG, lambda v: None,
                                                                               "--max-length", "100000"), "USAGE",
                ("--max-length 100000", "max_position_embeddings", "give at most 128")),
    HostileCase("encode-max-length-100000", tampered_multi_vector(ST_CONFIG, lambda v: None, "--max-length", "100000"),
                "USAGE", ("--max-length 100000", "give at most 128")),
    HostileCase("model-max-length-negative", tampered_cross_encoder("tokenizer_config.json",
                                                                    _set("model_max_length", -1)), "USAGE",
                ("tokenizer_config.json: model_max_length -1", "at least 2", "--max-length")),
    # --- tampered JSON: wrong types, missing keys, unknown modules --------------------------------------------
    HostileCase("dense-out-features-list", tampered_multi_vector(DENSE, _set("out_features", [TOKEN_DIM])), "USAGE",
                ("1_Dense/config.json: out_features [8]",)),
    HostileCase("dense-out-features-string", tampered_multi_vector(DENSE, _set("out_features", str(TOKEN_DIM))),
                "USAGE", ("1_Dense/config.json: out_features '8'",)),
    HostileCase("dense-out-features-missing", tampered_multi_vector(DENSE, _drop("out_features")), "USAGE",
                ("1_Dense/config.json: out_features None", f"set out_features to {TOKEN_DIM}")),
    HostileCase("dense-bias-string", tampered_multi_vector(DENSE, _set("bias", "false")), "USAGE",
                ("1_Dense/config.json: bias 'false'",)),
    HostileCase("dense-config-a-list", tampered_multi_vector(DENSE, lambda values: [values]), "USAGE",
                ("1_Dense/config.json must hold a JSON object, got list",)),
    HostileCase("dense-weights-missing", dense_weights_missing, "USAGE", ("1_Dense holds no model.safetensors",)),
    HostileCase("mask-config-a-list", tampered_multi_vector("2_MultiVectorMask/config.json", lambda v: [v]), "USAGE",
                ("2_MultiVectorMask/config.json must hold a JSON object",)),
    HostileCase("max-seq-length-string", tampered_multi_vector(SETTINGS, _set("max_seq_length", "32")), "USAGE",
                ("sentence_bert_config.json: max_seq_length '32'", "whole number")),
    HostileCase("sentence-bert-config-a-list", tampered_multi_vector(SETTINGS, lambda values: [values]), "USAGE",
                ("sentence_bert_config.json must hold a JSON object, got list",)),
    HostileCase("modules-an-object", tampered_multi_vector("modules.json", lambda modules: {"modules": modules}),
                "USAGE", ("modules.json must hold a list of modules, got dict",)),
    HostileCase("module-a-string", tampered_multi_vector("modules.json", lambda modules: [m["type"] for m in modules]),
                "USAGE", ("modules.json: module 0 is a str",)),
    HostileCase("module-idx-a-string", tampered_multi_vector("modules.json", lambda m: m[1].__setitem__("idx", "1")),
                "USAGE", ("modules.json: module 1's idx '1' is not a whole number",)),
    HostileCase("module-unknown-type", tampered_multi_vector("modules.json", _module_type(1, "mine.Projection")),
                "USAGE", ("modules.json lists ['Transformer', 'Projection', 'MultiVectorMask', 'Normalize']",)),
    HostileCase("prompts-a-list", tampered_multi_vector(ST_CONFIG, _set("prompts", ["query: "])), "USAGE",
                ("config_sentence_transformers.json: prompts ['query: ']", "fix the key")),
    HostileCase("prompt-a-number", tampered_multi_vector(ST_CONFIG, _set("prompts", {"query": 3})), "USAGE",
                ("config_sentence_transformers.json: prompts {'query': 3}",)),
    HostileCase("model-max-length-string", tampered_cross_encoder("tokenizer_config.json",
                                                                  _set("model_max_length", "512")), "USAGE",
                ("tokenizer_config.json: model_max_length '512'",)),
    HostileCase("activation-a-list", tampered_cross_encoder(ST_CONFIG, _set("activation_fn", ["Sigmoid"])), "USAGE",
                ("config_sentence_transformers.json: activation_fn ['Sigmoid']", "fix the key")),
    HostileCase("cross-encoder-settings-a-list", tampered_cross_encoder(ST_CONFIG, lambda values: [values]), "USAGE",
                ("config_sentence_transformers.json must hold a JSON object, got list",)),
    HostileCase("cross-encoder-modules-an-object", tampered_cross_encoder("modules.json", lambda m: {"m": m}),
                "USAGE", ("modules.json must hold a list of modules",)),
    HostileCase("cross-encoder-unknown-module", tampered_cross_encoder("modules.json", _module_type(0, "mine.Head")),
                "USAGE", ("modules.json lists a 'Head' module (type 'mine.Head')", "remove it")),
    HostileCase("positions-a-string", tampered_cross_encoder("config.json", _set("max_position_embeddings", "128")),
                "USAGE", ("config.json: max_position_embeddings '128'",)),
    HostileCase("config-size-a-string", config_size_not_a_number, "USAGE",
                ("config.json of", "hidden_size", "expected int")),
    # --- folders of another kind -------------------------------------------------------------------------------
    HostileCase("dense-kind-on-multi-vector", trained_from(MULTI_VECTOR, "--kind", "dense"), "USAGE",
                ("is a multi-vector folder", "--kind dense does not read", "train it with --kind multi-vector")),
    HostileCase("sparse-kind-on-multi-vector", trained_from(MULTI_VECTOR, "--kind", "sparse"), "USAGE",
                ("is a multi-vector folder", "train it with --kind multi-vector")),
    HostileCase("cross-encoder-kind-on-multi-vector", trained_from(MULTI_VECTOR, "--kind", "cross-encoder"), "USAGE",
                ("is a multi-vector folder", "train it with --kind multi-vector")),
    HostileCase("multi-vector-kind-on-sparse", trained_from(SPARSE, "--kind", "multi-vector"), "USAGE",
                ("is a SparseEncoder folder", "train it with --kind sparse", "without its modules.json")),
    HostileCase("qwen2-with-bert-tokenizer", qwen2_with_bert_tokenizer, "USAGE",
                ("qwen2-bert/tokenizer.json holds a WordPiece tokenizer", "Qwen2Tokenizer", "model_type 'qwen2'")),
    HostileCase("eos-the-template-cannot-append", eos_the_template_cannot_append, "USAGE",
                ("does not append its EOS token '[MASK]'", "cannot be followed")),
    # --- the controls: the untampered exports load -------------------------------------------------------------
    HostileCase("multi-vector-untampered", tampered_multi_vector(ST_CONFIG, lambda values: None), "OK"),
    HostileCase("cross-encoder-untampered", tampered_cross_encoder(ST_CONFIG, lambda values: None), "OK"),
]

# the resource bombs: each would allocate or pad to its size if it were not refused first
BOMBS = ("dense-out-features-2e9", "max-seq-length-huge", "query-expansion-length-huge", "token-dim-2e9",
         "query-expansion-option-huge", "max-length-beyond-positions", "cross-encoder-train-max-length-100000",
         "cross-encoder-eval-max-length-100000", "encode-max-length-100000")

"""`gradcache eval MODEL [--data FILE] [--output metrics.json]`: a model's metrics on any held-out file.

- A text model on a pairs file (`.tsv`, `.csv`, `.jsonl`, `.jsonl.gz`, read as `gradcache train text --data` reads
  it, every usable row a query; a `.jsonl.gz` read whole): each query ranks a corpus by cosine similarity
  (gradcache/train/eval/retrieval.py), the corpus being every distinct passage of the file (positives and hard
  negatives) or the `--corpus` id/text rows, the relevant passage being the row's positive (found in the corpus
  by its text, else by its id). Metrics:
  `recall@1`, `recall@10`, `mrr@10`, `ndcg@10` in percent, with `queries` and `corpus_size`. A multi-vector
  model (`--kind multi-vector`, a run or its export) ranks by MaxSim instead (gradcache/train/eval/maxsim.py); a
  SPLADE model by the dot product of its sparse rows, adding `nonzeros_per_query` and `nonzeros_per_document`
  (gradcache/train/eval/sparse_retrieval.py).
- A CLIP or SimCLR run on an image file or folder (read as `gradcache train --data` reads it, with the run's
  options): the run's own metrics on the held-out split of `--test-size` items of it (image-to-text and
  text-to-image recall@k, zero-shot top-1 where the data has classes; kNN top-1 of the held-out images against
  the rest).
- A CLIP model (a run, its `model/` export, built-in or open_clip) with `--classes FILE` on an ImageFolder
  `--data`: zero-shot top-1 of every image against FILE's classes (gradcache/train/commands/zero_shot.py).
- A cross-encoder (a `--kind cross-encoder` run or its export) on a pairs file: every usable row reranks its
  positive, hard negatives and other passages of the file (gradcache/train/eval/reranking.py), same metrics.
- A run without `--data`: its own held-out split, as `gradcache eval RUN` always scored it, with its baselines
  and `steps`.
"""
from __future__ import annotations

import dataclasses
import json

import numpy as np

from gradcache.train.commands.encode import embed_text_rows
from gradcache.train.commands.command_outputs import check_output, write_atomically
from gradcache.train.commands.command_inputs import Corpus, read_corpus
from gradcache.train.data.resources import reading_data
from gradcache.train.data.text.sources import read_text_pairs
from gradcache.train.data.text.text_pairs import TextPairs
from gradcache.train.errors import DataError, UsageError
from gradcache.train.eval.retrieval import retrieval_corpus
from gradcache.train.modes.loaded_model import LoadedModel

OUTPUT_SUFFIXES = (".json",)


def read_pairs(data: str, query_key: str, positive_key: str, negative_keys: list[str] | tuple[str, ...] = ()
               ) -> TextPairs:
    """Every usable row of a pairs file, as `gradcache train text --data` reads it (UsageError/DataError)."""
    try:
        return read_text_pairs(data, query_key, positive_key, negative_keys)
    except ValueError as error:
        if isinstance(error, DataError):
            raise
        raise UsageError(str(error)) from error


def pairs_corpus(pairs: TextPairs, corpus: str | None) -> tuple[Corpus, np.ndarray]:
    """The corpus to rank (the `--corpus` file, else the pairs' distinct passages), and (N,) the corpus index of
    each row's positive."""
    if corpus is not None:
        ranked = read_corpus(corpus)
        return ranked, ranked.indices_of(pairs.positives)
    texts, relevant = retrieval_corpus(pairs)
    return Corpus(ids=[str(index) for index in range(len(texts))], texts=texts), relevant


def text_metrics(model: LoadedModel, pairs: TextPairs, corpus: str | None = None,
                 batch_size: int = 256) -> dict[str, float]:
    """recall@1, recall@10, mrr@10, ndcg@10 (%) of `pairs`' queries over the corpus, with the counts."""
    ranked, relevant = pairs_corpus(pairs, corpus)
    queries = embed_text_rows(model, pairs.queries, "query", batch_size, "encode queries")
    passages = embed_text_rows(model, ranked.texts, "passage", batch_size, "encode corpus")
    metrics = model.mode.text_embeddings.rank(queries, passages, relevant)  # cosine, MaxSim or sparse dot product
    return {**metrics, "queries": len(pairs), "corpus_size": len(ranked), "skipped_rows": len(pairs.skipped)}


def run_metrics(model: LoadedModel, data: str | None, test_size: int | None = None) -> dict[str, float]:
    """A run's own evaluation: on its held-out split (`data` None: with its baselines and steps), or on the
    held-out split of `data` read with the run's options."""
    from gradcache.train.modes import mode_of

    config = model.config
    mode = mode_of(config)
    if data is not None:
        config = dataclasses.replace(config, data=str(data), test_size=test_size or config.test_size)
    with reading_data(config.data, config.eval_data):
        splits = mode.load_data(config)
    metrics = mode.evaluate(config, model.module, splits, model.device)
    return metrics if data is not None else {**metrics, **model.meta.baselines, "steps": model.meta.step}


def evaluate(model: LoadedModel, data: str | None, output: str | None = None, corpus: str | None = None,
             query_key: str = "query", positive_key: str = "positive", negative_keys: list[str] | None = None,
             test_size: int | None = None, batch_size: int = 256, classes: str | None = None) -> dict[str, float]:
    """The metrics of `model` on `data` (module docstring), written to `output` as one flat JSON object.

    Raises:
        UsageError: no `data` for a model folder; `corpus` for an image model; `classes` for a model that is not
            CLIP or without `data`; a bad output path.
        DataError: unusable data (the readers' messages), a class folder of `data` missing from `classes`.
    """
    path = None if output is None else check_output(output, OUTPUT_SUFFIXES)
    if classes is not None:
        metrics = _zero_shot(model, data, classes, corpus, test_size, batch_size)
        if path is not None:
            _write_metrics(path, metrics)
        return metrics
    if model.score_pairs is not None and data is not None:  # it scores pairs: each row reranks its candidates
        from gradcache.train.commands.pair_scores import rerank_metrics_of

        if corpus is not None:
            raise UsageError(f"--corpus is ranked by embeddings; MODEL ({model.source}) is a cross-encoder, which "
                             "reranks each row's candidates (drop --corpus)")
        metrics = rerank_metrics_of(model, read_pairs(data, query_key, positive_key, negative_keys or ()),
                                    batch_size)
        if path is not None:
            _write_metrics(path, metrics)
        return metrics
    if not model.mode.ranks_passages and corpus is not None:
        raise UsageError(f"--corpus ranks passages for a text model; MODEL ({model.source}) is a {model.noun} model")
    if data is None and model.config is None:
        raise UsageError(f"MODEL ({model.source}) is a model folder, not a run: give --data, a file of (query, "
                         "positive) rows to score it on")
    if not model.mode.ranks_passages and model.config is None:
        raise UsageError(f"MODEL ({model.source}) is an exported {model.noun} model: its metrics read the run's "
                         "options (data keys, kNN, prompts); give the run folder it was exported from")
    if model.mode.ranks_passages and data is not None:
        metrics = text_metrics(model, read_pairs(data, query_key, positive_key, negative_keys or ()), corpus,
                               batch_size)
    else:
        if corpus is not None:
            raise UsageError("--corpus needs --data, the file whose rows query it")
        metrics = run_metrics(model, data, test_size)
    if path is not None:
        _write_metrics(path, metrics)
    return metrics


def _write_metrics(path, metrics: dict[str, float]) -> None:
    write_atomically(path, lambda temporary: temporary.write_text(json.dumps(metrics, indent=2, sort_keys=True) + "\n"))


def _zero_shot(model: LoadedModel, data: str | None, classes: str, corpus: str | None, test_size: int | None,
               batch_size: int) -> dict[str, float]:
    """`--classes`: zero-shot top-1 of the ImageFolder `data`, after refusing what does not go with it."""
    from gradcache.train.commands.zero_shot import zero_shot_metrics

    if not (model.embeds_images and model.embeds_text):
        raise UsageError(f"--classes scores a CLIP model's zero-shot accuracy; MODEL ({model.source}) is a "
                         f"{model.noun} model (drop --classes)")
    if data is None:
        raise UsageError("--classes needs --data, an ImageFolder (one sub-folder of images per class) to classify")
    for value, option in ((corpus, "--corpus"), (test_size, "--test-size")):
        if value is not None:
            raise UsageError(f"{option} does not apply with --classes, which classifies every image of --data "
                             f"(drop {option})")
    return zero_shot_metrics(model, data, classes, batch_size)

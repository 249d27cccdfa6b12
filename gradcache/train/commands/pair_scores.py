"""`gradcache encode` and `gradcache eval` for a cross-encoder (a `--kind cross-encoder` run or its `model/`
export, a sentence-transformers `CrossEncoder` folder): it has no embeddings, it scores pairs.

- encode: `gradcache encode MODEL --data pairs.jsonl --output scores.npy [--pair-keys query passage]` writes one
  float32 score per (query, passage) row of the table, in input order: `CrossEncoder(folder).predict(pairs)`,
  the activation of the folder (Sigmoid for a run's) applied to the logit.
- eval: `gradcache eval MODEL --data rows.jsonl`: every usable (query, positive, hard negatives) row reranks its
  candidates (gradcache/train/eval/reranking.py), the others drawn by the run's --data-seed (a folder: 0).
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from gradcache.train.commands.command_inputs import _column, _existing
from gradcache.train.commands.command_outputs import check_output, write_atomically
from gradcache.train.modes.loaded_model import LoadedModel
from gradcache.train.data.text.text_pairs import TextPairs
from gradcache.train.errors import UsageError
from gradcache.train.eval.reranking import evaluate_reranking, score_pairs

PAIR_KEYS = ("query", "passage")  # --pair-keys' default


def read_pair_rows(data: str, keys: tuple[str, str]) -> list[tuple[str, str]]:
    """Every (query, passage) row of the table `data` (.tsv, .csv, .jsonl), its columns `keys`, in order."""
    path = _existing(data, "--data")
    queries, passages = (_column(path, key, "--data", "--pair-keys") for key in keys)
    return list(zip(queries, passages))


def encode_pairs(model: LoadedModel, data: str, output: str, keys: tuple[str, str] | None,
                 batch_size: int) -> np.ndarray:
    """(N,) float32 scores of `data`'s pairs by `model` (the activation applied), written to `output` (.npy).

    Raises:
        UsageError: an output other than .npy, a bad --batch-size.
        DataError: unusable data (command_inputs.py).
    """
    path = check_output(output, (".npy",))
    pairs = read_pair_rows(data, tuple(keys or PAIR_KEYS))
    with torch.inference_mode(), tqdm(total=len(pairs), desc="score pairs", unit="pair", file=sys.stderr,
                                      disable=None) as bar:
        def scored(chunk: list[tuple[str, str]]) -> torch.Tensor:
            bar.update(len(chunk))
            return model.score_pairs(chunk)

        logits = torch.from_numpy(score_pairs(scored, pairs, batch_size))
        scores = model.activation(logits).numpy().astype(np.float32)

    def write(temporary: Path) -> None:
        with open(temporary, "wb") as handle:
            np.save(handle, scores)

    write_atomically(path, write)
    return scores


def rerank_metrics_of(model: LoadedModel, pairs: TextPairs, batch_size: int) -> dict[str, float]:
    """recall@1, recall@10, mrr@10, ndcg@10 (%) of every row reranking its candidates, with the counts."""
    seed = model.config.data_seed if model.config is not None else 0
    with torch.inference_mode():
        metrics = evaluate_reranking(model.score_pairs, pairs, seed=seed, batch_size=batch_size)
    return {**metrics, "queries": len(pairs), "skipped_rows": len(pairs.skipped)}

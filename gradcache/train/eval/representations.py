"""What a kind of text model gives for a text, as `gradcache encode` writes it and `gradcache eval` ranks by it:
one object per representation, chosen by each kind (`Mode.text_embeddings`), so that the commands ask the kind and
never its name.

| representation | a text's embedding | `encode --output` | ranked by |
|---|---|---|---|
| `VECTORS` | (D,) L2-normalised float32 | `.npy` (N, D), or `.faiss` (an exact inner-product index) | cosine (eval/retrieval.py) |
| `TOKEN_VECTORS` | (n_i, D) unit token vectors | `.npz`: `values` (T, D) and `offsets` (N + 1,) | MaxSim (eval/maxsim.py) |
| `SPARSE_ROWS` | a (V,) nonnegative row | `.npz` in CSR form (outputs/sparse_rows.py) | dot product (eval/sparse_retrieval.py) |
"""
from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from gradcache.token_embeddings import TokenEmbeddings
from gradcache.train.eval.embed import embed_texts
from gradcache.train.eval.maxsim import embed_token_texts, maxsim_scores, ranked_metrics
from gradcache.train.eval.retrieval import retrieval_metrics
from gradcache.train.eval.sparse_retrieval import embed_sparse_texts, sparse_metrics
from gradcache.train.outputs.sparse_rows import CsrRows


def counted(encode: Callable[..., Any], bar: tqdm, rows: Callable[[Any], int] = len) -> Callable[..., Any]:
    """`encode`, advancing `bar` by the `rows` of every batch it embeds."""
    def encode_and_count(*args, **kwargs) -> Any:
        embeddings = encode(*args, **kwargs)
        bar.update(rows(embeddings))
        return embeddings

    return encode_and_count


class Representation:
    """How texts are embedded, written and ranked (module docstring); subclasses fill in every method."""

    suffixes: tuple[str, ...]  # what `encode --output` may end with
    gives: str  # for an --output of another suffix: "<what> : <the fix>"
    only_suffix: str | None = None  # texts and images alike: the one output it writes, and why (checked first)

    def embed(self, encode: Callable[..., Any], tokenizer: Callable, texts: Sequence[str], device: torch.device,
              batch_size: int, description: str) -> Any:
        """The embeddings of `texts` (one tower's `encode` after its `tokenizer`), in order, without gradients,
        with a progress bar on stderr."""
        raise NotImplementedError

    def rank(self, queries: Any, passages: Any, relevant: np.ndarray) -> dict[str, float]:
        """recall@1, recall@10, mrr@10, ndcg@10 (%) of `queries` over `passages`, `relevant` (N,) each query's
        passage."""
        raise NotImplementedError

    def save(self, embeddings: Any, temporary: Path, suffix: str) -> None:
        """Write `embeddings` to the file `temporary`, in the format of `suffix` (one of `suffixes`)."""
        raise NotImplementedError

    def describe(self, embeddings: Any) -> str:
        """What was written, for the line on stderr."""
        raise NotImplementedError


class Vectors(Representation):
    suffixes = (".npy", ".faiss")
    gives = "dense embeddings: end --output in .npy or .faiss"

    def embed(self, encode, tokenizer, texts, device, batch_size, description) -> np.ndarray:
        with tqdm(total=len(texts), desc=description, unit="text", file=sys.stderr, disable=None) as bar, \
                torch.inference_mode():
            return embed_texts(counted(encode, bar), tokenizer, texts, device, batch_size)

    def rank(self, queries: np.ndarray, passages: np.ndarray, relevant: np.ndarray) -> dict[str, float]:
        return retrieval_metrics(queries, passages, relevant)

    def save(self, embeddings: np.ndarray, temporary: Path, suffix: str) -> None:
        if suffix == ".npy":
            with open(temporary, "wb") as handle:
                np.save(handle, embeddings)
            return
        import faiss

        index = faiss.IndexIDMap2(faiss.IndexFlatIP(embeddings.shape[1]))
        index.add_with_ids(np.ascontiguousarray(embeddings, dtype=np.float32),
                           np.arange(len(embeddings), dtype=np.int64))
        faiss.write_index(index, str(temporary))

    def describe(self, embeddings: np.ndarray) -> str:
        return f"{embeddings.shape[0]} embeddings of {embeddings.shape[1]} dimensions"


class TokenVectors(Representation):
    suffixes = (".npz",)
    gives = "token vectors: end --output in .npz"
    only_suffix = ("embeds each text as token vectors of varying count, written as values and offsets to a .npz "
                   "file; give a file ending in .npz")

    def embed(self, encode, tokenizer, texts, device, batch_size, description) -> list[torch.Tensor]:
        with tqdm(total=len(texts), desc=description, unit="text", file=sys.stderr, disable=None) as bar, \
                torch.inference_mode():
            return embed_token_texts(counted(encode, bar, _token_rows), tokenizer, texts, device, batch_size)

    def rank(self, queries: list[torch.Tensor], passages: list[torch.Tensor], relevant: np.ndarray
             ) -> dict[str, float]:
        return ranked_metrics(maxsim_scores(queries, passages), relevant)

    def save(self, embeddings: list[torch.Tensor], temporary: Path, suffix: str) -> None:
        with open(temporary, "wb") as handle:
            np.savez(handle, **token_arrays(embeddings))

    def describe(self, embeddings: list[torch.Tensor]) -> str:
        values = token_arrays(embeddings)["values"]
        return f"{len(embeddings)} texts, {values.shape[0]} token vectors of {values.shape[1]} dimensions"


def _token_rows(embedded: TokenEmbeddings) -> int:
    return embedded.values.shape[0]


def token_arrays(vectors: list[torch.Tensor]) -> dict[str, np.ndarray]:
    """The `.npz` arrays of each text's (n_i, D) token vectors: `values` (T, D) float32 and `offsets` (N + 1,)
    int64, text i's vectors being `values[offsets[i]:offsets[i + 1]]`."""
    counts = np.array([0] + [len(v) for v in vectors], dtype=np.int64)
    return {"values": torch.cat(vectors).numpy().astype(np.float32, copy=False),
            "offsets": np.cumsum(counts, dtype=np.int64)}


class SparseRows(Representation):
    suffixes = (".npz",)
    gives = "sparse rows: end --output in .npz"

    def embed(self, encode, tokenizer, texts, device, batch_size, description) -> CsrRows:
        with tqdm(total=len(texts), desc=description, unit="text", file=sys.stderr, disable=None) as bar, \
                torch.inference_mode():
            return embed_sparse_texts(counted(encode, bar), tokenizer, texts, device, batch_size)

    def rank(self, queries: CsrRows, passages: CsrRows, relevant: np.ndarray) -> dict[str, float]:
        return sparse_metrics(queries, passages, relevant)

    def save(self, embeddings: CsrRows, temporary: Path, suffix: str) -> None:
        embeddings.save(temporary)

    def describe(self, embeddings: CsrRows) -> str:
        return f"{embeddings.shape[0]} sparse rows of {embeddings.shape[1]} columns, {len(embeddings.data)} non-zeros"


VECTORS, TOKEN_VECTORS, SPARSE_ROWS = Vectors(), TokenVectors(), SparseRows()

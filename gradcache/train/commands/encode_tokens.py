"""`gradcache encode MODEL --data FILE --output FILE.npz` for a multi-vector model (a `--kind multi-vector` run
or its `model/` export): each text's token vectors, in input order.

The `.npz` (`numpy.load`) holds `values`, (T, D) float32: the scored token vectors of every text one after the
other (unit length), and `offsets`, (N + 1,) int64: text i's vectors are `values[offsets[i]:offsets[i + 1]]`.
They equal sentence-transformers' `MultiVectorEncoder(RUN/model).encode_query(texts)` (`--tower query`) or
`encode_document(texts)` (`--tower passage`), text by text.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from gradcache.token_embeddings import TokenEmbeddings
from gradcache.train.commands.command_inputs import read_texts
from gradcache.train.commands.command_outputs import check_output, write_atomically
from gradcache.train.commands.model import LoadedModel
from gradcache.train.errors import UsageError
from gradcache.train.eval.maxsim import embed_token_texts

TOKEN_SUFFIXES = (".npz",)
TOKEN_KINDS = ("multi-vector",)  # the LoadedModel text kinds whose towers return TokenEmbeddings


def embed_token_rows(model: LoadedModel, texts: list[str], tower: str, batch_size: int,
                     description: str) -> list[torch.Tensor]:
    """Each text's (n_i, D) float32 scored token vectors by the `tower` ("query" or "passage") side, in order,
    with a progress bar on stderr."""
    encode = model.encode_query if tower == "query" else model.encode_passage
    with tqdm(total=len(texts), desc=description, unit="text", file=sys.stderr, disable=None) as bar:
        def counted(**tokens: torch.Tensor) -> TokenEmbeddings:
            embedded = encode(**tokens)
            bar.update(embedded.values.shape[0])
            return embedded

        return embed_token_texts(counted, model.side_tokenizer(tower), texts, model.device, batch_size)


def encode_tokens(model: LoadedModel, data: str, output: str, key: str | None, image_key: str | None, tower: str,
                  batch_size: int) -> dict[str, np.ndarray]:
    """Write the token vectors of every text of `data` to the `.npz` `output` (module docstring); return its arrays.

    Raises:
        UsageError: an output that is not `.npz`, images (`--image-key`, a folder, shards) for a text model.
        DataError: unusable data (gradcache/train/commands/command_inputs.py).
    """
    if Path(output).suffix.lower() not in TOKEN_SUFFIXES:
        raise UsageError(f"--output {output!r}: MODEL ({model.source}) embeds each text as token vectors of varying "
                         "count, written as values and offsets to a .npz file; give a file ending in .npz")
    path = check_output(output, TOKEN_SUFFIXES)
    if image_key is not None or Path(data).is_dir():
        raise UsageError(f"--data {data} holds images, but MODEL ({model.source}) embeds {model.text_kind} texts only; "
                         "give texts (a .txt file, or a table with --key)")
    with torch.inference_mode():
        vectors = embed_token_rows(model, read_texts(data, key), tower, batch_size, f"encode {tower}s")
    counts = np.array([0] + [len(v) for v in vectors], dtype=np.int64)
    arrays = {"values": torch.cat(vectors).numpy().astype(np.float32, copy=False),
              "offsets": np.cumsum(counts, dtype=np.int64)}

    def write(temporary: Path) -> None:
        with open(temporary, "wb") as handle:
            np.savez(handle, **arrays)

    write_atomically(path, write)
    return arrays

"""`gradcache encode MODEL --data FILE --output FILE.npy|FILE.faiss`: embeddings of texts or images, in input order.

Row i of the output is row i of the input (a text's line or table row, an image's sorted path or table row, a
shard sample in shard order then member order). Shards only: a member that does not decode is skipped, as
training skips it, and stderr says how many and which (its row is absent, the others keep their order).
The embeddings are L2-normalised float32, as the program scores them: every mode trains and ranks by cosine
similarity, and all-MiniLM-L6-v2 normalises itself (for a folder without a `Normalize` module, the direction of
its pooled output, which is all that cosine ranking reads). `.npy`: an (N, D) array (`numpy.load`).
A multi-vector model (`--kind multi-vector`) writes each text's token vectors to a `.npz` instead (`values` and
`offsets`, gradcache/train/eval/representations.py: sentence-transformers' `MultiVectorEncoder.encode_query` or
`encode_document`, text by text).
`.faiss`: an exact inner-product index (`IndexIDMap2` over `IndexFlatIP`) whose ids are the row numbers
(`faiss.read_index`; `index.search(queries, k)` returns rows of the input).
A SPLADE model (a `--kind sparse` run or a SparseEncoder folder) gives sparse rows instead, unnormalised, as
`SparseEncoder.encode` does: `.npz` only, in CSR form (`indptr`, `indices`, `data`, `shape`;
gradcache/train/outputs/sparse_rows.py, docs/outputs.md).
A cross-encoder has no embeddings: it writes one score per (query, passage) row (gradcache/train/commands/
pair_scores.py).
A vision-language model (`LoadedModel.embeds_inputs`) embeds each row of a table as one input: its text (`--key`),
its images (`--image-key`: a path under the table's folder, a list of them, or `{"bytes", "path"}`) or both, as
the `--tower` side with that side's prompt; a `.txt` file's lines and a folder's images are inputs too. A row with
neither, an image that cannot be used (row_images.py) or an input longer than the model's length is refused naming
the row (exit 2): no row is skipped.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from gradcache.train.commands.command_outputs import check_output, write_atomically
from gradcache.train.commands.command_inputs import (
    InputRow,
    decode_images,
    holds_shards,
    read_image_paths,
    read_input_rows,
    read_shard_images,
    read_texts,
)
from gradcache.train.errors import DataError, UsageError
from gradcache.train.eval.embed import embed_images
from gradcache.train.eval.representations import VECTORS, counted
from gradcache.train.modes.loaded_model import LoadedModel

OUTPUT_SUFFIXES = (".npy", ".faiss", ".npz")
TOWERS = ("query", "passage")


def embed_text_rows(model: LoadedModel, texts: list[str], tower: str, batch_size: int, description: str) -> Any:
    """The embeddings of `texts` by the `tower` ("query" or "passage") side, in order, as the model's kind embeds
    texts (`Mode.text_embeddings`: (N, D) L2-normalised float32, token vectors, sparse rows), with a progress bar
    on stderr."""
    return model.mode.text_embeddings.embed(model.side_encoder(tower), model.side_tokenizer(tower), texts,
                                            model.device, batch_size, description)


def embed_image_rows(model: LoadedModel, images: torch.Tensor, batch_size: int) -> np.ndarray:
    """(N, D) L2-normalised float32 embeddings of uint8 (N, 3, S, S) images, in order, with a progress bar."""
    with tqdm(total=len(images), desc="encode images", unit="image", file=sys.stderr, disable=None) as bar:
        return embed_images(counted(model.encode_image, bar), images, model.device, batch_size)


def encode(model: LoadedModel, data: str, output: str, key: str | None = None, image_key: str | None = None,
           tower: str = "passage", batch_size: int = 256,
           pair_keys: list[str] | None = None) -> np.ndarray | CsrRows | dict[str, np.ndarray]:
    """Embed every row of `data` with `model` and write them to `output` (module docstring); return them.

    Args:
        data: a .txt file or a table (with `key`) of texts; a folder or a table (with `image_key`) of images, or
            webdataset shards (a .tar, a folder of them, a glob or brace pattern).
        tower: "query" or "passage": the side that embeds texts (the same for one shared tower and for CLIP), and
            whose prompt is prepended to them (`LoadedModel.query_prompt` / `passage_prompt`).

    Raises:
        UsageError: a bad option, texts for a model without a text side or images for one without an image side.
        DataError: unusable data (gradcache/train/commands/command_inputs.py).
    """
    if model.score_pairs is not None:  # no embeddings: one score per (query, passage) row (pair_scores.py)
        from gradcache.train.commands.pair_scores import encode_pairs

        if key is not None or image_key is not None:
            raise UsageError(f"MODEL ({model.source}) is a cross-encoder: it scores (query, passage) rows named by "
                             "--pair-keys, not the texts of --key or the images of --image-key")
        return encode_pairs(model, data, output, pair_keys, batch_size)
    if pair_keys is not None:
        raise UsageError(f"--pair-keys names a cross-encoder's (query, passage) columns; MODEL ({model.source}) is a "
                         f"{model.noun} model that embeds texts (--key) or images (drop --pair-keys)")
    if tower not in TOWERS:
        raise UsageError(f"--tower {tower!r}: choose one of {', '.join(TOWERS)}")
    texts = model.mode.text_embeddings
    if texts.only_suffix is not None and Path(output).suffix.lower() not in texts.suffixes:
        raise UsageError(f"--output {output!r}: MODEL ({model.source}) {texts.only_suffix}")
    path = check_output(output, texts.suffixes if texts.only_suffix is not None else OUTPUT_SUFFIXES)
    if model.embeds_inputs:  # each row one input of its text, its images or both
        if path.suffix.lower() not in VECTORS.suffixes:
            raise UsageError(f"--output {output}: MODEL ({model.source}) gives {VECTORS.gives}")
        if holds_shards(data):
            raise UsageError(f"--data {data}: webdataset shards are not read for a vision-language model; give a "
                             "table of rows with --key and --image-key, a .txt file or a folder of images")
        embeddings = embed_input_rows(model, read_input_rows(data, key, image_key), tower, batch_size)
        write_atomically(path, lambda temporary: VECTORS.save(embeddings, temporary, path.suffix.lower()))
        return embeddings
    if key is not None and image_key is not None:
        raise UsageError(f"--key (texts) and --image-key (images) name what to embed: give one of them (MODEL "
                         f"({model.source}) is a {model.noun} model; a vision-language model takes both)")
    shards = image_key is None and holds_shards(data)
    images = shards or image_key is not None or Path(data).is_dir()
    if images and not model.embeds_images:
        raise UsageError(f"--data {data} holds images, but MODEL ({model.source}) embeds {model.noun} texts only; "
                         "give texts (a .txt file, or a table with --key)")
    if not images and not model.embeds_text:
        raise UsageError(f"--data {data}: MODEL ({model.source}) embeds images only; give a folder of images or a "
                         "table with --image-key")
    written = VECTORS if images else texts
    if path.suffix.lower() not in written.suffixes:
        raise UsageError(f"--output {output}: .npz holds the sparse rows of a SPLADE model (--kind sparse) or the "
                         f"token vectors of a multi-vector model, .npy or .faiss dense embeddings; MODEL "
                         f"({model.source}) gives {written.gives}")
    if shards:
        with torch.inference_mode():
            embeddings = embed_image_rows(model, _shard_images(data, model.image_size), batch_size)
    elif images:
        with torch.inference_mode():
            embeddings = embed_image_rows(model, decode_images(read_image_paths(data, image_key), model.image_size),
                                          batch_size)
    else:
        embeddings = embed_text_rows(model, read_texts(data, key), tower, batch_size, f"encode {tower}s")
    write_atomically(path, lambda temporary: written.save(embeddings, temporary, path.suffix.lower()))
    return embeddings


def embed_input_rows(model: LoadedModel, rows: list[InputRow], tower: str, batch_size: int) -> np.ndarray:
    """(N, D) L2-normalised float32 embeddings of a vision-language model's input `rows`, in order, by the `tower`
    side (`LoadedModel.embed_inputs`), `batch_size` rows' images open at a time, with a progress bar on stderr.

    Raises:
        DataError: a row whose image cannot be used, or that the model refuses (longer than its length), named.
    """
    chunks = []
    with tqdm(total=len(rows), desc=f"encode {tower}s", unit="input", file=sys.stderr, disable=None) as bar:
        for start in range(0, len(rows), batch_size):
            batch = rows[start:start + batch_size]
            inputs = [row.opened() for row in batch]
            try:
                chunks.append(model.embed_inputs(inputs, tower))
            except DataError:
                raise
            except ValueError:  # the model refuses an input: say which row, from the rows one at a time
                _refused_row(model, batch, inputs, tower)
                raise
            bar.update(len(batch))
    return F.normalize(torch.cat(chunks).float(), dim=1).numpy()


def _refused_row(model: LoadedModel, rows: list[InputRow], inputs: list[Any], tower: str) -> None:
    """DataError naming the first of `rows` whose input alone `model` refuses (ValueError), with its reason."""
    for row, one in zip(rows, inputs):
        try:
            model.embed_inputs([one], tower)
        except ValueError as error:
            raise DataError(f"--data {row.where}: {error}; every row is embedded in order, so shorten it (or "
                            "lower --max-pixels) or remove it") from error


def _shard_images(data: str, image_size: int) -> torch.Tensor:
    """The decoding samples of shards `data`; the skipped ones counted and named (the first ten) on stderr."""
    read = read_shard_images(data, image_size)
    if read.skipped:
        shown = "; ".join(read.skipped[:10]) + (" ..." if len(read.skipped) > 10 else "")
        print(f"encode: skipped {len(read.skipped)} shard samples that do not decode (no row for them; the "
              f"{len(read.images)} others keep shard then member order): {shown}", file=sys.stderr)
    return read.images


def rows_written(embeddings: Any) -> int:
    """How many texts, images or pairs `encode` wrote: token vectors come as a list (one tensor per text), every
    other representation as an array, sparse matrix or scores with one row per input."""
    return len(embeddings) if isinstance(embeddings, list) else int(embeddings.shape[0])


def describe(model: LoadedModel, embeddings: Any) -> str:
    """What `encode` wrote, for the line on stderr."""
    if model.score_pairs is not None:  # a cross-encoder's scores (commands/pair_scores.py)
        return f"{embeddings.shape[0]} scores of (query, passage) rows"
    written = VECTORS if isinstance(embeddings, np.ndarray) else model.mode.text_embeddings
    return written.describe(embeddings)

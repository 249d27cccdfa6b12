"""Text data: rows of (query, positive, hard negatives), and the batches a step trains on.

- `sources.py`: the one door: the rows of --data (and --eval-data, --corpus) as a run and the commands read them.
- `files.py`: which files --data names (a file, a folder, a glob or a brace pattern).
- `formats/`: one module per file format, registered in `FORMATS` (formats/__init__.py): each says its suffixes,
  whether it is indexed or streamed, and how its records are read.
- `usable_rows.py`: which rows can train (a query, a positive, h hard negatives).
- `row_index.py`: the offsets of an indexed format's usable rows; `parallel_index.py`: large `.jsonl` files
  indexed in forked processes; `indexed_pairs.py`: rows read through an index when a batch asks for them.
- `streamed_rows.py`: the rows of a streamed format (`.jsonl.gz`), read in order through a shuffle buffer.
- `text_pairs.py`: rows in memory (`TextPairs`), and the training and held-out split (`TextSplits`).
- `corpus.py`: passages by id (--corpus); `built_in.py`: the generated world (--data world); `batches.py`: the
  tokenised batches and the grouped InfoNCE.
"""

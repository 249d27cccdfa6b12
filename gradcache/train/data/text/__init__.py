"""Text data: rows of (query, positive, hard negatives) read from files (`pairs.py`: which rows are usable by `rows.py`, indexed by `row_index.py`, large
`.jsonl` files in parallel by `parallel_index.py`, a `.jsonl.gz` streamed by `gzip_rows.py`), the built-in world
(`world.py`), and the tokenised batches a step trains on (`batches.py`)."""

"""The data of `gradcache train vlm`: rows of a query, a positive and h hard negatives, each a text, its images or
both, and the batches a step trains on.

- `rows.py`: `RowSide`, `VisionLanguageRow`, `TrainingRows`, `VisionLanguageSplits`.
- `sources.py`: the one door, `load_vision_language_splits(config)`: the built-in shapes (`built_in.py`) or the
  rows of --data (`read_rows.py`: any text format, read into memory), and the held-out rows.
- `row_keys.py`: which fields make a row (the text and image keys); `record_rows.py`: one record as a row, or
  why it cannot train (the image values, the hard negatives paired, `<image>` placeholders).
- `opened_input.py`: a side with its images opened (data/images/row_images.py's safety).
- `batches.py`: `vision_language_batches`, one (query batch, passage batch) per step, bad images replaced and
  counted; `lengths.py`: `check_vision_language_lengths`, rows too long for --max-length refused at start.
"""
from gradcache.train.data.vision_language.batches import vision_language_batches
from gradcache.train.data.vision_language.built_in import BUILT_IN_VLM
from gradcache.train.data.vision_language.lengths import check_vision_language_lengths
from gradcache.train.data.vision_language.opened_input import opened_input
from gradcache.train.data.vision_language.rows import RowSide, TrainingRows, VisionLanguageRow, VisionLanguageSplits
from gradcache.train.data.vision_language.sources import load_vision_language_splits

__all__ = ["BUILT_IN_VLM", "RowSide", "TrainingRows", "VisionLanguageRow", "VisionLanguageSplits",
           "check_vision_language_lengths", "load_vision_language_splits", "opened_input", "vision_language_batches"]

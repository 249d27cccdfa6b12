"""The names that mark a folder as a run's: a checkpoint of any kind, newest or previous (`last.pt`, `last.dcp`,
`last.ds`: gradcache/train/checkpoints/), or its log or summary (`train_log.csv`, `metrics.json`: log.py).
`gradcache train` refuses a folder holding one unless it resumes there (preflight.py); a MODEL argument naming
one is loaded as a run (gradcache/train/commands/model.py)."""
from __future__ import annotations

from gradcache.train.checkpoints.deepspeed_checkpoint import DeepSpeedCheckpoint
from gradcache.train.checkpoints.run_checkpoint import FileCheckpoint, ShardedCheckpoint
from gradcache.train.run_folder.log import METRICS, TRAIN_LOG

RUN_FILES: tuple[str, ...] = (
    *(name for kind in (FileCheckpoint, ShardedCheckpoint, DeepSpeedCheckpoint)
      for name in (kind.name, kind.previous_name)),
    TRAIN_LOG, METRICS,
)

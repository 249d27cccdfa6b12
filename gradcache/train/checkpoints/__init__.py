"""Saved state of a run: atomic single-file checkpoints with a checksum (`atomic.py`, `checksum.py`), sharded
ones for `--fsdp` (`sharded.py`), both behind one interface (`run_checkpoint.py`), and how `--resume` chooses one
and merges its options with the command line (`resume.py`). ("checkpoint" here always means saved state;
activation recomputation is "grad checkpointing", in gradcache.models.)
May import: torch, the library, `gradcache.train.config` / `errors`; never the loop or the data.
"""

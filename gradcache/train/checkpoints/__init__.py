"""Saved state of a run: atomic single-file checkpoints with a checksum (`atomic.py`, `checksum.py`), sharded
ones for `--fsdp` (`sharded.py`), DeepSpeed's for `--deepspeed`, each kind behind one interface (`interface.py`)
and chosen between by one resolver (`run_checkpoint.py`), and how `--resume` chooses one and merges its options
with the command line (`resume.py`). What is loaded is read once and checked there (`regular_files.py`), bounded
before it is walked (`state_bounds.py`), and never run (`safe_unpickling.py`, `sharded_metadata.py`).
("checkpoint" here always means saved state; activation recomputation is "grad checkpointing", in gradcache.models.)
May import: torch, the library, `gradcache.train.config` / `errors` / `deepspeed_output`; never the loop or the data.
"""

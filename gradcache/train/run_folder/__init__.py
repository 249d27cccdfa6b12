"""What a run leaves in its output folder besides checkpoints: the lock that gives the folder to one job
(`lock.py`), the logs, metrics and curves (`log.py`) and, with `--report-to`, the same rows for TensorBoard
(`reporters.py`, `tensorboard.py`).
May import: the standard library, matplotlib, `gradcache.train.errors`; tensorboard (through
`torch.utils.tensorboard`) only when a run asks for it."""
